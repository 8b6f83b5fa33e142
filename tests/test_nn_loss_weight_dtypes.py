"""gc.nn's loss modules keep their weight buffers in the given array's dtype, as torch keeps a tensor's:
float64 class weights that float32 cannot hold (0.1, 1/3) give torch's float64 values and gradients on
numpy and ort-cpu; a buffer of another float dtype than the input's serves the input in its dtype, as an
array given to the functional form does (numpy's float64 default on a float32 model: torch, whose tensors
default to float32, refuses or promotes there instead)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.errors import CaptureError

try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

RNG = np.random.default_rng(5)
W = np.array([0.1, 1 / 3, 0.7, 2 / 3])  # not float32 numbers: a rounding shows at ~1e-8
PW = np.array([1.1, 0.3, 1 / 7, 2.9])


def _labels():
    return RNG.integers(0, 4, 6)


def _probs():
    p = np.exp(RNG.standard_normal((6, 4)))
    return p / p.sum(1, keepdims=True)


def _bits():
    return RNG.integers(0, 2, (6, 4)).astype(np.float64)


# (id, gc module from the weights, torch module from the same (as torch tensors), the input, the target)
CASES = [
    ("cross_entropy", lambda w: nn.CrossEntropyLoss(w, label_smoothing=0.2),
     lambda t, w: t.nn.CrossEntropyLoss(w, label_smoothing=0.2), lambda: RNG.standard_normal((6, 4)), _labels),
    ("cross_entropy_probs", lambda w: nn.CrossEntropyLoss(w, reduction="sum"),
     lambda t, w: t.nn.CrossEntropyLoss(w, reduction="sum"), lambda: RNG.standard_normal((6, 4)), _probs),
    ("nll", lambda w: nn.NLLLoss(w), lambda t, w: t.nn.NLLLoss(w), lambda: RNG.standard_normal((6, 4)), _labels),
    ("bce", lambda w: nn.BCELoss(w), lambda t, w: t.nn.BCELoss(w), lambda: RNG.uniform(0.1, 0.9, (6, 4)), _bits),
    ("bce_with_logits", lambda w: nn.BCEWithLogitsLoss(w, pos_weight=PW.astype(w.dtype)),
     lambda t, w: t.nn.BCEWithLogitsLoss(w, pos_weight=t.from_numpy(PW).to(w.dtype)),
     lambda: RNG.standard_normal((6, 4)), _bits),
    ("multi_margin", lambda w: nn.MultiMarginLoss(2, 0.5, w), lambda t, w: t.nn.MultiMarginLoss(2, 0.5, w),
     lambda: RNG.standard_normal((6, 4)), _labels),
    ("multilabel_soft_margin", lambda w: nn.MultiLabelSoftMarginLoss(w), lambda t, w: t.nn.MultiLabelSoftMarginLoss(w),
     lambda: RNG.standard_normal((6, 4)), _bits),
]
IDS = [c[0] for c in CASES]


def _torch(torch, theirs, w, x, y):
    """torch's loss of ``x`` (float64 or float32 as given) and its gradient for the weights ``w``."""
    xt = torch.tensor(x, requires_grad=True)
    out = theirs(torch, torch.from_numpy(w))(xt, torch.from_numpy(y))
    out.backward()
    return out.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("name,ours,theirs,make_x,make_y", CASES, ids=IDS)
def test_float64_weights_stay_float64_as_torch(name, ours, theirs, make_x, make_y):
    """The buffer is float64 in state_dict and the graph; the loss and its input gradient equal torch's
    float64 to 1e-12 on numpy and ort-cpu (float32 weights missed by ~1e-8)."""
    torch = pytest.importorskip("torch")
    x, y = make_x(), make_y()
    loss = ours(W)
    assert {k: v.dtype for k, v in loss.state_dict().items()} == {k: np.dtype(np.float64) for k in loss.state_dict()}
    want, want_grad = _torch(torch, theirs, W, x, y)
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, x, y: m(x, y), {"x": x}, {"y": y}, np.asarray(1.0), module=loss, backend=backend)
        assert got["out"].dtype == np.float64
        np.testing.assert_allclose(got["out"], want, rtol=1e-12, atol=1e-15, err_msg=backend)
        np.testing.assert_allclose(got["x"], want_grad, rtol=1e-12, atol=1e-15, err_msg=backend)


def test_linear_cross_entropy_loss_keeps_float64_class_weights():
    torch = pytest.importorskip("torch")
    ours = nn.LinearCrossEntropyLoss(3, 4, weight=W, dtype="float64", label_smoothing=0.1).init_parameters(seed=2)
    theirs = torch.nn.LinearCrossEntropyLoss(3, 4, weight=torch.from_numpy(W), dtype=torch.float64,
                                             label_smoothing=0.1)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    assert ours.state_dict()["weight"].dtype == np.float64
    x, y = RNG.standard_normal((5, 3)), RNG.integers(0, 4, 5)
    want = theirs(torch.from_numpy(x), torch.from_numpy(y)).item()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(gc.capture(ours, input=x, target=y), backend=backend).run({"input": x, "target": y})
        np.testing.assert_allclose(got["output"], want, rtol=1e-12, err_msg=backend)


TORCH_REFUSES = ["cross_entropy", "nll", "multi_margin"]  # torch: "expected scalar type Float but found Double"


@pytest.mark.parametrize("name,ours,theirs,make_x,make_y", CASES, ids=IDS)
@pytest.mark.parametrize("x_dtype,w_dtype", [(np.float32, np.float64), (np.float64, np.float32)])
def test_a_weight_of_another_dtype_serves_the_input_in_its_dtype(name, ours, theirs, make_x, make_y, x_dtype,
                                                                  w_dtype):
    """The loss is in the input's dtype and equals torch's with the weight in the input's dtype (where
    torch itself would refuse the pair, or promote it: a float64 numpy weight is numpy's default, not a
    choice of precision)."""
    torch = pytest.importorskip("torch")
    x, y = make_x().astype(x_dtype), make_y()
    y = y.astype(x_dtype) if y.dtype == np.float64 else y
    w = W.astype(w_dtype)
    if name in TORCH_REFUSES:
        with pytest.raises(RuntimeError, match="expected scalar type"):
            _torch(torch, theirs, w, x, y)
    want, _ = _torch(torch, theirs, w.astype(x_dtype), x, y)
    model = gc.capture(ours(w), input=x, target=y)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"input": x, "target": y})["output"]
        assert got.dtype == np.dtype(x_dtype), backend
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=backend)


def test_linear_cross_entropy_loss_takes_a_weight_of_another_dtype_in_the_inputs():
    torch = pytest.importorskip("torch")
    loss = nn.LinearCrossEntropyLoss(3, 4, weight=W).init_parameters(seed=0)  # float32 linear, float64 weight
    theirs = torch.nn.LinearCrossEntropyLoss(3, 4, weight=torch.from_numpy(W.astype(np.float32)))
    theirs.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in loss.state_dict().items()})
    x, y = RNG.standard_normal((5, 3)).astype(np.float32), RNG.integers(0, 4, 5)
    got = gc.Session(gc.capture(loss, input=x, target=y), backend="numpy").run({"input": x, "target": y})["output"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, theirs(torch.from_numpy(x), torch.from_numpy(y)).item(), rtol=1e-6)


def test_list_weights_are_float32_and_arrays_in_calls_take_the_input_dtype():
    """A list is float32 (torch.tensor's default), so it serves a float32 model as before; an array
    given to a functional form is a constant, which takes the input's dtype as any constant does (torch
    takes no arrays there)."""
    assert nn.CrossEntropyLoss([0.5, 2.0]).state_dict()["weight"].dtype == np.float32
    x, y = RNG.standard_normal((6, 4)).astype(np.float32), _labels()
    fn = lambda x, y: nn.functional.cross_entropy(x, y, W)  # noqa: E731
    got = gc.Session(gc.capture(fn, x=x, y=y), backend="numpy").run({"x": x, "y": y})["output"]
    assert got.dtype == np.float32


def test_a_computed_weight_of_another_dtype_is_refused_for_class_labels_as_torch():
    """A weight Tensor the model computes (here an input) follows torch: refused, naming both dtypes."""
    x, y = RNG.standard_normal((6, 4)).astype(np.float32), _labels()
    fn = lambda x, y, w: nn.functional.cross_entropy(x, y, w)  # noqa: E731
    with pytest.raises(CaptureError, match="cross_entropy: weight is float64 but the input is float32"):
        gc.capture(fn, x=x, y=y, w=W)
