"""torch's elementwise functions of one Tensor (``gc.tan``, ``gc.asinh``, ``gc.log1p``,
``gc.expm1``, ``gc.log2``, ``gc.exp2``, ``gc.erfc``, ``gc.sinc``, ``gc.logit``, ``gc.signbit``,
``gc.isposinf``, ``gc.clamp_min``, ...), each written in standard ONNX ops that have kernels and
gradient rules. As torch's, the float functions make an integer or bool Tensor float32 first."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import user_source
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import binary, cast, clip, erf, exp, lift, log, maximum, scalar, sqrt, unary, where
from graphc.dsl.ops_array import full_like, sin
from graphc.dsl.ops_divide import to_float
from graphc.dsl.ops_math import neg, sign, trunc
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES


def _float_unary(op: str, name: str, since: int) -> Callable[[Tensor], Tensor]:
    """``torch.<name>`` as the ONNX ``op`` on ``x`` made float."""
    def fn(x: Tensor) -> Tensor:
        return unary(op, to_float(lift(x)))
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``torch.{name}``; an integer or bool Tensor becomes float32. Signature: ai.onnx@{since}::{op}"
    return fn


tan = autocast_op()(_float_unary("Tan", "tan", 7))
sinh = autocast_op()(_float_unary("Sinh", "sinh", 9))
cosh = autocast_op()(_float_unary("Cosh", "cosh", 9))
asin = arcsin = autocast_op()(_float_unary("Asin", "asin", 7))
acos = arccos = autocast_op()(_float_unary("Acos", "acos", 7))
atan = arctan = _float_unary("Atan", "atan", 7)
asinh = arcsinh = _float_unary("Asinh", "asinh", 9)
acosh = arccosh = _float_unary("Acosh", "acosh", 9)
atanh = arctanh = _float_unary("Atanh", "atanh", 9)

# torch's aliases of existing functions
negative, absolute, fix = neg, abs_, trunc


def _small(x: Tensor) -> Tensor:
    """``x`` where ``|x| < 1``, else 0, at which the corrections below vanish exactly (``1 + 0`` and
    ``exp(0)`` are exact)."""
    return where(abs_(x) < scalar(1, x), x, scalar(0, x))


@autocast_op()
def log1p(x: Tensor) -> Tensor:
    """``log(1 + x)``, accurate for tiny ``|x|``: ``u = 1 + x`` rounds off ``e = x - (u - 1)``
    (exactly), and ``log(1 + x) = log(u) + e / u`` up to ``e**2``; the correction is taken only
    where ``|x| < 1`` (it is negligible, and ``e`` is nan at inf, beyond), so -1 gives -inf and inf
    gives inf, and the gradient is ``1 / u``, as torch's."""
    x = to_float(lift(x))
    one = scalar(1, x)
    xs = _small(x)
    us = one + xs
    return log(one + x) + (xs - (us - one)) / us


@autocast_op()
def expm1(x: Tensor) -> Tensor:
    """``exp(x) - 1``, accurate for tiny ``|x|``: ``u = exp(x)`` is off by the factor ``1 + d``
    and ``log(u) - x`` measures ``d``, so ``expm1(x) = u - 1 + u * (x - log(u))`` up to ``d**2``
    (taken where ``|x| < 1``: beyond it ``u - 1`` is accurate, and inf stays inf); the gradient is
    ``exp(x)``, as torch's."""
    x = to_float(lift(x))
    one = scalar(1, x)
    xs = _small(x)
    us = exp(xs)
    return exp(x) - one + us * (xs - log(us))


def _log_base(x: Tensor, base: float) -> Tensor:
    """``log(x) / log(base)``, a float32 (or half) ``x`` in float64 and rounded back, so that a
    power of ``base`` gives its exponent exactly, as torch; float64 within an ulp."""
    x = to_float(lift(x))
    wide = x if x.dtype == "float64" else cast(x, "float64")
    y = log(wide) / scalar(math.log(base), wide)
    return y if wide is x else cast(y, x.dtype)


@autocast_op()
def log2(x: Tensor) -> Tensor:
    """Base-2 logarithm (``_log_base``). Signature: ai.onnx@13::Log"""
    return _log_base(x, 2.0)


@autocast_op()
def log10(x: Tensor) -> Tensor:
    """Base-10 logarithm (``_log_base``). Signature: ai.onnx@13::Log"""
    return _log_base(x, 10.0)


def exp2(x: Tensor) -> Tensor:
    """``2 ** x`` (exact at integers). Signature: ai.onnx@15::Pow"""
    x = to_float(lift(x))
    return binary("Pow", scalar(2, x), x)


# Numerical Recipes' erfc (Chebyshev fit of log(erfc(x) / t) + x * x in t = 1 / (1 + x / 2), highest power
# first): relative error below 1.2e-7 for x >= 0.
_ERFC_COEFFS = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196,
                1.00002368, -1.26551223)
# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision: erfinv(x) / x as
# polynomials in w = -log(1 - x*x), for w < 5 in w - 2.5 and beyond in sqrt(w) - 3 (highest power first).
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                   -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                0.00943887047, 1.00167406, 2.83297682)


def horner(coeffs: tuple, t: Tensor) -> Tensor:
    """The polynomial with ``coeffs`` (highest power first) at ``t``."""
    p = scalar(coeffs[0], t)
    for c in coeffs[1:]:
        p = p * t + scalar(c, t)
    return p


@in_float32
def erfc(x: Tensor) -> Tensor:
    """``1 - erf(x)``, keeping its relative accuracy in the tail where ``1 - erf(x)`` rounds to 0:
    from 0.5 on ``t * exp(-x*x + P(t))``, ``t = 1 / (1 + x / 2)`` (Numerical Recipes' fit, relative
    error < 1.2e-7: within 5e-7 of torch in float32, and float64 only that accurate there). ``x*x`` is split as
    ``h*h + (x - h)(x + h)`` with ``h`` = ``x`` to 1/16, whose square is exact, so its rounding does
    not grow with ``x``. The tail reads ``x`` clipped to [0, 30] (erfc(30) is 0 even in float64),
    so its gradient is finite at +-inf."""
    x = to_float(lift(x))
    xt = clip(x, 0, 30)
    t = scalar(1, x) / (scalar(1, x) + scalar(0.5, x) * xt)
    poly = horner(_ERFC_COEFFS, t)
    sixteen = scalar(16, x)
    h = unary("Floor", xt * sixteen) / sixteen
    tail = t * exp(-(h * h)) * exp(poly - (xt - h) * (xt + h))
    return where(x < scalar(0.5, x), scalar(1, x) - erf(x), tail)


@autocast_op()
def erfinv(x: Tensor) -> Tensor:
    """The inverse of ``erf`` on [-1, 1] (+-inf at +-1, nan beyond): Giles' single-precision
    polynomials, within 3e-7 of torch's relative error in float32; float64 gets the same accuracy
    (1.3e-7 for ``|x| < 1 - 1e-8``, less beyond), not an ulp. The gradient is the polynomials'."""
    x = to_float(lift(x))
    one = scalar(1, x)
    edge = abs_(x) == one
    xs = where(edge, scalar(0, x), x)  # finite polynomials (and gradients) where the edge is picked
    w = -log((one - xs) * (one + xs))
    central = horner(_ERFINV_CENTRAL, w - scalar(2.5, x))
    tail = horner(_ERFINV_TAIL, sqrt(maximum(w, scalar(5, x))) - scalar(3, x))
    infinite = where(edge, scalar(math.inf, x), scalar(0, x))  # +-inf at +-1, gradient inf there and 0 elsewhere
    return where(edge, x * infinite, where(w < scalar(5, x), central, tail) * xs)


@in_float32
def sinc(x: Tensor) -> Tensor:
    """``sin(pi x) / (pi x)``, 1 at 0 (where the gradient is 0, as torch's)."""
    x = to_float(lift(x))
    zero = x == scalar(0, x)
    px = where(zero, scalar(1, x), x) * scalar(math.pi, x)
    return where(zero, scalar(1, x), sin(px) / px)


def logit(x: Tensor, eps: float | None = None) -> Tensor:
    """``log(x / (1 - x))``; with ``eps``, ``x`` clamped to ``[eps, 1 - eps]`` first (the gradient
    is 0 outside, as torch's; a negative ``eps`` clamps nothing, as torch's)."""
    x = to_float(lift(x))
    if eps is not None:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise CaptureError(f"logit eps={eps!r}; expected a number or None (at {user_source()})")
        if eps >= 0:
            x = clip(x, eps, 1 - eps)
    return log(x / (scalar(1, x) - x))


def deg2rad(x: Tensor) -> Tensor:
    """Degrees to radians: ``x * pi / 180``."""
    x = to_float(lift(x))
    return x * scalar(math.pi / 180, x)


def rad2deg(x: Tensor) -> Tensor:
    """Radians to degrees: ``x * 180 / pi``."""
    x = to_float(lift(x))
    return x * scalar(180 / math.pi, x)


def sgn(x: Tensor) -> Tensor:
    """``torch.sgn`` of a real Tensor: ``gc.sign`` (a bool Tensor is its own sign, as torch's)."""
    x = lift(x)
    return x if x.dtype == "bool" else sign(x)


def positive(x: Tensor) -> Tensor:
    """``x`` itself; a bool Tensor is refused, as torch's."""
    x = lift(x)
    if x.dtype == "bool":
        raise CaptureError(f"positive (+x) on a bool Tensor {x.type_str()} is not supported, as in torch "
                           f"(at {user_source()})")
    return x


def signbit(x: Tensor) -> Tensor:
    """Whether the sign bit is set: ``x < 0`` or ``1 / x < 0`` (-0.0 and -inf included); ONNX
    cannot read a nan's sign bit, so nan (-nan too) gives False."""
    x = lift(x)
    if x.dtype == "bool":
        return full_like(x, False, "bool")
    zero = scalar(0, x)
    if x.dtype not in FLOAT_DTYPES:
        return x < zero
    return (x < zero) | (unary("Reciprocal", x) < zero)


def _inf_test(x: Tensor, positive: bool) -> Tensor:
    x = lift(x)
    if x.dtype not in FLOAT_DTYPES:
        return full_like(x, False, "bool")
    return unary("IsInf", x, detect_negative=int(not positive), detect_positive=int(positive))


def isposinf(x: Tensor) -> Tensor:
    """Where ``x`` is +inf (all false for an integer Tensor). Signature: ai.onnx@20::IsInf"""
    return _inf_test(x, True)


def isneginf(x: Tensor) -> Tensor:
    """Where ``x`` is -inf (all false for an integer Tensor). Signature: ai.onnx@20::IsInf"""
    return _inf_test(x, False)


def isreal(x: Tensor) -> Tensor:
    """All true: graphc's Tensors are real."""
    return full_like(x, True, "bool")


def clamp_min(x: Tensor, min: Any) -> Tensor:  # noqa: A002 - torch's name
    """``gc.clamp(x, min=min)``: a number or a Tensor, which broadcasts with ``x``."""
    return clip(x, min, None)


def clamp_max(x: Tensor, max: Any) -> Tensor:  # noqa: A002 - torch's name
    """``gc.clamp(x, max=max)``: a number or a Tensor, which broadcasts with ``x``."""
    return clip(x, None, max)


__all__ = [
    "absolute", "acos", "acosh", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctanh", "asin", "asinh",
    "atan", "atanh", "clamp_max", "clamp_min", "cosh", "deg2rad", "erfc", "erfinv", "exp2", "expm1", "fix", "isneginf",
    "isposinf", "isreal", "log10", "log1p", "log2", "logit", "negative", "positive", "rad2deg", "sgn", "signbit",
    "sinc", "sinh", "tan",
]
