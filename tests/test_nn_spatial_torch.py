"""``PixelUnshuffle``, ``ChannelShuffle``, ``Unflatten``, ``UpsamplingNearest2d``,
``UpsamplingBilinear2d``, ``Softmax2d``, ``F.affine_grid`` and ``F.grid_sample`` against torch:
outputs and ``gc.grad`` gradients on the numpy and ort-cpu backends, the captured models through
the full ONNX checker; float64 gradients against central differences; torch's refusals as clear
errors."""

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

R = np.random.default_rng(48)
NCL = R.standard_normal((2, 6, 5)).astype(np.float32)
NCHW = R.standard_normal((2, 4, 6, 8)).astype(np.float32)
CHW = R.standard_normal((3, 6, 9)).astype(np.float32)
NCDHW = R.standard_normal((2, 2, 3, 4, 6)).astype(np.float32)

# (gc module and torch.nn constructor, input, dim 0 symbolic)
MODULES = [
    ("PixelUnshuffle(2)", NCHW, True), ("PixelUnshuffle(3)", CHW, False), ("PixelUnshuffle(2)", NCDHW, True),
    ("ChannelShuffle(2)", NCHW, True), ("ChannelShuffle(3)", NCL, True), ("ChannelShuffle(2)", NCDHW, True),
    ("Unflatten(1, (3, 2))", NCL, True), ("Unflatten(-1, (2, -1, 2))", NCHW, True),
    ("UpsamplingNearest2d(scale_factor=2)", NCHW, True), ("UpsamplingNearest2d(size=(9, 10))", NCHW, True),
    ("UpsamplingBilinear2d(scale_factor=2)", NCHW, True), ("UpsamplingBilinear2d(size=(7, 11))", NCHW, True),
    ("Softmax2d()", NCHW, True), ("Softmax2d()", CHW, False),
]


@pytest.mark.parametrize("ctor,x,batched", MODULES, ids=[f"{m[0]}-{m[1].ndim}d" for m in MODULES])
def test_shape_layers_and_their_gradients_match_torch(ctor, x, batched):
    pytest.importorskip("torch")
    assert_constructed_matches_torch(ctor, x, batched=batched)


def test_functional_forms_match_torch():
    torch = pytest.importorskip("torch")
    calls = [lambda F, x: F.pixel_unshuffle(x, 2), lambda F, x: F.channel_shuffle(x, 4),
             lambda F, x: F.upsample_nearest(x, scale_factor=3), lambda F, x: F.upsample_bilinear(x, (5, 9)),
             lambda F, x: F.upsample(x, size=(3, 4), mode="bicubic", align_corners=False)]
    model = gc.capture(lambda x: tuple(call(gc.nn.functional, x) for call in calls), x=NCHW)
    for got, call in zip(run_both(model, {"x": NCHW}).values(), calls):
        np.testing.assert_allclose(got, call(TorchNS(torch), torch.from_numpy(NCHW)).numpy(), rtol=1e-5, atol=1e-5)


def _grid(shape, seed):
    return np.random.default_rng(seed).uniform(-1.2, 1.2, shape).astype(np.float32)  # some points outside


IMAGE, GRID = R.standard_normal((2, 3, 5, 7)).astype(np.float32), _grid((2, 4, 6, 2), 1)
VOLUME, GRID3 = R.standard_normal((2, 2, 4, 5, 6)).astype(np.float32), _grid((2, 3, 2, 4, 3), 2)
SAMPLES = [(mode, padding, align, IMAGE, GRID) for mode in ("bilinear", "nearest", "bicubic")
           for padding in ("zeros", "border", "reflection") for align in (False, True)]
SAMPLES += [(mode, padding, align, VOLUME, GRID3) for mode in ("bilinear", "nearest")
            for padding in ("zeros", "border", "reflection") for align in (False, True)]


@pytest.mark.parametrize("mode,padding,align,x,grid", SAMPLES,
                         ids=[f"{s[0]}-{s[1]}-{s[2]}-{s[3].ndim}d" for s in SAMPLES])
def test_grid_sample_and_its_gradients_match_torch(mode, padding, align, x, grid):
    torch = pytest.importorskip("torch")

    def fn(F, x, grid):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align)

    xt, gt = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    want = fn(TorchNS(torch), xt, gt)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, {"x": x, "grid": grid}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{backend} x")
        np.testing.assert_allclose(got["grid"], gt.grad.numpy(), rtol=1e-3, atol=1e-3, err_msg=f"{backend} grid")
    model = gc.capture(lambda x, grid: fn(gc.nn.functional, x, grid), x=gc.spec("float32", ("N", *x.shape[1:])),
                       grid=gc.spec("float32", ("N", *grid.shape[1:])))
    np.testing.assert_allclose(run_both(model, {"x": x, "grid": grid})["output"], want.detach().numpy(), rtol=1e-4,
                               atol=1e-5)


THETA2 = (np.eye(2, 3) + 0.3 * R.standard_normal((2, 2, 3))).astype(np.float32)
THETA3 = (np.eye(3, 4) + 0.3 * R.standard_normal((2, 3, 4))).astype(np.float32)
GRIDS = [(THETA2, [2, 3, 5, 7], False), (THETA2, [2, 1, 4, 1], True), (THETA3, [2, 2, 4, 5, 6], False),
         (THETA3, [2, 1, 3, 1, 2], True)]


@pytest.mark.parametrize("theta,size,align", GRIDS, ids=[f"{g[1]}-{g[2]}" for g in GRIDS])
def test_affine_grid_and_a_spatial_transformer_match_torch(theta, size, align):
    """The grid, and ``grid_sample(x, affine_grid(theta))`` with its gradients wrt ``theta`` and ``x``."""
    torch = pytest.importorskip("torch")
    x = R.standard_normal(size).astype(np.float32)

    def fn(F, theta, x):
        grid = F.affine_grid(theta, size, align_corners=align)
        return grid, F.grid_sample(x, grid, align_corners=align)

    tt, xt = torch.tensor(theta, requires_grad=True), torch.tensor(x, requires_grad=True)
    want_grid, want = fn(TorchNS(torch), tt, xt)
    model = gc.capture(lambda theta: fn(gc.nn.functional, theta, x)[0], theta=theta)
    np.testing.assert_allclose(run_both(model, {"theta": theta})["output"], want_grid.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, theta, x: fn(F, theta, x)[1], {"theta": theta, "x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=backend)
        np.testing.assert_allclose(got["theta"], tt.grad.numpy(), rtol=1e-3, atol=1e-3, err_msg=f"{backend} theta")
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{backend} x")


# float64 central differences for each new lowering (onnxruntime has no float64 GridSample)
LOWERINGS = [
    ("pixel_unshuffle", lambda F, x: F.pixel_unshuffle(x, 2), NCHW, True),
    ("channel_shuffle", lambda F, x: F.channel_shuffle(x, 2), NCDHW, True),
    ("affine_grid", lambda F, theta: F.affine_grid(theta, [2, 1, 3, 4]), THETA2, True),
    ("affine_grid_3d", lambda F, theta: F.affine_grid(theta, [2, 1, 2, 3, 4], align_corners=True), THETA3, True),
    ("grid_sample_x", lambda F, x: F.grid_sample(x, GRID.astype(np.float64), padding_mode="border"), IMAGE, False),
    ("grid_sample_grid", lambda F, grid: F.grid_sample(gc.cast(IMAGE, "float64"), grid, mode="bicubic"), GRID, False),
    ("grid_sample_3d_grid", lambda F, grid: F.grid_sample(gc.cast(VOLUME, "float64"), grid,
                                                                   padding_mode="reflection"),
     GRID3, False),
]


@pytest.mark.parametrize("name,fn,x,on_ort", LOWERINGS, ids=[c[0] for c in LOWERINGS])
def test_lowering_gradients_match_central_differences(name, fn, x, on_ort):
    assert_grads_match_central_differences(fn, x, backends=("numpy", "ort-cpu") if on_ort else ("numpy",))


F = gc.nn.functional


@pytest.mark.parametrize("call,message", [
    (lambda x: nn.PixelUnshuffle(4)(x), r"pixel_unshuffle expects the height \(6\) to divide by downscale_factor=4"),
    (lambda x: F.pixel_unshuffle(x, 0), r"pixel_unshuffle downscale_factor must be a positive int, got 0"),
    (lambda x: F.pixel_unshuffle(x[0, 0], 2), r"pixel_unshuffle expects an input of rank 3 or more"),
    (lambda x: nn.ChannelShuffle(3)(x), r"channel_shuffle: 4 channels do not divide into groups=3"),
    (lambda x: nn.Softmax2d()(x[0, 0]), r"Softmax2d.*expects a \(C, H, W\) or \(N, C, H, W\) input, got rank 2"),
    (lambda x: F.affine_grid(gc.zeros(2, 3, 3), [2, 1, 4, 4]), r"affine_grid expects theta of shape \[2, 2, 3\] for "
     r"size \[2, 1, 4, 4\]"),
    (lambda x: F.affine_grid(gc.zeros(2, 2, 3), [2, 4, 4]), r"affine_grid size must be \[N, C, H, W\] or"),
    (lambda x: F.grid_sample(x, gc.zeros(2, 3, 3, 2), mode="area"), r"grid_sample mode='area'; expected one of"),
    (lambda x: F.grid_sample(x, gc.zeros(2, 3, 3, 2), padding_mode="wrap"), r"grid_sample padding_mode='wrap'"),
    (lambda x: F.grid_sample(x, gc.zeros(2, 3, 3, 3)), r"grid_sample expects a grid of rank 4 ending in 2"),
    (lambda x: F.grid_sample(F.unsqueeze(x, 2), gc.zeros(2, 1, 3, 3, 3), mode="bicubic"),
     r"5-D grid_sample needs opset 20 or later and mode 'bilinear' or 'nearest' \(got opset 21, mode 'bicubic'\)"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=NCHW)
    assert "test_nn_spatial_torch.py" in str(err.value)


def test_volumetric_grid_sample_needs_opset_20():
    with pytest.raises(gc.GraphError, match=r"5-D grid_sample needs opset 20 or later .*got opset 19"):
        gc.capture(lambda x, grid: F.grid_sample(x, grid), x=VOLUME, grid=GRID3, opset=19)
    model = gc.capture(lambda x, grid: F.grid_sample(x, grid, mode="bicubic"), x=IMAGE, grid=GRID, opset=17)
    assert [n.attributes["mode"].value for n in model.ir.graph if n.op_type == "GridSample"] == ["bicubic"]
    np.testing.assert_allclose(run_both(model, {"x": IMAGE, "grid": GRID})["output"],
                               run_both(gc.capture(lambda x, grid: F.grid_sample(x, grid, mode="bicubic"), x=IMAGE,
                                                   grid=GRID), {"x": IMAGE, "grid": GRID})["output"], rtol=1e-6)
