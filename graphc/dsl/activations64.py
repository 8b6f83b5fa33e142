"""float64 activations written out in standard ops, for ``ops_layers``: ONNX gives LeakyRelu, Elu,
Selu, HardSigmoid's constants as float32 attributes (LeakyRelu's 0.2 is 0.2000000029802...;
torch's is a double), and onnxruntime has no float64 kernel for them, nor for Softplus, Softsign or
HardSwish. The Where branches are torch's, so its gradients at the kinks and at NaN are too: a
branch not taken reads a safe value, so its derivative at NaN, times the zero gradient Where gives
it, stays 0."""

from __future__ import annotations

from typing import Any

from graphc.dsl.inplace import into
from graphc.dsl.ops import emit, lift, minimum, scalar, unary, where
from graphc.dsl.ops_elementwise import expm1, log1p
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32

__all__ = ["native_or_written"]

SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946  # torch's


def _softplus(x: Tensor) -> Tensor:
    """``max(x, 0) + log1p(exp(-|x|))``: torch's value far below 0 too, the max a Min whose tie
    gives torch's gradient 0.5 at 0."""
    return log1p(unary("Exp", -unary("Abs", x))) - minimum(-x, scalar(0.0, x))


def _leaky_relu(x: Tensor, alpha: float) -> Tensor:
    return where(x > scalar(0.0, x), x, x * scalar(alpha, x))


def _elu(x: Tensor, alpha: float) -> Tensor:
    negative = x <= scalar(0.0, x)
    return where(negative, scalar(alpha, x) * expm1(where(negative, x, scalar(0.0, x))), x)


def _hardsigmoid(x: Tensor, alpha: float, beta: float) -> Tensor:
    """``alpha x + beta`` clamped to [0, 1]; torch's gradient: alpha strictly inside, else 0 (NaN too)."""
    low, high = scalar(-beta / alpha, x), scalar((1 - beta) / alpha, x)
    inside = emit("And", [x > low, x < high])
    outside = where(x <= low, scalar(0.0, x), where(x >= high, scalar(1.0, x), x * scalar(0.0, x)))  # NaN: NaN
    return where(inside, x * scalar(alpha, x) + scalar(beta, x), outside)


def _hardswish(x: Tensor) -> Tensor:
    """torch's gradient: (2x + 3) / 6 inside (-3, 3), 0 up to -3, 1 from 3."""
    below = x < scalar(3.0, x)
    xs = where(below, x, scalar(0.0, x))
    upper = where(below, xs * (xs + scalar(3.0, x)) / scalar(6.0, x), x)
    return where(x <= scalar(-3.0, x), scalar(0.0, x), upper)


def _softsign(x: Tensor) -> Tensor:
    return x / (scalar(1.0, x) + unary("Abs", x))


def _selu(x: Tensor) -> Tensor:
    return _elu(x, SELU_ALPHA) * scalar(SELU_SCALE, x)


_WRITTEN = {"LeakyRelu": _leaky_relu, "Elu": _elu, "Selu": _selu, "HardSigmoid": _hardsigmoid, "HardSwish": _hardswish,
            "Softplus": _softplus, "Softsign": _softsign}


def native_or_written(x: Any, op: str, attrs: dict[str, float], inplace: bool = False) -> Tensor:
    """The ONNX activation ``op`` of ``x`` (with ``attrs``), written out where ``x`` is float64, in
    float32 where it is float16 or bfloat16 (``upcast``, as torch's); into ``x`` where ``inplace``."""
    x = lift(x)
    out = _WRITTEN[op](x, **attrs) if x.dtype == "float64" else in_float32(lambda x: unary(op, x, **attrs))(x)
    return into(x, out, inplace)
