"""Linear solvers and factorizations under torch's names (``gc.inverse``, ``gc.linalg.solve``,
``gc.linalg.lu_factor``, ``gc.linalg.solve_triangular``, ``gc.cholesky``, ``gc.linalg.matrix_power``, ...)
for float32 and float64 batches of ``n x n`` matrices, ``n`` static. Each is unrolled over the ``n`` pivot
steps into standard ONNX ops (Gather, ArgMax, GatherElements, Where, MatMul, Div, Sqrt), so ``gc.grad``
differentiates it like any other graph. A singular (or, for Cholesky, not positive-definite) matrix gives
inf/nan where torch raises."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import (binary, cast, clip, concat, constant, detach, emit, lift, log, matmul, reduction,
                            same_dtype, scalar, sqrt, squeeze, unsqueeze, where)
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops_views import swap_last
from graphc.dsl.tensor import Tensor

MAX_N = 128  # nodes grow as n (an inverse of n = 128 is about 6,200), the masks they use as n^3 bytes


class LUFactor(NamedTuple):
    """``gc.linalg.lu_factor``'s result: ``L`` below the diagonal (unit diagonal implied) and ``U`` on
    and above it, packed in ``LU``; ``pivots`` (int32, 1-based) the row swapped with each row, as LAPACK."""

    LU: Tensor
    pivots: Tensor


class PLU(NamedTuple):
    """``gc.linalg.lu`` and ``gc.lu_unpack``'s result: ``A = P @ L @ U``."""

    P: Tensor
    L: Tensor
    U: Tensor


class TriangularSolve(NamedTuple):
    """``gc.triangular_solve``'s result, as torch's."""

    solution: Tensor
    cloned_coefficient: Tensor


def square_matrices(fn: str, x: Any, name: str = "A") -> tuple[Tensor, int]:
    """``x`` checked to be float32/float64 ``(..., n, n)`` matrices with ``n`` static and at most
    ``MAX_N``; returns it and ``n``. Errors name ``fn`` and the argument ``name``."""
    x = lift(x)
    n = matrix_dims(fn, x, name)[1]
    if x.shape[-2] != n:
        raise op_error(fn, [x], f"{name} must be batches of square matrices, got {x.shape[-2]} x {n}", user_source())
    return x, n


def matrix_dims(fn: str, x: Tensor, name: str) -> tuple[int, int]:
    """The static ``(rows, cols)`` of float32/float64 matrices ``x`` (rank >= 2), both at most ``MAX_N``."""
    if x.dtype not in ("float32", "float64"):
        raise op_error(fn, [x], f"{name} must be float32 or float64, got {x.dtype}", user_source())
    if x.ndim < 2:
        raise op_error(fn, [x], f"{name} must be (..., rows, cols) matrices, got rank {x.ndim}", user_source())
    rows, cols = x.shape[-2:]
    if not isinstance(rows, int) or not isinstance(cols, int):
        raise op_error(fn, [x], f"{name}'s matrix size must be static (the steps are unrolled at capture), got "
                       f"{rows} x {cols}", user_source())
    if max(rows, cols) > MAX_N:
        raise op_error(fn, [x], f"{name}'s matrix size {rows} x {cols} is above the unrolled limit {MAX_N}",
                       user_source())
    return rows, cols


def right_hand_side(fn: str, a: Tensor, b: Any, n: int, name: str = "B") -> Tensor:
    """``b`` checked to be ``(..., n, k)`` matrices of ``a``'s dtype."""
    b = lift(b, a)
    same_dtype(fn, a, b)
    if b.ndim < 2:
        raise op_error(fn, [a, b], f"{name} must be (..., n, k) matrices, got rank {b.ndim}", user_source())
    if b.shape[-2] != n:
        raise op_error(fn, [a, b], f"{name} must have n = {n} rows, as A, got {b.shape[-2]}", user_source())
    return b


def pick(x: Tensor, axis: int, k: int) -> Tensor:
    """Row (``axis=-2``) or column (``axis=-1``) ``k`` of matrices ``x``, the dim kept (size 1)."""
    return emit("Gather", [x, constant(np.asarray([k], np.int64))], {"axis": x.ndim + axis})


def entry(x: Tensor, i: int, j: int) -> Tensor:
    """``x[..., i:i+1, j:j+1]``."""
    return pick(pick(x, -2, i), -1, j)


def mask(cells: np.ndarray) -> Tensor:
    return constant(np.asarray(cells, bool))


def eye_like(x: Tensor, n: int) -> Tensor:
    """The ``n x n`` identity, broadcast to ``x``'s batch dims (read at run time)."""
    eye = constant(np.eye(n, dtype=x.dtype.numpy))
    if x.ndim == 2:
        return eye
    batch = emit("Shape", [x], {"end": -2})
    shape = concat([batch, constant(np.asarray([n, n], np.int64))], 0)
    return emit("Expand", [eye, shape], out_types=[(x.dtype, (*x.shape[:-2], n, n))])


def _index(k: Any) -> Tensor:
    return constant(np.asarray(k, np.int64))


def _swap(at: Tensor, k: int, p: Tensor) -> Tensor:
    """``at`` (0 .. n-1) with entries ``k`` and ``p`` (``(..., 1)``) exchanged."""
    return where(at == _index(k), p, where(at == p, _index(k), at))


def lu_steps(a: Tensor, n: int) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Gaussian elimination with partial pivoting, as LAPACK's getrf: the packed ``LU``, the row order
    ``perm`` (int64 ``(..., n)``: ``A[perm] = L @ U``) and the 0-based pivot of each step (``(..., 1)``)."""
    rows = np.arange(n)
    at = constant(rows)
    perm: Tensor | None = None
    pivots = []
    for k in range(n):
        if k < n - 1:  # the largest |entry| on or below the diagonal, the first of equals
            col = squeeze(pick(a, -1, k), [a.ndim - 1])
            p = emit("ArgMax", [where(mask(rows >= k), abs_(col), scalar(-1, col))], {"axis": -1, "keepdims": 1})
            order = _swap(at, k, p)
            spread = emit("Expand", [unsqueeze(order, [-1]), emit("Shape", [a])], out_types=[("int64", a.shape)])
            a = emit("GatherElements", [a, spread], {"axis": a.ndim - 2})
            perm = order if perm is None else emit("GatherElements", [perm, order], {"axis": perm.ndim - 1})
        else:  # the last row pivots on itself
            p = emit("Expand", [_index([k]), concat([emit("Shape", [a], {"end": -2}), _index([1])], 0)],
                     out_types=[("int64", (*a.shape[:-2], 1))])
        pivots.append(p)
        if k == n - 1:
            break
        pivot = entry(a, k, k)
        safe = where(pivot == scalar(0, pivot), scalar(1, pivot), pivot)  # LAPACK skips a zero column
        below = mask((rows > k)[:, None])
        lower = where(below, binary("Div", pick(a, -1, k), safe), scalar(0, a))
        upper = where(mask((rows > k)[None, :]), pick(a, -2, k), scalar(0, a))
        a = where(mask((rows[:, None] > k) & (rows[None, :] == k)), lower, a - matmul(lower, upper))
    if perm is None:
        perm = at
    return a, perm, pivots


def permutation_rows(perm: Tensor, n: int, dtype: Any) -> Tensor:
    """The matrix ``Pm`` with ``Pm @ X = X[perm]`` (``Pm[i, j] = perm[i] == j``)."""
    return cast(unsqueeze(perm, [-1]) == constant(np.arange(n)), dtype)


def substitute(t: Tensor, b: Tensor, n: int, lower: bool, unit: bool = False) -> Tensor:
    """``X`` with ``T @ X = B`` for triangular ``T`` (only its ``lower`` or upper triangle read; its
    diagonal taken as ones when ``unit``): forward or back substitution, one column of ``T`` a step."""
    rows = np.arange(n)
    x = b
    for j in range(n) if lower else range(n - 1, -1, -1):
        xj = pick(x, -2, j)
        if not unit:
            xj = binary("Div", xj, entry(t, j, j))
        later = rows > j if lower else rows < j
        if later.any():
            col = where(mask(later[:, None]), pick(t, -1, j), scalar(0, t))
            x = x - matmul(col, xj)
        if not unit:
            x = where(mask((rows == j)[:, None]), xj, x)
    return x


def lu_solve_perm(lu: Tensor, perm: Tensor, b: Tensor, n: int, adjoint: bool = False) -> Tensor:
    """``X`` with ``A @ X = B`` (``A^T @ X = B`` when ``adjoint``) from ``A[perm] = L @ U`` packed in ``lu``."""
    pm = permutation_rows(perm, n, b.dtype)
    if adjoint:  # U^T L^T Pm X = B
        z = substitute(swap_last(lu), b, n, lower=True)
        return matmul(swap_last(pm), substitute(swap_last(lu), z, n, lower=False, unit=True))
    y = substitute(lu, matmul(pm, b), n, lower=True, unit=True)
    return substitute(lu, y, n, lower=False)


# -- LU ---------------------------------------------------------------------------------------


def lu_factor(A: Any, *, pivot: bool = True) -> LUFactor:
    """``torch.linalg.lu_factor``: the packed ``LU`` and LAPACK's 1-based int32 ``pivots`` of square ``A``
    (torch takes rectangular ones too; graphc only square)."""
    a, n = square_matrices("linalg.lu_factor", A)
    _pivoting("linalg.lu_factor", a, pivot)
    lu, _, pivots = lu_steps(a, n)
    return LUFactor(lu, cast(concat(pivots, -1) + _index(1), "int32"))


def _pivoting(fn: str, a: Tensor, pivot: bool) -> None:
    if not pivot:
        raise op_error(fn, [a], "pivot=False is not supported (torch has it on CUDA only)", user_source())


def lu(A: Any, *, pivot: bool = True) -> PLU:
    """``torch.linalg.lu``: ``(P, L, U)`` with ``A = P @ L @ U``, square ``A`` only."""
    a, n = square_matrices("linalg.lu", A)
    _pivoting("linalg.lu", a, pivot)
    packed, perm, _ = lu_steps(a, n)
    return PLU(swap_last(permutation_rows(perm, n, a.dtype)), *_unpacked(packed, n))


def _unpacked(packed: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(L, U)`` of a packed ``LU``: ones on ``L``'s diagonal, zeros in the other triangles."""
    rows = np.arange(n)
    eye = constant(np.eye(n, dtype=packed.dtype.numpy))
    lower = where(mask(rows[:, None] > rows[None, :]), packed, eye)
    return lower, where(mask(rows[:, None] <= rows[None, :]), packed, scalar(0, packed))


def _perm_of_pivots(fn: str, a: Tensor, pivots: Any, n: int) -> Tensor:
    """The row order ``perm`` of LAPACK's 1-based ``pivots`` (``(..., n)`` int32), swap by swap."""
    piv = lift(pivots)
    if piv.dtype not in ("int32", "int64") or piv.ndim < 1 or piv.shape[-1] != n:
        raise op_error(fn, [a, piv], f"pivots must be int32 (..., {n}), got {piv.type_str()}", user_source())
    piv = cast(piv, "int64") - _index(1)
    at = constant(np.arange(n))
    perm = None
    for k in range(n - 1):
        order = _swap(at, k, pick(piv, -1, k))
        perm = order if perm is None else emit("GatherElements", [perm, order], {"axis": perm.ndim - 1})
    return at if perm is None else perm


def lu_unpack(LU_data: Any, LU_pivots: Any, unpack_data: bool = True, unpack_pivots: bool = True) -> PLU:
    """``torch.lu_unpack``: ``(P, L, U)`` of ``lu_factor``'s result (square only); a part not unpacked is
    an empty Tensor, as torch's."""
    a, n = square_matrices("lu_unpack", LU_data, "LU_data")
    empty = constant(np.zeros(0, a.dtype.numpy))
    p = swap_last(permutation_rows(_perm_of_pivots("lu_unpack", a, LU_pivots, n), n, a.dtype)) \
        if unpack_pivots else empty
    return PLU(p, *(_unpacked(a, n) if unpack_data else (empty, empty)))


def lu_solve(LU: Any, pivots: Any, B: Any, *, left: bool = True, adjoint: bool = False) -> Tensor:
    """``torch.linalg.lu_solve``: ``X`` with ``A @ X = B`` from ``lu_factor(A)``; ``adjoint`` solves with
    ``A^T``, ``left=False`` solves ``X @ A = B``."""
    fn = "linalg.lu_solve"
    a, n = square_matrices(fn, LU, "LU")
    perm = _perm_of_pivots(fn, a, pivots, n)
    if left:
        return lu_solve_perm(a, perm, right_hand_side(fn, a, B, n), n, adjoint)
    b = lift(B, a)
    same_dtype(fn, a, b)
    if b.ndim < 2 or b.shape[-1] != n:
        raise op_error(fn, [a, b], f"with left=False, B must be (..., k, {n}) matrices, got {b.type_str()}",
                       user_source())
    return swap_last(lu_solve_perm(a, perm, swap_last(b), n, not adjoint))


# -- solve and inverse ------------------------------------------------------------------------


@autocast_op("linalg_solve")
def solve(A: Any, B: Any, *, left: bool = True) -> Tensor:
    """``torch.linalg.solve``: ``X`` with ``A @ X = B`` (``X @ A = B`` when not ``left``), by LU with
    partial pivoting; ``B`` a batch of vectors ``(..., n)`` when it has one dim less than ``A`` (or is 1-D),
    else ``(..., n, k)``; batch dims broadcast."""
    fn = "linalg.solve"
    a, n = square_matrices(fn, A)
    b = lift(B, a)
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    if vector:
        b = unsqueeze(b, [-1] if left else [-2])
    if not left:
        a, b = swap_last(a), swap_last(b)
    b = right_hand_side(fn, a, b, n)
    packed, perm, _ = lu_steps(a, n)
    x = lu_solve_perm(packed, perm, b, n)
    x = x if left else swap_last(x)
    return squeeze(x, [x.ndim - 1 if left else x.ndim - 2]) if vector else x


@autocast_op("linalg_inv")
def inv(A: Any) -> Tensor:
    """``torch.linalg.inv`` / ``torch.inverse``: ``solve(A, I)``."""
    a, n = square_matrices("linalg.inv", A)
    packed, perm, _ = lu_steps(a, n)
    return lu_solve_perm(packed, perm, eye_like(a, n), n)


@autocast_op()
def inverse(input: Any) -> Tensor:  # noqa: A002
    """``torch.inverse``: ``gc.linalg.inv``."""
    return inv(input)


def matrix_power(A: Any, n: int) -> Tensor:
    """``torch.linalg.matrix_power``: ``A`` multiplied by itself ``n`` times by repeated squaring (the
    identity for 0, powers of the inverse for ``n < 0``)."""
    fn = "linalg.matrix_power"
    a, size = square_matrices(fn, A)
    if not isinstance(n, int) or isinstance(n, bool):
        raise op_error(fn, [a], f"n must be a Python int, got {n!r}", user_source())
    if n < 0:
        a, n = inv(a), -n
    out = None
    while n:
        if n & 1:
            out = a if out is None else matmul(out, a)
        n >>= 1
        if n:
            a = matmul(a, a)
    return eye_like(a, size) if out is None else out


# Higham (2005)'s degree-13 Pade coefficients and the 1-norm up to which it needs no squaring
_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
           10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0)
_THETA13 = 5.371920351148152
MAX_SQUARINGS = 40  # exact for 1-norms up to 5.4 * 2**40; each squaring is one MatMul whether used or not


def matrix_exp(A: Any) -> Tensor:
    """``torch.linalg.matrix_exp``: scaling and squaring with Higham's degree-13 Pade approximant. The
    number of squarings ``s`` comes from each matrix's 1-norm at run time; the graph holds
    ``MAX_SQUARINGS`` masked squarings, of which each matrix takes its first ``s``."""
    a, n = square_matrices("linalg.matrix_exp", A)
    norm = detach(reduction("ReduceMax", reduction("ReduceSum", abs_(a), -2, True), -1, True))
    steps = emit("Ceil", [log(binary("Div", norm, scalar(_THETA13, a))) / scalar(np.log(2.0), a)])
    steps = clip(steps, scalar(0, a), scalar(MAX_SQUARINGS, a))  # log(0) = -inf: no squaring
    a = a * binary("Pow", scalar(2.0, a), -steps)
    eye = constant(np.eye(n, dtype=a.dtype.numpy))
    a2 = matmul(a, a)
    a4 = matmul(a2, a2)
    a6 = matmul(a4, a2)

    def terms(c: tuple[float, ...]) -> Tensor:  # c[0] A^6 + c[1] A^4 + c[2] A^2 (+ c[3] I)
        out = a6 * scalar(c[0], a) + a4 * scalar(c[1], a) + a2 * scalar(c[2], a)
        return out + eye * scalar(c[3], a) if len(c) > 3 else out

    b = _PADE13
    u = matmul(a, matmul(a6, terms(b[13:8:-2])) + terms(b[7::-2][:4]))
    v = matmul(a6, terms(b[12:7:-2])) + terms(b[6::-2])
    packed, perm, _ = lu_steps(v - u, n)
    x = lu_solve_perm(packed, perm, u + v, n)
    for i in range(MAX_SQUARINGS):  # X @ X for the first ``steps``, I @ X after (no overflow from unused squarings)
        x = matmul(where(steps > scalar(i, a), x, eye), x)
    return x


# -- triangular systems -----------------------------------------------------------------------


def solve_triangular(A: Any, B: Any, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> Tensor:
    """``torch.linalg.solve_triangular``: ``X`` with ``A @ X = B`` (``X @ A = B`` when not ``left``), reading
    only ``A``'s ``upper`` or lower triangle (and not its diagonal when ``unitriangular``)."""
    fn = "linalg.solve_triangular"
    a, n = square_matrices(fn, A)
    if left:
        return substitute(a, right_hand_side(fn, a, B, n), n, not upper, unitriangular)
    b = right_hand_side(fn, a, swap_last(lift(B, a)), n)
    return swap_last(substitute(swap_last(a), b, n, upper, unitriangular))


@autocast_op()
def triangular_solve(b: Any, A: Any, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> TriangularSolve:
    """``torch.triangular_solve`` (deprecated there): ``(X, A)`` with ``A @ X = b`` (``A^T @ X = b`` when
    ``transpose``)."""
    fn = "triangular_solve"
    a, n = square_matrices(fn, A)
    rhs = right_hand_side(fn, a, b, n, "b")
    t, lower = (swap_last(a), upper) if transpose else (a, not upper)
    return TriangularSolve(substitute(t, rhs, n, lower, unitriangular), emit("Identity", [a]))


# -- Cholesky ---------------------------------------------------------------------------------


def cholesky_lower(a: Tensor, n: int) -> Tensor:
    """``L`` with ``L @ L^T = A`` from ``A``'s lower triangle, a column a step (nan where ``A`` is not
    positive-definite)."""
    rows = np.arange(n)
    for k in range(n):
        col = where(mask((rows >= k)[:, None]), binary("Div", pick(a, -1, k), sqrt(entry(a, k, k))), scalar(0, a))
        a = where(mask((rows == k)[None, :]), col, a - matmul(col, swap_last(col)))
    return where(mask(rows[:, None] >= rows[None, :]), a, scalar(0, a))


@autocast_op()
def cholesky(A: Any, upper: bool = False) -> Tensor:
    """``torch.linalg.cholesky`` (and the old ``torch.cholesky``): lower ``L`` with ``A = L @ L^T`` from
    ``A``'s lower triangle, or upper ``U = L^T`` from its upper triangle."""
    a, n = square_matrices("linalg.cholesky", A)
    return swap_last(cholesky_lower(swap_last(a), n)) if upper else cholesky_lower(a, n)


def _factor(fn: str, L: Any, upper: bool) -> tuple[Tensor, int]:
    """The lower Cholesky factor given as ``L`` (lower, or upper when ``upper``) and ``n``."""
    f, n = square_matrices(fn, L, "L")
    rows = np.arange(n)
    f = swap_last(f) if upper else f
    return where(mask(rows[:, None] >= rows[None, :]), f, scalar(0, f)), n


@autocast_op()
def cholesky_solve(B: Any, L: Any, upper: bool = False) -> Tensor:
    """``torch.cholesky_solve``: ``X`` with ``L @ L^T @ X = B`` (``U^T @ U`` when ``upper``)."""
    low, n = _factor("cholesky_solve", L, upper)
    b = right_hand_side("cholesky_solve", low, B, n)
    return substitute(swap_last(low), substitute(low, b, n, lower=True), n, lower=False)


@autocast_op()
def cholesky_inverse(L: Any, upper: bool = False) -> Tensor:
    """``torch.cholesky_inverse``: the inverse of ``L @ L^T`` (``U^T @ U`` when ``upper``)."""
    low, n = _factor("cholesky_inverse", L, upper)
    return substitute(swap_last(low), substitute(low, eye_like(low, n), n, lower=True), n, lower=False)


__all__ = [
    "MAX_N", "MAX_SQUARINGS", "PLU", "LUFactor", "TriangularSolve", "cholesky", "cholesky_inverse", "cholesky_lower",
    "cholesky_solve", "entry", "eye_like", "inv", "inverse", "lu", "lu_factor", "lu_solve", "lu_solve_perm",
    "lu_steps", "lu_unpack", "mask", "matrix_dims", "matrix_exp", "matrix_power", "permutation_rows", "pick",
    "right_hand_side", "solve", "solve_triangular", "square_matrices", "substitute", "triangular_solve",
]
