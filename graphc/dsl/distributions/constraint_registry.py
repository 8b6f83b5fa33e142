"""``biject_to(constraint)`` and ``transform_to(constraint)``: torch's transforms from unconstrained reals onto a
constraint's region (``biject_to``'s bijective), for real, positive/nonnegative and the bounded constraints,
unit_interval, simplex, corr_cholesky, lower_cholesky, positive_definite and independent ones."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from graphc.dsl.distributions import constraints as c
from graphc.dsl.distributions.base import fail
from graphc.dsl.distributions.transform_base import (ComposeTransform, IndependentTransform, Transform,
                                                     identity_transform)
from graphc.dsl.distributions.transforms_corr import CorrCholeskyTransform
from graphc.dsl.distributions.transforms_elementwise import AffineTransform, ExpTransform, SigmoidTransform
from graphc.dsl.distributions.transforms_vector import (LowerCholeskyTransform, PositiveDefiniteTransform,
                                                        SoftmaxTransform, StickBreakingTransform)


def _interval(con: Any) -> Transform:
    lo, hi = con.lower_bound, con.upper_bound
    if isinstance(lo, numbers.Number) and lo == 0 and isinstance(hi, numbers.Number) and hi == 1:
        return SigmoidTransform()
    return ComposeTransform([SigmoidTransform(), AffineTransform(lo, hi - lo)])


# by constraint class, as torch's registry (so positive, a greater_than(0), maps as greater_than does)
_SHARED: dict[type | str, Callable[[Any], Transform]] = {
    c.GreaterThan: lambda con: ComposeTransform([ExpTransform(), AffineTransform(con.lower_bound, 1)]),
    c.GreaterThanEq: lambda con: ComposeTransform([ExpTransform(), AffineTransform(con.lower_bound, 1)]),
    c.LessThan: lambda con: ComposeTransform([ExpTransform(), AffineTransform(con.upper_bound, -1)]),
    c.Interval: _interval,
    c.HalfOpenInterval: _interval,
    "corr_cholesky": lambda con: CorrCholeskyTransform(),
}
_BIJECT = {**_SHARED, "simplex": lambda con: StickBreakingTransform()}
_TRANSFORM = {**_SHARED, "simplex": lambda con: SoftmaxTransform(),
              "lower_cholesky": lambda con: LowerCholeskyTransform(),
              "positive_definite": lambda con: PositiveDefiniteTransform()}


def _lookup(fn: str, table: dict, constraint: Any) -> Transform:
    con = c.as_constraint(constraint, fn)
    if isinstance(con, c.IndependentConstraint):
        return IndependentTransform(_lookup(fn, table, con.base_constraint), con.reinterpreted_batch_ndims)
    if con is c.real:
        return identity_transform
    rule = table.get(type(con)) or (table.get(con.name) if type(con) is c.Constraint else None)
    if rule is None:
        raise fail(fn, [], f"has no transform onto {con!r} (as torch's registry)")
    return rule(con)


def biject_to(constraint: Any) -> Transform:
    """A bijective transform from the reals onto ``constraint``, as ``torch.distributions.biject_to``."""
    return _lookup("biject_to", _BIJECT, constraint)


def transform_to(constraint: Any) -> Transform:
    """A transform from the reals onto ``constraint``, as ``torch.distributions.transform_to``."""
    return _lookup("transform_to", _TRANSFORM, constraint)


__all__ = ["biject_to", "transform_to"]
