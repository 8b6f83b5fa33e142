"""``torch.distributions.ContinuousBernoulli(probs=None, logits=None, lims=(0.499, 0.501))``: the density
``C(p) p^x (1 - p)^(1 - x)`` on ``[0, 1]``, with torch's formulas (Taylor expansions for ``p`` within ``lims``);
``rsample`` is ``icdf`` of a uniform draw."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl.distributions.base import UNIT_INTERVAL, Distribution
from graphc.dsl.distributions.discrete import binary_params, clamped_probs, softplus
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import log, where
from graphc.dsl.ops_array import pow as pow_
from graphc.dsl.ops_elementwise import log1p
from graphc.dsl.ops_sample import rand_like
from graphc.dsl.tensor import Tensor


class ContinuousBernoulli(Distribution):
    """``ContinuousBernoulli(probs=None, logits=None, lims=(0.499, 0.501))``; probs are clamped to
    ``[eps, 1 - eps]`` as torch's."""

    has_rsample, support = True, UNIT_INTERVAL

    def __init__(self, probs: Any = None, logits: Any = None, lims: tuple = (0.499, 0.501),
                 validate_args: bool | None = None):
        super().__init__((), (), validate_args)
        probs, self.logits = binary_params("ContinuousBernoulli", probs, logits, self._validate_args)
        self.probs = clamped_probs(probs)
        self._lims = (float(lims[0]), float(lims[1]))
        self._batch_shape = tuple(self.probs.shape)

    def _stable(self) -> Tensor:
        """Where ``probs`` is outside ``lims`` (the closed forms are used there)."""
        return (self.probs <= self._lims[0]) | (self.probs > self._lims[1])

    def _cut_probs(self) -> Tensor:
        return where(self._stable(), self.probs, self._lims[0])

    def _log_ratio(self) -> Tensor:
        cut = self._cut_probs()
        return log1p(-cut) - log(cut)

    def log_norm(self) -> Tensor:
        """``log C(p)``, torch's ``_cont_bern_log_norm``."""
        cut = self._cut_probs()
        below, above = where(cut <= 0.5, cut, 0.0), where(cut >= 0.5, cut, 1.0)
        closed = log(abs_(self._log_ratio())) - where(cut <= 0.5, log1p(-2.0 * below), log(2.0 * above - 1.0))
        x = (self.probs - 0.5) * (self.probs - 0.5)
        return where(self._stable(), closed, math.log(2.0) + (4.0 / 3.0 + 104.0 / 45.0 * x) * x)

    @property
    def mean(self) -> Tensor:
        cut = self._cut_probs()
        x = self.probs - 0.5
        taylor = 0.5 + (1.0 / 3.0 + 16.0 / 45.0 * x * x) * x
        return where(self._stable(), cut / (2.0 * cut - 1.0) + 1.0 / self._log_ratio(), taylor)

    @property
    def variance(self) -> Tensor:
        cut = self._cut_probs()
        ratio = self._log_ratio()
        closed = cut * (cut - 1.0) / ((1.0 - 2.0 * cut) * (1.0 - 2.0 * cut)) + 1.0 / (ratio * ratio)
        x = (self.probs - 0.5) * (self.probs - 0.5)
        return where(self._stable(), closed, 1.0 / 12.0 - (1.0 / 15.0 - 128.0 / 945.0 * x) * x)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.icdf(rand_like(self._expanded(self.probs, sample_shape)))

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.probs)
        return -(softplus(self.logits) - self.logits * v) + self.log_norm()

    def cdf(self, value: Any) -> Tensor:
        v, cut = self._value(value, self.probs), self._cut_probs()
        cdfs = (pow_(cut, v) * pow_(1.0 - cut, 1.0 - v) + cut - 1.0) / (2.0 * cut - 1.0)
        return where(v <= 0.0, 0.0, where(v >= 1.0, 1.0, where(self._stable(), cdfs, v)))

    def icdf(self, value: Any) -> Tensor:
        v, cut = self._prob(value, self.probs), self._cut_probs()
        return where(self._stable(), (log1p(-cut + v * (2.0 * cut - 1.0)) - log1p(-cut)) / -self._log_ratio(), v)

    def entropy(self) -> Tensor:
        log_p0, log_p1 = log1p(-self.probs), log(self.probs)
        return self.mean * (log_p0 - log_p1) - self.log_norm() - log_p0


__all__ = ["ContinuousBernoulli"]
