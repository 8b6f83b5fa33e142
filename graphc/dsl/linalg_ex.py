"""torch.linalg's ``*_ex`` forms: ``inv_ex``, ``cholesky_ex``, ``solve_ex`` and ``lu_factor_ex``, each the
result of the plain function and LAPACK's int32 ``info`` per matrix: 0, or the 1-based step whose
pivot is exactly zero (LU), or whose leading minor is not positive-definite (Cholesky: a diagonal
entry not > 0, NaN included). ``check_errors=True`` raises at capture where the eager values show a
failure; a graph cannot raise at run time, so there it reads as ``check_errors=False``."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import cast, concat, const_i64, constant, emit, scalar, squeeze, where
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_solve import cholesky, entry, eye_like, lu_solve_perm, lu_steps, pick, solve, square_matrices
from graphc.dsl.ops_views import swap_last
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError


class InvEx(NamedTuple):
    inverse: Tensor
    info: Tensor


class CholeskyEx(NamedTuple):
    L: Tensor
    info: Tensor


class SolveEx(NamedTuple):
    result: Tensor
    info: Tensor


class LUFactorEx(NamedTuple):
    LU: Tensor
    pivots: Tensor
    info: Tensor


def first_failure(failed: list[Tensor]) -> Tensor:
    """int32 ``(...)``: the 1-based index of the first true of the ``(..., 1, 1)`` flags, else 0."""
    steps = concat([squeeze(f, [f.ndim - 1]) for f in failed], -1)  # (..., n) bool
    n = len(failed)
    ranked = where(steps, constant(np.arange(n, 0, -1, dtype=np.int64)), constant(np.int64(0)))
    top = reduce_max(ranked, [-1])  # n + 1 - the first failing step, or 0
    return cast(where(top > scalar(0, top), scalar(n + 1, top) - top, top), "int32")


def checked_info(fn: str, info: Tensor, check_errors: bool, what: str) -> Tensor:
    """``info``, refused at capture when ``check_errors`` and its eager value shows a failure."""
    value = info.eager_value
    if check_errors and value is not None and np.any(value):
        raise CaptureError(f"{fn}: {what} (info {int(np.ravel(value)[np.flatnonzero(np.ravel(value))[0]])}) "
                           f"(at {user_source()})")
    return info


def _lu_info(packed: Tensor, n: int) -> Tensor:
    return first_failure([entry(packed, k, k) == scalar(0, packed) for k in range(n)])


@autocast_op("linalg_inv_ex")
def inv_ex(A: Any, *, check_errors: bool = False) -> InvEx:
    """``torch.linalg.inv_ex``: ``(inverse, info)``; ``info`` the first zero pivot of the LU."""
    a, n = square_matrices("linalg.inv_ex", A)
    packed, perm, _ = lu_steps(a, n)
    info = checked_info("linalg.inv_ex", _lu_info(packed, n), check_errors, "A is singular")
    return InvEx(lu_solve_perm(packed, perm, eye_like(a, n), n), info)


def solve_ex(A: Any, B: Any, *, left: bool = True, check_errors: bool = False) -> SolveEx:
    """``torch.linalg.solve_ex``: ``(result, info)``, ``result`` as ``gc.linalg.solve``'s."""
    a, n = square_matrices("linalg.solve_ex", A)
    packed, _, _ = lu_steps(a, n)  # torch's info is A's LU's, left or not
    info = checked_info("linalg.solve_ex", _lu_info(packed, n), check_errors, "A is singular")
    return SolveEx(solve(a, B, left=left), info)


def lu_factor_ex(A: Any, *, pivot: bool = True, check_errors: bool = False) -> LUFactorEx:
    """``torch.linalg.lu_factor_ex``: ``(LU, pivots, info)`` of square ``A``."""
    a, n = square_matrices("linalg.lu_factor_ex", A)
    if not pivot:
        raise op_error("linalg.lu_factor_ex", [a], "pivot=False is not supported (torch has it on CUDA only)",
                       user_source())
    packed, _, pivots = lu_steps(a, n)
    info = checked_info("linalg.lu_factor_ex", _lu_info(packed, n), check_errors, "U is singular")
    return LUFactorEx(packed, cast(concat(pivots, -1) + scalar(1, pivots[0]), "int32"), info)


@autocast_op("linalg_cholesky_ex")
def cholesky_ex(A: Any, *, upper: bool = False, check_errors: bool = False) -> CholeskyEx:
    """``torch.linalg.cholesky_ex``: ``(L, info)``; ``info`` the first step whose pivot (``A``'s diagonal
    entry less the squares of the row so far) is not > 0."""
    a, n = square_matrices("linalg.cholesky_ex", A)
    factor = cholesky(a, upper=upper)
    low = swap_last(factor) if upper else factor
    tri = swap_last(a) if upper else a  # the triangle read, as the lower one
    failed = []
    for k in range(n):  # the pivot of step k: A[k, k] - sum_{j<k} L[k, j]^2
        pivot = entry(tri, k, k)
        if k:
            head = emit("Slice", [pick(low, -2, k), const_i64([0]), const_i64([k]), const_i64([-1])])
            pivot = pivot - reduce_sum(head * head, [-1], keepdims=True)
        failed.append(~(pivot > scalar(0, pivot)))
    info = checked_info("linalg.cholesky_ex", first_failure(failed), check_errors, "A is not positive-definite")
    return CholeskyEx(factor, info)


__all__ = ["CholeskyEx", "InvEx", "LUFactorEx", "SolveEx", "cholesky_ex", "inv_ex", "lu_factor_ex", "solve_ex"]
