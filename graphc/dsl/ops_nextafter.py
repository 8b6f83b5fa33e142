"""``gc.nextafter``: the float next to ``input`` towards ``other``, exact in every float dtype without
reading bits (ONNX's BitCast needs opset 26): the step is a power of two from the exponent of
``frexp``, computed in float64, where every float16, bfloat16 and float32 value and step is exact."""

from __future__ import annotations

from typing import Any

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import binary, cast, detach, maximum, operand_pair, scalar, where
from graphc.dsl.ops_elementwise import signbit
from graphc.dsl.ops_math import isfinite, isinf, isnan
from graphc.dsl.ops_special import frexp
from graphc.dsl.tensor import Tensor

# per dtype: bits of precision, the exponent of the least subnormal, the largest finite value
_FORMATS = {
    "float16": (11, -24, 65504.0),
    "bfloat16": (8, -133, 3.3895313892515355e38),
    "float32": (24, -149, 3.4028234663852886e38),
    "float64": (53, -1074, 1.7976931348623157e308),
}


def _operands(input: Any, other: Any) -> tuple[Tensor, Tensor]:  # noqa: A002 - torch's names
    """Both operands promoted as torch's (``ops.promote``), which must give a float dtype; integers alone are
    refused, as torch's."""
    a, b = operand_pair(input, other)
    if a.dtype not in _FORMATS:
        raise op_error("nextafter", [a, b], f"expected float Tensors, got {a.dtype} ones after promotion",
                       user_source())
    return a, b


def nextafter(input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
    """``torch.nextafter``: the float after ``input`` in the direction of ``other`` (``other`` itself
    where they are equal, so ``nextafter(0.0, -0.0)`` is -0.0; NaN if either is; the least subnormal
    from 0; the largest finite value from an infinity; infinity past the largest). The gradient is 1
    to ``input`` (where finite) and 0 to ``other``, as torch's. Signature: ai.onnx@15::Pow"""
    a, b = _operands(input, other)
    bits, least, largest = _FORMATS[str(a.dtype)]
    wide = a if a.dtype == "float64" else cast(a, "float64")
    x, y = detach(wide), detach(b if b.dtype == "float64" else cast(b, "float64"))
    mantissa, exponent = frexp(x)
    e = cast(exponent, "float64")
    two = scalar(2.0, x)
    up = binary("Pow", two, maximum(e - scalar(bits, x), scalar(least, x)))  # the spacing in |x|'s binade
    below = binary("Pow", two, maximum(e - scalar(bits + 1, x), scalar(least, x)))  # in the one below it
    away = (y > x) == (x > scalar(0, x))  # the step makes |x| larger
    step = where(away | (abs_(mantissa) != scalar(0.5, x)), up, below)
    equal, zero = x == y, x == scalar(0, x)
    size = where(zero, binary("Pow", two, scalar(least, x)), where(away, abs_(x) + step, abs_(x) - step))
    size = where(isinf(x), scalar(largest, x), size)
    size = where(isnan(x) | isnan(y), x + y, where(equal, abs_(y), size))
    # the sign as a factor: onnxruntime's Where turns a chosen -0.0 into +0.0 (onnxruntime#32191)
    negative = (equal & signbit(y)) | (~equal & ((zero & (y < x)) | (~zero & signbit(x))))
    value = size * where(negative, scalar(-1.0, x), scalar(1.0, x))
    finite = where(isfinite(wide), wide, scalar(0, x))
    value = value + -(detach(finite) - finite)  # + -0.0 keeps every value and carries input's gradient
    return value if a.dtype == "float64" else cast(value, a.dtype)

__all__ = ["nextafter"]
