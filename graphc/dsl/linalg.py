"""``gc.linalg``: torch.linalg's functions under its names. The solvers and factorizations come from
``ops_solve`` (unrolled over a static matrix size ``n``), the determinants, ``cross`` and ``diagonal``
from ``ops_linalg``; here are the Householder QR, ``lstsq`` through it, the norms, ``vecdot``,
``multi_dot``, ``tensorinv`` and ``tensorsolve``, and from ``ops_eigen``'s Jacobi ``eigh`` and ``svd``:
``pinv``, ``matrix_rank``, ``cond`` and the 2- and nuclear matrix norms."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import (cast, constant, lift, matmul, maximum, reshape, same_dtype, scalar, squeeze, stack,
                            unsqueeze, where)
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_linalg import det, slogdet
from graphc.dsl.ops_linalg import cross as _cross
from graphc.dsl.ops_linalg import diagonal as _diagonal
from graphc.dsl.ops_eigen import eigh, eigvalsh, svd, svdvals
from graphc.dsl.linalg_ex import cholesky_ex, inv_ex, lu_factor_ex, solve_ex
from graphc.dsl.linalg_householder import householder_product, reflectors
from graphc.dsl.linalg_ldl import ldl_factor, ldl_factor_ex, ldl_solve
from graphc.dsl.ops_array import static_dim
from graphc.dsl.ops_factories import powers
from graphc.dsl.ops_math import amax, amin
from graphc.dsl.ops_math import norm as _norm
from graphc.dsl.ops_solve import (cholesky, eye_like, inv, lu, lu_factor, lu_solve, mask, matrix_dims, matrix_exp,
                                  matrix_power, right_hand_side, solve, solve_triangular)
from graphc.dsl.ops_views import movedim, narrow, swap_last
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES


class QR(NamedTuple):
    """``gc.linalg.qr``'s result, as torch's."""

    Q: Tensor
    R: Tensor


class Lstsq(NamedTuple):
    """``gc.linalg.lstsq``'s result, as torch's default (CPU ``gelsy``) driver: ``residuals`` and
    ``singular_values`` empty, ``rank`` the number of columns (full rank is assumed)."""

    solution: Tensor
    residuals: Tensor
    rank: Tensor
    singular_values: Tensor


def _householder(a: Tensor, m: int, n: int) -> tuple[Tensor, Tensor]:
    """``(Q, R)`` with ``A = Q @ R``, ``Q`` ``m x m`` orthogonal and ``R`` ``m x n`` upper triangular, from
    LAPACK's reflectors (geqrf's ``beta = -sign(alpha) * norm``, none where a column is already zero
    below the diagonal), so the signs are torch's."""
    r, refl = reflectors(a, m, n)
    q = eye_like(a, m)
    for v, tau in refl:
        q = q - matmul(matmul(q, v) * tau, swap_last(v))
    upper = np.arange(m)[:, None] <= np.arange(n)[None, :]
    return q, where(mask(upper), r, scalar(0, a))


@autocast_op("linalg_qr")
def qr(A: Any, mode: str = "reduced") -> QR:
    """``torch.linalg.qr`` by Householder reflections, ``(..., m, n)`` with static ``m`` and ``n``:
    ``mode`` "reduced" (``Q`` ``m x k``, ``R`` ``k x n``, ``k = min(m, n)``), "complete" (``Q`` ``m x m``,
    ``R`` ``m x n``) or "r" (``R`` reduced, ``Q`` empty)."""
    a = lift(A)
    m, n = matrix_dims("linalg.qr", a, "A")
    if mode not in ("reduced", "complete", "r"):
        raise op_error("linalg.qr", [a], f"mode must be 'reduced', 'complete' or 'r', got {mode!r}", user_source())
    q, r = _householder(a, m, n)
    k = min(m, n)
    if mode == "complete":
        return QR(q, r)
    r = r if k == m else narrow(r, -2, 0, k)
    return QR(constant(np.zeros(0, a.dtype.numpy)) if mode == "r" else q if k == m else narrow(q, -1, 0, k), r)


@autocast_op("linalg_lstsq")
def lstsq(A: Any, B: Any, rcond: float | None = None, *, driver: str | None = None) -> Lstsq:
    """``torch.linalg.lstsq`` for full-rank ``(..., m, n)`` ``A`` with ``m >= n``: ``R^-1 Q^T B`` from the
    reduced QR (``rcond`` and ``driver`` are accepted and ignored: no rank is estimated)."""
    fn = "linalg.lstsq"
    a = lift(A)
    m, n = matrix_dims(fn, a, "A")
    if m < n:
        raise op_error(fn, [a], f"A must have at least as many rows as columns (full-rank least squares), got "
                       f"{m} x {n}", user_source())
    b = right_hand_side(fn, a, B, m)
    q, r = qr(a)
    x = solve_triangular(r, matmul(swap_last(q), b), upper=True)
    empty = constant(np.zeros(0, a.dtype.numpy))
    return Lstsq(x, empty, constant(np.asarray(n, np.int64)), empty)


# -- norms and products -----------------------------------------------------------------------


def _floating(fn: str, x: Any, dtype: Any) -> Tensor:
    x = lift(x)
    if x.dtype not in FLOAT_DTYPES:
        raise op_error(fn, [x], f"expects a floating-point input, got {x.dtype}", user_source())
    return x if dtype is None else cast(x, dtype)


@autocast_op("linalg_vector_norm")
def vector_norm(x: Any, ord: float = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                dtype: Any = None) -> Tensor:
    """``torch.linalg.vector_norm`` over ``dim`` (None: all): ``ord`` 2, 1, inf, -inf, 0 (the count of
    nonzeros) or any other number; the gradient at a zero vector is 0, as torch's."""
    return _norm(_floating("linalg.vector_norm", x, dtype), ord, dim, keepdim)


@autocast_op("linalg_matrix_norm")
def matrix_norm(A: Any, ord: Any = "fro", dim: tuple[int, int] = (-2, -1), keepdim: bool = False, *,  # noqa: A002
                dtype: Any = None) -> Tensor:
    """``torch.linalg.matrix_norm``: ``ord`` "fro", 1 / -1 (largest / smallest column sum of ``|A|``),
    inf / -inf (row sums), "nuc" / 2 / -2 (sum, largest, smallest singular value)."""
    fn = "linalg.matrix_norm"
    a = _floating(fn, A, dtype)
    if a.ndim < 2 or len(dim) != 2:
        raise op_error(fn, [a], f"takes a Tensor of rank >= 2 and two dims, got rank {a.ndim}, dim={dim}",
                       user_source())
    d0, d1 = (d % a.ndim if -a.ndim <= d < a.ndim else None for d in dim)
    if d0 is None or d1 is None or d0 == d1:
        raise op_error(fn, [a], f"dim must be two different dims of a rank-{a.ndim} Tensor, got {dim}",
                       user_source())
    if ord == "fro":
        return _norm(a, 2, [d0, d1], keepdim)
    if ord in ("nuc", 2, -2):
        s = svdvals(movedim(a, (d0, d1), (-2, -1)))
        out = reduce_sum(s, [-1]) if ord == "nuc" else (amax if ord == 2 else amin)(s, -1, False)
        return unsqueeze(out, sorted((d0, d1))) if keepdim else out
    if ord not in (1, -1, math.inf, -math.inf):
        raise op_error(fn, [a], f"ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got {ord!r}", user_source())
    summed, across = (d0, d1) if abs(ord) == 1 else (d1, d0)
    sums = reduce_sum(abs_(a), [summed], keepdims=True)
    out = (amax if ord > 0 else amin)(sums, across, True)
    return out if keepdim else squeeze(out, sorted((d0, d1)))


def norm(A: Any, ord: Any = None, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
         dtype: Any = None) -> Tensor:
    """``torch.linalg.norm``: a vector norm over one dim (or all, flattened, when ``ord`` and ``dim`` are
    None), a matrix norm over two; with ``ord`` and no ``dim``, ``A`` must be 1-D or 2-D."""
    a = lift(A)
    dims = (dim,) if isinstance(dim, int) else None if dim is None else tuple(dim)
    if dims is None:
        if ord is None:
            return vector_norm(a, 2, None, keepdim, dtype=dtype)
        if a.ndim not in (1, 2):
            raise op_error("linalg.norm", [a], f"with ord={ord!r} and no dim, A must be 1-D or 2-D, got rank "
                           f"{a.ndim}", user_source())
        dims = tuple(range(a.ndim))
    if len(dims) == 1:
        return vector_norm(a, 2 if ord is None else ord, dims, keepdim, dtype=dtype)
    return matrix_norm(a, "fro" if ord is None else ord, dims, keepdim, dtype=dtype)


@autocast_op("linalg_vecdot")
def vecdot(x: Any, y: Any, *, dim: int = -1) -> Tensor:
    """``torch.linalg.vecdot``: ``sum(x * y, dim)``, the operands broadcast (real: nothing to conjugate)."""
    a, b = lift(x), lift(y)
    same_dtype("Mul", a, b)
    return reduce_sum(a * b, [dim])


@autocast_op("linalg_multi_dot")
def multi_dot(tensors: Any) -> Tensor:
    """``torch.linalg.multi_dot``: the product of 2-D matrices from left to right; the first may be a
    1-D row and the last a 1-D column, whose dims leave the result (torch picks a cheaper order, with
    the same result up to rounding)."""
    ts = [lift(t) for t in tensors]
    if len(ts) < 2:
        raise op_error("linalg.multi_dot", ts, f"expects at least 2 tensors, got {len(ts)}", user_source())
    for i, t in enumerate(ts):
        ok = t.ndim == 2 or (t.ndim == 1 and i in (0, len(ts) - 1))
        if not ok:
            where_ = "the first and last" if t.ndim == 1 else "every"
            raise op_error("linalg.multi_dot", ts, f"tensor {i} must be 2-D (1-D only as {where_} one), got rank "
                           f"{t.ndim}", user_source())
    first, last = ts[0].ndim == 1, ts[-1].ndim == 1
    out = unsqueeze(ts[0], [0]) if first else ts[0]
    for t in ts[1:-1]:
        out = matmul(out, t)
    out = matmul(out, unsqueeze(ts[-1], [1]) if last else ts[-1])
    drop = ([0] if first else []) + ([1] if last else [])
    return squeeze(out, drop) if drop else out


@autocast_op("linalg_cross")
def cross(input: Any, other: Any, *, dim: int = -1) -> Tensor:  # noqa: A002
    """``torch.linalg.cross``: ``gc.cross`` along ``dim`` (default the last), operands of one rank."""
    return _cross(input, other, dim)


def diagonal(A: Any, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """``torch.linalg.diagonal``: ``gc.diagonal`` with the last two dims as default."""
    return _diagonal(A, offset, dim1, dim2)


def _tolerance(fn: str, a: Tensor, s: Tensor, atol: float | None, rtol: float | None) -> Tensor:
    """torch's cut-off for ``pinv`` and ``matrix_rank``: ``max(atol, rtol * largest |s|)`` with ``rtol``
    ``eps * max(m, n)`` when neither is given, 0 when only ``atol`` is (Python numbers only)."""
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not isinstance(value, (int, float)):
            raise op_error(fn, [a], f"{name} must be a Python number or None here, got {type(value).__name__}",
                           user_source())
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else float(np.finfo(a.dtype.numpy).eps) * max(a.shape[-2:])
    largest = amax(abs_(s), -1, True)
    return maximum(largest * scalar(rtol, s), scalar(0.0 if atol is None else atol, s))


def _spectrum(a: Tensor, hermitian: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(U, s, Vh)`` with ``A = U diag(s) Vh``: the SVD, or for ``hermitian`` the eigendecomposition."""
    if hermitian:
        w, v = eigh(a)
        return v, w, swap_last(v)
    return svd(a, full_matrices=False)


def pinv(A: Any, *, atol: float | None = None, rtol: float | None = None, hermitian: bool = False) -> Tensor:
    """``torch.linalg.pinv``: ``V diag(1/s) U^T`` over the singular values (eigenvalues when ``hermitian``)
    above torch's tolerance."""
    a = lift(A)
    matrix_dims("linalg.pinv", a, "A")
    u, s, vh = _spectrum(a, hermitian)
    keep = abs_(s) > _tolerance("linalg.pinv", a, s, atol, rtol)
    inverse = where(keep, scalar(1, s) / where(keep, s, scalar(1, s)), scalar(0, s))
    return matmul(swap_last(vh) * unsqueeze(inverse, [-2]), swap_last(u))


@autocast_op("linalg_matrix_rank")
def matrix_rank(A: Any, *, atol: float | None = None, rtol: float | None = None,
                hermitian: bool = False) -> Tensor:
    """``torch.linalg.matrix_rank``: the count (int64) of singular values (eigenvalues when ``hermitian``)
    above torch's tolerance."""
    a = lift(A)
    matrix_dims("linalg.matrix_rank", a, "A")
    s = _spectrum(a, hermitian)[1]
    return reduce_sum(cast(abs_(s) > _tolerance("linalg.matrix_rank", a, s, atol, rtol), "int64"), [-1])


@autocast_op("linalg_cond")
def cond(A: Any, p: Any = None) -> Tensor:
    """``torch.linalg.cond``: the ratio of the largest to the smallest singular value (``p`` None or 2;
    -2 the inverse), else ``matrix_norm(A, p) * matrix_norm(inv(A), p)`` (square ``A``)."""
    a = lift(A)
    if p in (None, 2, -2):
        s = svdvals(a)
        big, small = amax(s, -1, False), amin(s, -1, False)
        return big / small if p != -2 else small / big
    return matrix_norm(a, p) * matrix_norm(inv(a), p)


def _static_prod(fn: str, a: Tensor, dims: Any) -> int:
    if not all(isinstance(d, int) for d in dims):
        raise op_error(fn, [a], f"needs static dims, got {a.type_str()}", user_source())
    return int(np.prod(dims, dtype=np.int64))


@autocast_op("linalg_tensorinv")
def tensorinv(A: Any, ind: int = 2) -> Tensor:
    """``torch.linalg.tensorinv``: the inverse of ``A`` read as a matrix (its first ``ind`` dims the rows),
    with shape ``A.shape[ind:] + A.shape[:ind]``."""
    a = lift(A)
    if not isinstance(ind, int) or not 0 < ind < max(a.ndim, 1):
        raise op_error("linalg.tensorinv", [a], f"ind must be a positive int below the rank {a.ndim}, got {ind!r}",
                       user_source())
    rows, cols = a.shape[:ind], a.shape[ind:]
    matrix = reshape(a, [_static_prod("linalg.tensorinv", a, rows), _static_prod("linalg.tensorinv", a, cols)])
    return reshape(inv(matrix), [*cols, *rows])


@autocast_op("linalg_tensorsolve")
def tensorsolve(A: Any, B: Any, dims: Any = None) -> Tensor:
    """``torch.linalg.tensorsolve``: ``X`` with ``tensordot(A, X, X.ndim) = B`` (``dims`` of ``A`` moved last
    first), through ``solve`` on ``A`` read as a square matrix."""
    a, b = lift(A), lift(B, lift(A))
    if dims is not None:
        dims = [dims] if isinstance(dims, int) else list(dims)
        a = movedim(a, dims, list(range(a.ndim - len(dims), a.ndim)))
    x_shape = a.shape[b.ndim:]
    rows = _static_prod("linalg.tensorsolve", a, a.shape[:b.ndim])
    x = solve(reshape(a, [rows, _static_prod("linalg.tensorsolve", a, x_shape)]), reshape(b, [rows]))
    return reshape(x, list(x_shape))


def vander(x: Any, *, N: int | None = None) -> Tensor:  # noqa: N803 - torch's name
    """``torch.linalg.vander``: ``[*, n] -> [*, n, N]``, column ``j`` holding ``x ** j`` (``ops_factories.powers``);
    ``N`` (default ``n``, static) at least 2 and integer ``x`` giving int64, as torch's."""
    x = lift(x)
    if x.dtype not in FLOAT_DTYPES and (x.dtype == "bool" or not str(x.dtype).startswith(("int", "uint"))):
        raise op_error("Mul", [x], f"linalg.vander takes float or integer tensors, got {x.dtype}", user_source())
    n = N if N is not None else static_dim(x, -1, "linalg.vander") if x.ndim else 1
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise CaptureError(f"linalg.vander: N must be greater than 1, got {n!r} (at {user_source()})")
    return stack(powers(x if x.dtype in FLOAT_DTYPES else cast(x, "int64"), int(n)), -1)


__all__ = [
    "QR", "Lstsq", "cholesky", "cholesky_ex", "cond", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "inv_ex",
    "lstsq", "lu", "lu_factor", "lu_factor_ex", "lu_solve", "matrix_exp", "matrix_norm", "matrix_power", "matrix_rank",
    "multi_dot", "norm", "pinv", "qr", "slogdet", "solve", "solve_ex", "solve_triangular", "svd", "svdvals",
    "tensorinv", "tensorsolve", "vander", "vecdot", "vector_norm",
]
__all__ += ["ldl_factor", "ldl_factor_ex", "ldl_solve"]  # from linalg_ldl
__all__ += ["householder_product"]  # from linalg_householder
