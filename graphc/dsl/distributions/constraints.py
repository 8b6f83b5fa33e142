"""``gc.distributions.constraints``: torch's constraints that transforms and ``biject_to``/``transform_to`` use.
A ``Constraint`` is the ``(name, test)`` pair the families' ``support`` checks read (``test(values, dist)`` of a
constant's values), with torch's ``event_dim`` and ``is_discrete``; bounds may be numbers or Tensors (a Tensor
bound is tested only where it is a constant)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

import numpy as np

from graphc.dsl.distributions.base import fail, known
from graphc.dsl.tensor import Tensor


class Constraint(tuple):
    """A region of values: ``(name, test)``, ``event_dim`` (the rightmost dims one test reads together) and
    ``is_discrete``."""

    def __new__(cls, name: str, test: Callable, event_dim: int = 0, is_discrete: bool = False) -> Self:
        new = super().__new__(cls, (name, test))
        new.event_dim, new.is_discrete = event_dim, is_discrete
        return new

    name = property(lambda self: self[0])

    def check(self, value: Any) -> np.ndarray:
        """The test of ``value``'s (a constant's) values, one bool per event; torch's ``check``."""
        v = np.asarray(known(value) if isinstance(value, Tensor) else value)
        if isinstance(value, Tensor) and known(value) is None:
            raise fail("constraints.check", [value], "reads a constant's values only, got a run-time Tensor")
        with np.errstate(all="ignore"):
            ok = np.broadcast_to(self[1](v, None), v.shape)
        return np.all(ok, axis=tuple(range(-self.event_dim, 0))) if self.event_dim else ok

    def __repr__(self) -> str:
        return f"constraints.{self.name}"


def _bound(b: Any) -> Any:
    """A bound's values (None for a run-time Tensor, which is not tested)."""
    return known(b) if isinstance(b, Tensor) else b


def _against(op: Callable, *bounds: Any) -> Callable:
    def test(v: np.ndarray, d: Any) -> Any:
        values = [_bound(b) for b in bounds]
        return True if any(b is None for b in values) else op(v, *values)
    return test


class _Bounded(Constraint):
    """A constraint of ``lower_bound``/``upper_bound`` (either may be None)."""

    def __new__(cls, name: str, test: Callable, lower_bound: Any = None, upper_bound: Any = None) -> Self:
        new = super().__new__(cls, name, test)
        new.lower_bound, new.upper_bound = lower_bound, upper_bound
        return new


class GreaterThan(_Bounded):
    def __new__(cls, lower_bound: Any) -> Self:
        return super().__new__(cls, f"greater_than(lower_bound={lower_bound})",
                               _against(lambda v, lo: v > lo, lower_bound), lower_bound)


class GreaterThanEq(_Bounded):
    def __new__(cls, lower_bound: Any) -> Self:
        return super().__new__(cls, f"greater_than_eq(lower_bound={lower_bound})",
                               _against(lambda v, lo: v >= lo, lower_bound), lower_bound)


class LessThan(_Bounded):
    def __new__(cls, upper_bound: Any) -> Self:
        return super().__new__(cls, f"less_than(upper_bound={upper_bound})",
                               _against(lambda v, hi: v < hi, upper_bound), None, upper_bound)


class Interval(_Bounded):
    def __new__(cls, lower_bound: Any, upper_bound: Any) -> Self:
        return super().__new__(cls, f"interval(lower_bound={lower_bound}, upper_bound={upper_bound})",
                               _against(lambda v, lo, hi: (v >= lo) & (v <= hi), lower_bound, upper_bound),
                               lower_bound, upper_bound)


class HalfOpenInterval(_Bounded):
    def __new__(cls, lower_bound: Any, upper_bound: Any) -> Self:
        return super().__new__(cls, f"half_open_interval(lower_bound={lower_bound}, upper_bound={upper_bound})",
                               _against(lambda v, lo, hi: (v >= lo) & (v < hi), lower_bound, upper_bound),
                               lower_bound, upper_bound)


class IndependentConstraint(Constraint):
    """``independent(base_constraint, reinterpreted_batch_ndims)``: the base's test, over
    ``reinterpreted_batch_ndims`` more event dims."""

    def __new__(cls, base_constraint: Constraint, reinterpreted_batch_ndims: int) -> Self:
        if not isinstance(base_constraint, Constraint):
            raise fail("constraints.independent", [], f"base_constraint must be a gc.distributions.constraints "
                                                      f"Constraint, got {base_constraint!r}")
        n = reinterpreted_batch_ndims
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise fail("constraints.independent", [], f"reinterpreted_batch_ndims must be an int >= 0, got {n!r}")
        new = super().__new__(cls, f"independent({base_constraint.name}, {n})", base_constraint[1],
                              base_constraint.event_dim + n, base_constraint.is_discrete)
        new.base_constraint, new.reinterpreted_batch_ndims = base_constraint, n
        return new


def _simplex(v: np.ndarray, d: Any) -> Any:
    return np.all(v >= 0, -1, keepdims=True) & (np.abs(v.sum(-1, keepdims=True) - 1) < 1e-6)


def _lower_triangular(v: np.ndarray, d: Any) -> Any:
    return np.all(np.triu(v, 1) == 0, axis=(-2, -1), keepdims=True)


def _lower_cholesky(v: np.ndarray, d: Any) -> Any:
    diag = np.diagonal(v, 0, -2, -1)[..., None, :]
    return _lower_triangular(v, d) & np.all(diag > 0, axis=(-2, -1), keepdims=True)


def _corr_cholesky(v: np.ndarray, d: Any) -> Any:
    tol = np.finfo(v.dtype).eps * v.shape[-1] * 10  # torch's fudge factor
    unit_rows = np.all(np.abs(np.linalg.norm(v, axis=-1) - 1) <= tol, -1)[..., None, None]
    return _lower_cholesky(v, d) & unit_rows


def _positive_definite(v: np.ndarray, d: Any) -> Any:
    symmetric = np.all(np.isclose(v, np.swapaxes(v, -1, -2), atol=1e-6), axis=(-2, -1), keepdims=True)
    with np.errstate(all="ignore"):
        eig = np.linalg.eigvalsh(v) if v.shape[-1] else np.ones(v.shape[:-1])
    return symmetric & np.all(eig > 0, -1)[..., None, None]


independent = IndependentConstraint
greater_than, greater_than_eq, less_than = GreaterThan, GreaterThanEq, LessThan
interval, half_open_interval = Interval, HalfOpenInterval
real = Constraint("real", lambda v, d: ~np.isnan(v))
real_vector = independent(real, 1)
positive, nonnegative = greater_than(0.0), greater_than_eq(0.0)
unit_interval = interval(0.0, 1.0)
boolean = Constraint("boolean", lambda v, d: (v == 0) | (v == 1), is_discrete=True)
simplex = Constraint("simplex", _simplex, 1)
lower_triangular = Constraint("lower_triangular", _lower_triangular, 2)
lower_cholesky = Constraint("lower_cholesky", _lower_cholesky, 2)
corr_cholesky = Constraint("corr_cholesky", _corr_cholesky, 2)
positive_definite = Constraint("positive_definite", _positive_definite, 2)

# the names of the families' ``support`` pairs (graphc/dsl/distributions/base.py), read as these constraints
BY_NAME = {"real": real, "real_vector": real_vector, "positive": positive, "nonnegative": nonnegative,
           "unit_interval": unit_interval, "boolean": boolean, "simplex": simplex, "lower_cholesky": lower_cholesky,
           "positive_definite": positive_definite, "corr_cholesky": corr_cholesky}


def as_constraint(c: Any, fn: str) -> Constraint:
    """``c`` as a ``Constraint`` (a family's ``support`` pair by its name), else a CaptureError naming ``fn``."""
    if isinstance(c, Constraint):
        return c
    if isinstance(c, tuple) and len(c) == 2 and c[0] in BY_NAME:
        return BY_NAME[c[0]]
    raise fail(fn, [], f"constraint must be a gc.distributions.constraints Constraint, got {c!r}")


__all__ = ["Constraint", "GreaterThan", "GreaterThanEq", "HalfOpenInterval", "IndependentConstraint", "Interval",
           "LessThan", "as_constraint", "boolean", "greater_than", "greater_than_eq", "half_open_interval",
           "independent", "interval", "less_than", "lower_cholesky", "lower_triangular", "nonnegative", "positive",
           "positive_definite", "real", "real_vector", "simplex", "unit_interval"]
__all__ += ["corr_cholesky"]
