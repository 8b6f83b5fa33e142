"""gc.fake_quantize_per_tensor_affine / _per_channel_affine against torch 2.13: values bit for bit (ties,
saturation, NaN and infinities, float16/32/64, number and Tensor qparams, int and float per-channel zero
points) on the numpy and ort-cpu backends with a symbolic batch dim; torch's straight-through gradient,
at the clamp boundaries too; a tiny fake-quantized CNN's gradients; and torch's errors for bad arguments."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

SCALE_C = np.array([0.03, 0.25, 0.0071], np.float32)


def _input(dtype: str, seed: int = 0) -> np.ndarray:
    """Normal values, exact ties of scale 0.25, NaN, +-inf, a tiny negative and a huge value."""
    x = np.random.default_rng(seed).standard_normal((16, 3, 8)) * 3
    x[0, :, :] = (np.arange(-4, 4) + 0.5) * 0.25
    x[1, :, :5] = [np.nan, np.inf, -np.inf, -1e-3, 1e30]
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        return x.astype(dtype)


def _run(fn, arrays: list) -> dict:
    """``fn`` captured with arrays[0]'s dim 0 symbolic, checked, run on numpy and ort-cpu."""
    names = [f"x{i}" for i in range(len(arrays))]
    specs = {n: gc.spec(a.dtype.name, (("N",) if i == 0 else a.shape[:1]) + a.shape[1:])
             for i, (n, a) in enumerate(zip(names, arrays))}
    model = gc.capture(lambda **kw: fn(*(kw[n] for n in names)), **specs)
    onnx.checker.check_model(model.proto, full_check=True)
    with np.errstate(all="ignore"):
        return {b: gc.Session(model, backend=b).run(dict(zip(names, arrays)))["output"] for b in ("numpy", "ort-cpu")}


def _assert_same(got: dict, want: np.ndarray) -> None:
    for backend, y in got.items():
        assert y.dtype == want.dtype and y.shape == want.shape, backend
        np.testing.assert_array_equal(y, want, err_msg=backend)  # bit for bit: NaN never comes out
        np.testing.assert_array_equal(np.signbit(y), np.signbit(want), err_msg=f"{backend}: signs")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("scale, zero_point, lo, hi", [(0.0371, 5, -128, 127), (0.25, 0, 0, 255), (0.1, 3, 0, 15),
                                                       (0.5, -2, -8, 7), (1e-3, 0, -32768, 32767)])
def test_per_tensor_is_torchs_bit_for_bit(dtype, scale, zero_point, lo, hi):
    x = _input(dtype)
    want = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), scale, zero_point, lo, hi).numpy()
    _assert_same(_run(lambda t: gc.fake_quantize_per_tensor_affine(t, scale, zero_point, lo, hi), [x]), want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("zp", [np.int32(4), np.float32(5.7), np.float64(-3.5)])
def test_per_tensor_tensor_qparams_truncate_a_float_zero_point(dtype, zp):
    x, s, z = _input(dtype), np.array(0.0371, dtype), np.array(zp)
    want = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), torch.from_numpy(s), torch.from_numpy(z),
                                                 -128, 127).numpy()
    _assert_same(_run(lambda t, s_, z_: gc.fake_quantize_per_tensor_affine(t, s_, z_, -128, 127), [x, s, z]), want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("zp", [np.array([0, 5, -3], np.int32), np.array([0.0, 2.5, -3.3], np.float32)])
@pytest.mark.parametrize("axis", [1, 2])
def test_per_channel_is_torchs_bit_for_bit(dtype, zp, axis):
    x = _input(dtype)
    x = x if axis == 1 else np.ascontiguousarray(x.transpose(0, 2, 1))[:, :3]  # 3 channels along axis 2
    x = np.ascontiguousarray(np.moveaxis(x, 1, axis)) if axis == 2 else x
    want = torch.fake_quantize_per_channel_affine(torch.from_numpy(x), torch.from_numpy(SCALE_C), torch.from_numpy(zp),
                                                  axis, -128, 127).numpy()
    got = _run(lambda t, s, z: gc.fake_quantize_per_channel_affine(t, s, z, axis, -128, 127), [x, SCALE_C, zp])
    _assert_same(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_straight_through_gradient_is_torchs_at_the_boundaries(dtype, per_channel):
    # scale 0.25, zp 2: x = 0.25 * (k + 0.5) are ties, rounded to even, either side of quant_min/quant_max
    k = np.array([-131, -130.5, -130.6, -130.4, -130, 124, 124.5, 125.5, 125.4, 125.6, 0.1, -0.1, 3])
    x = (0.25 * k).astype(dtype).reshape(-1, 1)
    c = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    s, z = np.array([0.25], np.float32), np.array([2], np.int32)
    xt = torch.tensor(x, requires_grad=True)
    if per_channel:
        def fn(M, v):
            return gc.fake_quantize_per_channel_affine(v, s, z, 1, -128, 127)
        y = torch.fake_quantize_per_channel_affine(xt, torch.from_numpy(s), torch.from_numpy(z), 1, -128, 127)
    else:
        def fn(M, v):
            return gc.fake_quantize_per_tensor_affine(v, 0.25, 2, -128, 127)
        y = torch.fake_quantize_per_tensor_affine(xt, 0.25, 2, -128, 127)
    (y * torch.from_numpy(c)).sum().backward()
    assert 0 < (xt.grad.numpy() == 0).sum() < x.size  # the boundary cases go both ways
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, {"v": x}, {}, c, backend=backend)
        np.testing.assert_array_equal(got["out"], y.detach().numpy(), err_msg=backend)
        np.testing.assert_array_equal(got["v"], xt.grad.numpy(), err_msg=backend)


def test_fake_quantized_cnn_gradients_match_torch():
    """Conv weights fake-quantized per output channel, activations per tensor (uint8), as QAT does."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((4, 2, 3, 3)) * 0.3).astype(np.float32)
    fc = (rng.standard_normal((3, 4 * 6 * 6)) * 0.1).astype(np.float32)
    x = rng.standard_normal((5, 2, 8, 8)).astype(np.float32)
    c = rng.standard_normal((5, 3)).astype(np.float32)
    ws = np.abs(w).reshape(4, -1).max(1).astype(np.float32) / 127
    zw = np.zeros(4, np.int32)

    def net(M, w, fc, x):
        h = M.conv2d(x, M.fake_quantize_per_channel_affine(w, ws, zw, 0, -128, 127))
        h = M.fake_quantize_per_tensor_affine(M.relu(h), 0.02, 0, 0, 255)
        return M.linear(M.flatten(h, 1), fc)

    import torch.nn.functional as F

    class T:  # torch under the names the net reads
        conv2d, relu, linear, flatten = F.conv2d, F.relu, F.linear, torch.flatten

        @staticmethod
        def fake_quantize_per_channel_affine(t, s, z, *a):
            return torch.fake_quantize_per_channel_affine(t, torch.from_numpy(s), torch.from_numpy(z), *a)

        fake_quantize_per_tensor_affine = staticmethod(torch.fake_quantize_per_tensor_affine)

    class G:
        conv2d, relu, linear = gc.nn.functional.conv2d, gc.nn.functional.relu, gc.nn.functional.linear
        flatten = staticmethod(gc.flatten)
        fake_quantize_per_channel_affine = staticmethod(gc.fake_quantize_per_channel_affine)
        fake_quantize_per_tensor_affine = staticmethod(gc.fake_quantize_per_tensor_affine)

    wt, fct = torch.tensor(w, requires_grad=True), torch.tensor(fc, requires_grad=True)
    out = net(T, wt, fct, torch.from_numpy(x))
    (out * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda M, w_, fc_, x: net(G, w_, fc_, x), {"w": w, "fc": fc}, {"x": x}, c, backend=backend)
        np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-5, atol=1e-5, err_msg=backend)
        np.testing.assert_allclose(got["w"], wt.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=backend)
        np.testing.assert_allclose(got["fc"], fct.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=backend)


@pytest.mark.parametrize("call, match", [
    (lambda t: gc.fake_quantize_per_tensor_affine(t, 0.1, 0, 5, 2), "quant_min.*less than or equal.*quant_max"),
    (lambda t: gc.fake_quantize_per_tensor_affine(t, 0.1, 300, -128, 127), "zero_point.*between.*got 300"),
    (lambda t: gc.fake_quantize_per_tensor_affine(t, 0.1, 0.5, -128, 127), "zero_point must be an int"),
    (lambda t: gc.fake_quantize_per_tensor_affine(t, 0.1, 0, -128.0, 127), "quant_min must be an int"),
    (lambda t: gc.fake_quantize_per_tensor_affine(gc.cast(t, "int32"), 0.1, 0, -128, 127), "float Tensor, got int32"),
    (lambda t: gc.fake_quantize_per_channel_affine(t, SCALE_C, np.zeros(3, np.int32), 3, -128, 127), "axis"),
    (lambda t: gc.fake_quantize_per_channel_affine(t, SCALE_C, np.zeros(3, np.int32), -1, -128, 127), "axis"),
    (lambda t: gc.fake_quantize_per_channel_affine(t, SCALE_C[:2], np.zeros(2, np.int32), 1, -128, 127),
     r"scale must be 1-D of input.size\(1\) = 3"),
    (lambda t: gc.fake_quantize_per_channel_affine(t, gc.cast(t[0, :, 0], "float64"), np.zeros(3, np.int32), 1, 0, 9),
     "Scale must be Float or BFloat16, found float64"),
    (lambda t: gc.fake_quantize_per_channel_affine(t, SCALE_C, np.zeros(3, np.int64), 1, 0, 9),
     "Zero-point must be Int32, Float or Half, found int64"),
])
def test_bad_arguments_raise_torchs_errors(call, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(call, t=gc.spec("float32", ("N", 3, 4)))


@pytest.mark.parametrize("opset", [17, 21])
def test_int8_and_uint8_ranges_lower_to_quantize_dequantize_linear(opset):
    def ops(lo, hi, zero_point=0, dtype="float32"):
        model = gc.capture(lambda t: gc.fake_quantize_per_tensor_affine(t, 0.1, zero_point, lo, hi), opset=opset,
                           t=gc.spec(dtype, ("N", 4)))
        onnx.checker.check_model(model.proto, full_check=True)
        return {n.op_type for n in model.proto.graph.node}

    assert {"QuantizeLinear", "DequantizeLinear"} <= ops(-128, 127) and "QuantizeLinear" in ops(0, 255, 3)
    assert "QuantizeLinear" not in ops(0, 15) | ops(-128, 127, dtype="float64")  # arithmetic: no integer type
