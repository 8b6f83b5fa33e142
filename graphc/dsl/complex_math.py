"""torch's elementwise math on complex Tensors (``graphc.dsl.complex_ops``' real parts): logs, roots, the
trigonometric and hyperbolic functions and their inverses, sigmoid, expm1, exp2, sinc, sgn, square, reciprocal, the
predicates ``isfinite``/``isnan``/``isinf`` and ``isclose``/``allclose``. ``TABLE`` names each with the real
function it stands beside: ``gc.<name>`` takes either kind, and a complex Tensor has the method, and the in-place
``z.<name>_()`` (``gc.<name>_(z)``) where torch has one (``IN_PLACE``).

The formulas are the stable ones, so values are torch's to rounding: ``log``'s real part is ``log1p`` near
``|z| = 1``, the inverse functions are Kahan's (Branch Cuts for Complex Elementary Functions, 1987) from two
principal square roots, ``tanh`` divides by ``sinh(x)**2 + cos(y)**2`` (no cancellation). The branch cuts
are torch's, a signed zero imaginary part choosing the side: ``log``, ``sqrt`` on the negative real axis
(``log1p`` left of -1, ``acosh`` left of 1), ``asin``, ``acos``, ``atanh`` on the real axis beyond +-1,
``asinh``, ``atan`` on the imaginary axis beyond +-i. Gradients are the real ops': for a real loss, the
(real, imag) pair of torch's ``.grad`` of a complex leaf."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from graphc.dsl import ops, ops_aliases, ops_array, ops_binary, ops_elementwise, ops_math
from graphc.dsl.complex_ops import abs as complex_abs
from graphc.dsl.complex_ops import sum as complex_sum
from graphc.dsl.complex_ops import (add, as_complex, conj, div, either_kind, eq, exp, mul, neg, of_parts, parts, sub,
                                   write)
from graphc.dsl.builder import user_source
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.errors import CaptureError

_BIG = 20.0  # tanh(x) is +-1 in float64 beyond |x| = 20; its imaginary part is then 4 sin y cos y exp(-2|x|)


def _times_i(z: ComplexTensor) -> ComplexTensor:
    re, im = parts(z)
    return of_parts(-im, re)


def _times_minus_i(z: ComplexTensor) -> ComplexTensor:
    re, im = parts(z)
    return of_parts(im, -re)


def _scaled(z: ComplexTensor, factor: float) -> ComplexTensor:
    re, im = parts(z)
    return of_parts(re * factor, im * factor)


def sqrt(z: ComplexTensor) -> ComplexTensor:
    """The principal root: ``t = sqrt((|x| + |z|) / 2)`` then the other part ``y / 2t`` (no cancellation)."""
    x, y = parts(z)
    t = ops.sqrt((ops.abs(x) + ops_binary.hypot(x, y)) * 0.5)
    twice = ops.where(t == ops.scalar(0.0, t), ops.scalar(1.0, t), t) * 2.0  # t is 0 only where z is
    right = x >= ops.scalar(0.0, x)
    return of_parts(ops.where(right, t, ops.abs(y) / twice), ops.where(right, y / twice, ops_binary.copysign(t, y)))


def log(z: ComplexTensor) -> ComplexTensor:
    """``log|z| + i angle z``; ``log|z|`` is ``log1p(a**2 - 1 + b**2) / 2`` where the larger part ``a`` is in
    [0.5, 2] (where ``|z|`` may be near 1)."""
    x, y = parts(z)
    a, b = ops.maximum(ops.abs(x), ops.abs(y)), ops.minimum(ops.abs(x), ops.abs(y))
    near = (a >= ops.scalar(0.5, a)) & (a <= ops.scalar(2.0, a))
    modulus = ops.where(near, ops_elementwise.log1p((a - 1.0) * (a + 1.0) + b * b) * 0.5,
                        ops.log(ops_binary.hypot(x, y)))
    return of_parts(modulus, ops_binary.atan2(y, x))


def log1p(z: ComplexTensor) -> ComplexTensor:
    """``log(1 + z)``: ``log1p(2x + x**2 + y**2) / 2`` for ``|z| < 0.5``, as torch's."""
    x, y = parts(z)
    small = ops_binary.hypot(x, y) < ops.scalar(0.5, x)
    modulus = ops.where(small, ops_elementwise.log1p(x * (x + 2.0) + y * y) * 0.5,
                        ops.log(ops_binary.hypot(x + 1.0, y)))
    return of_parts(modulus, ops_binary.atan2(y, x + 1.0))


def expm1(z: ComplexTensor) -> ComplexTensor:
    """``exp(z) - 1``: the real part ``expm1(x) cos y - 2 sin(y/2)**2``, accurate near 0."""
    x, y = parts(z)
    half = ops_array.sin(y * 0.5)
    return of_parts(ops_elementwise.expm1(x) * ops_array.cos(y) - half * half * 2.0, ops.exp(x) * ops_array.sin(y))


def sinc(z: ComplexTensor) -> ComplexTensor:
    """``sin(pi z) / (pi z)``, 1 at 0 with torch's zero gradient there."""
    zero = eq(z, 0.0)
    w = _scaled(of_parts(*(ops.where(zero, ops.scalar(1.0, p), p) for p in parts(z))), math.pi)
    x, y = parts(div(sin(w), w))
    return of_parts(ops.where(zero, ops.scalar(1.0, x), x), ops.where(zero, ops.scalar(0.0, y), y))


def logsumexp(z: ComplexTensor, dim: Any, keepdim: bool = False) -> ComplexTensor:
    """``log(sum(exp(z)))`` over ``dim``, from the largest real part (0 where infinite, as the real one's)."""
    x, _ = parts(z)
    top = ops.detach(ops_math.amax(x, dim, keepdim=True))
    top = ops.where(ops_math.isinf(top), ops.scalar(0.0, top), top)
    out = add(log(complex_sum(exp(sub(z, top)), dim, keepdim=True)), top)
    if keepdim:
        return out
    re, im = parts(out)
    dims = [dim] if isinstance(dim, int) else list(dim)
    return of_parts(ops.squeeze(re, dims), ops.squeeze(im, dims))


def sin(z: ComplexTensor) -> ComplexTensor:
    x, y = parts(z)
    return of_parts(ops_array.sin(x) * ops_elementwise.cosh(y), ops_array.cos(x) * ops_elementwise.sinh(y))


def cos(z: ComplexTensor) -> ComplexTensor:
    x, y = parts(z)
    return of_parts(ops_array.cos(x) * ops_elementwise.cosh(y), -(ops_array.sin(x) * ops_elementwise.sinh(y)))


def sinh(z: ComplexTensor) -> ComplexTensor:
    x, y = parts(z)
    return of_parts(ops_elementwise.sinh(x) * ops_array.cos(y), ops_elementwise.cosh(x) * ops_array.sin(y))


def cosh(z: ComplexTensor) -> ComplexTensor:
    x, y = parts(z)
    return of_parts(ops_elementwise.cosh(x) * ops_array.cos(y), ops_elementwise.sinh(x) * ops_array.sin(y))


def tanh(z: ComplexTensor) -> ComplexTensor:
    """``(sinh x cosh x + i sin y cos y) / (sinh(x)**2 + cos(y)**2)``; beyond ``|x| = 20`` the real part is
    ``sign x`` and the imaginary one ``4 sin y cos y exp(-2|x|)`` (no overflow)."""
    x, y = parts(z)
    big = ops.abs(x) > ops.scalar(_BIG, x)
    xs = ops.where(big, ops.scalar(0.0, x), x)
    s, sy, cy = ops_elementwise.sinh(xs), ops_array.sin(y), ops_array.cos(y)
    den = s * s + cy * cy
    far = sy * cy * ops.exp(ops.abs(x) * -2.0) * 4.0
    return of_parts(ops.where(big, ops_math.sign(x), s * ops_elementwise.cosh(xs) / den),
                    ops.where(big, far, sy * cy / den))


def tan(z: ComplexTensor) -> ComplexTensor:
    """``-i tanh(i z)``."""
    return _times_minus_i(tanh(_times_i(z)))


def _roots(z: ComplexTensor) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The parts of Kahan's ``sqrt(1 - z)`` and ``sqrt(1 + z)`` (``1 - z``'s imaginary part is ``-y``, signed
    zeros kept)."""
    return parts(sqrt(sub(1.0, z))), parts(sqrt(add(1.0, z)))


def asin(z: ComplexTensor) -> ComplexTensor:
    x, _ = parts(z)
    (ar, ai), (br, bi) = _roots(z)
    return of_parts(ops_binary.atan2(x, ar * br - ai * bi), ops_elementwise.asinh(ar * bi - ai * br))


def acos(z: ComplexTensor) -> ComplexTensor:
    (ar, ai), (br, bi) = _roots(z)
    return of_parts(ops_binary.atan2(ar, br) * 2.0, ops_elementwise.asinh(br * ai - bi * ar))


def acosh(z: ComplexTensor) -> ComplexTensor:
    """Kahan's, from ``sqrt(z - 1)`` and ``sqrt(z + 1)``."""
    (ar, ai), (br, bi) = parts(sqrt(sub(z, 1.0))), parts(sqrt(add(z, 1.0)))
    return of_parts(ops_elementwise.asinh(ar * br + ai * bi), ops_binary.atan2(ai, br) * 2.0)


def asinh(z: ComplexTensor) -> ComplexTensor:
    """``-i asin(i z)``."""
    return _times_minus_i(asin(_times_i(z)))


def atanh(z: ComplexTensor) -> ComplexTensor:
    """``log((1 + z) / (1 - z)) / 2``: the real part a quarter of ``log`` of the squared moduli's ratio where it
    is below 0.5, else of ``log1p(4x / |1 - z|**2)``; the imaginary part ``atan2(2y, (1 - x)(1 + x) - y**2) / 2``."""
    x, y = parts(z)
    one_minus = 1.0 - x
    above, below = (x + 1.0) * (x + 1.0) + y * y, one_minus * one_minus + y * y
    ratio = above / below
    real = ops.where(ratio < ops.scalar(0.5, x), ops.log(ratio), ops_elementwise.log1p(x * 4.0 / below)) * 0.25
    return of_parts(real, ops_binary.atan2(y * 2.0, one_minus * (x + 1.0) - y * y) * 0.5)


def atan(z: ComplexTensor) -> ComplexTensor:
    """``-i atanh(i z)``."""
    return _times_minus_i(atanh(_times_i(z)))


def sgn(z: ComplexTensor) -> ComplexTensor:
    """``z / |z|``, 0 at 0 with torch's zero gradient there."""
    x, y = parts(z)
    size = complex_abs(z)
    zero = size == ops.scalar(0.0, size)
    safe = ops.where(zero, ops.scalar(1.0, size), size)
    nothing = ops.scalar(0.0, size)
    return of_parts(ops.where(zero, nothing, x / safe), ops.where(zero, nothing, y / safe))


def isfinite(z: ComplexTensor) -> Tensor:
    return ops_math.logical_and(*map(ops_math.isfinite, parts(z)))


def isnan(z: ComplexTensor) -> Tensor:
    return ops_math.logical_or(*map(ops_math.isnan, parts(z)))


def isinf(z: ComplexTensor) -> Tensor:
    return ops_math.logical_or(*map(ops_math.isinf, parts(z)))


def isclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002 - torch's names
            equal_nan: bool = False) -> Tensor:
    """Where ``|input - other| <= atol + rtol |other|`` (complex moduli, the error finite) or the two are
    equal (nan equal to nan, in either part, with ``equal_nan``), as torch's."""
    ops_binary.check_tolerances(rtol, atol)
    like = next(p for p in (*_real_parts(input), *_real_parts(other)) if isinstance(p, Tensor))
    a, b = as_complex(input, like), as_complex(other, like)
    close = eq(a, b)
    if equal_nan:
        close = ops_math.logical_or(close, ops_math.logical_and(isnan(a), isnan(b)))
    error = complex_abs(sub(a, b))
    within = error <= complex_abs(b) * rtol + atol
    return ops_math.logical_or(close, ops_math.logical_and(ops_math.isfinite(error), within))


def _real_parts(x: Any) -> tuple[Any, ...]:
    return parts(x) if isinstance(x, ComplexTensor) else (x,)


def allclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002 - torch's names
             equal_nan: bool = False) -> Tensor:
    """Whether ``isclose`` holds everywhere: a bool scalar Tensor, as the real ``gc.allclose``."""
    return ops_math.all(isclose(input, other, rtol, atol, equal_nan))


_LOG2, _LOG10 = 1 / math.log(2.0), 1 / math.log(10.0)

# name: (the real function gc.<name> was, the complex one)
TABLE = {
    "sqrt": (ops.sqrt, sqrt), "rsqrt": (ops_array.rsqrt, lambda z: div(1.0, sqrt(z))),
    "reciprocal": (ops_math.reciprocal, lambda z: div(1.0, z)), "square": (ops_math.square, lambda z: mul(z, z)),
    "log": (ops.log, log), "log2": (ops_elementwise.log2, lambda z: _scaled(log(z), _LOG2)),
    "log10": (ops_elementwise.log10, lambda z: _scaled(log(z), _LOG10)), "log1p": (ops_elementwise.log1p, log1p),
    "expm1": (ops_elementwise.expm1, expm1), "exp2": (ops_elementwise.exp2, lambda z: exp(_scaled(z, math.log(2.0)))),
    "sinc": (ops_elementwise.sinc, sinc), "sigmoid": (ops.sigmoid, lambda z: div(1.0, add(1.0, exp(neg(z))))),
    "sin": (ops_array.sin, sin), "cos": (ops_array.cos, cos), "tan": (ops_elementwise.tan, tan),
    "sinh": (ops_elementwise.sinh, sinh), "cosh": (ops_elementwise.cosh, cosh), "tanh": (ops.tanh, tanh),
    "asin": (ops_elementwise.asin, asin), "acos": (ops_elementwise.acos, acos), "atan": (ops_elementwise.atan, atan),
    "asinh": (ops_elementwise.asinh, asinh), "acosh": (ops_elementwise.acosh, acosh),
    "atanh": (ops_elementwise.atanh, atanh),
    "arcsin": (ops_elementwise.arcsin, asin), "arccos": (ops_elementwise.arccos, acos),
    "arctan": (ops_elementwise.arctan, atan), "arcsinh": (ops_elementwise.arcsinh, asinh),
    "arccosh": (ops_elementwise.arccosh, acosh), "arctanh": (ops_elementwise.arctanh, atanh),
    "sgn": (ops_elementwise.sgn, sgn), "neg": (ops_math.neg, neg), "negative": (ops_elementwise.negative, neg),
    "conj_physical": (ops_aliases.conj_physical, conj),
    "isfinite": (ops_math.isfinite, isfinite), "isnan": (ops_math.isnan, isnan), "isinf": (ops_math.isinf, isinf),
    "isclose": (ops_binary.isclose, isclose), "allclose": (ops_binary.allclose, allclose),
}

# torch.special's functions that take complex Tensors (gc.special.<name>)
SPECIAL = {"expit": TABLE["sigmoid"][1], "exp2": TABLE["exp2"][1], "expm1": expm1, "log1p": log1p, "sinc": sinc,
           "logsumexp": logsumexp}

# the ones torch also writes in place (``z.log_()``): all but the predicates, and ``exp``
IN_PLACE = sorted({*TABLE} - {"isfinite", "isnan", "isinf", "isclose", "allclose"} | {"exp"})


def _in_place(fn: Callable[..., ComplexTensor]) -> Callable[..., ComplexTensor]:
    """``z.<name>_()``: ``z`` rebound to ``fn(z)`` (``complex_ops.write``: a view writes its base), and returned."""
    return lambda z: write(z, fn(z))


def _of_a_tensor(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, refusing a complex number or array as its input (torch takes a Tensor), naming ``name``."""
    def op(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002 - torch's name
        if not isinstance(input, ComplexTensor):
            raise CaptureError(f"{name}: input must be a Tensor, as torch's, got {type(input).__name__} {input!r} "
                               f"(at {user_source()}); make one with gc.tensor or gc.complex")
        return fn(input, *args, **kwargs)
    return op


for _name, (_real, _complex) in TABLE.items():
    globals()[f"{_name}_any"] = either_kind(_real, _of_a_tensor(_name, _complex))  # graphc/__init__.py: gc.<name>
    setattr(ComplexTensor, _name, _complex)
for _name in IN_PLACE:
    setattr(ComplexTensor, f"{_name}_", _in_place(getattr(ComplexTensor, _name)))

__all__ = sorted(TABLE)
