"""LAPACK's Householder representation of QR, unrolled over static matrix sizes: the reflectors
(``reflectors``, which ``gc.linalg.qr`` uses too), ``torch.geqrf``, ``torch.linalg.householder_product``
(``torch.orgqr``) and ``torch.ormqr``."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import concat, lift, matmul, scalar, sqrt, squeeze, where
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_solve import eye_like, mask, matrix_dims, pick
from graphc.dsl.ops_views import expand_as, narrow, swap_last
from graphc.dsl.tensor import Tensor


class Geqrf(NamedTuple):
    """``torch.geqrf``'s result: ``R`` on and above the diagonal, the reflectors below it, and ``tau``."""

    a: Tensor
    tau: Tensor


def reflectors(a: Tensor, m: int, n: int) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """``(R before zeroing below the diagonal, [(v, tau)])``: LAPACK geqrf's reflectors ``I - tau v v^T``
    (``v`` ``(..., m, 1)`` with ``v[k] = 1``, ``beta = -sign(alpha) * norm``, ``tau = 0`` where a column is
    already zero below the diagonal), one per column ``k < min(m - 1, n)``."""
    rows = np.arange(m)
    r, out = a, []
    for k in range(min(m - 1, n)):
        x = where(mask((rows >= k)[:, None]), pick(r, -1, k), scalar(0, a))
        alpha = pick(x, -2, k)
        below = reduce_sum(where(mask((rows > k)[:, None]), x * x, scalar(0, a)), [-2], keepdims=True)
        flat = below == scalar(0, a)
        size = sqrt(alpha * alpha + below)
        beta = where(alpha >= scalar(0, a), -size, size)
        tau = where(flat, scalar(0, a), (beta - alpha) / where(flat, scalar(1, a), beta))
        v = where(mask((rows == k)[:, None]), scalar(1, a), x / where(flat, scalar(1, a), alpha - beta))
        r = r - matmul(v * tau, matmul(swap_last(v), r))
        out.append((v, tau))
    return r, out


def _product(fn: str, v: Tensor, tau: Tensor, m: int) -> Tensor:
    """``H_1 ... H_k`` (``m x m``) from the reflectors stored below the diagonal of ``v``'s first ``k``
    columns (unit diagonal implied) and ``tau`` ``(..., k)``."""
    k = tau.shape[-1]
    if not isinstance(k, int) or k > min(m, v.shape[-1]):
        raise op_error(fn, [v, tau], f"tau must have at most min(rows, cols) = {min(m, v.shape[-1])} elements in its "
                       f"last dim, got {k}", user_source())
    rows = np.arange(m)
    q = eye_like(v, m)
    for i in range(k):
        col = where(mask((rows == i)[:, None]), scalar(1, v), where(mask((rows > i)[:, None]), pick(v, -1, i),
                                                                   scalar(0, v)))
        t = pick(tau, -1, i)[..., None]  # (..., 1, 1)
        q = q - matmul(matmul(q, col) * t, swap_last(col))
    return q


def _float_pair(fn: str, a: Any, tau: Any) -> tuple[Tensor, Tensor, int, int]:
    a = lift(a)
    m, n = matrix_dims(fn, a, "input")
    tau = lift(tau, a)
    if tau.dtype != a.dtype or tau.ndim != a.ndim - 1:
        raise op_error(fn, [a, tau], f"tau must be input's dtype {a.dtype} with one dim fewer (rank {a.ndim - 1}), "
                       f"got {tau.dtype} of rank {tau.ndim}", user_source())
    return a, tau, m, n


@autocast_op()
def geqrf(input: Any) -> Geqrf:  # noqa: A002 - torch's name
    """``torch.geqrf``: LAPACK's QR, ``(..., m, n)`` with static sizes; ``a`` holds ``R`` on and above the
    diagonal and the reflectors below it, ``tau`` ``(..., min(m, n))``. No gradient, as torch's."""
    a = lift(input)
    m, n = matrix_dims("geqrf", a, "input")
    r, refl = reflectors(a, m, n)
    packed = r
    for k, (v, _) in enumerate(refl):
        below = np.zeros((m, n), bool)
        below[k + 1:, k] = True
        packed = where(mask(below), v, packed)
    taus = [squeeze(t, [-1]) for _, t in refl]
    zero = expand_as(scalar(0, a), squeeze(pick(pick(a, -2, 0), -1, 0), [-1]))  # (..., 1)
    taus += [zero] * (min(m, n) - len(refl))
    return Geqrf(packed, concat(taus, -1))


@autocast_op("orgqr")
def householder_product(A: Any, tau: Any) -> Tensor:
    """``torch.linalg.householder_product`` (``torch.orgqr``): the first ``n`` columns of ``H_1 ... H_k``,
    ``H_i = I - tau_i v_i v_i^T`` with ``v_i`` below the diagonal of ``A``'s column ``i`` (``m >= n >= k``)."""
    fn = "linalg.householder_product"
    a, tau, m, n = _float_pair(fn, A, tau)
    if m < n:
        raise op_error(fn, [a], f"input must have at least as many rows as columns, got {m} x {n}", user_source())
    q = _product(fn, a, tau, m)
    return q if n == m else narrow(q, -1, 0, n)


orgqr = householder_product


@autocast_op()
def ormqr(input: Any, tau: Any, other: Any, left: bool = True, transpose: bool = False) -> Tensor:  # noqa: A002
    """``torch.ormqr``: ``other`` multiplied by ``Q = H_1 ... H_k`` from ``geqrf``'s reflectors in ``input``
    (``(..., m, k)`` for ``left``, ``(..., n, k)`` else): ``Q @ other`` (``Q^T`` if ``transpose``), or
    ``other @ Q`` for ``left=False``."""
    fn = "ormqr"
    a, tau, m, _ = _float_pair(fn, input, tau)
    c = lift(other, a)
    rows, cols = matrix_dims(fn, c, "other")
    if (rows if left else cols) != m:
        raise op_error(fn, [a, c], f"input's rows ({m}) must equal other's {'rows' if left else 'columns'} "
                       f"({rows if left else cols}) for left={left}", user_source())
    q = _product(fn, a, tau, m)
    q = swap_last(q) if transpose else q
    return matmul(q, c) if left else matmul(c, q)
