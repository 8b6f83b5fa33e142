"""Tensor methods and functions against torch's: each case is ``fn(M, *params, **inputs)`` with
``M`` the DSL's namespace (``gc.nn.functional``) or torch's, and methods called on the tensors
themselves. The output on the numpy and ort-cpu backends (after the full ONNX checker) and the
``gc.grad`` gradients of ``sum(out * c)`` with respect to every float ``param`` match torch's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import TorchNS, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, gc_grads, run_both

R = np.random.default_rng(11)
X = R.standard_normal((2, 3, 4)).astype(np.float32)
Y = R.standard_normal((2, 3, 4)).astype(np.float32)
# divisors kept away from 0 and quotients away from whole numbers (the jumps of % and //)
D = (np.sign(Y) * (np.abs(Y) + 0.5)).astype(np.float32)

# (id, fn(M, *params, **inputs), params (differentiated), inputs (graph inputs, not differentiated))
CASES = [
    ("remainder", lambda M, x, d: x % d, (X * 5, D), {}),
    ("remainder_scalar", lambda M, x: x % -0.7, (X,), {}),
    ("remainder_fn", lambda M, x, d: M.remainder(x, d), (X * 5, D), {}),
    ("fmod", lambda M, x, d: M.fmod(x, d), (X * 5, D), {}),
    ("clamp_tensor_bounds", lambda M, x, lo, hi: x.clamp(min=lo, max=hi), (X, X[:, :1] * 0.5, Y[:1] + 0.5), {}),
    ("clamp_tensor_min_over_max", lambda M, x, lo, hi: M.clamp(x, lo, hi), (X, Y, Y - 0.3), {}),
    ("clamp_tensor_min_broadcasts_x", lambda M, x, lo: x.clamp(lo), (X[0], Y * 0.2), {}),
    ("clamp_tensor_max_only", lambda M, x, hi: x.clamp(max=hi), (X, Y[0, 0]), {}),
    ("flatten_0d", lambda M, x: (x * 2).sum().flatten(), (X,), {}),
    ("sum_dim_keepdim", lambda M, x: x.sum(dim=(0, 2), keepdim=True), (X,), {}),
    ("sum_dim_positional_keepdim", lambda M, x: x.sum(-1, True), (X,), {}),
    ("mean_dim", lambda M, x: x.mean(dim=1), (X,), {}),
    ("max_dim_keepdim_values", lambda M, x: x.amax(dim=1, keepdim=True) if M is not F else x.max(dim=1, keepdim=True),
     (X,), {}),
    ("min_dim", lambda M, x: x.amin(-1) if M is not F else x.min(dim=-1), (X,), {}),
    ("max_elementwise", lambda M, x, y: x.max(y), (X, Y), {}),
    ("min_elementwise", lambda M, x, y: x.min(y), (X, Y), {}),
    ("softmax_dim", lambda M, x: x.softmax(dim=1), (X,), {}),
    ("log_softmax_dim", lambda M, x: x.log_softmax(dim=-1), (X,), {}),
    ("cumsum_bool", lambda M, x: (x > 0).cumsum(1), (X,), {}),
]
IDS = [c[0] for c in CASES]


def _torch(fn, params, inputs, c=None):
    import torch

    ts = [torch.tensor(p, requires_grad=True) for p in params]
    out = fn(TorchNS(torch), *ts, **{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()})
    if c is not None:
        (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), [None if t.grad is None else t.grad.numpy() for t in ts]


@pytest.mark.parametrize("name,fn,params,inputs", CASES, ids=IDS)
def test_output_and_gradients_match_torch(name, fn, params, inputs):
    pytest.importorskip("torch")
    want, _ = _torch(fn, params, inputs)
    names = [f"p{i}" for i in range(len(params))]
    feeds = {**dict(zip(names, params)), **inputs}
    model = gc.capture(lambda **kw: fn(F, *(kw.pop(n) for n in names), **kw), **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, feeds)["output"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if want.dtype.kind != "f":
        return
    c = R.standard_normal(want.shape).astype(want.dtype)
    _, dparams = _torch(fn, params, inputs, c)
    grads = gc_grads(fn, dict(zip(names, params)), inputs, c)
    for n, dp in zip(names, dparams):
        np.testing.assert_allclose(grads[n], 0 if dp is None else dp, rtol=1e-4, atol=1e-5, err_msg=n)


@pytest.mark.parametrize("call,message", [
    (lambda x: x.sum(1, dim=2), "as axis= or dim=, not both"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=gc.spec("float32", ("N", 3, 4)))
    assert "test_dsl_torch_methods.py" in str(err.value)
