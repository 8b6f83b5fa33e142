"""Elementwise math, logic and reductions under torch's names (``gc.square``, ``gc.trunc``,
``gc.logaddexp``, ``gc.isnan``, ``gc.nan_to_num``, ``gc.logical_and``, ``gc.prod``, ``gc.amax``,
``gc.any``, ``gc.norm``, ...), each written in standard ONNX ops that have kernels and gradient
rules. Rounding ops have no gradient (torch's is zero); integer Tensors round to themselves."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import user_source
from graphc.dsl.devices import refuse_out
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import (cast, emit, exp, int64_accumulated, lift, log, maximum, operand_pair, reduction, scalar,
                            sqrt)
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops import min as reduce_min
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops import unary, where
from graphc.dsl.ops_array import full_like
from graphc.dsl.ops_divide import to_float
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, finfo

# -- elementwise ------------------------------------------------------------------------------


def square(x: Tensor) -> Tensor:
    """``x * x``. Signature: ai.onnx@14::Mul"""
    x = lift(x)
    return x * x


@autocast_op()
def reciprocal(x: Tensor) -> Tensor:
    """``1 / x``; an integer or bool Tensor becomes float32 first, as torch's. Signature: ai.onnx@13::Reciprocal"""
    return unary("Reciprocal", to_float(lift(x)))


def neg(x: Tensor) -> Tensor:
    """``-x``. Signature: ai.onnx@13::Neg"""
    return unary("Neg", x)


def sign(x: Tensor) -> Tensor:
    """-1, 0 or 1 (nan stays nan). Signature: ai.onnx@13::Sign"""
    return unary("Sign", x)


def floor(x: Tensor) -> Tensor:
    """Signature: ai.onnx@13::Floor"""
    return _rounding("Floor", x)


def ceil(x: Tensor) -> Tensor:
    """Signature: ai.onnx@13::Ceil"""
    return _rounding("Ceil", x)


def round(x: Tensor, decimals: int = 0) -> Tensor:  # noqa: A001 - torch's name
    """Round half to even, as torch; ``decimals`` scales by ``10**decimals`` around it, as torch's.
    Signature: ai.onnx@11::Round"""
    x = lift(x)
    if not decimals or x.dtype not in FLOAT_DTYPES:
        return _rounding("Round", x)
    scale = scalar(10.0 ** decimals, x)
    return _rounding("Round", x * scale) / scale


def trunc(x: Tensor) -> Tensor:
    """Round towards zero: ``ceil`` below 0, ``floor`` above. Signature: ai.onnx@16::Where"""
    x = lift(x)
    if x.dtype not in FLOAT_DTYPES:
        return _rounding("Floor", x)
    return where(x < scalar(0, x), unary("Ceil", x), unary("Floor", x))


def frac(x: Tensor) -> Tensor:
    """``x - trunc(x)``, the sign of ``x``; its gradient is the identity, as torch's."""
    x = lift(x)
    return x - trunc(x)


def _rounding(op: str, x: Tensor) -> Tensor:
    x = lift(x)
    return unary(op, x) if x.dtype in FLOAT_DTYPES else x


@in_float32
def logaddexp(a: Any, b: Any) -> Tensor:
    """``log(exp(a) + exp(b))`` without overflow: ``max(a, b) + log(1 + exp(-|a - b|))``; where
    ``a - b`` is nan (both the same infinity) the difference is taken as 0, so -inf and -inf give
    -inf, as torch's."""
    a, b = operand_pair(a, b)
    diff = a - b
    diff = where(unary("IsNaN", diff), scalar(0, diff), diff)
    return maximum(a, b) + log(scalar(1, diff) + exp(-abs_(diff)))


# -- logic and tests --------------------------------------------------------------------------


def _truth(x: Any) -> Tensor:
    """``x`` as bool: nonzero is true, as torch's logical functions read any dtype."""
    x = lift(x)
    return x if x.dtype == "bool" else x != scalar(0, x)


def logical_not(x: Tensor) -> Tensor:
    """Signature: ai.onnx@1::Not"""
    return unary("Not", _truth(x))


def logical_and(a: Any, b: Any) -> Tensor:
    """Signature: ai.onnx@7::And"""
    return emit("And", [_truth(a), _truth(b)])


def logical_or(a: Any, b: Any) -> Tensor:
    """Signature: ai.onnx@7::Or"""
    return emit("Or", [_truth(a), _truth(b)])


def logical_xor(a: Any, b: Any) -> Tensor:
    """Signature: ai.onnx@7::Xor"""
    return emit("Xor", [_truth(a), _truth(b)])


def isnan(x: Tensor) -> Tensor:
    """Signature: ai.onnx@20::IsNaN (all false for an integer Tensor)"""
    x = lift(x)
    return unary("IsNaN", x) if x.dtype in FLOAT_DTYPES else full_like(x, False, "bool")


def isinf(x: Tensor) -> Tensor:
    """Signature: ai.onnx@20::IsInf (all false for an integer Tensor)"""
    x = lift(x)
    return unary("IsInf", x) if x.dtype in FLOAT_DTYPES else full_like(x, False, "bool")


def isfinite(x: Tensor) -> Tensor:
    """Neither nan nor infinite."""
    return logical_not(isnan(x) | isinf(x))


def nan_to_num(x: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """nan, +inf and -inf replaced by ``nan``, ``posinf`` and ``neginf`` (by default the dtype's
    largest and lowest finite values, as torch); the gradient flows where ``x`` is finite."""
    x = lift(x)
    if x.dtype not in FLOAT_DTYPES:
        return x
    info = finfo(x.dtype)
    big = scalar(info.max if posinf is None else posinf, x)
    low = scalar(info.min if neginf is None else neginf, x)
    x = where(unary("IsNaN", x), scalar(nan, x), x)
    x = where(unary("IsInf", x, detect_negative=0), big, x)
    return where(unary("IsInf", x, detect_positive=0), low, x)


# -- reductions -------------------------------------------------------------------------------


@autocast_op()
def prod(x: Tensor, dim: int | None = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """Product over ``dim`` (None: all); ``dtype`` casts first, else bool and integer Tensors
    multiply in int64, as torch. Signature: ai.onnx@18::ReduceProd"""
    x = lift(x)
    return reduction("ReduceProd", int64_accumulated(x) if dtype is None else cast(x, dtype), dim, keepdim)


def amax(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """Largest value over ``dim`` (``()``: all); ties share the gradient, as torch's.
    Signature: ai.onnx@18::ReduceMax"""
    return reduce_max(x, None if dim == () else dim, keepdim)


def amin(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """Smallest value over ``dim`` (``()``: all). Signature: ai.onnx@18::ReduceMin"""
    return reduce_min(x, None if dim == () else dim, keepdim)


def any(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    """Whether any entry over ``dim`` (None: all) is nonzero: the int64 count of them above 0."""
    return reduce_sum(_truth(x), dim, keepdim) > 0


def all(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    """Whether every entry over ``dim`` (None: all) is nonzero: none is zero."""
    return logical_not(any(logical_not(x), dim, keepdim))


@autocast_op()
def norm(x: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, out: Any = None,
         dtype: Any = None) -> Tensor:
    """``torch.norm`` / ``torch.linalg.vector_norm`` over ``dim`` (None: all): ``p`` 2 or "fro", 1,
    ``inf``, ``-inf``, 0 (the count of nonzeros) or any other number (``sum(|x|**p)**(1/p)``); the
    gradient at a zero vector is 0, as torch's, not nan. ``dtype`` casts ``x`` first, as torch's;
    ``out=`` is refused."""
    refuse_out("norm", out)
    x = to_float(lift(x) if dtype is None else cast(lift(x), dtype))
    if p in (2, "fro"):
        return _root_or_zero(reduce_sum(x * x, dim, keepdim), sqrt)
    if not isinstance(p, (int, float)):
        raise CaptureError(f"norm p={p!r}; expected 'fro' or a number (at {user_source()})")
    if p == 1:
        return reduce_sum(abs_(x), dim, keepdim)
    if math.isinf(p):
        return (amax if p > 0 else amin)(abs_(x), () if dim is None else dim, keepdim)
    if p == 0:
        return reduce_sum(cast(x != scalar(0, x), x.dtype), dim, keepdim)
    return _root_or_zero(reduce_sum(abs_(x) ** scalar(p, x), dim, keepdim), lambda t: t ** scalar(1 / p, t))


def _root_or_zero(total: Tensor, root: Any) -> Tensor:
    """``root(total)``, whose gradient at a zero ``total`` is 0 (torch's), not nan: the root's
    infinite slope there is never evaluated."""
    zero = total == scalar(0, total)
    return where(zero, scalar(0, total), root(where(zero, scalar(1, total), total)))


@autocast_op()
@in_float32
def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Tensor:
    """``torch.nn.functional.normalize``: ``x / max(norm(x, p, dim), eps)``, any ``p`` ``norm`` takes (2, 1,
    ``inf``, ``-inf``, 0, any other number), as torch's; ``out=`` refused."""
    refuse_out("normalize", out)
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise CaptureError(f"normalize p={p!r}; expected a number (at {user_source()})")
    x = lift(x)
    if p == 2:  # the max before the sqrt: no gradient reaches sqrt's infinite slope at 0 (torch's, 1/eps)
        return x / sqrt(maximum(reduce_sum(x * x, dim, keepdims=True), scalar(eps * eps, x)))
    return x / maximum(norm(x, p, dim, keepdim=True), scalar(eps, x))


__all__ = [
    "all", "amax", "amin", "any", "ceil", "floor", "frac", "isfinite", "isinf", "isnan", "logaddexp", "logical_and",
    "logical_not", "logical_or", "logical_xor", "nan_to_num", "neg", "norm", "normalize", "prod", "reciprocal",
    "round", "sign", "square", "trunc",
]
