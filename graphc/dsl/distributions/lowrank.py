"""``torch.distributions.LowRankMultivariateNormal(loc, cov_factor, cov_diag)``: covariance
``W @ W^T + diag(D)`` (``W`` ``(..., n, m)``, ``n`` and ``m`` static), its determinant and inverse through the
``m x m`` capacitance ``C = I + W^T D^-1 W`` (its Cholesky factor by ``gc.linalg.cholesky``): the matrix
determinant lemma and the Woodbury identity, as torch's."""

from __future__ import annotations

import math
from functools import reduce
from typing import Any

import numpy as np

from graphc.dsl.distributions.base import POSITIVE, REAL, Distribution, check, fail
from graphc.dsl.distributions.mvn import REAL_VECTOR, half_log_det, mahalanobis
from graphc.dsl.ops import cast, constant, log, matmul, sqrt
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_factories import promote_types
from graphc.dsl.ops_linalg import diag_embed
from graphc.dsl.ops_reshape import broadcast_tensors, squeeze, unsqueeze
from graphc.dsl.ops_sample import randn_like
from graphc.dsl.ops_solve import cholesky, eye_like, solve_triangular
from graphc.dsl.ops_views import swap_last
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES, as_dtype, to_numpy
from graphc.passes.infer import InferenceError, broadcast


def _lifted(**values: Any) -> list[Tensor]:
    """The values in one float dtype (the float Tensors' promoted, float32 if none is one)."""
    dtypes = [v.dtype for v in values.values() if isinstance(v, Tensor) and v.dtype in FLOAT_DTYPES]
    dtype = reduce(promote_types, dtypes) if dtypes else as_dtype("float32")
    return [cast(v, dtype) if isinstance(v, Tensor) and v.dtype != dtype else v if isinstance(v, Tensor)
            else constant(np.asarray(v, to_numpy(dtype))) for v in values.values()]


def _static(t: Tensor, name: str, rank: int, what: str) -> None:
    if t.ndim < rank or not all(isinstance(d, int) for d in t.shape[t.ndim - rank:]):
        raise fail("LowRankMultivariateNormal", [t], f"{name} must be {what} (static sizes), got {t.type_str()}")


def capacitance_tril(w: Tensor, d: Tensor) -> Tensor:
    """The lower Cholesky factor of ``I + W^T diag(D)^-1 W``."""
    k = matmul(swap_last(w) / unsqueeze(d, -2), w)
    return cholesky(k + eye_like(k, k.shape[-1]))


def lowrank_logdet(w: Tensor, d: Tensor, c: Tensor) -> Tensor:
    """``log|W W^T + D|`` by the matrix determinant lemma: ``log|C| + log|D|``."""
    return 2.0 * half_log_det(c) + sum_(log(d), axis=-1)


def lowrank_mahalanobis(w: Tensor, d: Tensor, x: Tensor, c: Tensor) -> Tensor:
    """``x^T (W W^T + D)^-1 x`` by the Woodbury identity."""
    wt_dinv_x = squeeze(matmul(swap_last(w) / unsqueeze(d, -2), unsqueeze(x, -1)), -1)
    return sum_(x * x / d, axis=-1) - mahalanobis(c, wt_dinv_x)


def trace_xxt(x: Tensor) -> Tensor:
    """``trace(X X^T)`` of each matrix."""
    return sum_(x * x, axis=[-2, -1])


class LowRankMultivariateNormal(Distribution):
    """``LowRankMultivariateNormal(loc, cov_factor, cov_diag)``: event shape ``(n,)``, batch shape the three's
    broadcast; ``cov_factor`` ``(..., n, m)``, ``cov_diag`` ``(..., n)`` positive."""

    has_rsample, support = True, REAL_VECTOR
    _unexpanded = ("_w", "_d", "_capacitance_tril")  # kept unbroadcast, as torch's

    def __init__(self, loc: Any, cov_factor: Any, cov_diag: Any, validate_args: bool | None = None):
        loc, w, d = _lifted(loc=loc, cov_factor=cov_factor, cov_diag=cov_diag)
        _static(loc, "loc", 1, "at least one-dimensional")
        n = loc.shape[-1]
        _static(w, "cov_factor", 2, f"a batch of {n} x m matrices (n = loc's last dim)")
        if w.shape[-2] != n:
            raise fail("LowRankMultivariateNormal", [loc, w], f"cov_factor must be a batch of {n} x m matrices (n = "
                                                              f"loc's last dim), got {w.type_str()}")
        if d.ndim < 1 or d.shape[-1] != n:
            raise fail("LowRankMultivariateNormal", [loc, d], f"cov_diag must be a batch of vectors of size {n} (loc's "
                                                              f"last dim), got {d.type_str()}")
        try:
            broadcast(loc.shape[:-1], w.shape[:-2], d.shape[:-1])
        except InferenceError as exc:
            raise fail("LowRankMultivariateNormal", [loc, w, d], f"the batch dims of loc {loc.type_str()}, cov_factor "
                                                                 f"{w.type_str()} and cov_diag {d.type_str()} do not "
                                                                 f"broadcast: {exc}") from None
        super().__init__((), (n,), validate_args)
        if self._validate_args:
            for name, t in (("loc", loc), ("cov_factor", w)):
                check("LowRankMultivariateNormal", name, t, REAL)
            check("LowRankMultivariateNormal", "cov_diag", d, POSITIVE)
        loc_, self.cov_factor, d_ = broadcast_tensors(unsqueeze(loc, -1), w, unsqueeze(d, -1))
        self.loc, self.cov_diag = loc_[..., 0], d_[..., 0]
        self._batch_shape = tuple(self.loc.shape[:-1])
        self._w, self._d = w, d
        self._capacitance_tril = capacitance_tril(w, d)

    def _batched(self, t: Tensor, event_rank: int) -> Tensor:
        """``t`` broadcast to the batch shape (plus its ``event_rank`` last dims)."""
        like = self.loc[..., 0] if event_rank == 0 else unsqueeze(self.loc, -1) if event_rank == 2 else self.loc
        return broadcast_tensors(t, like)[0]

    mean = mode = property(lambda self: self.loc)
    variance = property(lambda self: self._batched(sum_(self._w * self._w, axis=-1) + self._d, 1))

    @property
    def scale_tril(self) -> Tensor:
        """``sqrt(D) * cholesky(I + D^-1/2 W W^T D^-1/2)``, the ``n x n`` factor torch builds."""
        sqrt_d = unsqueeze(sqrt(self._d), -1)
        scaled = self._w / sqrt_d
        k = matmul(scaled, swap_last(scaled))
        return self._batched(sqrt_d * cholesky(k + eye_like(k, k.shape[-1])), 2)

    @property
    def covariance_matrix(self) -> Tensor:
        return self._batched(matmul(self._w, swap_last(self._w)) + diag_embed(self._d), 2)

    @property
    def precision_matrix(self) -> Tensor:
        """``D^-1 - A^T A`` with ``A = C^-1 W^T D^-1`` (Woodbury)."""
        a = solve_triangular(self._capacitance_tril, swap_last(self._w) / unsqueeze(self._d, -2), upper=False)
        return self._batched(diag_embed(1.0 / self._d) - matmul(swap_last(a), a), 2)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        eps_w = randn_like(self._expanded(self.cov_factor[..., 0, :], sample_shape))
        eps_d = randn_like(self._expanded(self.loc, sample_shape))
        return (self.loc + squeeze(matmul(self._w, unsqueeze(eps_w, -1)), -1)) + sqrt(self._d) * eps_d

    def _log_det(self) -> Tensor:
        return lowrank_logdet(self._w, self._d, self._capacitance_tril)

    def log_prob(self, value: Any) -> Tensor:
        diff = self._value(value, self.loc) - self.loc
        m = lowrank_mahalanobis(self._w, self._d, diff, self._capacitance_tril)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + self._log_det() + m)

    def entropy(self) -> Tensor:
        h = 0.5 * (self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._log_det())
        return self._batched(h, 0) if self._batch_shape else h


__all__ = ["LowRankMultivariateNormal", "capacitance_tril", "lowrank_logdet", "lowrank_mahalanobis", "trace_xxt"]
