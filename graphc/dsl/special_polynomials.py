"""torch.special's orthogonal polynomials of ``input`` and degree ``n``: Chebyshev's ``T``, ``U``, ``V``, ``W``
and their shifted forms (in ``2 x - 1``), Hermite's ``H`` and ``He``, Laguerre's ``L`` and Legendre's ``P``,
each as torch's: ``n`` truncated to an integer (nan and +-inf count as negative), 0 for ``n < 0``, the values
at the ends of the interval exact, the Chebyshev ones by ``cos``/``sin`` of ``n acos(x)`` inside ``(-1, 1)``
above a degree (6; 8 for unshifted ``U``, ``V``, ``W``; 4 for shifted ``W``), Hermite's nan above degree 512
(128 for float32), else the three-term recurrence from degrees 0 and 1, computed in float64. A static ``n``
up to ``UNROLL`` is unrolled; a larger one, or a Tensor ``n`` (broadcast with ``input``), is an ONNX Loop in
which each element steps to its own degree, until the largest's or until every value stepping is nan
(torch's early stop). torch defines no derivative for any of them, so autodiff refuses them by name."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl.builder import user_source
from graphc.dsl.control_while import while_loop
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import cast, lift, scalar, unary, where
from graphc.dsl.ops_array import cos, sin
from graphc.dsl.ops_elementwise import acos
from graphc.dsl.ops_math import any as any_
from graphc.dsl.ops_math import isfinite, isnan
from graphc.dsl.ops_special import no_derivative
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

UNROLL = 32  # a static degree up to this is unrolled; beyond, the recurrence is a Loop
_HERMITE_LIMIT = {"float32": 128, "float64": 512}  # torch's: nan above (1024 for other dtypes)

# (y, P_{j-1}, P_j, j) -> P_{j+1} for j = 1, 2, ..., each with torch's order of operations
Step = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
# (x, n, result dtype) -> (where, value) pairs, the first that holds wins; the recurrence elsewhere
Edges = Callable[[Tensor, Tensor, str], list[tuple[Tensor, Tensor]]]


def _parity(n: Tensor, value: Tensor) -> Tensor:
    """``value`` for an even ``n``, ``-value`` for an odd one."""
    half = n * scalar(0.5, n)
    return where(unary("Floor", half) == half, value, -value)


def _degree(fn: str, n: Any) -> tuple[Tensor | None, int | None]:
    """``(n as a Tensor, None)`` or ``(None, n truncated)`` for a number (nan and +-inf: -1, as torch's cast)."""
    if isinstance(n, (Tensor, np.ndarray)):
        return lift(n), None
    if isinstance(n, (bool, int, float, np.number)):
        return None, int(n) if math.isfinite(n) else -1
    raise CaptureError(f"special.{fn} n: expected an int, a float or a Tensor, got {type(n).__name__} "
                       f"(at {user_source()})")


def _result_dtype(fn: str, tensors: list[Tensor]) -> str:
    """torch's result dtype: the floats' promotion (mixed: float32 at least), float32 without one."""
    for t in tensors:
        if t.dtype.startswith("complex"):
            raise CaptureError(f"special.{fn}: expected real Tensors, got {t.dtype} (at {user_source()})")
    floats = {t.dtype for t in tensors if t.dtype in FLOAT_DTYPES}
    if "float64" in floats:
        return "float64"
    return floats.pop() if len(floats) == 1 else "float32"


def _recurrence(y: Tensor, n: Tensor, handled: Tensor, first: Tensor, step: Step, static: int | None) -> Tensor:
    """``P_n(y)`` by ``step`` from ``P_0 = 1`` and ``P_1 = first``, where not ``handled`` (there ``n >= 2``)."""
    zero = where(isfinite(y), y * scalar(0, y), scalar(0, y)) + n * scalar(0, n)  # the broadcast shape
    p, q = zero + scalar(1, y), first + zero
    if static is not None and static <= UNROLL:
        for j in range(1, static):
            p, q = q, step(y, p, q, scalar(j, y))
        return q
    steps = where(handled, scalar(0, n), n) + zero

    def more(j: Tensor, p: Tensor, q: Tensor) -> Tensor:
        return any_((j < steps) & ~isnan(q))

    def body(j: Tensor, p: Tensor, q: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        active = j < steps
        return j + scalar(1, j), where(active, q, p), where(active, step(y, p, q, j), q)

    return while_loop(more, body, (scalar(1, y), p, q))[2]


def _polynomial(fn: str, input: Any, n: Any, first: Callable[[Tensor], Tensor], step: Step,  # noqa: A002
                edges: Edges, shifted: bool = False) -> Tensor:
    """torch.special's ``fn``: ``edges``, else ``P_0 = 1``, ``P_1 = first(y)``, then ``step`` (``y = 2 x - 1``
    where ``shifted``, else ``x``)."""
    x = lift(input)
    degree, static = _degree(fn, n)
    dtype = _result_dtype(fn, [x] if degree is None else [x, degree])
    x64 = cast(x, "float64") if x.dtype != "float64" else x
    if degree is None:
        n64 = scalar(static, x64)
    else:  # truncated toward 0; nan and +-inf as -1
        nf = cast(degree, "float64") if degree.dtype != "float64" else degree
        n64 = where(isfinite(nf), unary("Sign", nf) * unary("Floor", abs_(nf)), scalar(-1, nf))
    y = x64 + x64 - scalar(1, x64) if shifted else x64
    one = scalar(1, x64)
    p1 = first(y)
    cases = [(n64 < scalar(0, n64), scalar(0, x64)), *edges(x64, n64, dtype), (n64 == scalar(0, n64), one),
             (n64 == one, p1)]
    handled = cases[0][0]
    for mask, _ in cases[1:]:
        handled = handled | mask
    value = _recurrence(y, n64, handled, p1, step, static)
    for mask, v in reversed(cases):
        value = where(mask, v, value)
    return no_derivative(value if dtype == "float64" else cast(value, dtype), f"special.{fn}")


def _chebyshev_step(y: Tensor, p: Tensor, q: Tensor, j: Tensor) -> Tensor:
    return (y + y) * q - p


def _chebyshev(kind: str, shifted: bool) -> tuple[Callable[[Tensor], Tensor], Edges]:
    """``(P_1, edges)`` of Chebyshev's ``kind`` (T, U, V, W), shifted or not, as torch's."""
    above = 4 if shifted and kind == "W" else 6 if shifted or kind == "T" else 8

    def edges(x: Tensor, n: Tensor, dtype: str) -> list[tuple[Tensor, Tensor]]:
        one = scalar(1, x)
        y = x + x - one if shifted else x
        ends = (x == one, x == scalar(0, x)) if shifted else (x == one, x == -one)
        n1, n21 = n + one, n + n + one
        at_one, at_minus = {"T": (one, _parity(n, one)), "U": (n1, _parity(n, n1)), "V": (one, _parity(n, n21)),
                            "W": (n21, _parity(n, one))}[kind]
        inside = (n > scalar(above, n)) & (abs_(y) < one)
        theta = acos(where(inside, y, scalar(0, x)))
        half = theta * scalar(0.5, x)
        if kind == "T":
            trig = cos(n * theta)
        elif kind == "U":  # sin(theta) is not 0 inside (-1, 1)
            trig = sin(n1 * theta) / sin(theta)
        elif kind == "V":  # sin(theta / 2) rounds to 1 next to -1: torch's +-(2n + 1) there
            trig = where(sin(half) != one, cos((n + scalar(0.5, x)) * theta) / cos(half), _parity(n, n21))
        else:  # libm's cos(theta / 2) rounds to 1 for the one y above 1 - 2**-52: torch's end values there
            # (+-1 for the shifted W); decided on y, exactly, not by a backend's Acos and Cos at the tie
            end = _parity(n, one) if shifted else where(x > scalar(0, x), n21, _parity(n, one))
            trig = where(y > scalar(1 - 2.0**-52, x), end, sin((n + scalar(0.5, x)) * theta) / sin(half))
        return [(ends[0], at_one), (ends[1], at_minus), (inside, trig)]

    firsts = {"T": lambda y: y, "U": lambda y: y + y, "V": lambda y: y + y - scalar(1, y),
              "W": lambda y: y + y + scalar(1, y)}
    return firsts[kind], edges


def _chebyshev_fn(kind: str, shifted: bool) -> Callable[[Any, Any], Tensor]:
    name = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind.lower()}"
    first, edges = _chebyshev(kind, shifted)

    def polynomial(input: Any, n: Any) -> Tensor:  # noqa: A002 - torch's names
        return _polynomial(name, input, n, first, _chebyshev_step, edges, shifted)

    polynomial.__name__ = polynomial.__qualname__ = name
    polynomial.__doc__ = (f"Chebyshev's polynomial of the {kind} kind{', shifted to [0, 1],' if shifted else ''} "
                          f"of ``input`` and degree ``n`` (a number or a Tensor, broadcast), as torch's "
                          f"``special.{name}``.")
    return polynomial


chebyshev_polynomial_t = _chebyshev_fn("T", shifted=False)
chebyshev_polynomial_u = _chebyshev_fn("U", shifted=False)
chebyshev_polynomial_v = _chebyshev_fn("V", shifted=False)
chebyshev_polynomial_w = _chebyshev_fn("W", shifted=False)
shifted_chebyshev_polynomial_t = _chebyshev_fn("T", shifted=True)
shifted_chebyshev_polynomial_u = _chebyshev_fn("U", shifted=True)
shifted_chebyshev_polynomial_v = _chebyshev_fn("V", shifted=True)
shifted_chebyshev_polynomial_w = _chebyshev_fn("W", shifted=True)


def _hermite_limit(x: Tensor, n: Tensor, dtype: str) -> list[tuple[Tensor, Tensor]]:
    return [(n > scalar(_HERMITE_LIMIT.get(dtype, 1024), n), scalar(math.nan, x))]


def hermite_polynomial_h(input: Any, n: Any) -> Tensor:  # noqa: A002 - torch's names
    """The physicists' Hermite polynomial ``H_n``: ``H_{j+1} = 2x H_j - 2j H_{j-1}``; nan above degree 512
    (float32: 128), as torch."""
    return _polynomial("hermite_polynomial_h", input, n, lambda x: x + x,
                       lambda x, p, q, j: (x + x) * q - (j + j) * p, _hermite_limit)


def hermite_polynomial_he(input: Any, n: Any) -> Tensor:  # noqa: A002 - torch's names
    """The probabilists' Hermite polynomial ``He_n``: ``He_{j+1} = x He_j - j He_{j-1}``, as ``H``."""
    return _polynomial("hermite_polynomial_he", input, n, lambda x: x, lambda x, p, q, j: x * q - j * p,
                       _hermite_limit)


def laguerre_polynomial_l(input: Any, n: Any) -> Tensor:  # noqa: A002 - torch's names
    """Laguerre's polynomial ``L_n``: ``(j + 1) L_{j+1} = (2j + 1 - x) L_j - j L_{j-1}``; 1 at ``x = 0``."""
    return _polynomial("laguerre_polynomial_l", input, n, lambda x: scalar(1, x) - x,
                       lambda x, p, q, j: (((j + j) + (scalar(1, x) - x)) * q - j * p) / (j + scalar(1, x)),
                       lambda x, n, dtype: [(abs_(x) == scalar(0, x), scalar(1, x))])


def legendre_polynomial_p(input: Any, n: Any) -> Tensor:  # noqa: A002 - torch's names
    """Legendre's polynomial ``P_n``: ``(j + 1) P_{j+1} = (2j + 1) x P_j - j P_{j-1}``; +-1 at +-1."""
    def ends(x: Tensor, n: Tensor, dtype: str) -> list[tuple[Tensor, Tensor]]:
        one = scalar(1, x)
        return [(abs_(x) == one, where(x > scalar(0, x), one, _parity(n, one)))]

    return _polynomial("legendre_polynomial_p", input, n, lambda x: x,
                       lambda x, p, q, j: ((j + j + scalar(1, x)) * x * q - j * p) / (j + scalar(1, x)), ends)


__all__ = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
           "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p",
           "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
           "shifted_chebyshev_polynomial_w"]
