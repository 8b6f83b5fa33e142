"""torch's older top-level linear algebra (``torch.svd``, ``qr``, ``lu``, ``lu_solve``, ``pinverse``, ``nuclear_norm``,
``frobenius_norm``, ``norm_except_dim``, ``svd_lowrank``, ``pca_lowrank``) over ``gc.linalg``; ``torch.matrix_rank``'s
removal error."""

from __future__ import annotations

from typing import Any, NamedTuple

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.linalg import QR, matrix_norm, pinv
from graphc.dsl.linalg import qr as linalg_qr
from graphc.dsl.linalg_ex import lu_factor_ex
from graphc.dsl.ops import lift, mean
from graphc.dsl.ops_array import expand, zeros_like
from graphc.dsl.ops_eigen import svd as linalg_svd
from graphc.dsl.ops_math import norm
from graphc.dsl.ops_solve import lu_solve as linalg_lu_solve
from graphc.dsl.ops_solve import matrix_dims
from graphc.dsl.ops_views import narrow, swap_last
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES


class SVDV(NamedTuple):
    """``gc.svd``'s result, as ``torch.svd``'s: ``V``, not ``Vh``."""

    U: Tensor
    S: Tensor
    V: Tensor


def _zero_square(a: Tensor, dim: int) -> Tensor:
    """Zeros ``(..., k, k)`` with ``k = a.shape[dim]`` (``dim`` -2 or -1), ``a``'s batch and dtype."""
    k = a.shape[dim]
    edge = zeros_like(narrow(a, -1 if dim == -2 else -2, 0, 1))  # (..., k, 1) or (..., 1, k)
    return expand(edge, *([-1] * (a.ndim - 2)), k, k)


def svd(input: Any, some: bool = True, compute_uv: bool = True) -> SVDV:
    """``torch.svd``: ``A = U diag(S) V^T`` (``some`` False asks for the full ``U``, ``V``: square matrices
    only here); ``compute_uv`` False gives zero ``U`` ``(m, m)`` and ``V`` ``(n, n)``, as torch."""
    a = lift(input)
    matrix_dims("svd", a, "input")
    u, s, vh = linalg_svd(a, full_matrices=not some and compute_uv)
    if not compute_uv:
        return SVDV(_zero_square(a, -2), s, _zero_square(a, -1))
    return SVDV(u, s, swap_last(vh))


def qr(input: Any, some: bool = True) -> QR:
    """``torch.qr``: ``gc.linalg.qr`` with mode "reduced" (``some``) or "complete"."""
    return linalg_qr(input, "reduced" if some else "complete")


def lu(A: Any, pivot: bool = True, get_infos: bool = False) -> tuple[Tensor, ...]:
    """``torch.lu``: ``(A_LU, pivots)``, and the int32 ``infos`` when ``get_infos`` (square ``A`` only)."""
    packed, pivots, info = lu_factor_ex(A, pivot=pivot)
    return (packed, pivots, info) if get_infos else (packed, pivots)


def lu_solve(b: Any, LU_data: Any, LU_pivots: Any) -> Tensor:  # noqa: N803 - torch's names
    """``torch.lu_solve`` (deprecated in torch): ``gc.linalg.lu_solve(LU_data, LU_pivots, b)``."""
    return linalg_lu_solve(LU_data, LU_pivots, b)


def svd_lowrank(A: Any, q: int | None = 6, niter: int | None = 2, M: Any = None) -> SVDV:  # noqa: N803
    """``torch.svd_lowrank``: ``(U (..., m, q), S (..., q), V (..., n, q))`` of ``A - M``, its ``q`` largest
    singular triplets (``q``, None meaning 6 as torch's, cut to ``min(m, n)``), computed exactly: torch's
    randomized range finder (``niter`` power iterations, accepted and unused here) approximates these, so signs and
    an inexact low-rank tail may differ from torch's."""
    a = lift(A)
    a = a if M is None else a - lift(M, a)
    m, n = matrix_dims("svd_lowrank", a, "A")
    q = 6 if q is None else q
    if isinstance(q, bool) or not isinstance(q, int) or q < 0:
        raise CaptureError(f"svd_lowrank q={q!r} must be a non-negative int (at {user_source()})")
    q = min(q, m, n)
    u, s, v = svd(a)
    return SVDV(u[..., :q], s[..., :q], v[..., :q])


def pca_lowrank(A: Any, q: int | None = None, center: bool = True, niter: int = 2) -> SVDV:  # noqa: N803
    """``torch.pca_lowrank``: ``svd_lowrank`` of ``A`` less its column means (``center``); ``q`` defaults to
    ``min(6, m, n)`` and may not exceed ``min(m, n)``, as torch's."""
    a = lift(A)
    m, n = matrix_dims("pca_lowrank", a, "A")
    q = min(6, m, n) if q is None else q
    if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q <= min(m, n):
        raise CaptureError(f"pca_lowrank q={q!r} must be a non-negative int not greater than min(m, n)="
                           f"{min(m, n)} (at {user_source()})")
    return svd_lowrank(a - mean(a, -2, keepdims=True) if center else a, q, niter)


@autocast_op()
def pinverse(input: Any, rcond: float = 1e-15) -> Tensor:
    """``torch.pinverse``: ``gc.linalg.pinv`` cutting singular values below ``rcond`` times the largest."""
    return pinv(input, atol=0.0, rtol=rcond)


def matrix_rank(*args: Any, **kwargs: Any) -> Tensor:
    """``torch.matrix_rank`` was removed: it raises as torch's does, pointing at ``gc.linalg.matrix_rank``."""
    raise CaptureError("This function was deprecated since version 1.9 and is now removed. Please use the "
                       "`gc.linalg.matrix_rank` function instead. The parameter 'symmetric' was renamed in "
                       "`gc.linalg.matrix_rank()` to 'hermitian'.")


@autocast_op()
def nuclear_norm(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    """``torch.nuclear_norm(input, keepdim=False)`` over the last two dims, or ``(input, dim, keepdim)``."""
    if isinstance(dim, bool):  # the (input, keepdim) overload called positionally
        dim, keepdim = None, dim
    return matrix_norm(input, "nuc", (-2, -1) if dim is None else tuple(dim), keepdim)


def _float(fn: str, x: Any) -> Tensor:
    x = lift(x)
    if x.dtype not in FLOAT_DTYPES:
        raise op_error(fn, [x], f"input must be floating point, got {x.dtype}", user_source())
    return x


@autocast_op()
def frobenius_norm(input: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    """``torch.frobenius_norm(input, dim, keepdim=False)``: the 2-norm over at most two dims (``()``: all)."""
    x = _float("frobenius_norm", input)
    dims = [dim] if isinstance(dim, int) else list(dim)
    if len(dims) > 2:
        raise op_error("frobenius_norm", [x], f"dim: expected at most 2 dimensions, got {len(dims)}", user_source())
    return norm(x, 2, dims or None, keepdim)


def norm_except_dim(v: Any, pow: float = 2, dim: int = 0) -> Tensor:
    """``torch.norm_except_dim``: the ``pow``-norm over every dim but ``dim``, kept as size-1 dims (``dim``
    -1: the norm of all of ``v``, a scalar), as weight normalisation uses it."""
    x = _float("norm_except_dim", v)
    if dim == -1:
        return norm(x, pow)
    if not -x.ndim <= dim < x.ndim:
        raise op_error("norm_except_dim", [x], f"dim must be -1 or in [{-x.ndim}, {x.ndim}), got {dim}",
                       user_source())
    return norm(x, pow, [d for d in range(x.ndim) if d != dim % x.ndim], True)


__all__ = ["SVDV", "frobenius_norm", "lu", "matrix_rank", "norm_except_dim", "nuclear_norm", "pinverse", "qr",
           "svd"]
