"""Bilinear / F.bilinear, CosineSimilarity / F.cosine_similarity, PairwiseDistance /
F.pairwise_distance and F.pdist against torch: values and gradients of every input and parameter
on the numpy and ort-cpu backends (torch's eps clamping and zero-distance gradients included),
float64 central differences of the lowerings, the full ONNX checker, and torch's refusals."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads, torch_twin
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads, torch_twin

R = np.random.default_rng(8)
A = R.standard_normal((4, 5)).astype(np.float32)
B = R.standard_normal((4, 5)).astype(np.float32)
TINY = np.concatenate([A[:2], A[2:] * 1e-10]).astype(np.float32)  # rows under eps: the clamp matters
DUP = np.concatenate([A, A[1:2]]).astype(np.float32)  # rows 1 and 4 equal: a zero distance

# (id, F function, inputs, keyword arguments)
FUNCTIONS = [
    ("cosine", "cosine_similarity", (A, B), {}),
    ("cosine-dim0-eps", "cosine_similarity", (A, B), {"dim": 0, "eps": 1e-3}),
    ("cosine-tiny", "cosine_similarity", (TINY, B), {}),
    ("cosine-broadcast", "cosine_similarity", (A, B[:1]), {"dim": -1}),
    ("pairwise", "pairwise_distance", (A, B), {}),
    ("pairwise-p1-keepdim", "pairwise_distance", (A, B), {"p": 1.0, "keepdim": True}),
    ("pairwise-p3-eps", "pairwise_distance", (A, B), {"p": 3.0, "eps": 1e-2}),
    ("pairwise-inf", "pairwise_distance", (A, B), {"p": math.inf}),
    ("pairwise-unbatched", "pairwise_distance", (A[0], B[0]), {}),
    ("pdist", "pdist", (DUP,), {}),
    ("pdist-p1", "pdist", (A,), {"p": 1.0}),
    ("pdist-p3", "pdist", (DUP,), {"p": 3.0}),
    ("bilinear", "bilinear", (R.standard_normal((2, 3, 4)), R.standard_normal((2, 3, 5)),
                              R.standard_normal((6, 4, 5)), R.standard_normal(6)), {}),
    ("bilinear-unbatched-nobias", "bilinear", (A[0, :4], B[0], R.standard_normal((3, 4, 5))), {}),
]


@pytest.mark.parametrize("name,fn,args,kwargs", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_function_and_gradients_match_torch(name, fn, args, kwargs):
    torch = pytest.importorskip("torch")
    args = [np.asarray(a, np.float32) for a in args]
    params = {f"a{i}": a for i, a in enumerate(args)}
    tin = [torch.tensor(a, requires_grad=True) for a in args]
    want = getattr(torch.nn.functional, fn)(*tin, **kwargs)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, *a: getattr(F, fn)(*a, **kwargs), params, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=backend)
        for k, t in zip(params, tin):
            np.testing.assert_allclose(got[k], t.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{backend} {k}")
    model = gc.capture(lambda **a: getattr(gc.nn.functional, fn)(*a.values(), **kwargs), **params)
    onnx.checker.check_model(model.proto, full_check=True)


# (the constructor in both libraries, inputs)
MODULES = [("Bilinear(4, 5, 3)", (A[:, :4], B)), ("Bilinear(4, 5, 3, bias=False)", (A[:, :4], B)),
           ("CosineSimilarity(dim=0)", (A, B)), ("PairwiseDistance(p=1.5, keepdim=True)", (A, B))]


@pytest.mark.parametrize("ctor,args", MODULES, ids=[m[0] for m in MODULES])
def test_module_matches_torch(ctor, args):
    torch = pytest.importorskip("torch")
    layer, tl = torch_twin(ctor, seed=1)
    tin = {k: torch.tensor(a, requires_grad=True) for k, a in zip(("x1", "x2"), args)}
    want = tl(*tin.values())
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, x1, x2: m(x1, x2), dict(zip(tin, args)), {}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-5, atol=1e-5, err_msg=backend)
        for k, t in tin.items():
            np.testing.assert_allclose(got[k], t.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{backend} {k}")
        for k, p in tl.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{backend} {k}")


def test_bilinear_init_is_torchs():
    sd = nn.Bilinear(16, 3, 50).init_parameters(seed=0).state_dict()
    assert sd["weight"].shape == (50, 16, 3) and sd["bias"].shape == (50,)
    assert all(0.24 < np.abs(v).max() <= 0.25 for v in sd.values())  # U(+-1/sqrt(in1_features))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_bilinear_gradients_match_central_differences(bias):
    layer = nn.Bilinear(5, 5, 3, bias=bias, dtype="float64")
    assert_grads_match_central_differences(lambda m, x: m(x, x * x + 1), R.standard_normal((2, 3, 5)), module=layer)


@pytest.mark.parametrize("fn", [lambda F, x: F.cosine_similarity(x, x[::-1], dim=-1),
                                lambda F, x: F.pairwise_distance(x, x[::-1], p=3.0),
                                lambda F, x: F.pdist(x, p=2.0)],
                         ids=["cosine", "pairwise", "pdist"])
def test_lowerings_match_central_differences(fn):
    """(Not cosine_similarity under its eps clamp: there torch's gradient is the unclamped norm's,
    which no difference quotient gives; ``cosine-tiny`` checks it against torch.)"""
    assert_grads_match_central_differences(fn, np.random.default_rng(0).standard_normal((4, 4)))


def test_refusals_name_the_argument():
    F = gc.nn.functional
    w = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(gc.GraphError, match=r"Bilinear.*input2 features and weight dim 2 differ \(6 vs 5\)"):
        gc.capture(lambda a, b: F.bilinear(a, b, w), a=A[:, :4], b=np.zeros((4, 6), np.float32))
    with pytest.raises(gc.GraphError, match=r"Bilinear.*input1 and input2 batch dims differ \(4 vs 3\)"):
        gc.capture(lambda a, b: F.bilinear(a, b, w), a=A[:, :4], b=B[:3])
    with pytest.raises(gc.GraphError, match=r"Bilinear.*weight must be \[out, in1, in2\], got rank 2"):
        gc.capture(lambda a, b: F.bilinear(a, b, w[0]), a=A[:, :4], b=B)
    with pytest.raises(gc.GraphError, match=r"pdist.*expects a 2-D input \[N, M\] with a static N, got shape "
                                            r"\[2, 2, 5\]"):
        gc.capture(F.pdist, x=A.reshape(2, 2, 5))
    with pytest.raises(gc.GraphError, match=r"pdist.*static N, got shape \['N', 5\]"):
        gc.capture(F.pdist, x=gc.spec("float32", ("N", 5)))
    with pytest.raises(gc.GraphError, match=r"pdist.*p must be a number >= 0, got -1"):
        gc.capture(lambda x: F.pdist(x, -1), x=A)


@pytest.mark.parametrize("fn", ["cosine_similarity", "pairwise_distance"])
def test_numpy_operand_takes_the_tensors_dtype(fn):
    """A numpy second operand is a constant of the first's dtype (float64 here), as torch's result."""
    torch = pytest.importorskip("torch")
    x, other = A.astype(np.float64), np.ones((4, 5))
    model = gc.capture(lambda x: getattr(gc.nn.functional, fn)(x, other), x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    want = getattr(torch.nn.functional, fn)(torch.from_numpy(x), torch.from_numpy(other)).numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})
        (out,) = got.values()
        assert out.dtype == np.float64, backend
        np.testing.assert_allclose(out, want, rtol=1e-12, err_msg=backend)
