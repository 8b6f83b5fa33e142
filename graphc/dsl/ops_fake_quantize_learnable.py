"""torch's learnable fake quantization (LSQ/LSQ+), ``gc.fake_quantize_learnable_per_tensor_affine`` and
``gc.fake_quantize_learnable_per_channel_affine`` after torch's private
``torch._fake_quantize_learnable_per_{tensor,channel}_affine``: the value of the non-learnable ops with the
zero point rounded and clamped, and the gradients of torch's CPU kernels for ``input``, ``scale`` and
``zero_point``. Per element, with ``q = round(zero_point + x / scale)`` (unclamped) and ``xfq`` the fake
quantized value: in range ``dx = dy``, ``dscale = dy * (xfq - x) / scale * grad_factor``, ``dzero_point = 0``;
below (above) ``dx = 0``, ``dscale = dy * (quant_min - zero_point) * grad_factor`` (``quant_max``),
``dzero_point = -dy * scale * grad_factor``; ``scale``/``zero_point`` sum them over their broadcast."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import cast, clip, detach, lift, reshape, scalar, unary, where
from graphc.dsl.ops_fake_quantize import (
    check_range,
    fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine,
    float_compute,
    quantize_clamped,
)
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES


def _check(op: str, x: Tensor, s: Tensor, z: Tensor, quant_min: Any, quant_max: Any, grad_factor: Any) -> None:
    check_range(op, x, quant_min, quant_max)
    if not quant_min <= 0 <= quant_max:  # torch's backward checks it; here at the call
        raise op_error(op, [x], f"the quantization range should include 0, got [{quant_min}, {quant_max}]",
                       user_source())
    for name, t in (("scale", s), ("zero_point", z)):
        if t.dtype not in FLOAT_DTYPES:
            raise op_error(op, [x, t], f"{name} must be a float Tensor, got {t.dtype}", user_source())
    if not isinstance(grad_factor, (int, float, np.integer, np.floating)) or isinstance(grad_factor, bool):
        raise op_error(op, [x], f"grad_factor must be a number, got {type(grad_factor).__name__} {grad_factor!r}",
                       user_source())


def _learnable(x: Tensor, xc: Tensor, value: Tensor, s: Tensor, z: Tensor, sc: Tensor, zp: Tensor,
               quant_min: int, quant_max: int, grad_factor: float) -> Tensor:
    """``value`` forward; back, torch's gradient kernel: ``sc``/``zp`` are the float32 scale and the
    backward's zero point shaped to broadcast against ``x``, ``s``/``z`` the arguments they came from
    (without a gradient path). Each gradient is ``(t - detach(t)) * detach(g)``, zero forward."""
    dt = xc.dtype
    scale, zero = cast(sc, dt), cast(zp, dt)
    inv = cast(unary("Reciprocal", sc), dt)
    q, mask = quantize_clamped(xc, inv, zero, quant_min, quant_max, True, zp_in_round=True)
    gf = scalar(float(np.float32(grad_factor)), xc)  # torch's kernels take a float
    below = ~mask & (q == scalar(quant_min, q))  # q: NaN and past 2**63 are quant_min, as torch's int64 cast
    outside = where(below, scalar(quant_min, xc), scalar(quant_max, xc)) - zero
    d_scale = where(mask, ((q - zero) * scale - xc) * inv, outside) * gf  # in range: (xfq - x) / scale
    d_zero = where(mask, scalar(0.0, xc), -scale * gf)
    live_s, live_z = cast(s, dt), cast(z, dt)
    grads = ((live_s - detach(live_s)) * detach(d_scale) + (live_z - detach(live_z)) * detach(d_zero)
             + where(mask, xc - detach(xc), scalar(0.0, xc)))
    return detach(value) + (grads if grads.dtype == x.dtype else cast(grads, x.dtype))


def fake_quantize_learnable_per_tensor_affine(input: Any, scale: Any, zero_point: Any,  # noqa: A002
                                              quant_min: int, quant_max: int, grad_factor: float = 1.0) -> Tensor:
    """``torch._fake_quantize_learnable_per_tensor_affine``: ``fake_quantize_per_tensor_affine`` with the
    zero point ``clamp(round_half_even(zero_point))``; gradients to ``input``, ``scale`` and ``zero_point``
    (one-element float Tensors) as torch's kernel, whose zero point is ``int(clamp(zero_point + 0.5))``.
    ``quant_min <= 0 <= quant_max``. Signature: ai.onnx@21::Round"""
    op = "fake_quantize_learnable_per_tensor_affine"
    x, s, z = lift(input), lift(scale), lift(zero_point)
    _check(op, x, s, z, quant_min, quant_max, grad_factor)
    for name, t in (("scale", s), ("zero_point", z)):
        if all(isinstance(d, int) for d in t.shape) and int(np.prod(t.shape)) != 1:
            raise op_error(op, [x, t], f"{name} must have one element, got shape {list(t.shape)}", user_source())
    sc, z32 = cast(reshape(s, []), "float32"), cast(reshape(z, []), "float32")
    zp_fwd = clip(unary("Round", detach(z32)), float(quant_min), float(quant_max))
    value = fake_quantize_per_tensor_affine(detach(x), detach(sc), zp_fwd, quant_min, quant_max)
    zp_bwd = cast(cast(clip(detach(z32) + scalar(0.5, z32), float(quant_min), float(quant_max)), "int64"), "float32")
    return _learnable(x, float_compute(x), value, reshape(s, []), reshape(z, []), detach(sc), zp_bwd,
                      quant_min, quant_max, grad_factor)


def fake_quantize_learnable_per_channel_affine(input: Any, scale: Any, zero_point: Any, axis: int,  # noqa: A002
                                               quant_min: int, quant_max: int, grad_factor: float = 1.0) -> Tensor:
    """``torch._fake_quantize_learnable_per_channel_affine``: ``fake_quantize_per_channel_affine`` with the
    int32 zero points ``clamp(round_half_even(zero_point))``; gradients to ``input``, ``scale`` (float32)
    and ``zero_point`` (float) as torch's kernel, summed over all but ``axis``. ``quant_min <= 0 <= quant_max``.
    Signature: ai.onnx@21::Round"""
    op = "fake_quantize_learnable_per_channel_affine"
    x, s, z = lift(input), lift(scale), lift(zero_point)
    _check(op, x, s, z, quant_min, quant_max, grad_factor)
    zp = clip(unary("Round", detach(z)), float(quant_min), float(quant_max))
    value = fake_quantize_per_channel_affine(detach(x), detach(s), cast(zp, "int32"), axis, quant_min, quant_max)
    along = [-1] + [1] * (x.ndim - axis - 1)
    return _learnable(x, float_compute(x), value, reshape(s, along), reshape(z, along), reshape(cast(detach(s), "float32"),
                      along), reshape(cast(zp, "float32"), along), quant_min, quant_max, grad_factor)


__all__ = ["fake_quantize_learnable_per_channel_affine", "fake_quantize_learnable_per_tensor_affine"]
