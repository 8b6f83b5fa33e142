"""torch.distributions' transformed families: ``HalfNormal``, ``HalfCauchy`` (``|x|`` of a Normal/Cauchy),
``Pareto`` (``scale * exp(x)`` of an Exponential), ``RelaxedBernoulli`` (``sigmoid`` of a logistic),
``RelaxedOneHotCategorical`` (``softmax`` of Gumbel-perturbed logits) and ``LogisticNormal`` (stick breaking of a
Normal), with torch's formulas; ``rsample`` transforms the base's reparameterised draw."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions.base import (NONNEGATIVE, POSITIVE, SIMPLEX, UNIT_INTERVAL, Distribution, check, finfo,
                                           known, params, sum_rightmost)
from graphc.dsl.distributions.continuous import Cauchy, Exponential, Normal
from graphc.dsl.distributions.discrete import Categorical, binary_params, clamped_probs, softplus
from graphc.dsl.distributions.transformed_distribution import TransformedDistribution, TransformedFamily
from graphc.dsl.distributions.transforms_elementwise import AbsTransform, AffineTransform, ExpTransform
from graphc.dsl.distributions.transforms_vector import StickBreakingTransform
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import clip, exp, log, sigmoid, where
from graphc.dsl.ops_array import full_like, logsumexp, zeros_like
from graphc.dsl.ops_elementwise import log1p
from graphc.dsl.ops_sample import rand_like
from graphc.dsl.tensor import Tensor


class _Half(TransformedFamily):
    """``|x|`` of a symmetric ``base_dist`` centred at 0 (attribute ``scale``)."""

    has_rsample, support = True, NONNEGATIVE
    base_dist: Distribution
    transforms = property(lambda self: [AbsTransform()])

    mode = property(lambda self: zeros_like(self.scale))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return abs_(self.base_dist.rsample(sample_shape))

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.scale)
        return where(v >= 0.0, self.base_dist.log_prob(v) + math.log(2), -math.inf)

    def cdf(self, value: Any) -> Tensor:
        return 2.0 * self.base_dist.cdf(self._value(value, self.scale)) - 1.0

    def icdf(self, value: Any) -> Tensor:
        return self.base_dist.icdf((self._prob(value, self.scale) + 1.0) / 2.0)

    def entropy(self) -> Tensor:
        return self.base_dist.entropy() - math.log(2)


class HalfNormal(_Half):
    """``torch.distributions.HalfNormal(scale)``."""

    def __init__(self, scale: Any, validate_args: bool | None = None):
        (self.scale,) = params("HalfNormal", scale=scale)
        super().__init__(self.scale.shape, (), validate_args)
        if self._validate_args:
            check("HalfNormal", "scale", self.scale, POSITIVE)
        self.base_dist = Normal(0.0, self.scale, validate_args=False)

    mean = property(lambda self: self.scale * math.sqrt(2 / math.pi))
    variance = property(lambda self: self.scale * self.scale * (1 - 2 / math.pi))


class HalfCauchy(_Half):
    """``torch.distributions.HalfCauchy(scale)``: mean and variance inf, as torch's."""

    def __init__(self, scale: Any, validate_args: bool | None = None):
        (self.scale,) = params("HalfCauchy", scale=scale)
        super().__init__(self.scale.shape, (), validate_args)
        if self._validate_args:
            check("HalfCauchy", "scale", self.scale, POSITIVE)
        self.base_dist = Cauchy(0.0, self.scale, validate_args=False)

    mean = variance = property(lambda self: full_like(self.scale, math.inf))


def _at_least_scale(v: np.ndarray, d: Pareto) -> Any:
    scale = known(d.scale)
    return v >= scale if scale is not None else True


class Pareto(TransformedFamily):
    """``torch.distributions.Pareto(scale, alpha)``: ``scale * exp(x)``, ``x ~ Exponential(alpha)``; mean inf for
    ``alpha <= 1``, variance inf for ``alpha <= 2``, as torch's."""

    has_rsample, support = True, ("greater_than_eq(scale)", _at_least_scale)
    transforms = property(lambda self: [ExpTransform(), AffineTransform(0.0, self.scale)])

    def __init__(self, scale: Any, alpha: Any, validate_args: bool | None = None):
        self.scale, self.alpha = params("Pareto", scale=scale, alpha=alpha)
        super().__init__(self.scale.shape, (), validate_args)
        if self._validate_args:
            check("Pareto", "scale", self.scale, POSITIVE)
            check("Pareto", "alpha", self.alpha, POSITIVE)
        self.base_dist = Exponential(self.alpha, validate_args=False)

    mode = property(lambda self: self.scale)

    @property
    def mean(self) -> Tensor:
        a = clip(self.alpha, 1.0)
        return a * self.scale / (a - 1.0)

    @property
    def variance(self) -> Tensor:
        a = clip(self.alpha, 2.0)
        return self.scale * self.scale * a / ((a - 1.0) * (a - 1.0) * (a - 2.0))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.scale * exp(self.base_dist.rsample(sample_shape))

    def log_prob(self, value: Any) -> Tensor:
        x = log(self._value(value, self.scale) / self.scale)
        return self.base_dist.log_prob(x) - x - log(self.scale)

    def cdf(self, value: Any) -> Tensor:
        return self.base_dist.cdf(log(self._value(value, self.scale) / self.scale))

    def icdf(self, value: Any) -> Tensor:
        return self.scale * exp(self.base_dist.icdf(value))

    def entropy(self) -> Tensor:
        return log(self.scale / self.alpha) + (1.0 + 1.0 / self.alpha)


class RelaxedBernoulli(Distribution):
    """``torch.distributions.RelaxedBernoulli(temperature, probs=None, logits=None)``: ``sigmoid`` of
    ``(logits + logistic noise) / temperature``, clamped to ``[tiny, 1 - eps]`` as torch's."""

    has_rsample, support = True, UNIT_INTERVAL

    def __init__(self, temperature: Any, probs: Any = None, logits: Any = None, validate_args: bool | None = None):
        super().__init__((), (), validate_args)
        self.temperature, self.probs, self.logits = binary_params("RelaxedBernoulli", probs, logits,
                                                                  self._validate_args, temperature=temperature)
        self._batch_shape = tuple(self.probs.shape)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        u = clamped_probs(rand_like(self._expanded(self.logits, sample_shape)))
        fi = finfo(self.logits)
        y = sigmoid((log(u) - log1p(-u) + self.logits) / self.temperature)
        return clip(y, float(fi.tiny), float(1 - fi.eps))

    def log_prob(self, value: Any) -> Tensor:
        fi = finfo(self.logits)
        y = clip(self._value(value, self.logits), float(fi.tiny), float(1 - fi.eps))
        x = log(y) - log1p(-y)
        diff = self.logits - x * self.temperature
        return log(self.temperature) + diff - 2.0 * softplus(diff) + softplus(-x) + softplus(x)


class RelaxedOneHotCategorical(Distribution):
    """``torch.distributions.RelaxedOneHotCategorical(temperature, probs=None, logits=None)``: ``softmax`` of
    ``(logits + Gumbel noise) / temperature`` over the last dim (event shape ``(K,)``, K static)."""

    has_rsample, support = True, SIMPLEX

    def __init__(self, temperature: Any, probs: Any = None, logits: Any = None, validate_args: bool | None = None):
        self._categorical = Categorical(probs, logits, validate_args)
        k = self._categorical.static_events("RelaxedOneHotCategorical")
        super().__init__(self._categorical.batch_shape, (k,), validate_args)
        self.temperature = self._prob(temperature, self.logits)  # broadcast with the (batch, K) values, as torch's

    _unexpanded = ("temperature",)
    probs = property(lambda self: self._categorical.probs)
    logits = property(lambda self: self._categorical.logits)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        u = clamped_probs(rand_like(self._expanded(self.logits, sample_shape)))
        scores = (self.logits - log(-log(u))) / self.temperature
        return exp(scores - logsumexp(scores, -1, keepdim=True))

    def log_prob(self, value: Any) -> Tensor:
        k, t = self.event_shape[0], self.temperature
        x = log(self._value(value, self.logits))
        score = self.logits - x * t
        score = sum_rightmost(score - logsumexp(score, -1, keepdim=True), 1)
        return score + (math.lgamma(k) + (k - 1) * log(t)) - sum_rightmost(x, 1)


class LogisticNormal(TransformedDistribution):
    """``torch.distributions.LogisticNormal(loc, scale)``: ``StickBreakingTransform`` of ``Normal(loc, scale)``'s
    draws over the last dim (a 0-d Normal is taken as one of batch ``(1,)``, as torch's), event shape ``(K + 1,)``
    for ``K`` Normal coordinates."""

    has_rsample, support = True, SIMPLEX

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None):
        base = Normal(loc, scale, validate_args)
        base = base if base.batch_shape else base.expand((1,))
        super().__init__(base, StickBreakingTransform(), validate_args)

    loc = property(lambda self: self.base_dist.base_dist.loc)
    scale = property(lambda self: self.base_dist.base_dist.scale)


__all__ = ["HalfCauchy", "HalfNormal", "LogisticNormal", "Pareto", "RelaxedBernoulli", "RelaxedOneHotCategorical"]
