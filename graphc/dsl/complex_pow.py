"""Complex powers: ``z ** w``, ``w ** z`` and ``gc.pow`` where the base or the exponent is complex
(``graphc.dsl.complex_ops``' real parts).

An integral real exponent is products of ``z`` (binary powering; the reciprocal for a negative one), so
``z ** 2`` is exact and differentiable at 0; exponent 0 gives 1, as torch's (``0 ** 0`` too). Any other
exponent is ``exp(w log z)`` on the principal branch (``log z = log|z| + i angle z``, the cut on the negative
real axis, as torch's ``std::pow``). The gradients are the real ops', torch's conjugate-Wirtinger ones."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from graphc.dsl import ops_array
from graphc.dsl.complex_math import log as complex_log
from graphc.dsl.complex_ops import div, either_kind, exp, mul, of_parts, operand
from graphc.dsl.tensor import ComplexTensor, Tensor

_MAX_INTEGRAL = 2 ** 31  # a larger integral exponent is exp(w log z), as a fractional one (no 60-product chains)


def log(z: Any) -> ComplexTensor:
    """The principal ``log z`` of a complex (or real) Tensor (``graphc.dsl.complex_math.log``)."""
    return complex_log(z if isinstance(z, ComplexTensor) else of_parts(z, None))


def _integral(exponent: Any) -> int | None:
    """``exponent`` as an int where it is a real Python or numpy number with an integral value, else None."""
    if isinstance(exponent, numbers.Real) and float(exponent).is_integer() and abs(float(exponent)) < _MAX_INTEGRAL:
        return int(exponent)
    return None


def _powered(z: ComplexTensor, n: int) -> ComplexTensor:
    """``z ** n`` by binary powering: about ``2 log2 |n|`` complex products."""
    result, square, k = None, z, abs(n)
    while k:
        if k & 1:
            result = square if result is None else mul(result, square)
        k >>= 1
        if k:
            square = mul(square, square)
    return div(1.0, result) if n < 0 else result


def _log_of(base: Any) -> Any:
    """``log(base)``: a complex Tensor, or a numpy complex for a number or array base."""
    if isinstance(base, (Tensor, ComplexTensor)):
        return log(base)
    return np.log(np.asarray(base, np.complex128))


def pow(input: Any, exponent: Any) -> ComplexTensor:  # noqa: A001,A002 - torch's names
    """``input ** exponent`` with either complex (Tensors or numbers): ``torch.pow`` on complex values."""
    n = _integral(exponent)
    if isinstance(input, ComplexTensor) and n is not None:
        if n == 0:
            re, _ = operand(input)
            return of_parts(ops_array.ones_like(re), None)
        return _powered(input, n)
    return exp(mul(exponent, _log_of(input)))


pow_any = either_kind(ops_array.pow, pow)

for _name, _method in {"__pow__": pow, "__rpow__": lambda a, b: pow(b, a), "pow": pow}.items():
    setattr(ComplexTensor, _name, _method)

__all__ = ["pow", "log"]
