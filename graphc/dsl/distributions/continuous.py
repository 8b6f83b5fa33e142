"""torch.distributions' continuous families of one parameter pair: ``Normal``, ``LogNormal``,
``Laplace``, ``Cauchy``, ``Exponential``, ``Uniform`` and ``Gumbel`` (and ``GeneralizedPareto``, a location-scale
family with a shape), with torch's formulas; ``rsample``
transforms ``gc.randn_like``/``gc.rand_like`` noise, so the gradient reaches the parameters as torch's."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions.base import NONNEGATIVE, POSITIVE, REAL, Distribution, check, fail, finfo, known, params
from graphc.dsl.distributions.transformed_distribution import TransformedFamily
from graphc.dsl.distributions.transforms_elementwise import ExpTransform
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import cast, clip, exp, log, maximum, where
from graphc.dsl.ops_array import full_like
from graphc.dsl.ops_elementwise import atan, expm1, log1p, tan
from graphc.dsl.ops_math import sign
from graphc.dsl.ops_sample import rand_like, randn_like
from graphc.dsl.special import ndtr, ndtri
from graphc.dsl.tensor import Tensor

EULER = 0.57721566490153286061


class _LocScale(Distribution):
    """A family of a real ``loc`` and a positive ``scale``, broadcast together (its batch shape)."""

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None):
        family = type(self).__name__
        self.loc, self.scale = params(family, loc=loc, scale=scale)
        super().__init__(self.loc.shape, (), validate_args)
        if self._validate_args:
            check(family, "loc", self.loc, REAL)
            check(family, "scale", self.scale, POSITIVE)


class Normal(_LocScale):
    """``torch.distributions.Normal(loc, scale)``."""

    has_rsample, support = True, REAL

    mean = mode = property(lambda self: self.loc)
    stddev = property(lambda self: self.scale)
    variance = property(lambda self: self.scale * self.scale)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.loc + randn_like(self._expanded(self.loc, sample_shape)) * self.scale

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.loc)
        return -((v - self.loc) * (v - self.loc)) / (2.0 * self.variance) - log(self.scale) - math.log(
            math.sqrt(2 * math.pi))

    def cdf(self, value: Any) -> Tensor:
        return ndtr((self._value(value, self.loc) - self.loc) / self.scale)

    def icdf(self, value: Any) -> Tensor:
        return self.loc + self.scale * ndtri(self._prob(value, self.loc))

    def entropy(self) -> Tensor:
        return 0.5 + 0.5 * math.log(2 * math.pi) + log(self.scale)


class LogNormal(TransformedFamily):
    """``torch.distributions.LogNormal(loc, scale)``: ``exp`` of ``Normal(loc, scale)``."""

    has_rsample, support = True, POSITIVE
    transforms = property(lambda self: [ExpTransform()])

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None):
        self.base_dist = Normal(loc, scale, validate_args)
        self.loc, self.scale = self.base_dist.loc, self.base_dist.scale
        super().__init__(self.loc.shape, (), validate_args)

    mean = property(lambda self: exp(self.loc + self.base_dist.variance / 2.0))
    mode = property(lambda self: exp(self.loc - self.base_dist.variance))
    variance = property(lambda self: expm1(self.base_dist.variance) * exp(2.0 * self.loc + self.base_dist.variance))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return exp(self.base_dist.rsample(sample_shape))

    def log_prob(self, value: Any) -> Tensor:
        x = log(self._value(value, self.loc))
        return self.base_dist.log_prob(x) - x

    def cdf(self, value: Any) -> Tensor:
        return self.base_dist.cdf(log(self._value(value, self.loc)))

    def icdf(self, value: Any) -> Tensor:
        return exp(self.base_dist.icdf(value))

    def entropy(self) -> Tensor:
        return self.base_dist.entropy() + self.loc


class Laplace(_LocScale):
    """``torch.distributions.Laplace(loc, scale)``."""

    has_rsample, support = True, REAL

    mean = mode = property(lambda self: self.loc)
    stddev = property(lambda self: math.sqrt(2) * self.scale)
    variance = property(lambda self: 2.0 * self.scale * self.scale)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        """``u`` uniform on ``[eps - 1, 1)``, as torch's."""
        u = maximum(rand_like(self._expanded(self.loc, sample_shape)) * 2.0 - 1.0, finfo(self.loc).eps - 1.0)
        return self.loc - self.scale * sign(u) * log1p(-abs_(u))

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.loc)
        return -log(2.0 * self.scale) - abs_(v - self.loc) / self.scale

    def cdf(self, value: Any) -> Tensor:
        d = self._value(value, self.loc) - self.loc
        return 0.5 - 0.5 * sign(d) * expm1(-abs_(d) / self.scale)

    def icdf(self, value: Any) -> Tensor:
        term = self._prob(value, self.loc) - 0.5
        return self.loc - self.scale * sign(term) * log1p(-2.0 * abs_(term))

    def entropy(self) -> Tensor:
        return 1.0 + log(2.0 * self.scale)


class Cauchy(_LocScale):
    """``torch.distributions.Cauchy(loc, scale)``: mean nan, variance inf, as torch's."""

    has_rsample, support = True, REAL

    mode = property(lambda self: self.loc)
    mean = property(lambda self: full_like(self.loc, math.nan))
    variance = property(lambda self: full_like(self.loc, math.inf))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        u = rand_like(self._expanded(self.loc, sample_shape))
        return self.loc + tan(math.pi * (u - 0.5)) * self.scale

    def log_prob(self, value: Any) -> Tensor:
        z = (self._value(value, self.loc) - self.loc) / self.scale
        return -math.log(math.pi) - log(self.scale) - log1p(z * z)

    def cdf(self, value: Any) -> Tensor:
        return atan((self._value(value, self.loc) - self.loc) / self.scale) / math.pi + 0.5

    def icdf(self, value: Any) -> Tensor:
        p = self._prob(value, self.loc)
        return tan(math.pi * (p - 0.5)) * self.scale + self.loc

    def entropy(self) -> Tensor:
        return math.log(4 * math.pi) + log(self.scale)


class Exponential(Distribution):
    """``torch.distributions.Exponential(rate)``."""

    has_rsample, support = True, NONNEGATIVE

    def __init__(self, rate: Any, validate_args: bool | None = None):
        (self.rate,) = params("Exponential", rate=rate)
        super().__init__(self.rate.shape, (), validate_args)
        if self._validate_args:
            check("Exponential", "rate", self.rate, POSITIVE)

    mean = stddev = property(lambda self: 1.0 / self.rate)
    mode = property(lambda self: full_like(self.rate, 0.0))
    variance = property(lambda self: 1.0 / (self.rate * self.rate))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return -log1p(-rand_like(self._expanded(self.rate, sample_shape))) / self.rate

    def log_prob(self, value: Any) -> Tensor:
        return log(self.rate) - self.rate * self._value(value, self.rate)

    def cdf(self, value: Any) -> Tensor:
        return 1.0 - exp(-self.rate * self._value(value, self.rate))

    def icdf(self, value: Any) -> Tensor:
        return -log1p(-self._prob(value, self.rate)) / self.rate

    def entropy(self) -> Tensor:
        return 1.0 - log(self.rate)


def _in_interval(v: np.ndarray, dist: Uniform) -> Any:
    """``low <= v < high`` where both bounds are constants (else nothing is checked)."""
    low, high = known(dist.low), known(dist.high)
    return True if low is None or high is None else (v >= low) & (v < high)


class Uniform(Distribution):
    """``torch.distributions.Uniform(low, high)`` on ``[low, high)``."""

    has_rsample, support = True, ("interval [low, high)", _in_interval)

    def __init__(self, low: Any, high: Any, validate_args: bool | None = None):
        self.low, self.high = params("Uniform", low=low, high=high)
        super().__init__(self.low.shape, (), validate_args)
        lo, hi = known(self.low), known(self.high)
        if self._validate_args and lo is not None and hi is not None and not np.all(lo < hi):
            raise fail("Uniform", [self.low, self.high], f"needs low < high, got low={lo}, high={hi}")

    mean = property(lambda self: (self.high + self.low) / 2.0)
    mode = property(lambda self: self.high * math.nan)
    stddev = property(lambda self: (self.high - self.low) / 12 ** 0.5)
    variance = property(lambda self: (self.high - self.low) * (self.high - self.low) / 12.0)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.low + rand_like(self._expanded(self.low, sample_shape)) * (self.high - self.low)

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.low)
        inside = cast(self.low <= v, self.low.dtype) * cast(self.high > v, self.low.dtype)
        return log(inside) - log(self.high - self.low)

    def cdf(self, value: Any) -> Tensor:
        return clip((self._value(value, self.low) - self.low) / (self.high - self.low), 0.0, 1.0)

    def icdf(self, value: Any) -> Tensor:
        return self._prob(value, self.low) * (self.high - self.low) + self.low

    def entropy(self) -> Tensor:
        return log(self.high - self.low)


class Gumbel(_LocScale):
    """``torch.distributions.Gumbel(loc, scale)``."""

    has_rsample, support = True, REAL

    mean = property(lambda self: self.loc + self.scale * EULER)
    mode = property(lambda self: self.loc)
    stddev = property(lambda self: (math.pi / math.sqrt(6)) * self.scale)
    variance = property(lambda self: self.stddev * self.stddev)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        """``u`` uniform on ``[tiny, 1 - eps)``, as torch's."""
        fi = finfo(self.loc)
        u = float(fi.tiny) + rand_like(self._expanded(self.loc, sample_shape)) * float(1 - fi.eps - fi.tiny)
        return self.loc - self.scale * log(-log(u))

    def log_prob(self, value: Any) -> Tensor:
        y = (self.loc - self._value(value, self.loc)) / self.scale
        return (y - exp(y)) - log(self.scale)

    def cdf(self, value: Any) -> Tensor:
        return exp(-exp((self.loc - self._value(value, self.loc)) / self.scale))

    def icdf(self, value: Any) -> Tensor:
        return self.loc - self.scale * log(-log(self._prob(value, self.loc)))

    def entropy(self) -> Tensor:
        return log(self.scale) + (1 + EULER)


def _generalized_pareto_support(v: np.ndarray, d: GeneralizedPareto) -> Any:
    """``loc <= v``, and ``v <= loc - scale / concentration`` where ``concentration < 0`` (constants only)."""
    loc, scale, c = known(d.loc), known(d.scale), known(d.concentration)
    if loc is None or scale is None or c is None:
        return True
    with np.errstate(all="ignore"):
        upper = np.where(c < 0, loc - scale / np.where(c < 0, c, -1.0), np.inf)
    return (v >= loc) & (v <= upper)


class GeneralizedPareto(Distribution):
    """``torch.distributions.GeneralizedPareto(loc, scale, concentration)``: a concentration within ``1e-8`` of 0
    (torch's ``isclose``) takes the exponential limit; mean nan for ``concentration >= 1``, variance nan for
    ``concentration >= 1/2``, as torch's; ``rsample`` is ``icdf`` of a uniform draw."""

    has_rsample = True
    support = ("interval [loc, loc - scale / concentration if concentration < 0 else inf]",
               _generalized_pareto_support)

    def __init__(self, loc: Any, scale: Any, concentration: Any, validate_args: bool | None = None):
        name = "GeneralizedPareto"
        self.loc, self.scale, self.concentration = params(name, loc=loc, scale=scale, concentration=concentration)
        super().__init__(self.loc.shape, (), validate_args)
        if self._validate_args:
            check(name, "loc", self.loc, REAL)
            check(name, "scale", self.scale, POSITIVE)
            check(name, "concentration", self.concentration, REAL)

    def _conc(self) -> tuple:
        """``(c == 0 within 1e-8, c with those set to 1)``: the branch and a concentration safe to divide by."""
        zero = abs_(self.concentration) <= 1e-8
        return zero, where(zero, 1.0, self.concentration)

    mode = property(lambda self: self.loc)

    @property
    def mean(self) -> Tensor:
        c = self.concentration
        return where(c < 1.0, self.loc + self.scale / (1.0 - where(c < 1.0, c, 0.5)), math.nan)

    @property
    def variance(self) -> Tensor:
        c = self.concentration
        safe = where(c < 0.5, c, 0.25)
        return where(c < 0.5, self.scale * self.scale / ((1.0 - safe) * (1.0 - safe) * (1.0 - 2.0 * safe)), math.nan)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.icdf(rand_like(self._expanded(self.loc, sample_shape)))

    def log_prob(self, value: Any) -> Tensor:
        z = (self._value(value, self.loc) - self.loc) / self.scale
        zero, c = self._conc()
        y = 1.0 / c + 1.0
        nonzero = where(y == 0.0, y, y * log1p(c * z))
        return -log(self.scale) - where(zero, z, nonzero)

    def log_survival_function(self, value: Any) -> Tensor:
        z = (self._value(value, self.loc) - self.loc) / self.scale
        zero, c = self._conc()
        return where(zero, -z, -log1p(c * z) / c)

    def log_cdf(self, value: Any) -> Tensor:
        return log1p(-exp(self.log_survival_function(value)))

    def cdf(self, value: Any) -> Tensor:
        return exp(self.log_cdf(value))

    def icdf(self, value: Any) -> Tensor:
        zero, c = self._conc()
        log_u = log1p(-self._prob(value, self.loc))
        return where(zero, self.loc - self.scale * log_u, self.loc + self.scale / c * expm1(-c * log_u))

    def entropy(self) -> Tensor:
        return log(self.scale) + self.concentration + 1.0


__all__ = ["Cauchy", "Exponential", "GeneralizedPareto", "Gumbel", "Laplace", "LogNormal", "Normal", "Uniform"]
