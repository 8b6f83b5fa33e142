"""``gc.linalg.ldl_factor``, ``ldl_factor_ex`` and ``ldl_solve``: LAPACK's real ``sytrf``/``sytrs`` (lower)
as torch's, Bunch-Kaufman diagonal pivoting with 1x1 and 2x2 blocks of ``D``, unrolled over the static
``n``. Which positions start a 2x2 block differs from matrix to matrix, so each position ``k`` computes
both a 1x1 step and a 2x2 step (at ``k, k + 1``) and picks per matrix; a position that is a block's
second does nothing. ``LD`` holds ``L`` below the diagonal (LAPACK's product form: a step's interchange
moves only the trailing block, not earlier columns) and ``D`` on it, a 2x2 block's off-diagonal entry
at ``LD[k + 1, k]``; ``pivots`` (int32, 1-based) is ``ipiv``: ``p > 0`` a 1x1 block after swapping rows
and columns ``k`` and ``p``, ``-p`` twice a 2x2 block after swapping ``k + 1`` and ``p``. Only ``A``'s
lower triangle is read. torch has no derivative for either; ``gc.grad`` differentiates the unrolled
steps (the pivot choices held)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.linalg_ex import checked_info, first_failure
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import (cast, concat, const_i64, constant, emit, lift, matmul, maximum, scalar, squeeze,
                            unsqueeze, where)
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops_math import isnan
from graphc.dsl.ops_solve import entry, pick, right_hand_side, square_matrices
from graphc.dsl.ops_views import swap_last
from graphc.dsl.tensor import Tensor

ALPHA = (1 + math.sqrt(17.0)) / 8  # sytf2's growth bound for choosing a 1x1 pivot


class LDLFactor(NamedTuple):
    LD: Tensor
    pivots: Tensor


class LDLFactorEx(NamedTuple):
    LD: Tensor
    pivots: Tensor
    info: Tensor


def _safe(x: Tensor) -> Tensor:
    """``x`` with exact zeros made ones: a divisor of the branch not taken (no inf, no nan gradient)."""
    return where(x == scalar(0, x), scalar(1, x), x)


def _index(k: Any) -> Tensor:
    return constant(np.asarray(k, np.int64))


def _order(n: int, i: Tensor, j: Tensor) -> Tensor:
    """int64 ``(..., n)``: ``0 .. n-1`` with entries ``i`` and ``j`` (``(..., 1)``) exchanged."""
    at = _index(np.arange(n))
    return where(at == i, j, where(at == j, i, at))


def _gathered(a: Tensor, index: Tensor, axis: int) -> Tensor:
    spread = emit("Expand", [index, emit("Shape", [a])], out_types=[("int64", a.shape)])
    return emit("GatherElements", [a, spread], {"axis": a.ndim + axis})


def _step(a: Tensor, k: int, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """sytf2's step at position ``k`` of the symmetric (trailing-block) working matrix ``a``: the matrix
    after it, whether it takes a 2x2 block (bool ``(..., 1, 1)``), its signed 1-based pivot (int64
    ``(..., 1)``) and whether column ``k`` is exactly zero or nan (``info``; no update then)."""
    rows = np.arange(n)
    akk = entry(a, k, k)
    absakk = abs_(akk)
    one = scalar(1, a)
    if k == n - 1:  # the last position: a 1x1 block, nothing to update
        zero = (absakk == scalar(0, a)) | isnan(absakk)
        last = emit("Expand", [_index([k + 1]), concat([emit("Shape", [a], {"end": -2}), const_i64([1])], 0)],
                    out_types=[("int64", (*a.shape[:-2], 1))])
        return a, zero & ~zero, last, zero
    below = where(constant((rows > k)[:, None]), abs_(pick(a, -1, k)), scalar(-1, a))
    imax = emit("ArgMax", [below], {"axis": a.ndim - 2, "keepdims": 1})  # (..., 1, 1), the first of equals
    colmax = reduce_max(below, [-2], keepdims=True)
    row = emit("GatherElements", [a, emit("Expand", [imax, concat([emit("Shape", [a], {"end": -2}),
                                                                      const_i64([1, n])], 0)],
                                          out_types=[("int64", (*a.shape[:-2], 1, n))])], {"axis": a.ndim - 2})
    others = constant((rows >= k)[None, :]) & ~(_index(rows) == imax)
    rowmax = reduce_max(where(others, abs_(row), scalar(0, a)), [-1], keepdims=True)
    aii = emit("GatherElements", [row, imax], {"axis": a.ndim - 1})
    alpha = scalar(ALPHA, a)
    zero = (maximum(absakk, colmax) == scalar(0, a)) | isnan(absakk)
    keep = zero | (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / _safe(rowmax)))
    two = ~(keep | (abs_(aii) >= alpha * rowmax))
    kp = squeeze(where(keep, _index([[k]]), imax), [-1])  # (..., 1)
    kk = squeeze(where(two, _index([[k + 1]]), _index([[k]])), [-1])
    order = _order(n, kk, kp)
    swapped = _gathered(_gathered(a, unsqueeze(order, [-1]), -2), unsqueeze(order, [-2]), -1)
    trailing = (rows[:, None] >= k) & (rows[None, :] >= k)
    b = where(constant(trailing), swapped, a)
    # 1x1: A[i, j] -= x[i] * (x[j] / d) below and right of k, column k scaled by 1 / d (dsyr, dscal)
    x = where(constant((rows > k)[:, None]), pick(b, -1, k), scalar(0, a))
    lk = x * (one / _safe(entry(b, k, k)))
    col_k = constant((rows > k)[:, None] & (rows == k)[None, :])
    step1 = where(col_k, lk, b - matmul(x, swap_last(lk)))
    # 2x2 at k, k + 1: sytf2's W = [A[:, k], A[:, k + 1]] @ inv(D) by its formulas, A -= [A[:, k], A[:, k + 1]] @ W^T
    step2 = b
    if k < n - 2:
        d21 = _safe(entry(b, k + 1, k))
        d11, d22 = entry(b, k + 1, k + 1) / d21, entry(b, k, k) / d21
        d21 = (one / _safe(d11 * d22 - one)) / d21
        later = constant((rows > k + 1)[:, None])
        c0 = where(later, pick(b, -1, k), scalar(0, a))
        c1 = where(later, pick(b, -1, k + 1), scalar(0, a))
        wk, wkp1 = d21 * (d11 * c0 - c1), d21 * (d22 * c1 - c0)
        update = b - matmul(concat([c0, c1], -1), swap_last(concat([wk, wkp1], -1)))
        step2 = where(constant((rows > k + 1)[:, None] & (rows == k)[None, :]), wk,
                      where(constant((rows > k + 1)[:, None] & (rows == k + 1)[None, :]), wkp1, update))
    out = where(zero, a, where(two, step2, step1))
    out = where(constant(rows[:, None] >= rows[None, :]), out, swap_last(out))  # the lower triangle's, as LAPACK reads
    pivot = kp + _index(1)
    return out, two, where(squeeze(two, [-1]), -pivot, pivot), zero


def _factor(fn: str, A: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(LD, pivots, info)``, ``info`` the first position whose column is exactly zero (or nan)."""
    a, n = square_matrices(fn, A)
    rows = np.arange(n)
    lower = constant(rows[:, None] >= rows[None, :])
    a = where(lower, a, swap_last(a))  # symmetric from the lower triangle
    pivots, failed = [], []
    second = None  # (..., 1, 1): position k is the second of a 2x2 block
    for k in range(n):
        after, two, pivot, zero = _step(a, k, n)
        if second is None:
            a, first = after, two
            pivots.append(pivot)
            failed.append(zero)
        else:
            a = where(second, a, after)
            pivots.append(where(squeeze(second, [-1]), pivots[-1], pivot))
            failed.append(zero & ~second)
            first = two & ~second
        second = first
    ld = where(lower, a, scalar(0, a))
    return ld, cast(concat(pivots, -1), "int32"), first_failure(failed)


def ldl_factor_ex(A: Any, *, hermitian: bool = False, check_errors: bool = False) -> LDLFactorEx:
    """``torch.linalg.ldl_factor_ex``: ``(LD, pivots, info)``; ``info`` LAPACK's: the first 1-based
    position whose ``D`` entry is exactly zero, else 0. ``hermitian`` changes nothing for real ``A``."""
    ld, pivots, info = _factor("linalg.ldl_factor_ex", A)
    return LDLFactorEx(ld, pivots, checked_info("linalg.ldl_factor_ex", info, check_errors, "D is singular"))


def ldl_factor(A: Any, *, hermitian: bool = False) -> LDLFactor:
    """``torch.linalg.ldl_factor``: ``(LD, pivots)`` of the symmetric ``A`` (its lower triangle read)."""
    ld, pivots, _ = _factor("linalg.ldl_factor", A)
    return LDLFactor(ld, pivots)


def _blocks(fn: str, ld: Tensor, pivots: Any, n: int) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Per position of ``pivots``: whether it starts a 2x2 block and whether it is one's second (bool
    ``(..., 1, 1)``), and the rows its interchange swaps (int64 ``(..., 1)``; equal when none)."""
    piv = lift(pivots)
    if piv.dtype not in ("int32", "int64") or piv.ndim < 1 or piv.shape[-1] != n:
        raise op_error(fn, [ld, piv], f"pivots must be int32 (..., {n}), got {piv.type_str()}", user_source())
    piv = cast(piv, "int64")
    out, first = [], None
    for k in range(n):
        p = pick(piv, -1, k)  # (..., 1)
        neg = p < _index(0)
        second = neg & first if first is not None else neg & ~neg
        first = neg & ~second
        kp = where(second, _index([k]), where(neg, -p, p) - _index(1))
        kk = where(first, _index([k + 1]), _index([k]))
        out.append((unsqueeze(first, [-1]), unsqueeze(second, [-1]), kk, kp))
    return out


def _swap_rows(b: Tensor, n: int, kk: Tensor, kp: Tensor) -> Tensor:
    pm = cast(unsqueeze(_order(n, kk, kp), [-1]) == _index(np.arange(n)), b.dtype)
    return matmul(pm, b)


def _column(ld: Tensor, k: int, n: int, first: Tensor) -> Tensor:
    """``L``'s column ``k`` below the diagonal (``(..., n, 1)``), without row ``k + 1`` where ``k`` starts
    a 2x2 block (that entry is ``D``'s)."""
    rows = np.arange(n)[:, None]
    col = pick(ld, -1, k)
    return where(constant(rows > k + 1), col, where(constant(rows == k + 1) & ~first, col, scalar(0, ld)))


def _solve_d(ld: Tensor, b: Tensor, n: int, blocks: list) -> Tensor:
    """``inv(D) @ b``, each 2x2 block by sytrs's formulas."""
    one = scalar(1, ld)
    out = []
    for k, (first, second, _, _) in enumerate(blocks):
        bk = pick(b, -2, k)
        row = bk / _safe(entry(ld, k, k))
        for j, flag in ((k, first), (k - 1, second)):  # the block at j, j + 1
            if 0 <= j < n - 1:
                e = _safe(entry(ld, j + 1, j))
                akm1, ak = entry(ld, j, j) / e, entry(ld, j + 1, j + 1) / e
                denom = _safe(akm1 * ak - one)
                bkm1, bkp = pick(b, -2, j) / e, pick(b, -2, j + 1) / e
                row = where(flag, (ak * bkm1 - bkp) / denom if j == k else (akm1 * bkp - bkm1) / denom, row)
        out.append(row)
    return concat(out, -2)


def ldl_solve(LD: Any, pivots: Any, B: Any, *, hermitian: bool = False) -> Tensor:
    """``torch.linalg.ldl_solve``: ``X`` with ``A @ X = B`` from ``ldl_factor(A)``, as LAPACK's sytrs;
    batch dims broadcast."""
    fn = "linalg.ldl_solve"
    ld, n = square_matrices(fn, LD, "LD")
    blocks = _blocks(fn, ld, pivots, n)
    b = right_hand_side(fn, ld, B, n)
    rows = np.arange(n)[:, None]
    for k, (first, _, kk, kp) in enumerate(blocks):  # L @ Y = P-interleaved B
        b = _swap_rows(b, n, kk, kp)
        b = b - matmul(_column(ld, k, n, first), pick(b, -2, k))
    b = _solve_d(ld, b, n, blocks)
    for k in range(n - 1, -1, -1):  # L^T, the interchanges undone in reverse
        first, _, kk, kp = blocks[k]
        b = where(constant(rows == k), b - matmul(swap_last(_column(ld, k, n, first)), b), b)
        b = _swap_rows(b, n, kk, kp)
    return b


__all__ = ["ALPHA", "LDLFactor", "LDLFactorEx", "ldl_factor", "ldl_factor_ex", "ldl_solve"]
