"""torch's fake quantization for quantization-aware training, ``gc.fake_quantize_per_tensor_affine``
and ``gc.fake_quantize_per_channel_affine``: the value torch's CPU kernels compute, bit for bit (float32
``inv_scale = 1 / scale``, ``x * inv_scale`` rounded half to even, clamped, ``(q - zero_point) * scale``),
and torch's straight-through gradient (``dy`` where the rounded value lies in ``[quant_min, quant_max]``,
else 0; none to ``scale`` or ``zero_point``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import cast, constant, detach, emit, lift, reshape, scalar, unary, where
from graphc.dsl.tensor import Tensor
from graphc.passes.values import FAKE_QUANTIZE_KEY

_FLOATS = ("float16", "bfloat16", "float32", "float64")
# the ranges QuantizeLinear saturates to (the others clamp in arithmetic), by zero point type
_QDQ_TYPES = {(-128, 127): np.int8, (0, 255): np.uint8}


def check_range(op: str, x: Tensor, quant_min: Any, quant_max: Any) -> None:
    for name, v in (("quant_min", quant_min), ("quant_max", quant_max)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise op_error(op, [x], f"{name} must be an int, got {type(v).__name__} {v!r}", user_source())
    if quant_min > quant_max:
        raise op_error(op, [x], f"`quant_min` should be less than or equal to `quant_max`, got quant_min="
                       f"{quant_min} > quant_max={quant_max}", user_source())
    if x.dtype not in _FLOATS:
        raise op_error(op, [x], f"input must be a float Tensor, got {x.dtype}", user_source())


def _zero_point_number(op: str, x: Tensor, zero_point: Any, quant_min: int, quant_max: int) -> None:
    if not isinstance(zero_point, (int, np.integer)) or isinstance(zero_point, bool):
        raise op_error(op, [x], f"zero_point must be an int or a Tensor, got {type(zero_point).__name__} "
                       f"{zero_point!r}", user_source())
    if not quant_min <= zero_point <= quant_max:
        raise op_error(op, [x], f"`zero_point` must be between `quant_min` and `quant_max`, got {zero_point} "
                       f"outside [{quant_min}, {quant_max}]", user_source())


def quantize_clamped(x: Tensor, inv: Tensor, zp: Tensor, quant_min: int, quant_max: int, per_channel: bool,
              zp_in_round: bool = False):
    """``(q, mask)``: ``q = clamp(round(x * inv) + zp)`` (``round(x * inv + zp)`` if ``zp_in_round``),
    NaN to ``quant_min`` as torch's ``fmax(NaN, lo)``; ``mask`` where it was in range. torch's
    per-channel kernels cast to int64 before clamping, so past +-2**63 (infinities too) is INT64_MIN
    on x86, then ``quant_min``."""
    a = x * inv
    r = unary("Round", a + zp) if zp_in_round else unary("Round", a) + zp
    lo, hi = scalar(quant_min, r), scalar(quant_max, r)
    mask = (r >= lo) & (r <= hi)
    above = (r > hi) & (r < scalar(2.0**63, r)) if per_channel else r > hi
    q = where(mask, r, where(above, hi, lo))  # NaN fails every comparison: lo
    return q, mask


def _qdq(x: Tensor, inv: Tensor, sc: Tensor, zp: Tensor, z: Tensor, quant_min: int, quant_max: int,
         axis: int | None = None):
    """``(value, mask, r)`` through QuantizeLinear + DequantizeLinear, the pair quantized deployments read:
    ``z`` the int8/uint8 zero point, ``zp`` it as a float broadcasting as ``inv``, ``sc`` the scale
    (per channel: 1-D along ``axis``), ``r`` the unclamped ``round(x * inv) + zp``. ``x * inv`` is
    quantized with scale 1: QuantizeLinear divides, and ``x / scale`` differs from torch's
    ``x * (1 / scale)`` in the last bit (5 of 6.4M normal values rounded to another integer). On ort-cpu,
    2 threads, float32[32, 64, 56, 56], forward with the gradient's mask: 76 ms, against 143-161 ms
    for the same value in Mul/Round/Add/compare/Where/Sub/Mul arithmetic (QDQ alone: 18.5 ms). The
    QuantizeLinear is marked (``FAKE_QUANTIZE_KEY``) for the inference export to quantize ``x``
    by ``sc`` itself."""
    a = x * inv
    attrs = None if axis is None else {"axis": axis}
    one = np.float32(1.0) if axis is None else np.ones(sc.shape, np.float32)
    q = emit("QuantizeLinear", [a, constant(one), z], attrs)
    q.value.producer().metadata_props[FAKE_QUANTIZE_KEY] = "quantize"
    r = unary("Round", a) + zp
    return emit("DequantizeLinear", [q, sc, z], attrs), (r >= scalar(quant_min, r)) & (r <= scalar(quant_max, r)), r


def _straight_through(x: Tensor, value: Tensor, mask: Tensor) -> Tensor:
    """``value`` forward, ``dy * mask`` back to ``x``: ``x - x`` is +0 where ``mask`` holds, so the sum
    is ``value`` (and turns a -0.0 into torch's +0.0, which comes from integer arithmetic). The Add is
    marked (``FAKE_QUANTIZE_KEY``): the inference export keeps ``value`` alone."""
    y = detach(value) + where(mask, x - detach(x), scalar(0.0, x))
    y.value.producer().metadata_props[FAKE_QUANTIZE_KEY] = "output"
    return y


def float_compute(x: Tensor) -> Tensor:
    """float16/bfloat16 as float32: torch's kernels multiply them by a float ``inv_scale``."""
    return x if x.dtype in ("float32", "float64") else cast(x, "float32")


@autocast_op(named=lambda a: None if isinstance(a["scale"], Tensor) else "fake_quantize_per_tensor_affine")
def fake_quantize_per_tensor_affine(input: Any, scale: Any, zero_point: Any, quant_min: int,  # noqa: A002
                                    quant_max: int) -> Tensor:
    """``torch.fake_quantize_per_tensor_affine``: ``(clamp(round(x / scale) + zero_point, quant_min,
    quant_max) - zero_point) * scale`` as torch computes it: ``1 / scale`` in float32, the product in
    float32 (float64 inputs too), a float zero point truncated to an int; the gradient is ``dy`` where
    the unclamped value is in range. ``scale``/``zero_point``: numbers or one-element Tensors (no
    gradient). An int8 or uint8 range with a number zero point on float32 (or float16/bfloat16) lowers to
    QuantizeLinear + DequantizeLinear, the others to arithmetic. Signature: ai.onnx@21::QuantizeLinear"""
    op = "fake_quantize_per_tensor_affine"
    x = lift(input)
    check_range(op, x, quant_min, quant_max)
    qtype = _QDQ_TYPES.get((quant_min, quant_max))
    if isinstance(zero_point, Tensor):
        z64 = cast(reshape(detach(zero_point), []), "int64")  # torch's zero_point.item() as int
        zp, z = cast(z64, "float32"), qtype and cast(z64, np.dtype(qtype).name)
    else:
        _zero_point_number(op, x, zero_point, quant_min, quant_max)
        zp, z = constant(np.float32(zero_point)), qtype and constant(qtype(zero_point))
    if isinstance(scale, Tensor):
        sc = cast(reshape(detach(scale), []), "float32")
    else:
        sc = constant(np.float32(scale))
    inv = unary("Reciprocal", sc)
    xc = float_compute(x)
    if xc.dtype == "float32" and qtype:
        value, mask, _ = _qdq(xc, inv, sc, zp, z, quant_min, quant_max)
    elif xc.dtype == "float64":
        q, mask = quantize_clamped(xc, cast(inv, "float64"), cast(zp, "float64"), quant_min, quant_max, False)
        value = cast((cast(q, "float32") - zp) * sc, "float64")  # torch: (int64 - zp) * float scale, a float
    else:
        q, mask = quantize_clamped(xc, inv, zp, quant_min, quant_max, False)
        value = (q - zp) * sc
    return _straight_through(x, value if value.dtype == x.dtype else cast(value, x.dtype), mask)


def fake_quantize_per_channel_affine(input: Any, scale: Any, zero_point: Any, axis: int,  # noqa: A002
                                     quant_min: int, quant_max: int) -> Tensor:
    """``torch.fake_quantize_per_channel_affine``: per-tensor's formula with ``scale[c]`` and
    ``zero_point[c]`` along ``axis`` (``0 <= axis < input.dim()``, as torch); ``scale`` float32, the
    product in the input's dtype; an int32 ``zero_point`` is added after rounding, a float one before
    (``round(x / scale + zero_point)``), as torch's two kernels. Signature: ai.onnx@21::Round"""
    op = "fake_quantize_per_channel_affine"
    x = lift(input)
    check_range(op, x, quant_min, quant_max)
    s, z = lift(scale), lift(zero_point)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not 0 <= axis < x.ndim:
        raise op_error(op, [x], f"`axis` must be between 0 and number of dimensions of input ({x.ndim}), "
                       f"got {axis!r}", user_source())
    if s.dtype not in ("float32", "bfloat16"):
        raise op_error(op, [x, s], f"Scale must be Float or BFloat16, found {s.dtype}", user_source())
    if z.dtype not in ("int32", "float32", "float16"):
        raise op_error(op, [x, z], f"Zero-point must be Int32, Float or Half, found {z.dtype}", user_source())
    channels = x.shape[axis]
    for name, t in (("scale", s), ("zero_point", z)):
        if t.ndim != 1 or (isinstance(channels, int) and isinstance(t.shape[0], int) and t.shape[0] != channels):
            raise op_error(op, [x, t], f"{name} must be 1-D of input.size({axis}) = {channels} elements, got shape "
                           f"{list(t.shape)}", user_source())
    xc = float_compute(x)
    along = [-1] + [1] * (x.ndim - axis - 1)
    sc = reshape(cast(detach(s), "float32"), along)
    zp = reshape(cast(detach(z), xc.dtype), along)
    inv = unary("Reciprocal", sc)
    float_zp = z.dtype != "int32"
    qtype = _QDQ_TYPES.get((quant_min, quant_max))
    if qtype and not float_zp and xc.dtype == "float32" and isinstance(s.shape[0], int):
        flat = cast(detach(s), "float32")
        value, mask, r = _qdq(xc, inv, flat, zp, cast(detach(z), np.dtype(qtype).name), quant_min, quant_max, axis)
        # torch casts r to int64 before clamping: NaN and past 2**63 are INT64_MIN on x86, then quant_min
        overflow = ~(r < scalar(2.0**63, r))
        value = where(overflow, (scalar(quant_min, zp) - zp) * sc, value)
        value.value.producer().metadata_props[FAKE_QUANTIZE_KEY] = "overflow"
        return _straight_through(x, value if value.dtype == x.dtype else cast(value, x.dtype), mask)
    q, mask = quantize_clamped(xc, cast(inv, xc.dtype), zp, quant_min, quant_max, True, float_zp)
    if float_zp and xc.dtype != "float64":  # torch: fmax(float, int64) is a double, so is the rest
        value = (cast(q, "float64") - cast(zp, "float64")) * cast(sc, "float64")
    else:
        value = (q - zp) * cast(sc, xc.dtype)
    return _straight_through(x, value if value.dtype == x.dtype else cast(value, x.dtype), mask)


__all__ = ["fake_quantize_per_channel_affine", "fake_quantize_per_tensor_affine"]
