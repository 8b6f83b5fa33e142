"""``kl_divergence(p, q)`` for the pairs torch registers among graphc's families, with torch's formulas (inf
where ``q`` gives no mass to part of ``p``'s support), and ``register_kl`` to add pairs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from graphc.dsl.distributions.base import Distribution, fail, known, param_dtype, sum_rightmost
from graphc.dsl.distributions.continuous import (EULER, Cauchy, Exponential, Gumbel, Laplace, LogNormal, Normal,
                                                 Uniform)
from graphc.dsl.distributions.continuous_bernoulli import ContinuousBernoulli
from graphc.dsl.distributions.counts import Binomial, Geometric, Poisson
from graphc.dsl.distributions.discrete import Bernoulli, Categorical, OneHotCategorical, softplus
from graphc.dsl.distributions.gamma import Beta, Dirichlet, Gamma
from graphc.dsl.distributions.independent import Independent
from graphc.dsl.distributions.lowrank import LowRankMultivariateNormal, lowrank_logdet, lowrank_mahalanobis, trace_xxt
from graphc.dsl.distributions.mvn import MultivariateNormal, half_log_det, mahalanobis
from graphc.dsl.distributions.transformed import HalfNormal, Pareto
from graphc.dsl.distributions.transformed_distribution import TransformedDistribution
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import exp, log, matmul, sqrt, where
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import full_like, rsqrt
from graphc.dsl.ops_elementwise import log1p
from graphc.dsl.ops_linalg import diag_embed
from graphc.dsl.ops_reshape import unsqueeze
from graphc.dsl.ops_solve import solve_triangular
from graphc.dsl.ops_special import digamma, lgamma
from graphc.dsl.ops_views import swap_last
from graphc.dsl.tensor import Tensor

_KL: dict[tuple[type, type], Callable[[Distribution, Distribution], Tensor]] = {}


def register_kl(type_p: type, type_q: type) -> Callable:
    """A decorator adding ``fn(p, q)`` to the KL table for ``(type_p, type_q)``, as torch's: ``kl_divergence``
    picks the most specific registered pair the two distributions' types are subclasses of."""
    for name, t in (("type_p", type_p), ("type_q", type_q)):
        if not (isinstance(t, type) and issubclass(t, Distribution)):
            raise fail("register_kl", [], f"{name} must be a subclass of gc.distributions.Distribution, got {t!r}")

    def register(fn: Callable) -> Callable:
        _KL[type_p, type_q] = fn
        return fn
    return register


def _pair(family: type) -> Callable:
    return register_kl(family, family)


def _dispatch(type_p: type, type_q: type) -> Callable | None:
    """The rule of the most specific registered pair (``p``'s type first) matching ``(type_p, type_q)``."""
    matches = [(a, b) for a, b in _KL if issubclass(type_p, a) and issubclass(type_q, b)]
    if not matches:
        return None
    return _KL[max(matches, key=lambda m: (len(m[0].__mro__), len(m[1].__mro__)))]


def kl_divergence(p: Distribution, q: Distribution) -> Tensor:
    """``KL(p || q)`` over the batch shape, as ``torch.distributions.kl_divergence``."""
    for name, d in (("p", p), ("q", q)):
        if not isinstance(d, Distribution):
            raise fail("kl_divergence", [], f"{name} must be a gc.distributions Distribution, got {type(d).__name__}")
    rule = _dispatch(type(p), type(q))
    if rule is None:
        pairs = ", ".join(sorted(f"{a.__name__}-{b.__name__}" for a, b in _KL))
        raise fail("kl_divergence", [], f"no KL divergence for p={type(p).__name__} and q={type(q).__name__}; "
                                        f"registered (p-q): {pairs}")
    dtypes = [param_dtype(d) for d in (p, q)]
    if dtypes[0] != dtypes[1]:
        raise fail("kl_divergence", [], f"p's {dtypes[0]} parameters and q's {dtypes[1]} ones differ; give both one "
                                        f"dtype (graphc does not promote them as torch does)")
    return rule(p, q)


@_pair(Normal)
def _normal(p: Normal, q: Normal) -> Tensor:
    var_ratio = (p.scale / q.scale) * (p.scale / q.scale)
    t1 = ((p.loc - q.loc) / q.scale) * ((p.loc - q.loc) / q.scale)
    return 0.5 * (var_ratio + t1 - 1.0 - log(var_ratio))


@_pair(LogNormal)
def _lognormal(p: LogNormal, q: LogNormal) -> Tensor:
    return _normal(p.base_dist, q.base_dist)


@_pair(Laplace)
def _laplace(p: Laplace, q: Laplace) -> Tensor:
    scale_ratio = p.scale / q.scale
    loc_abs_diff = abs_(p.loc - q.loc)
    return -log(scale_ratio) + loc_abs_diff / q.scale + scale_ratio * exp(-loc_abs_diff / p.scale) - 1.0


@_pair(Cauchy)
def _cauchy(p: Cauchy, q: Cauchy) -> Tensor:
    return log((p.scale + q.scale) * (p.scale + q.scale) + (p.loc - q.loc) * (p.loc - q.loc)) - log(
        4.0 * p.scale * q.scale)


@_pair(Exponential)
def _exponential(p: Exponential, q: Exponential) -> Tensor:
    rate_ratio = q.rate / p.rate
    return -log(rate_ratio) + rate_ratio - 1.0


@_pair(Uniform)
def _uniform(p: Uniform, q: Uniform) -> Tensor:
    result = log((q.high - q.low) / (p.high - p.low))
    return where((q.low > p.low) | (q.high < p.high), math.inf, result)


@_pair(Gumbel)
def _gumbel(p: Gumbel, q: Gumbel) -> Tensor:
    ct1, ct2, ct3 = p.scale / q.scale, q.loc / q.scale, p.loc / q.scale
    return -log(ct1) - ct2 + ct3 + ct1 * EULER + exp(ct2 + lgamma(1.0 + ct1) - ct3) - (1 + EULER)


@_pair(Bernoulli)
def _bernoulli(p: Bernoulli, q: Bernoulli) -> Tensor:
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t1 = where(p.probs == 0.0, 0.0, where(q.probs == 0.0, math.inf, t1))
    t2 = (1.0 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    t2 = where(p.probs == 1.0, 0.0, where(q.probs == 1.0, math.inf, t2))
    return t1 + t2


@_pair(Categorical)
def _categorical(p: Categorical, q: Categorical) -> Tensor:
    t = p.probs * (p.logits - q.logits)
    t = where(p.probs == 0.0, 0.0, where(q.probs == 0.0, math.inf, t))
    return sum_(t, axis=-1)


@_pair(OneHotCategorical)
def _one_hot_categorical(p: OneHotCategorical, q: OneHotCategorical) -> Tensor:
    return _categorical(p._categorical, q._categorical)


@_pair(Independent)
def _independent(p: Independent, q: Independent) -> Tensor:
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise fail("kl_divergence", [], f"Independent distributions with reinterpreted_batch_ndims "
                                        f"{p.reinterpreted_batch_ndims} and {q.reinterpreted_batch_ndims} differ "
                                        f"(torch has no KL for them either)")
    return sum_rightmost(kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)


@_pair(Gamma)
def _gamma(p: Gamma, q: Gamma) -> Tensor:
    t1 = q.concentration * log(p.rate / q.rate)
    t2 = lgamma(q.concentration) - lgamma(p.concentration)
    t3 = (p.concentration - q.concentration) * digamma(p.concentration)
    return t1 + t2 + t3 + (q.rate - p.rate) * (p.concentration / p.rate)


@_pair(Beta)
def _beta(p: Beta, q: Beta) -> Tensor:
    sum_p, sum_q = p.concentration1 + p.concentration0, q.concentration1 + q.concentration0
    t1 = lgamma(q.concentration1) + lgamma(q.concentration0) + lgamma(sum_p)
    t2 = lgamma(p.concentration1) + lgamma(p.concentration0) + lgamma(sum_q)
    t3 = (p.concentration1 - q.concentration1) * digamma(p.concentration1)
    t4 = (p.concentration0 - q.concentration0) * digamma(p.concentration0)
    return t1 - t2 + t3 + t4 + (sum_q - sum_p) * digamma(sum_p)


@_pair(Dirichlet)
def _dirichlet(p: Dirichlet, q: Dirichlet) -> Tensor:
    sum_p, sum_q = sum_(p.concentration, axis=-1), sum_(q.concentration, axis=-1)
    t2 = sum_(lgamma(p.concentration) - lgamma(q.concentration), axis=-1)
    t4 = digamma(p.concentration) - unsqueeze(digamma(sum_p), -1)
    return lgamma(sum_p) - lgamma(sum_q) - t2 + sum_((p.concentration - q.concentration) * t4, axis=-1)


@_pair(Poisson)
def _poisson(p: Poisson, q: Poisson) -> Tensor:
    return p.rate * (log(p.rate) - log(q.rate)) - (p.rate - q.rate)


@_pair(Binomial)
def _binomial(p: Binomial, q: Binomial) -> Tensor:
    """inf where ``p.total_count > q.total_count``; a constant ``p.total_count < q.total_count`` is refused,
    as torch's (a run-time one gives the formula's value)."""
    np_, nq = known(p.total_count), known(q.total_count)
    if np_ is not None and nq is not None and np.any(np_ < nq):
        raise fail("kl_divergence", [], "KL between Binomials where q.total_count > p.total_count is not "
                                        "implemented (as torch)")
    kl = p.total_count * (p.probs * (p.logits - q.logits) + log1p(-p.probs) - log1p(-q.probs))
    return where(p.total_count > q.total_count, math.inf, kl)


@_pair(Geometric)
def _geometric(p: Geometric, q: Geometric) -> Tensor:
    return -p.entropy() - log1p(-q.probs) / p.probs - q.logits


@_pair(HalfNormal)
def _half_normal(p: HalfNormal, q: HalfNormal) -> Tensor:
    return _normal(p.base_dist, q.base_dist)


@_pair(Pareto)
def _pareto(p: Pareto, q: Pareto) -> Tensor:
    alpha_ratio = q.alpha / p.alpha
    result = q.alpha * log(p.scale / q.scale) - log(alpha_ratio) + alpha_ratio - 1.0
    return where(p.scale < q.scale, math.inf, result)


@_pair(MultivariateNormal)
def _multivariate_normal(p: MultivariateNormal, q: MultivariateNormal) -> Tensor:
    if p.event_shape != q.event_shape:
        raise fail("kl_divergence", [], f"MultivariateNormals of event shapes {p.event_shape} and {q.event_shape} "
                                        f"(torch has no KL for them either)")
    z = solve_triangular(q.scale_tril, p.scale_tril, upper=False)
    term2 = sum_(z * z, axis=[-2, -1])
    term3 = mahalanobis(q.scale_tril, q.loc - p.loc)
    return half_log_det(q.scale_tril) - half_log_det(p.scale_tril) + 0.5 * (term2 + term3 - p.event_shape[0])


def _same_events(p: Distribution, q: Distribution, what: str) -> None:
    if p.event_shape != q.event_shape:
        raise fail("kl_divergence", [], f"{what} of event shapes {p.event_shape} and {q.event_shape} (torch has no KL "
                                        f"for them either)")


def _woodbury_a(q: LowRankMultivariateNormal) -> Tensor:
    """``C^-1 W^T D^-1`` of ``q``: ``inv(cov) = D^-1 - A^T A``."""
    return solve_triangular(q._capacitance_tril, swap_last(q._w) / unsqueeze(q._d, -2), upper=False)


def _lowrank_q_terms(p: Distribution, q: LowRankMultivariateNormal) -> tuple[Tensor, Tensor]:
    """``log|cov_q|`` and the Mahalanobis term of ``q.loc - p.loc`` under ``q``."""
    return (lowrank_logdet(q._w, q._d, q._capacitance_tril),
            lowrank_mahalanobis(q._w, q._d, q.loc - p.loc, q._capacitance_tril))


@_pair(LowRankMultivariateNormal)
def _lowrank_lowrank(p: LowRankMultivariateNormal, q: LowRankMultivariateNormal) -> Tensor:
    _same_events(p, q, "LowRankMultivariateNormals")
    log_det_q, term3 = _lowrank_q_terms(p, q)
    a = _woodbury_a(q)
    term2 = (sum_(p._d / q._d, axis=-1) + trace_xxt(p._w * unsqueeze(rsqrt(q._d), -1))
             - trace_xxt(a * unsqueeze(sqrt(p._d), -2)) - trace_xxt(matmul(a, p._w)))
    term1 = log_det_q - lowrank_logdet(p._w, p._d, p._capacitance_tril)
    return 0.5 * (term1 + term2 + term3 - p.event_shape[0])


@register_kl(MultivariateNormal, LowRankMultivariateNormal)
def _mvn_lowrank(p: MultivariateNormal, q: LowRankMultivariateNormal) -> Tensor:
    _same_events(p, q, "a MultivariateNormal and a LowRankMultivariateNormal")
    log_det_q, term3 = _lowrank_q_terms(p, q)
    term2 = trace_xxt(p.scale_tril * unsqueeze(rsqrt(q._d), -1)) - trace_xxt(matmul(_woodbury_a(q), p.scale_tril))
    return 0.5 * (log_det_q - 2.0 * half_log_det(p.scale_tril) + term2 + term3 - p.event_shape[0])


@register_kl(LowRankMultivariateNormal, MultivariateNormal)
def _lowrank_mvn(p: LowRankMultivariateNormal, q: MultivariateNormal) -> Tensor:
    _same_events(p, q, "a LowRankMultivariateNormal and a MultivariateNormal")
    term2 = (trace_xxt(solve_triangular(q.scale_tril, p._w, upper=False))
             + trace_xxt(solve_triangular(q.scale_tril, diag_embed(sqrt(p._d)), upper=False)))
    term1 = 2.0 * half_log_det(q.scale_tril) - lowrank_logdet(p._w, p._d, p._capacitance_tril)
    return 0.5 * (term1 + term2 + mahalanobis(q.scale_tril, q.loc - p.loc) - p.event_shape[0])


@_pair(TransformedDistribution)
def _transformed(p: TransformedDistribution, q: TransformedDistribution) -> Tensor:
    """The bases' KL, for equal transforms and event shapes (torch has no other)."""
    if p.transforms != q.transforms:
        raise fail("kl_divergence", [], "TransformedDistributions of different transforms (or transforms not known "
                                        "equal: Tensor parameters must be the same Tensors or equal constants) have "
                                        "no KL, as torch's")
    _same_events(p, q, "TransformedDistributions")
    return kl_divergence(p.base_dist, q.base_dist)


@_pair(ContinuousBernoulli)
def _continuous_bernoulli(p: ContinuousBernoulli, q: ContinuousBernoulli) -> Tensor:
    t1 = p.mean * (p.logits - q.logits)
    return t1 + p.log_norm() + log1p(-p.probs) - q.log_norm() - log1p(-q.probs)


@register_kl(Beta, ContinuousBernoulli)
def _beta_continuous_bernoulli(p: Beta, q: ContinuousBernoulli) -> Tensor:
    return -p.entropy() - p.mean * q.logits - log1p(-q.probs) - q.log_norm()


@register_kl(ContinuousBernoulli, Exponential)
def _continuous_bernoulli_exponential(p: ContinuousBernoulli, q: Exponential) -> Tensor:
    return -p.entropy() - log(q.rate) + q.rate * p.mean


@register_kl(Exponential, Gamma)
def _exponential_gamma(p: Exponential, q: Gamma) -> Tensor:
    ratio = q.rate / p.rate
    return (-q.concentration * log(ratio) + ratio + lgamma(q.concentration) + q.concentration * EULER
            - (1 + EULER))


@register_kl(Gamma, Exponential)
def _gamma_exponential(p: Gamma, q: Exponential) -> Tensor:
    return -p.entropy() - log(q.rate) + q.rate * p.concentration / p.rate


@register_kl(Beta, Exponential)
def _beta_exponential(p: Beta, q: Exponential) -> Tensor:
    return -p.entropy() - log(q.rate) + q.rate * p.mean


@register_kl(Beta, Gamma)
def _beta_gamma(p: Beta, q: Gamma) -> Tensor:
    t2 = lgamma(q.concentration) - q.concentration * log(q.rate)
    t3 = (q.concentration - 1.0) * (digamma(p.concentration1) - digamma(p.concentration1 + p.concentration0))
    return -p.entropy() + t2 - t3 + q.rate * p.mean


@register_kl(Beta, Uniform)
def _beta_uniform(p: Beta, q: Uniform) -> Tensor:
    result = -p.entropy() + log(q.high - q.low)
    return where((q.low > 0.0) | (q.high < 1.0), math.inf, result)


@register_kl(Pareto, Exponential)
def _pareto_exponential(p: Pareto, q: Exponential) -> Tensor:
    prod = p.scale * q.rate
    result = log(p.alpha / prod) - 1.0 / p.alpha + p.alpha * prod / (p.alpha - 1.0) - 1.0
    return where(p.alpha <= 1.0, math.inf, result)


@register_kl(Pareto, Gamma)
def _pareto_gamma(p: Pareto, q: Gamma) -> Tensor:
    common = log(p.scale) + 1.0 / p.alpha
    t2 = lgamma(q.concentration) - q.concentration * log(q.rate)
    t4 = q.rate * p.alpha * p.scale / (p.alpha - 1.0)
    result = log(p.alpha) - common + t2 + (1.0 - q.concentration) * common + t4 - 1.0
    return where(p.alpha <= 1.0, math.inf, result)


@register_kl(Bernoulli, Poisson)
def _bernoulli_poisson(p: Bernoulli, q: Poisson) -> Tensor:
    return -p.entropy() - (p.probs * log(q.rate) - q.rate)


@register_kl(ContinuousBernoulli, Pareto)
@register_kl(Exponential, Beta)
@register_kl(Exponential, ContinuousBernoulli)
@register_kl(Exponential, Pareto)
@register_kl(Exponential, Uniform)
@register_kl(Gamma, Beta)
@register_kl(Gamma, ContinuousBernoulli)
@register_kl(Gamma, Pareto)
@register_kl(Gamma, Uniform)
@register_kl(Beta, Pareto)
@register_kl(Pareto, Beta)
@register_kl(Pareto, ContinuousBernoulli)
@register_kl(Pareto, Uniform)
@register_kl(Poisson, Bernoulli)
@register_kl(Poisson, Binomial)
def _infinite(p: Distribution, q: Distribution) -> Tensor:
    """inf: ``q`` has no mass on part of ``p``'s support."""
    return full_like(next(v for v in vars(p).values() if isinstance(v, Tensor)), math.inf)


__all__ = ["kl_divergence", "register_kl"]
