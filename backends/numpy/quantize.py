"""Quantization kernels for 4/8/16-bit integer types: QuantizeLinear, DequantizeLinear (per
tensor, per axis and blocked), DynamicQuantizeLinear, MatMulInteger. int4/uint4 values are
ml_dtypes arrays (onnx packs them two to a byte in files); float8 variants are out of scope
(see the conformance exclusions)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from graphc.backends.numpy.kernels import kernel, require_shape


def _broadcast_param(p, x, axis, block_size, what):
    """A scale or zero point (``what``) shaped to broadcast against ``x``; refused where its shape
    is not the spec's: per axis [x's dim on ``axis``], blocked x's shape but ceil(dim / block_size)
    on ``axis`` (one value: per tensor)."""
    if p.ndim == 0 or p.size == 1 and not block_size:
        return p.reshape(())
    axis = axis % x.ndim
    dim = x.shape[axis]
    if block_size:
        blocks = list(x.shape)
        blocks[axis] = -(-dim // block_size)
        require_shape(p, blocks, what, f"blocked: x's shape with ceil({dim} / block_size {block_size}) = "
                                       f"{blocks[axis]} on axis {axis}")
        p = np.repeat(p, block_size, axis=axis)
        return np.take(p, range(dim), axis=axis)
    require_shape(p, (dim,), what, f"per axis: one value per index of x's axis {axis}, {dim} long")
    shape = [1] * x.ndim
    shape[axis] = dim
    return p.reshape(shape)


@kernel("DequantizeLinear", since=10)
def dequantize_linear(x, scale, zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    s = _broadcast_param(scale, x, axis, block_size, "x_scale")
    xi = x.astype(np.float32) if scale.dtype.itemsize < 4 else x.astype(scale.dtype)
    if zero_point is not None:
        xi = xi - _broadcast_param(zero_point, x, axis, block_size, "x_zero_point").astype(xi.dtype)
    out = xi * s
    dtype = tensor_dtype_to_np_dtype(output_dtype) if output_dtype else scale.dtype
    return (out.astype(dtype),)


@kernel("QuantizeLinear", since=10)
def quantize_linear(x, scale, zero_point=None, *, axis=1, block_size=0, output_dtype=0, saturate=1,
                    precision=0):
    if zero_point is not None:
        dtype = zero_point.dtype
    else:
        dtype = np.dtype(tensor_dtype_to_np_dtype(output_dtype)) if output_dtype else np.dtype(np.uint8)
    s = _broadcast_param(scale, x, axis, block_size, "y_scale").astype(np.float32)
    q = np.rint(x.astype(np.float32) / s)  # round half to even
    if zero_point is not None:
        q = q + _broadcast_param(zero_point, x, axis, block_size, "y_zero_point").astype(np.float32)
    info = ml_dtypes.iinfo(dtype)  # numpy's iinfo knows no int4/uint4
    # NaN saturates to the type's least value, as onnxruntime's CPU kernel (the spec leaves it open);
    # numpy's cast of NaN to an integer is undefined
    return (np.where(np.isnan(q), info.min, np.clip(q, info.min, info.max)).astype(dtype),)


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    lo, hi = float(x.min(initial=0.0)), float(x.max(initial=0.0))  # the range always holds 0; empty x: 0 and 0
    scale = np.float32((hi - lo) / 255)
    zero_point = np.uint8(np.clip(np.rint(-lo / scale), 0, 255)) if scale else np.uint8(0)
    y = np.clip(np.rint(x / scale) + zero_point, 0, 255).astype(np.uint8) if scale else np.zeros(x.shape, np.uint8)
    return y, np.array(scale, np.float32), np.array(zero_point, np.uint8)


@kernel("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    ai = a.astype(np.int32) - (a_zero_point.astype(np.int32) if a_zero_point is not None else 0)
    bz = b_zero_point.astype(np.int32) if b_zero_point is not None else 0
    if np.ndim(bz) == 1:
        bz = bz.reshape(1, -1)
    return (np.matmul(ai, b.astype(np.int32) - bz).astype(np.int32),)


def _requantize(real, y_scale, y_zero_point):
    q = np.rint(real / y_scale.astype(np.float64)) + y_zero_point.astype(np.float64)
    info = np.iinfo(y_zero_point.dtype)
    return np.clip(q, info.min, info.max).astype(y_zero_point.dtype)


def _real(x, scale, zero_point, axis=None):
    zp, s = zero_point.astype(np.float64), scale.astype(np.float64)
    if axis is not None and s.ndim == 1 and s.size > 1:
        shape = [1] * x.ndim
        shape[axis] = s.size
        zp, s = zp.reshape(shape), s.reshape(shape)
    return (x.astype(np.float64) - zp) * s


@kernel("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    real = np.matmul(_real(a, a_scale, a_zero_point, axis=-2), _real(b, b_scale, b_zero_point, axis=-1))
    return (_requantize(real, y_scale, y_zero_point),)


def _float_conv(x, w, **attrs):
    from graphc.backends.numpy.conv import conv

    return conv(x, w, **attrs)[0]


@kernel("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None,
                 group=1, kernel_shape=None, pads=None, strides=None):
    xf = x.astype(np.float64) - (x_zero_point.astype(np.float64) if x_zero_point is not None else 0)
    wz = w_zero_point.astype(np.float64) if w_zero_point is not None else np.zeros(1)
    wf = w.astype(np.float64) - (wz.reshape(-1, *([1] * (w.ndim - 1))) if wz.size > 1 else wz.ravel()[0])
    y = _float_conv(xf, wf, auto_pad=auto_pad, dilations=dilations, group=group,
                    kernel_shape=kernel_shape, pads=pads, strides=strides)
    return (np.rint(y).astype(np.int32),)


@kernel("QLinearConv", since=10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    m = w.shape[0] if w.ndim else 0
    for name, value in (("w_scale", w_scale), ("w_zero_point", w_zero_point)):
        if value.ndim > 1 or value.size not in (1, m):
            raise ValueError(f"{name} has shape {list(value.shape)}, expected one value or one per output channel "
                             f"[M] = [{m}] (W has shape {list(w.shape)})")
    xf = _real(x, x_scale, x_zero_point)
    wf = _real(w, w_scale, w_zero_point, axis=0)
    y = _float_conv(xf, wf, auto_pad=auto_pad, dilations=dilations, group=group,
                    kernel_shape=kernel_shape, pads=pads, strides=strides)
    require_shape(b, (w.shape[0],), "bias B", f"one value per output channel, M = {w.shape[0]}")
    if b is not None:  # int32 bias in units of x_scale * w_scale
        scale = (x_scale.astype(np.float64) * w_scale.astype(np.float64)).reshape(-1)
        y = y + (b.astype(np.float64) * scale).reshape(1, -1, *([1] * (y.ndim - 2)))
    return (_requantize(y, y_scale, y_zero_point),)
