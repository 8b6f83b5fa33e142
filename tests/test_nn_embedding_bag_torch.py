"""EmbeddingBag / F.embedding_bag against torch: sum, mean and max over 2-D bags and 1-D runs
with offsets (empty bags, include_last_offset), padding_idx, per_sample_weights; values and
gradients of the weight (and of the sample weights) on the numpy and ort-cpu backends, float64
central differences, the full ONNX checker, and torch's refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads

R = np.random.default_rng(9)
W = R.standard_normal((10, 4)).astype(np.float32)
BAGS = np.array([[1, 2, 0, 7], [0, 0, 0, 0], [3, 3, 9, 4]], np.int64)  # with padding_idx=0: an empty bag
FLAT = np.array([4, 1, 0, 8, 8, 2, 5], np.int64)
OFFSETS = np.array([0, 3, 3, 5], np.int64)  # bags [0:3], [3:3] (empty), [3:5], [5:7]
PSW2 = R.standard_normal(BAGS.shape).astype(np.float32)
PSW1 = R.standard_normal(FLAT.shape).astype(np.float32)

# (id, input, offsets, keyword arguments, per_sample_weights)
CASES = [
    ("2d-mean", BAGS, None, {}, None),
    ("2d-sum-padding", BAGS, None, {"mode": "sum", "padding_idx": 0}, None),
    ("2d-mean-padding", BAGS, None, {"padding_idx": 0}, None),
    ("2d-max-padding", BAGS, None, {"mode": "max", "padding_idx": 0}, None),
    ("2d-sum-weighted", BAGS, None, {"mode": "sum"}, PSW2),
    ("1d-mean", FLAT, OFFSETS, {}, None),
    ("1d-sum-weighted-padding", FLAT, OFFSETS, {"mode": "sum", "padding_idx": -2}, PSW1),
    ("1d-max", FLAT, OFFSETS, {"mode": "max"}, None),
    ("1d-mean-last-offset", FLAT, np.array([0, 2, 2, 7]), {"include_last_offset": True, "padding_idx": 8}, None),
]


RUNS = [(*c, False) for c in CASES] + [(*c, True) for c in CASES if c[2] is not None]  # offsets fed as an input


@pytest.mark.parametrize("name,idx,offsets,kwargs,psw,fed", RUNS, ids=[r[0] + ("-fed" if r[-1] else "") for r in RUNS])
def test_embedding_bag_and_gradients_match_torch(name, idx, offsets, kwargs, psw, fed):
    torch = pytest.importorskip("torch")
    tw = torch.tensor(W, requires_grad=True)
    tpsw = None if psw is None else torch.tensor(psw, requires_grad=True)
    toff = None if offsets is None else torch.from_numpy(offsets)
    want = torch.nn.functional.embedding_bag(torch.from_numpy(idx), tw, toff, per_sample_weights=tpsw, **kwargs)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    params = {"w": W, **({} if psw is None else {"psw": psw})}
    inputs = {"idx": idx, **({"off": offsets} if fed else {})}

    def fn(F, w, psw=None, idx=None, off=None):
        return F.embedding_bag(idx, w, off if fed else offsets, per_sample_weights=psw, **kwargs)

    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, params, inputs, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=backend)
        np.testing.assert_allclose(got["w"], tw.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{backend} weight")
        if psw is not None:
            np.testing.assert_allclose(got["psw"], tpsw.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{backend} psw")
    F = gc.nn.functional
    spec = gc.spec("int64", idx.shape if psw is not None else ("N", *idx.shape[1:]) if idx.ndim == 2 else ("T",))
    model = (gc.capture(lambda w, idx, off: fn(F, w, psw, idx, off), w=W, idx=spec, off=offsets) if fed else
             gc.capture(lambda w, idx: fn(F, w, psw, idx), w=W, idx=spec))
    onnx.checker.check_model(model.proto, full_check=True)


def test_module_matches_torch_names_init_and_output():
    torch = pytest.importorskip("torch")
    bag = nn.EmbeddingBag(10, 4, mode="sum", padding_idx=3)
    state = bag.init_parameters(seed=2).state_dict()
    assert list(state) == ["weight"] and state["weight"].shape == (10, 4)
    assert np.all(state["weight"][3] == 0) and np.abs(state["weight"]).max() > 1  # N(0, 1), the padding row zero
    tbag = torch.nn.EmbeddingBag(10, 4, mode="sum", padding_idx=3)
    tbag.load_state_dict({"weight": torch.from_numpy(state["weight"])})
    bag.weight.data = state["weight"]
    model = gc.capture(lambda x, off: bag(x, off), x=FLAT, off=OFFSETS)
    want = tbag(torch.from_numpy(FLAT), torch.from_numpy(OFFSETS)).detach().numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": FLAT, "off": OFFSETS})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=backend)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_gradients_match_central_differences(mode):
    psw = np.linspace(-1, 1, FLAT.size) if mode == "sum" else None
    assert_grads_match_central_differences(
        lambda F, w: F.embedding_bag(FLAT, w, OFFSETS, mode=mode, per_sample_weights=psw, padding_idx=2),
        R.standard_normal((10, 4)))


def test_refusals_name_the_argument():
    F = gc.nn.functional
    cases = [
        (lambda: F.embedding_bag(FLAT, W, OFFSETS, mode="min"), r"mode='min'; expected 'sum', 'mean' or 'max'"),
        (lambda: F.embedding_bag(BAGS, W, OFFSETS), r"a 2-D input is a batch of fixed-length bags: offsets has to be"),
        (lambda: F.embedding_bag(FLAT, W), r"a 1-D input needs offsets"),
        (lambda: F.embedding_bag(FLAT, W, [1, 3]), r"offsets\[0\] has to be 0 .*got 1"),
        (lambda: F.embedding_bag(FLAT, W, [[0, 3]]), r"offsets has to be a 1-D tensor"),
        (lambda: F.embedding_bag(BAGS[None], W), r"input has to be 1D or 2D, got rank 3"),
        (lambda: F.embedding_bag(BAGS, W, per_sample_weights=PSW2), r"per_sample_weights is only supported for "
                                                                   r"mode='sum', got mode='mean'"),
        (lambda: F.embedding_bag(BAGS, W, mode="sum", per_sample_weights=PSW1), r"per_sample_weights has shape "
                                                                               r"\[7\]; expected input's \[3, 4\]"),
        (lambda: F.embedding_bag(BAGS, W, padding_idx=10), r"padding_idx 10 is outside \[-10, 10\)"),
        (lambda: F.embedding_bag(BAGS, W, mode="max", scale_grad_by_freq=True), r"mode='max' does not support "
                                                                                r"scale_grad_by_freq"),
    ]
    for call, message in cases:
        with pytest.raises(gc.GraphError, match=r"embedding_bag.*" + message):
            gc.capture(lambda w: call(), w=W)
    with pytest.raises(gc.GraphError, match=r"EmbeddingBag mode='first'; expected 'sum', 'mean' or 'max'"):
        nn.EmbeddingBag(10, 4, mode="first")
