"""torch.distributions' families of a power of a simple draw: ``Weibull`` (``scale * E ** (1 / concentration)``, ``E``
Exponential(1)), ``Kumaraswamy`` (``(1 - U ** (1 / concentration0)) ** (1 / concentration1)``, ``U`` Uniform(0, 1))
and ``InverseGamma`` (``1 / G``, ``G`` Gamma). Each is a TransformedDistribution with torch's transforms (``log_prob``,
``cdf``, ``icdf`` through them) and torch's closed forms; ``rsample`` transforms the base's reparameterised draw."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl.distributions.base import POSITIVE, UNIT_INTERVAL, check, params
from graphc.dsl.distributions.continuous import EULER, Exponential, Uniform
from graphc.dsl.distributions.gamma import Gamma
from graphc.dsl.distributions.transformed_distribution import TransformedDistribution, TransformedFamily
from graphc.dsl.distributions.transforms_elementwise import AffineTransform, PowerTransform
from graphc.dsl.ops import exp, log, where
from graphc.dsl.ops_array import full_like
from graphc.dsl.ops_array import pow as pow_
from graphc.dsl.ops_special import digamma, lgamma
from graphc.dsl.tensor import Tensor


def _positive_pair(family: str, validate: bool | None, **values: Any) -> list[Tensor]:
    """Two positive parameters broadcast together, checked where constant unless ``validate`` is False."""
    pair = params(family, **values)
    if validate is not False:
        for name, t in zip(values, pair):
            check(family, name, t, POSITIVE)
    return pair


class Weibull(TransformedFamily):
    """``torch.distributions.Weibull(scale, concentration)``."""

    has_rsample, support = True, POSITIVE
    transforms = property(lambda self: [PowerTransform(1.0 / self.concentration), AffineTransform(0.0, self.scale)])

    def __init__(self, scale: Any, concentration: Any, validate_args: bool | None = None):
        self.scale, self.concentration = _positive_pair("Weibull", validate_args, scale=scale,
                                                        concentration=concentration)
        super().__init__(self.scale.shape, (), validate_args)
        self.base_dist = Exponential(full_like(self.scale, 1.0), validate_args=False)

    mean = property(lambda self: self.scale * exp(lgamma(1.0 + 1.0 / self.concentration)))
    mode = property(lambda self: self.scale * pow_((self.concentration - 1.0) / self.concentration,
                                                   1.0 / self.concentration))

    @property
    def variance(self) -> Tensor:
        r = 1.0 / self.concentration
        return self.scale * self.scale * (exp(lgamma(1.0 + 2.0 * r)) - exp(2.0 * lgamma(1.0 + r)))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.scale * pow_(self.base_dist.rsample(sample_shape), 1.0 / self.concentration)

    def entropy(self) -> Tensor:
        r = 1.0 / self.concentration
        return EULER * (1.0 - r) + log(self.scale * r) + 1.0


def _kumaraswamy_moment(a: Tensor, b: Tensor, n: int) -> Tensor:
    """``E[X ** n] = b B(1 + n / a, b)``."""
    arg = 1.0 + n / a
    return b * exp(lgamma(arg) + lgamma(b) - lgamma(arg + b))


class Kumaraswamy(TransformedFamily):
    """``torch.distributions.Kumaraswamy(concentration1, concentration0)``: mode nan where either is below 1, as
    torch's."""

    has_rsample, support = True, UNIT_INTERVAL

    @property
    def transforms(self) -> list:
        return [PowerTransform(1.0 / self.concentration0), AffineTransform(1.0, -1.0),
                PowerTransform(1.0 / self.concentration1)]

    def __init__(self, concentration1: Any, concentration0: Any, validate_args: bool | None = None):
        self.concentration1, self.concentration0 = _positive_pair("Kumaraswamy", validate_args,
                                                                  concentration1=concentration1,
                                                                  concentration0=concentration0)
        super().__init__(self.concentration1.shape, (), validate_args)
        self.base_dist = Uniform(full_like(self.concentration0, 0.0), full_like(self.concentration0, 1.0),
                                 validate_args=False)

    mean = property(lambda self: _kumaraswamy_moment(self.concentration1, self.concentration0, 1))

    @property
    def mode(self) -> Tensor:
        """``((a - 1) / (a b - 1)) ** (1 / a)``, nan where ``a < 1`` or ``b < 1``. torch 2.13's formula,
        ``log1p(-b) / b - log1p(-a b)``, is nan for every ``a, b`` (``log1p`` of a number below -1)."""
        a, b = self.concentration1, self.concentration0
        ok = (a >= 1.0) & (b >= 1.0)
        return where(ok, pow_((a - 1.0) / (a * b - 1.0), 1.0 / a), math.nan)

    @property
    def variance(self) -> Tensor:
        mean = self.mean
        return _kumaraswamy_moment(self.concentration1, self.concentration0, 2) - mean * mean

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        u = self.base_dist.rsample(sample_shape)
        return pow_(1.0 - pow_(u, 1.0 / self.concentration0), 1.0 / self.concentration1)

    def entropy(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        return (1.0 - 1.0 / b) + (1.0 - 1.0 / a) * (digamma(b + 1.0) + EULER) - log(a) - log(b)


class InverseGamma(TransformedFamily):
    """``torch.distributions.InverseGamma(concentration, rate)``: mean inf for ``concentration <= 1``, variance inf
    for ``concentration <= 2``, as torch's; ``sample`` inverts Gamma's (rejection) draws."""

    has_rsample, support = True, POSITIVE
    transforms = property(lambda self: [PowerTransform(-1.0)])
    sample = TransformedDistribution.sample

    def __init__(self, concentration: Any, rate: Any, validate_args: bool | None = None):
        self.base_dist = Gamma(concentration, rate, validate_args)
        super().__init__(self.base_dist.batch_shape, (), validate_args)

    concentration = property(lambda self: self.base_dist.concentration)
    rate = property(lambda self: self.base_dist.rate)
    mode = property(lambda self: self.rate / (self.concentration + 1.0))

    @property
    def mean(self) -> Tensor:
        c = self.concentration
        return where(c > 1.0, self.rate / (c - 1.0), math.inf)

    @property
    def variance(self) -> Tensor:
        c = self.concentration
        return where(c > 2.0, self.rate * self.rate / ((c - 1.0) * (c - 1.0) * (c - 2.0)), math.inf)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return 1.0 / self.base_dist.rsample(sample_shape)

    def entropy(self) -> Tensor:
        c = self.concentration
        return c + log(self.rate) + lgamma(c) - (1.0 + c) * digamma(c)


__all__ = ["InverseGamma", "Kumaraswamy", "Weibull"]
