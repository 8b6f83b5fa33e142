"""The padding layers (``gc.nn.ZeroPad2d``, ``ReflectionPad1d``, ...), ``F.pad`` in every mode and
the convolutions' ``padding_mode``: outputs on the numpy and ort-cpu backends and ``gc.grad``
gradients against torch (several ranks, odd sizes, crops, unbatched inputs, strides, dilations),
float64 gradients against central differences, and torch's limits as clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn

try:
    from torch_grad_util import (TorchNS, assert_constructed_matches_torch, assert_grads_match_central_differences,
                                 assert_module_matches_torch, run_both)
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (TorchNS, assert_constructed_matches_torch,
                                       assert_grads_match_central_differences, assert_module_matches_torch, run_both)

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
    assert_module_matches_torch(layer, want_layer, x)


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


# (gc module and torch.nn constructor, input): padding_mode with int, tuple, 'same' and 'valid' padding
CONVS = [
    ("Conv1d(3, 4, 3, padding=2, padding_mode='reflect')", NCW),
    ("Conv1d(3, 2, 4, padding='same', dilation=2, padding_mode='circular')", NCW),
    ("Conv2d(3, 4, (3, 4), stride=2, padding=(2, 1), padding_mode='reflect')", NCHW),
    ("Conv2d(3, 6, 3, padding='same', dilation=(2, 1), groups=3, padding_mode='replicate')", NCHW),
    ("Conv2d(3, 2, 2, padding=1, bias=False, padding_mode='circular')", NCHW),
    ("Conv2d(3, 2, 3, padding='valid', padding_mode='reflect')", NCHW),
    ("Conv3d(2, 3, 3, padding=1, padding_mode='replicate')", NCDHW),
    ("Conv3d(2, 2, (2, 3, 3), stride=(1, 2, 2), padding=(1, 2, 1), padding_mode='circular')", NCDHW),
]


@pytest.mark.parametrize("ctor,x", CONVS, ids=[c[0] for c in CONVS])
def test_conv_padding_modes_and_their_gradients_match_torch(ctor, x):
    pytest.importorskip("torch")
    assert_constructed_matches_torch(ctor, x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layer,x", [
    (lambda: nn.Conv1d(3, 2, 3, padding="same", dilation=2, padding_mode="reflect", dtype="float64"), NCW),
    (lambda: nn.Conv2d(3, 2, 3, stride=2, padding=(1, 2), padding_mode="circular", dtype="float64"), NCHW),
    (lambda: nn.Conv3d(2, 2, 2, padding=1, padding_mode="replicate", dtype="float64"), NCDHW),
], ids=["reflect", "circular", "replicate"])
def test_conv_padding_mode_gradients_match_central_differences(layer, x):
    """On the numpy backend: onnxruntime's CPU Conv has no float64 kernel (its float32 gradients
    are checked against torch above)."""
    assert_grads_match_central_differences(lambda m, x: m(x), x, module=layer(), backends=("numpy",))


@pytest.mark.parametrize("cls,args", [(nn.Conv1d, (3, 4, 3)), (nn.Conv2d, (3, 6, (3, 2), 1, 1, 1, 3)),
                                      (nn.Conv3d, (2, 4, 3))])
def test_padding_mode_keeps_parameters_and_init(cls, args):
    """The state_dict (names, shapes, seeded values) is the one of padding_mode='zeros'."""
    zeros, circular = cls(*args, padding_mode="zeros"), cls(*args, padding_mode="circular")
    for m in (zeros, circular):
        m.init_parameters(seed=5)
    assert circular.padding_mode == "circular" and list(zeros.state_dict()) == list(circular.state_dict())
    for k, v in zeros.state_dict().items():
        np.testing.assert_array_equal(circular.state_dict()[k], v)


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.pad(x, (7, 0), mode="reflect"), r"pad \(7, 0\) reflect pads must be smaller than dim 2's size 7"),
    (lambda x: gc.pad(x, (8, 0), mode="circular"), r"circular pads wrap around dim 2 more than once"),
    (lambda x: gc.pad(x, (3, -5), mode="circular"), r"the crops leave 2 of its 7"),
    (lambda x: gc.pad(x, (-4, -4)), r"pad \(-4, -4\) crops more than dim 2's size 7"),
    (lambda x: gc.pad(x, (1, 1), mode="replicate", value=2.0), r"pad mode='replicate' takes no value"),
    (lambda x: nn.ReflectionPad2d(1)(x[0, 0]), r"ReflectionPad2d\(float32\[7\]\): expects a \(C, H, W\) or "
     r"\(N, C, H, W\) input, got rank 1"),
    (lambda x: nn.CircularPad1d((1, 2, 3)), r"padding must be an int or 2 ints, got \[1, 2, 3\]"),
    (lambda x: nn.Conv1d(3, 4, 3, padding_mode="mirror"), r"Conv1d padding_mode='mirror'; expected one of \['zeros', "
     r"'reflect', 'replicate', 'circular'\]"),
    (lambda x: nn.ConvTranspose2d(3, 4, 3, padding_mode="reflect"), r"ConvTranspose2d supports padding_mode='zeros' "
     "only"),
    (lambda x: nn.Conv1d(3, 4, 3, padding=7, padding_mode="reflect")(x), r"reflect pads must be smaller than dim 2's"),
])
def test_bad_pads_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=NCW)
    assert "test_nn_padding.py" in str(err.value)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_a_long_axis_pad_gradient_is_linear_in_its_size(mode):
    # a [2, 200000] signal: the [out, in] matrix along it would hold 4e10 entries (the rule asked for
    # 191 GiB); dy is summed back by a scatter instead, equal to the adjoint written out with np.add.at
    n, pad = 200_000, (300, 7)
    model = gc.capture(lambda x, c: (gc.nn.functional.pad(x, pad, mode=mode) * c).sum(),
                       x=gc.spec("float32", (2, n)), c=gc.spec("float32", (2, n + sum(pad))))
    grads = gc.grad(model, "output", wrt=["x"])
    assert len(grads.proto.SerializeToString()) < 1 << 20
    x, c = R.standard_normal((2, n)).astype(np.float32), R.standard_normal((2, n + sum(pad))).astype(np.float32)
    positions = np.pad(np.arange(n), pad, mode={"replicate": "edge", "circular": "wrap"}.get(mode, mode))
    expected = np.zeros((2, n), np.float64)
    np.add.at(expected, (slice(None), positions), c.astype(np.float64))
    np.testing.assert_allclose(run_both(grads, {"x": x, "c": c})["x_grad"], expected, rtol=1e-5, atol=1e-4)
