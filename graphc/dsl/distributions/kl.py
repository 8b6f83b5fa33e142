"""``kl_divergence(p, q)`` for the same-family pairs torch registers, with torch's formulas (inf where
``q`` gives no mass to part of ``p``'s support)."""

from __future__ import annotations

import math
from collections.abc import Callable

from graphc.dsl.distributions.base import Distribution, fail, param_dtype, sum_rightmost
from graphc.dsl.distributions.continuous import (EULER, Cauchy, Exponential, Gumbel, Laplace, LogNormal, Normal,
                                                 Uniform)
from graphc.dsl.distributions.discrete import Bernoulli, Categorical, OneHotCategorical, softplus
from graphc.dsl.distributions.independent import Independent
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import exp, log, where
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_special import lgamma
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


__all__ = ["kl_divergence", "register_kl"]
