"""The padding layers (``gc.nn.ZeroPad2d``, ``ReflectionPad1d``, ...) and ``F.pad`` in every mode:
outputs on the numpy and ort-cpu backends and ``gc.grad`` input gradients against torch (several
ranks, odd sizes, crops, unbatched inputs), float64 gradients against central differences, and
torch's limits as clear errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn

try:
    from torch_grad_util import TorchNS, assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, assert_grads_match_central_differences, gc_grads, run_both

R = np.random.default_rng(21)
NCW, CW = R.standard_normal((2, 3, 7)).astype(np.float32), R.standard_normal((3, 6)).astype(np.float32)
NCHW, CHW = R.standard_normal((2, 3, 5, 6)).astype(np.float32), R.standard_normal((2, 4, 5)).astype(np.float32)
NCDHW, CDHW = R.standard_normal((1, 2, 3, 4, 5)).astype(np.float32), R.standard_normal((2, 3, 3, 4)).astype(np.float32)

# (gc module and torch.nn constructor, input): each kind in 1, 2 and 3 dims, batched and unbatched
MODULES = [
    ("ZeroPad1d(2)", NCW), ("ZeroPad2d((1, 0, 2, 3))", CHW), ("ZeroPad3d((1, 2, 0, 1, 2, 0))", NCDHW),
    ("ZeroPad2d(-1)", NCHW),
    ("ConstantPad1d((3, -2), 1.5)", CW), ("ConstantPad2d((2, 1, -1, 2), -0.5)", NCHW),
    ("ConstantPad3d(1, 2.0)", CDHW),
    ("ReflectionPad1d((3, 1))", NCW), ("ReflectionPad1d(2)", CW), ("ReflectionPad2d((1, 2, 3, 0))", NCHW),
    ("ReflectionPad2d((2, -1, 1, 3))", CHW), ("ReflectionPad2d((4, -3, 0, 0))", NCHW),  # mirrored, then cropped
    ("ReflectionPad3d((1, 2, 2, 1, 0, 2))", NCDHW), ("ReflectionPad3d(1)", CDHW),
    ("ReplicationPad1d((2, 4))", NCW), ("ReplicationPad2d((2, 0, -1, 3))", NCHW), ("ReplicationPad2d(3)", CHW),
    ("ReplicationPad3d((1, 0, 2, 1, 1, 1))", NCDHW), ("ReplicationPad3d((0, 2, -1, 1, 3, 0))", CDHW),
    ("CircularPad1d((3, 2))", NCW), ("CircularPad1d((-2, 4))", CW), ("CircularPad2d((1, 2, 2, 1))", NCHW),
    ("CircularPad2d((4, -1, 0, 4))", CHW), ("CircularPad3d((2, 1, 1, 2, 1, 1))", NCDHW), ("CircularPad3d(1)", CDHW),
]


@pytest.mark.parametrize("ctor,x", MODULES, ids=[m[0] for m in MODULES])
def test_pad_modules_and_their_gradients_match_torch(ctor, x):
    torch = pytest.importorskip("torch")
    layer = eval(f"nn.{ctor}", {"nn": nn})  # noqa: S307 - the constructors listed above
    want_layer = eval(f"torch.nn.{ctor}", {"torch": torch})  # noqa: S307
    assert repr(layer) == repr(want_layer) and layer.state_dict() == {}
    xt = torch.tensor(x, requires_grad=True)
    want = want_layer(xt)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, x: m(x), {"x": x}, {}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-6, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=backend)
    model = gc.capture(layer, x=gc.spec("float32", ("N", *x.shape[1:])))
    onnx.checker.check_model(model.proto, full_check=True)
    np.testing.assert_allclose(run_both(model, {"x": x})["output"], want.detach().numpy(), rtol=1e-6)


# (mode, pad, input): F.pad, the pads of up to three dims, crops included
FUNCTIONAL = [
    ("reflect", (2, 1), NCW), ("reflect", (2, -1, 1, 3), NCHW), ("reflect", (5, -4), NCW),
    ("reflect", (1, 2, 2, 1, 2, 1), NCDHW), ("replicate", (2, 1, -1, 3, 0, 2), CDHW), ("replicate", (-2, 3), CW),
    ("circular", (1, 2, -1, 3), NCHW), ("circular", (5, 6), NCW), ("circular", (1, 2, 2, 1, 3, 1), NCDHW),
    ("constant", (1, -2, 2, 1), NCHW),
]


@pytest.mark.parametrize("mode,pad,x", FUNCTIONAL, ids=[f"{m}{p}" for m, p, _ in FUNCTIONAL])
def test_functional_pad_gradients_match_central_differences(mode, pad, x):
    """Pad's reflect, edge and wrap gradient rules, float64, on both backends."""
    assert_grads_match_central_differences(lambda M, x: M.pad(x, pad, mode=mode), x)


@pytest.mark.parametrize("mode,pad,x", FUNCTIONAL, ids=[f"{m}{p}" for m, p, _ in FUNCTIONAL])
def test_functional_pad_matches_torch(mode, pad, x):
    torch = pytest.importorskip("torch")
    want = TorchNS(torch).pad(torch.from_numpy(x), pad, mode=mode).numpy()
    got = run_both(gc.capture(lambda x: gc.nn.functional.pad(x, pad, mode=mode), x=x), {"x": x})["output"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.pad(x, (7, 0), mode="reflect"), r"pad \(7, 0\) reflect pads must be smaller than dim 2's size 7"),
    (lambda x: gc.pad(x, (8, 0), mode="circular"), r"circular pads wrap around dim 2 more than once"),
    (lambda x: gc.pad(x, (3, -5), mode="circular"), r"the crops leave 2 of its 7"),
    (lambda x: gc.pad(x, (-4, -4)), r"pad \(-4, -4\) crops more than dim 2's size 7"),
    (lambda x: gc.pad(x, (1, 1), mode="replicate", value=2.0), r"pad mode='replicate' takes no value"),
    (lambda x: nn.ReflectionPad2d(1)(x[0, 0]), r"ReflectionPad2d expects a \(C, H, W\) or \(N, C, H, W\) input, "
     "got rank 1"),
    (lambda x: nn.CircularPad1d((1, 2, 3)), r"padding must be an int or 2 ints, got \[1, 2, 3\]"),
])
def test_bad_pads_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=NCW)
    assert "test_nn_padding.py" in str(err.value)
