"""Symmetric eigendecomposition and SVD by Jacobi rotations (``gc.linalg.eigh``, ``eigvalsh``, ``svd``,
``svdvals``), for float32 and float64 batches with static matrix sizes. The pairs of each round of a
sweep are disjoint (a round-robin tournament), so one round is a single ``n x n`` rotation matrix
applied by MatMul; a fixed number of sweeps is unrolled, and ``gc.grad`` differentiates the rotations
(exact for distinct eigenvalues / singular values, as torch's)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import concat, constant, emit, lift, matmul, scalar, sqrt, unsqueeze, where
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_solve import eye_like, mask, matrix_dims, square_matrices
from graphc.dsl.ops_views import swap_last
from graphc.dsl.tensor import Tensor


class Eigh(NamedTuple):
    """``gc.linalg.eigh``'s result: ``eigenvalues`` ascending and ``eigenvectors`` in the columns."""

    eigenvalues: Tensor
    eigenvectors: Tensor


class SVD(NamedTuple):
    """``gc.linalg.svd``'s result: ``A = U @ diag(S) @ Vh``, ``S`` descending."""

    U: Tensor
    S: Tensor
    Vh: Tensor


def sweeps(n: int) -> int:
    """Jacobi sweeps unrolled for size ``n``: convergence is quadratic once the off-diagonal part is
    small; measured to float64 precision (1e-13) for random and clustered spectra up to n = 32."""
    return 6 + math.ceil(math.log2(max(n, 2)))


def _rounds(n: int) -> list[list[tuple[int, int]]]:
    """The rounds of a round-robin tournament of ``n`` players: every pair once, disjoint in a round."""
    players = list(range(n + n % 2))  # a bye (player n) for odd n
    out = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [tuple(sorted((players[i], players[-1 - i]))) for i in range(half)]
        if n > 1:
            out.append([p for p in pairs if p[1] < n])
        players = [players[0], players[-1], *players[1:-1]]
    return out


def _rotation(app: Tensor, aqq: Tensor, apq: Tensor, pairs: list[tuple[int, int]], n: int) -> Tensor:
    """The ``n x n`` rotation that zeroes entry (p, q) of each pair's symmetric 2 x 2 block
    ``[[app, apq], [apq, aqq]]`` (Golub and Van Loan's ``sym.schur2``; none where ``apq`` is 0)."""
    d = aqq - app  # t = tan(angle) = sign(d) 2 apq / (|d| + sqrt(d^2 + 4 apq^2)), no overflow as apq -> 0
    twice = apq * scalar(2, apq)
    den = abs_(d) + sqrt(d * d + twice * twice)
    zero = den == scalar(0, den)  # a 2 x 2 block that is already diagonal, equal entries
    sign = where(d >= scalar(0, d), scalar(1, d), scalar(-1, d))
    t = where(zero, scalar(0, d), sign * twice / where(zero, scalar(1, d), den))
    c = scalar(1, t) / sqrt(scalar(1, t) + t * t)
    s = t * c
    r = len(pairs)
    table = np.full((n, n), 3 * r + 1, np.int64)  # 0 off the rotated cells
    np.fill_diagonal(table, 3 * r)  # 1 on the other diagonal cells
    for i, (p, q) in enumerate(pairs):
        table[p, p] = table[q, q] = i
        table[p, q], table[q, p] = r + i, 2 * r + i
    one = reduce_sum(c * scalar(0, c), [-1], keepdims=True) + scalar(1, c)
    values = concat([c, s, -s, one, one - one], -1)
    return emit("Gather", [values, constant(table)], {"axis": values.ndim - 1})


def _diagonal(a: Tensor, n: int) -> Tensor:
    return reduce_sum(a * constant(np.eye(n, dtype=a.dtype.numpy)), [-1])


def _pair_entries(a: Tensor, pairs: list[tuple[int, int]], n: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(a_pp, a_qq, a_pq)`` of each pair, ``(..., pairs)``."""
    ps, qs = (np.asarray(ix, np.int64) for ix in zip(*pairs))
    diag = _diagonal(a, n)
    app, aqq = (emit("Gather", [diag, constant(ix)], {"axis": diag.ndim - 1}) for ix in (ps, qs))
    rows = emit("Gather", [a, constant(ps)], {"axis": a.ndim - 2})
    return app, aqq, reduce_sum(rows * constant(np.eye(n, dtype=a.dtype.numpy)[qs]), [-1])


def _jacobi_eigen(a: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Eigenvalues (unsorted) and eigenvectors of symmetric ``a``: ``J^T A J`` round by round."""
    v = eye_like(a, n)
    for _ in range(sweeps(n)):
        for pairs in _rounds(n):
            j = _rotation(*_pair_entries(a, pairs, n), pairs, n)
            a = matmul(matmul(swap_last(j), a), j)
            v = matmul(v, j)
    return _diagonal(a, n), v


def _order(values: Tensor, descending: bool) -> Tensor:
    """The indices that sort ``values`` along the last dim."""
    k = constant(np.asarray([values.shape[-1]], np.int64))
    return emit("TopK", [values, k], {"axis": values.ndim - 1, "largest": int(descending), "sorted": 1},
                num_outputs=2)[1]


def _columns(x: Tensor, order: Tensor) -> Tensor:
    """The columns of matrices ``x`` in ``order`` (``(..., n)``)."""
    rows, n = x.shape[-2], order.shape[-1]
    shape = concat([emit("Shape", [order], {"end": -1}), constant(np.asarray([rows, n]))], 0)
    spread = emit("Expand", [unsqueeze(order, [-2]), shape],
                  out_types=[("int64", (*order.shape[:-1], rows, n))])
    return emit("GatherElements", [x, spread], {"axis": x.ndim - 1})


MAX_JACOBI_N = 64  # eigh about 33,300 nodes for n = 64 (14,100 for 32), svd about 30,300 (13,100)


def _size_checked(fn: str, a: Tensor, size: int) -> None:
    if size > MAX_JACOBI_N:
        raise op_error(fn, [a], f"the Jacobi rotations are unrolled up to a matrix size of {MAX_JACOBI_N}, got "
                       f"{size}", user_source())


def _symmetric(fn: str, A: Any, UPLO: str) -> tuple[Tensor, int]:
    """``A`` made symmetric from its lower (``UPLO="L"``) or upper triangle, as torch reads it."""
    a, n = square_matrices(fn, A)
    _size_checked(fn, a, n)
    if UPLO not in ("L", "U"):
        raise op_error(fn, [a], f"UPLO must be 'L' or 'U', got {UPLO!r}", user_source())
    rows = np.arange(n)
    keep = rows[:, None] >= rows[None, :] if UPLO == "L" else rows[:, None] <= rows[None, :]
    return where(mask(keep), a, swap_last(a)), n


@autocast_op("linalg_eigh")
def eigh(A: Any, UPLO: str = "L") -> Eigh:
    """``torch.linalg.eigh``: eigenvalues ascending and orthonormal eigenvectors of the symmetric matrix
    read from ``A``'s ``UPLO`` triangle, by cyclic Jacobi (each eigenvector's sign is its own, as
    LAPACK's differs by routine)."""
    a, n = _symmetric("linalg.eigh", A, UPLO)
    values, vectors = _jacobi_eigen(a, n)
    order = _order(values, descending=False)
    return Eigh(emit("GatherElements", [values, order], {"axis": values.ndim - 1}), _columns(vectors, order))


@autocast_op("linalg_eigvalsh")
def eigvalsh(A: Any, UPLO: str = "L") -> Tensor:
    """``torch.linalg.eigvalsh``: ``eigh``'s eigenvalues."""
    return eigh(A, UPLO).eigenvalues


def _one_sided(a: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """One-sided Jacobi on the ``n`` columns of ``a``: ``(A V, V)`` with the columns of ``A V`` orthogonal."""
    v = eye_like(a, n)
    for _ in range(sweeps(n)):
        for pairs in _rounds(n):
            ps, qs = (constant(np.asarray(ix, np.int64)) for ix in zip(*pairs))
            cp, cq = (emit("Gather", [a, ix], {"axis": a.ndim - 1}) for ix in (ps, qs))
            app, aqq, apq = (reduce_sum(x * y, [-2]) for x, y in ((cp, cp), (cq, cq), (cp, cq)))
            j = _rotation(app, aqq, apq, pairs, n)
            a = matmul(a, j)
            v = matmul(v, j)
    return a, v


@autocast_op("linalg_svd")
def svd(A: Any, full_matrices: bool = True, *, driver: str | None = None) -> SVD:
    """``torch.linalg.svd`` by one-sided Jacobi: ``U`` ``m x k``, ``S`` descending, ``Vh`` ``k x n`` with
    ``k = min(m, n)``; ``full_matrices`` completes ``U`` or ``Vh`` for square matrices only (there is
    nothing to complete). Singular vectors' signs are their own; a zero singular value's ``U`` column
    is 0. ``driver`` is accepted and ignored."""
    fn = "linalg.svd"
    a = lift(A)
    m, n = matrix_dims(fn, a, "A")
    _size_checked(fn, a, min(m, n))
    if full_matrices and m != n:
        raise op_error(fn, [a], f"full_matrices=True needs square matrices here, got {m} x {n}; pass "
                       "full_matrices=False", user_source())
    tall = m >= n
    work, v = _one_sided(a if tall else swap_last(a), min(m, n))
    sigma = sqrt(reduce_sum(work * work, [-2]))
    order = _order(sigma, descending=True)
    sigma = emit("GatherElements", [sigma, order], {"axis": sigma.ndim - 1})
    work, v = _columns(work, order), _columns(v, order)
    zero = unsqueeze(sigma == scalar(0, sigma), [-2])
    u = where(zero, scalar(0, sigma), work / where(zero, scalar(1, sigma), unsqueeze(sigma, [-2])))
    return SVD(u, sigma, swap_last(v)) if tall else SVD(v, sigma, swap_last(u))


@autocast_op("linalg_svdvals")
def svdvals(A: Any, *, driver: str | None = None) -> Tensor:
    """``torch.linalg.svdvals``: the singular values, descending."""
    return svd(A, False).S


__all__ = ["MAX_JACOBI_N", "SVD", "Eigh", "eigh", "eigvalsh", "svd", "svdvals", "sweeps"]
