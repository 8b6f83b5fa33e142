"""The 3-D and adaptive max pools, ``return_indices`` and ``max_unpool``, ``ConvTranspose3d``,
``LPPool`` and ``LocalResponseNorm`` against torch: outputs and ``gc.grad`` gradients of the
input and the parameters on the numpy and ort-cpu backends, the captured models through the full
ONNX checker; float64 gradients against central differences; torch's refusals as clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn

try:
    from torch_grad_util import (TorchNS, assert_constructed_matches_torch, assert_grads_match_central_differences,
                                 gc_grads, run_both)
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (TorchNS, assert_constructed_matches_torch,
                                       assert_grads_match_central_differences, gc_grads, run_both)

R = np.random.default_rng(47)
NCL = R.standard_normal((2, 3, 9)).astype(np.float32)
NCHW = R.standard_normal((2, 3, 6, 8)).astype(np.float32)
NCDHW = R.standard_normal((2, 2, 4, 6, 5)).astype(np.float32)
NCDHW7 = R.standard_normal((1, 2, 7, 5, 6)).astype(np.float32)  # ceil_mode windows hang over
POS = {k: np.abs(v) + 0.1 for k, v in (("NCL", NCL), ("NCHW", NCHW), ("NCDHW7", NCDHW7))}  # odd p: positive sums

# (gc module and torch.nn constructor, input): parameterless layers
MODULES = [
    ("MaxPool3d(2)", NCDHW), ("MaxPool3d((3, 2, 2), stride=(2, 1, 2), padding=1, dilation=(1, 2, 1))", NCDHW),
    ("MaxPool3d(3, stride=2, ceil_mode=True)", NCDHW7),
    ("AvgPool3d(2)", NCDHW), ("AvgPool3d(3, stride=2, padding=1, count_include_pad=False)", NCDHW7),
    ("AvgPool3d((2, 3, 3), stride=2, ceil_mode=True)", NCDHW7),
    ("AvgPool3d(2, divisor_override=3)", NCDHW), ("AvgPool3d((3, 2, 3), stride=(2, 1, 2), padding=1, "
                                                 "divisor_override=-5)", NCDHW7),
    ("AvgPool2d(3, stride=2, padding=1, divisor_override=4)", NCHW), ("AvgPool2d((2, 3), divisor_override=-2)", NCHW),
    ("AdaptiveAvgPool3d((2, 3, 1))", NCDHW), ("AdaptiveAvgPool3d(1)", NCDHW7),
    ("AdaptiveAvgPool3d((None, 2, 5))", NCDHW),
    ("AdaptiveMaxPool1d(3)", NCL), ("AdaptiveMaxPool1d(1)", NCL), ("AdaptiveMaxPool2d((3, 2))", NCHW),
    ("AdaptiveMaxPool2d((1, None))", NCHW), ("AdaptiveMaxPool2d(1)", NCHW), ("AdaptiveMaxPool3d((2, 3, 5))", NCDHW),
    ("AdaptiveMaxPool3d(1)", NCDHW),
    ("LPPool1d(2, 3)", NCL), ("LPPool1d(3, 4, stride=2, ceil_mode=True)", POS["NCL"]),
    ("LPPool2d(2, (2, 3), stride=(1, 2))", NCHW), ("LPPool2d(1.5, 3, stride=2, ceil_mode=True)", POS["NCHW"]),
    ("LPPool2d(float('inf'), 2)", NCHW),
    ("LPPool3d(2, 2)", NCDHW), ("LPPool3d(3, (3, 2, 2), stride=2, ceil_mode=True)", POS["NCDHW7"]),
    ("LocalResponseNorm(3)", NCHW), ("LocalResponseNorm(2, alpha=0.1, beta=0.5, k=2.0)", NCHW),
    ("LocalResponseNorm(4, alpha=0.3)", NCL), ("LocalResponseNorm(5, alpha=0.2, beta=1.0)", NCDHW),
]


@pytest.mark.parametrize("ctor,x", MODULES, ids=[m[0] for m in MODULES])
def test_pool_layers_and_their_gradients_match_torch(ctor, x):
    pytest.importorskip("torch")
    assert_constructed_matches_torch(ctor, x, rtol=1e-4, atol=1e-5)


CONVS = [
    ("ConvTranspose3d(2, 3, 2, stride=2)", NCDHW),
    ("ConvTranspose3d(2, 4, (3, 2, 3), stride=(2, 1, 2), padding=1, output_padding=(1, 0, 1), groups=2, "
     "dilation=(1, 2, 1))", NCDHW),
    ("ConvTranspose3d(2, 3, 3, padding=(0, 1, 1), bias=False)", NCDHW7),
]


@pytest.mark.parametrize("ctor,x", CONVS, ids=[c[0] for c in CONVS])
def test_conv_transpose3d_and_its_gradients_match_torch(ctor, x):
    pytest.importorskip("torch")
    assert_constructed_matches_torch(ctor, x, seed=3, rtol=1e-4, atol=1e-4)


# (torch.nn.functional call on x, input): every max pool that can return indices
INDEXED = [
    ("max_pool1d(x, 3, 2, 1, return_indices=True)", NCL),
    ("max_pool1d_with_indices(x, 4, 3, 2, 1, True)", NCL),
    ("max_pool2d(x, 3, 2, 1, return_indices=True)", NCHW),
    ("max_pool2d(x, (2, 3), (2, 1), (1, 0), (1, 2), return_indices=True)", NCHW),
    ("max_pool2d_with_indices(x, 2)", NCHW),
    ("max_pool3d(x, (2, 3, 2), 2, 1, return_indices=True)", NCDHW),
    ("max_pool3d_with_indices(x, 3, 2, ceil_mode=True)", NCDHW7),
    ("adaptive_max_pool1d(x, 3, return_indices=True)", NCL),
    ("adaptive_max_pool2d(x, (3, 4), True)", NCHW),
    ("adaptive_max_pool2d_with_indices(x, 1)", NCHW),
    ("adaptive_max_pool3d(x, (2, 3, 5), return_indices=True)", NCDHW),
    ("adaptive_max_pool3d_with_indices(x, (1, 1, 1))", NCDHW),
]


@pytest.mark.parametrize("call,x", INDEXED, ids=[c[0] for c in INDEXED])
def test_max_pool_indices_match_torch(call, x):
    """torch's indices (flat in each channel's plane, int64) and values, the values' gradients."""
    torch = pytest.importorskip("torch")
    fn = eval(f"lambda F, x: F.{call}")  # noqa: S307 - the calls listed above
    want, want_indices = fn(TorchNS(torch), torch.from_numpy(x))
    model = gc.capture(lambda x: fn(gc.nn.functional, x), x=gc.spec("float32", ("N", *x.shape[1:])))
    out = run_both(model, {"x": x})
    assert out["output_1"].dtype == np.int64
    np.testing.assert_array_equal(out["output_0"], want.numpy())
    np.testing.assert_array_equal(out["output_1"], want_indices.numpy())
    xt = torch.tensor(x, requires_grad=True)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (fn(TorchNS(torch), xt)[0] * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, x: fn(F, x), {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-6, err_msg=backend)


def test_max_pool_modules_return_indices_in_torch_argument_order():
    """``MaxPool2d(kernel, stride, padding, dilation, return_indices, ceil_mode)`` as torch's."""
    torch = pytest.importorskip("torch")
    for name, x in (("MaxPool1d", NCL), ("MaxPool2d", NCHW), ("MaxPool3d", NCDHW7)):
        layer, want_layer = getattr(nn, name)(3, 2, 1, 1, True, True), getattr(torch.nn, name)(3, 2, 1, 1, True, True)
        got = run_both(gc.capture(layer, x=x), {"x": x})
        for g, w in zip(got.values(), want_layer(torch.from_numpy(x))):
            np.testing.assert_array_equal(g, w.numpy())


# (torch.nn.functional calls on x: a pool with indices, then its unpool, input)
UNPOOLS = [
    ("max_unpool1d(*max_pool1d(x, 3, 2, 1, return_indices=True), 3, 2, 1)", NCL),
    ("max_unpool1d(*max_pool1d(x, 2, return_indices=True), 2, output_size=[2, 3, 9])", NCL),
    ("max_unpool2d(*max_pool2d(x, 2, return_indices=True), 2)", NCHW),
    ("max_unpool2d(*max_pool2d(x, (3, 2), (2, 2), (1, 0), return_indices=True), (3, 2), (2, 2), (1, 0), (6, 9))",
     NCHW),
    ("max_unpool3d(*max_pool3d(x, 2, return_indices=True), 2, output_size=(7, 5, 6))", NCDHW7),
    ("max_unpool3d(*max_pool3d(x, (2, 3, 2), (2, 2, 1), (1, 1, 0), return_indices=True), (2, 3, 2), (2, 2, 1), "
     "(1, 1, 0), (2, 2, 4, 6, 5))", NCDHW),
]


@pytest.mark.parametrize("call,x", UNPOOLS, ids=[u[0] for u in UNPOOLS])
def test_max_unpool_matches_torch(call, x):
    torch = pytest.importorskip("torch")
    fn = eval(f"lambda F, x: F.{call.replace('*max_pool', '*F.max_pool')}")  # noqa: S307 - the calls above
    xt = torch.tensor(x, requires_grad=True)
    want = fn(TorchNS(torch), xt)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    model = gc.capture(lambda x: fn(gc.nn.functional, x), x=gc.spec("float32", ("N", *x.shape[1:])))
    np.testing.assert_array_equal(run_both(model, {"x": x})["output"], want.detach().numpy())
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, x: fn(F, x), {"x": x}, {}, c, backend=backend)
        np.testing.assert_array_equal(got["out"], want.detach().numpy())
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-6, err_msg=backend)


def test_max_unpool_modules_match_torch():
    torch = pytest.importorskip("torch")
    pool, unpool = nn.MaxPool2d(2, return_indices=True), nn.MaxUnpool2d(2)
    model = gc.capture(lambda x: unpool(*pool(x), output_size=[2, 3, 7, 9]), x=NCHW)
    want = torch.nn.MaxUnpool2d(2)(*torch.nn.MaxPool2d(2, return_indices=True)(torch.from_numpy(NCHW)),
                                   output_size=[2, 3, 7, 9])
    np.testing.assert_array_equal(run_both(model, {"x": NCHW})["output"], want.numpy())


# float64 central differences for each new lowering, on ort-cpu too where it has float64 kernels for all
# the forward and backward ops (none for AveragePool, ConvTranspose, nor the Resize of MaxPool's tiled gradient)
LOWERINGS = [
    ("max_pool3d_indices", lambda F, x: F.max_pool3d(x, 2, 1, return_indices=True)[0], NCDHW, True),
    ("adaptive_max_pool2d", lambda F, x: F.adaptive_max_pool2d(x, (2, 4)), NCHW, False),
    ("adaptive_avg_pool3d", lambda F, x: F.adaptive_avg_pool3d(x, (2, 1, 5)), NCDHW, False),
    ("avg_pool3d_ceil", lambda F, x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), NCDHW7,
     False),
    ("max_unpool2d", lambda F, x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2, output_size=(7, 9)),
     NCHW, False),
    ("lp_pool2d", lambda F, x: F.lp_pool2d(x, 2, 3, 2, ceil_mode=True), NCHW, False),
    ("lp_pool1d_p3", lambda F, x: F.lp_pool1d(x, 3, 2), POS["NCL"], False),
    ("lp_pool3d_p1.5", lambda F, x: F.lp_pool3d(x, 1.5, 2, ceil_mode=True), POS["NCDHW7"], False),
    ("avg_pool3d_divisor", lambda F, x: F.avg_pool3d(x, 3, 2, padding=1, divisor_override=4), NCDHW7, True),
    ("avg_pool2d_divisor", lambda F, x: F.avg_pool2d(x, (3, 2), 2, padding=1, divisor_override=5), NCHW, True),
    ("local_response_norm", lambda F, x: F.local_response_norm(x, 2, 0.5, 0.75, 1.0), NCHW, False),
    ("local_response_norm_5d", lambda F, x: F.local_response_norm(x, 3, 0.5), NCDHW, False),
    ("conv_transpose3d", lambda F, x: F.conv_transpose3d(
        x, np.random.default_rng(3).standard_normal((2, 2, 2, 3, 2)), stride=(2, 1, 2), padding=1), NCDHW, False),
]


@pytest.mark.parametrize("name,fn,x,on_ort", LOWERINGS, ids=[c[0] for c in LOWERINGS])
def test_lowering_gradients_match_central_differences(name, fn, x, on_ort):
    assert_grads_match_central_differences(fn, x, backends=("numpy", "ort-cpu") if on_ort else ("numpy",))


@pytest.mark.parametrize("call,message", [
    (lambda x: gc.nn.functional.adaptive_max_pool3d(x, (1, 2)), r"output_size must be an int or 3 sizes"),
    (lambda x: gc.nn.functional.max_pool3d(x[0], 2), r"MaxPool.*expects a rank-5 input \(N, C, D, H, W\), got rank 4"),
    (lambda x: gc.nn.functional.avg_pool3d(x, 2, divisor_override=0), r"avg_pool3d divisor_override must be a "
     "nonzero int, got 0"),
    (lambda x: nn.AvgPool3d(2, divisor_override=1.5)(x), r"divisor_override must be a nonzero int, got 1.5"),
    (lambda x: gc.nn.functional.avg_pool2d(x[0], 2, ceil_mode=True, divisor_override=2), r"avg_pool2d "
     r"divisor_override with ceil_mode=True is not supported"),
    (lambda x: gc.nn.functional.avg_pool3d(x, 3, 2, ceil_mode=True, divisor_override=2), r"avg_pool3d "
     r"divisor_override with ceil_mode=True is not supported"),
    (lambda x: gc.nn.functional.max_unpool3d(*gc.nn.functional.max_pool3d(x, 2, return_indices=True), 2,
                                             output_size=(6, 6, 6)),
     r"max_unpool3d output_size \[6, 6, 6\]: dim 0 must be between 2 and 6 \(exclusive\)"),
    (lambda x: gc.nn.functional.max_unpool3d(*gc.nn.functional.max_pool3d(x, 2, return_indices=True), 2,
                                             output_size=(4, 6)),
     r"max_unpool3d output_size must have 3 or 5 entries, got \[4, 6\]"),
    (lambda x: gc.nn.functional.max_unpool3d(x, gc.cast(x, "int32"), 2), r"indices must be int64 of the input's "
     r"shape"),
    (lambda x: nn.LPPool3d(0, 2)(x), r"lp_pool3d norm_type must be nonzero, got 0"),
    (lambda x: gc.nn.functional.local_response_norm(x[0, 0, 0], 2), r"local_response_norm expects an input of rank 3 "
     "or more"),
    (lambda x: nn.LocalResponseNorm(0)(x), r"local_response_norm size must be a positive int, got 0"),
    (lambda x: nn.ConvTranspose3d(3, 2, 2)(x), r"input has 2 channels, weight expects 3"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=NCDHW)
    assert "test_nn_pooling_torch.py" in str(err.value)


# (torch.nn.functional call on x with an output size of 0, input): torch returns an empty tensor
EMPTY = [
    ("adaptive_avg_pool2d(x, 0)", NCHW),
    ("adaptive_avg_pool2d(x, (None, 0))", NCHW),
    ("adaptive_avg_pool1d(x, 0)", NCL),
    ("adaptive_avg_pool3d(x, (0, 2, 9))", NCDHW),
    ("adaptive_max_pool2d(x, (0, 3), return_indices=True)", NCHW),
    ("adaptive_max_pool1d(x, 0)", NCL),
]


@pytest.mark.parametrize("call,x", EMPTY, ids=[c[0] for c in EMPTY])
def test_adaptive_pool_to_a_size_of_zero_is_empty_as_torch(call, x):
    """torch's shapes and dtypes (forward only: torch's backward refuses an empty output)."""
    torch = pytest.importorskip("torch")
    fn = eval(f"lambda F, x: F.{call}")  # noqa: S307 - the calls listed above
    want = fn(TorchNS(torch), torch.from_numpy(x))
    want = want if isinstance(want, tuple) else (want,)
    got = list(run_both(gc.capture(lambda x: fn(gc.nn.functional, x), x=gc.spec("float32", ("N", *x.shape[1:]))),
                        {"x": x}).values())
    assert [(g.shape, g.dtype) for g in got] == [(tuple(w.shape), w.numpy().dtype) for w in want]
