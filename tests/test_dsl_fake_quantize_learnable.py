"""gc.fake_quantize_learnable_per_tensor_affine / _per_channel_affine against torch 2.13's
torch._fake_quantize_learnable_*: values and the input's gradient bit for bit, the scale's and zero point's
gradients to float32 summation error, on the numpy and ort-cpu backends (a symbolic batch dim too); zero
points that round differently forward (half to even) and back (+0.5, truncated), clamped ones, ties of the
scale at the range's ends, NaN and infinities; float64 inputs; and errors for bad arguments."""

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


def _input(dtype: str, scale: float, seed: int = 0) -> np.ndarray:
    """Normal values over the range and past it, ties of ``scale`` around both ends, NaN and +-inf."""
    x = np.random.default_rng(seed).standard_normal((6, 3, 10)) * 8 * scale
    x[0, :, :] = (np.array([-10, -9, -8, -7, -6, 5, 6, 7, 8, 9]) + 0.5) * scale
    x[1, 0, :3] = [np.nan, np.inf, -np.inf]
    return x.astype(dtype)


def _torch(fn, x, s, z, c):
    """torch's output and gradients of ``sum(out * c)``; float64 gradients from torch's float32 kernel."""
    xt, st, zt = (torch.tensor(a, requires_grad=True) for a in (x.astype(np.float32), s, z))
    out = fn(xt, st, zt)
    (out * torch.from_numpy(c.astype(np.float32))).sum().backward()
    return fn(torch.from_numpy(x), st, zt).detach().numpy(), xt.grad.numpy(), st.grad.numpy(), zt.grad.numpy()


def _check(fn_torch, fn_gc, x, s, z, exact_dx=True):
    c = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)
    c[1, 0, :3] = 1.0  # the NaN/inf elements' gradients are finite: they must come out finite
    want, dx, ds, dz = _torch(fn_torch, x, s, z, c)
    finite = np.isfinite(x)
    for backend in ("numpy", "ort-cpu"):
        with np.errstate(all="ignore"):
            got = gc_grads(lambda M, x_, s_, z_: fn_gc(x_, s_, z_), {"x": x, "s": s, "z": z}, {}, c, backend=backend)
        np.testing.assert_array_equal(got["out"], want, err_msg=backend)
        assert got["x"].dtype == x.dtype and got["s"].shape == s.shape and got["z"].shape == z.shape
        if exact_dx:
            np.testing.assert_array_equal(got["x"], dx, err_msg=backend)
        else:  # float64: the float32 kernel's mask, the values of c
            np.testing.assert_array_equal(got["x"][finite], c[finite] * (dx[finite] != 0), err_msg=backend)
        # float32 sums in another order: the error bound of the summed magnitudes
        for name, g, bound in (("s", ds, np.abs(c).sum() * 20), ("z", dz, np.abs(c).sum() * np.abs(s).max() * 2)):
            np.testing.assert_allclose(got[name], g, rtol=0, atol=bound * 1e-6, err_msg=f"{backend}: {name}")
            assert np.abs(g).max() > 1e-2, "the case must give the parameter a gradient"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("scale, zero_point, lo, hi, gf", [
    (0.25, 2.5, -8, 7, 1.0),      # zp 2 forward, 3 back: the gradient's mask is not the forward's
    (0.0371, -1.3, -128, 127, 0.5), (0.1, 300.0, 0, 255, 0.25),  # zp clamped to 255
    (0.5, 0.0, 0, 15, 1 / np.sqrt(180 * 15)), (0.25, -3.5, -8, 7, 2.0)])  # -3.5: -4 forward, -3 back (truncated)
def test_per_tensor_matches_torch(dtype, scale, zero_point, lo, hi, gf):
    x, s, z = _input(dtype, scale), np.array([scale], np.float32), np.array([zero_point], np.float32)
    _check(lambda a, b, c: torch._fake_quantize_learnable_per_tensor_affine(a, b, c, lo, hi, gf),
           lambda a, b, c: gc.fake_quantize_learnable_per_tensor_affine(a, b, c, lo, hi, gf), x, s, z,
           exact_dx=dtype == "float32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_per_channel_matches_torch(dtype, axis):
    n = (6, 3, 10)[axis]
    rng = np.random.default_rng(axis)
    s = rng.uniform(0.05, 0.4, n).astype(np.float32)
    z = np.resize(np.array([2.5, -1.5, 0.4, 9.0, -3.2], np.float32), n)  # ties to even; 9 clamped to 7
    x = _input(dtype, 0.25)
    _check(lambda a, b, c: torch._fake_quantize_learnable_per_channel_affine(a, b, c, axis, -8, 7, 0.7),
           lambda a, b, c: gc.fake_quantize_learnable_per_channel_affine(a, b, c, axis, -8, 7, 0.7), x, s, z,
           exact_dx=dtype == "float32")


def _qparams(per_channel: bool) -> tuple:
    return (np.array([0.1, 0.2, 0.05] if per_channel else [0.1], np.float32),
            np.array([1.0, -2.0, 0.0] if per_channel else [1.4], np.float32))


class _Learned(gc.nn.Module):
    def __init__(self, per_channel: bool):
        super().__init__()
        self.per_channel = per_channel
        s, z = _qparams(per_channel)
        self.scale, self.zero_point = gc.nn.Parameter(s), gc.nn.Parameter(z)

    def forward(self, x, c):
        if self.per_channel:
            y = gc.fake_quantize_learnable_per_channel_affine(x, self.scale, self.zero_point, 1, -128, 127, 0.1)
        else:
            y = gc.fake_quantize_learnable_per_tensor_affine(x, self.scale, self.zero_point, -128, 127, 0.1)
        return {"loss": gc.sum(y * c)}


@pytest.mark.parametrize("per_channel", [False, True])
def test_symbolic_batch_dim_gradients(per_channel):
    model = gc.capture(_Learned(per_channel), x=gc.spec("float32", ("N", 3, 4)), c=gc.spec("float32", ("N", 3, 4)))
    grads = gc.grad(model, "loss")
    onnx.checker.check_model(grads.proto, full_check=True)
    s, z = (torch.tensor(p, requires_grad=True) for p in _qparams(per_channel))
    for n in (2, 7):
        rng = np.random.default_rng(n)
        x, c = (rng.standard_normal((n, 3, 4)) * 10).astype(np.float32), rng.standard_normal((n, 3, 4)).astype(np.float32)
        s.grad = z.grad = None
        if per_channel:
            y = torch._fake_quantize_learnable_per_channel_affine(torch.from_numpy(x), s, z, 1, -128, 127, 0.1)
        else:
            y = torch._fake_quantize_learnable_per_tensor_affine(torch.from_numpy(x), s, z, -128, 127, 0.1)
        (y * torch.from_numpy(c)).sum().backward()
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(grads, backend=backend).run({"x": x, "c": c})
            np.testing.assert_allclose(got["scale_grad"], s.grad.numpy(), rtol=1e-5, atol=1e-5, err_msg=backend)
            np.testing.assert_allclose(got["zero_point_grad"], z.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=backend)


S1, Z1 = np.array([0.1], np.float32), np.array([0.0], np.float32)


@pytest.mark.parametrize("call, match", [
    (lambda t: gc.fake_quantize_learnable_per_tensor_affine(t, S1, Z1, 1, 7), r"range should include 0, got \[1, 7\]"),
    (lambda t: gc.fake_quantize_learnable_per_tensor_affine(t, S1, Z1, 5, -2), "quant_min.*less than or equal"),
    (lambda t: gc.fake_quantize_learnable_per_tensor_affine(t, S1, np.array([0], np.int32), -8, 7),
     "zero_point must be a float Tensor, got int32"),
    (lambda t: gc.fake_quantize_learnable_per_tensor_affine(t, np.array([0.1, 0.2], np.float32), Z1, -8, 7),
     r"scale must have one element, got shape \[2\]"),
    (lambda t: gc.fake_quantize_learnable_per_tensor_affine(t, S1, Z1, -8, 7, "1"), "grad_factor must be a number"),
    (lambda t: gc.fake_quantize_learnable_per_channel_affine(t, np.ones(3, np.float32), np.zeros(3, np.float32), 3,
                                                             -8, 7), "axis"),
    (lambda t: gc.fake_quantize_learnable_per_channel_affine(t, np.ones(2, np.float32), np.zeros(2, np.float32), 1,
                                                             -8, 7), r"scale must be 1-D of input.size\(1\) = 3"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(call, t=gc.spec("float32", ("N", 3, 4)))
