"""Division and remainder as torch does them (``/``, ``//``, ``%``, ``gc.remainder``,
``gc.fmod``): true division makes integers float, ``//`` and ``%`` round towards minus infinity
(the divisor's sign), ``fmod`` towards zero (the dividend's sign)."""

from __future__ import annotations

from typing import Any

from graphc.dsl.builder import user_source
from graphc.dsl.ops import binary, cast, emit, operand_pair, scalar, unary, where
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES


def true_divide(a: Any, b: Any) -> Tensor:
    """``a / b`` as torch divides: a bool or integer Tensor becomes float32 (or the other
    operand's float dtype) first, never a truncating integer Div; then the two promote as torch's
    (``ops.promote``). Signature: ai.onnx@14::Div"""
    a = to_float(a, b) if isinstance(a, Tensor) else a
    b = to_float(b, a) if isinstance(b, Tensor) else b
    return binary("Div", a, b)


def floor_divide(a: Any, b: Any) -> Tensor:
    """``a // b`` as torch: rounded down, not towards zero. Integers: ``(a - a mod b) / b``, exact
    (ONNX Mod takes the divisor's sign). Floats: Python's and torch's ``(a - fmod(a, b)) / b``,
    less 1 where the remainder's sign is not the divisor's, then rounded to the nearest whole
    number (``floor(a / b)`` would give 10 for ``1 // 0.1``, not 9); ``a / b`` where ``b`` is 0."""
    a, b = operand_pair(a, b)
    if a.dtype not in FLOAT_DTYPES and b.dtype not in FLOAT_DTYPES:
        return binary("Div", binary("Sub", a, binary("Mod", a, b)), b)
    a, b = to_float(a, b), to_float(b, a)
    zero = scalar(0, a)
    mod, wrong_sign = _fmod_and_wrong_sign(a, b)
    div = (a - mod) / b - cast(wrong_sign, a.dtype)
    floor = unary("Floor", div)
    floor = floor + cast(div - floor > scalar(0.5, a), a.dtype)
    return where(b == zero, a / b, floor)


def remainder(a: Any, b: Any) -> Tensor:
    """``a % b`` as torch (``torch.remainder``): ``a - floor(a / b) * b``, the divisor's sign
    (``-7 % 3`` is 2, ``7 % -3`` is -2). Integers: ONNX Mod; floats: C's fmod, plus ``b`` where its
    sign is not the divisor's. Signature: ai.onnx@13::Mod"""
    a, b = _int_or_float_pair("remainder", a, b)
    if a.dtype not in FLOAT_DTYPES:
        return emit("Mod", [a, b])
    mod, wrong_sign = _fmod_and_wrong_sign(a, b)
    return where(wrong_sign, mod + b, mod)


def fmod(a: Any, b: Any) -> Tensor:
    """``torch.fmod``: C's remainder, ``a - trunc(a / b) * b``, the dividend's sign (``-7 fmod 3``
    is -1). Signature: ai.onnx@13::Mod (fmod=1)"""
    a, b = _int_or_float_pair("fmod", a, b)
    return emit("Mod", [a, b], {"fmod": 1})


def _int_or_float_pair(fn: str, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    a, b = operand_pair(a, b)
    if a.dtype == "bool":
        raise CaptureError(f"{fn} takes integer or float Tensors, got bool ones; cast them first "
                           f"(at {user_source()})")
    return a, b


def _fmod_and_wrong_sign(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """C's ``fmod(a, b)`` (float Mod, the dividend's sign) and where it is nonzero with the sign
    opposite to ``b``'s: there the floored remainder is ``fmod + b``."""
    zero = scalar(0, a)
    mod = emit("Mod", [a, b], {"fmod": 1})
    return mod, (mod != zero) & ((b < zero) ^ (mod < zero))


def to_float(t: Tensor, other: Any = None) -> Tensor:
    """``t``, a bool or integer Tensor cast to ``other``'s float dtype (a Tensor's), else float32."""
    if t.dtype in FLOAT_DTYPES:
        return t
    return cast(t, other.dtype if isinstance(other, Tensor) and other.dtype in FLOAT_DTYPES else "float32")


__all__ = ["fmod", "remainder", "to_float"]
