"""torch.distributions' counting families: ``Poisson``, ``Binomial``, ``Geometric`` and ``NegativeBinomial``,
with torch's formulas. Geometric draws by inversion (``floor(log(u) / log1p(-p))``) and Binomial, for a constant
integer ``total_count``, as a sum of that many Bernoulli draws; Poisson by ``gc.poisson`` and NegativeBinomial as a
Gamma-Poisson mixture (rejection loops, ``graphc.dsl.ops_rejection``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.distributions.base import (NONNEGATIVE, POSITIVE, Distribution, check, enumerated, fail, finfo,
                                           known, params)
from graphc.dsl.distributions.discrete import binary_params, softplus
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import cast, clip, constant, exp, log, maximum, minimum, sigmoid, where
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import expand, zeros_like
from graphc.dsl.ops_binary import xlogy
from graphc.dsl.ops_elementwise import log1p
from graphc.dsl.ops_layers import logsigmoid
from graphc.dsl.ops_math import floor
from graphc.dsl.ops_rejection import gamma_draws, poisson
from graphc.dsl.ops_reshape import unsqueeze
from graphc.dsl.ops_sample import rand_like
from graphc.dsl.ops_special import lgamma
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import to_numpy

NONNEGATIVE_INTEGER = ("nonnegative_integer", lambda v, d: (v >= 0) & (v == np.floor(v)))
HALF_OPEN_UNIT = ("half_open_interval [0, 1)", lambda v, d: (v >= 0) & (v < 1))
MAX_TOTAL_COUNT = 4096  # Binomial.sample draws total_count uniforms per count


def _within_total_count(v: np.ndarray, d: Binomial) -> Any:
    n = known(d.total_count)
    return NONNEGATIVE_INTEGER[1](v, d) & (v <= n if n is not None else True)


class Poisson(Distribution):
    """``torch.distributions.Poisson(rate)``."""

    support = NONNEGATIVE_INTEGER

    def __init__(self, rate: Any, validate_args: bool | None = None):
        (self.rate,) = params("Poisson", rate=rate)
        super().__init__(self.rate.shape, (), validate_args)
        if self._validate_args:
            check("Poisson", "rate", self.rate, NONNEGATIVE)

    mean = variance = property(lambda self: self.rate)
    mode = property(lambda self: floor(self.rate))

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.rate)
        return xlogy(v, self.rate) - self.rate - lgamma(v + 1.0)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """``gc.poisson`` of the expanded rates."""
        return poisson(self._expanded(self.rate, sample_shape))


class Geometric(Distribution):
    """``torch.distributions.Geometric(probs=None, logits=None)``: the number of failures before the first
    success."""

    support = NONNEGATIVE_INTEGER

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None):
        super().__init__((), (), validate_args)
        self.probs, self.logits = binary_params("Geometric", probs, logits, self._validate_args)
        self._batch_shape = tuple(self.probs.shape)
        if self._validate_args:
            check("Geometric", "probs", self.probs, POSITIVE)

    mean = property(lambda self: 1.0 / self.probs - 1.0)
    mode = property(lambda self: zeros_like(self.probs))
    variance = property(lambda self: (1.0 / self.probs - 1.0) / self.probs)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """Inversion: ``floor(log(u) / log1p(-p))``, ``u`` uniform on ``[tiny, 1)``, as torch's."""
        tiny = float(finfo(self.probs).tiny)
        u = maximum(rand_like(self._expanded(self.probs, sample_shape)), tiny)
        return floor(log(u) / log1p(-self.probs))

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.probs)
        p = where((self.probs == 1.0) & (v == 0.0), 0.0, self.probs)
        return v * log1p(-p) + log(self.probs)

    def entropy(self) -> Tensor:
        return (softplus(self.logits) - self.logits * self.probs) / self.probs


class Binomial(Distribution):
    """``torch.distributions.Binomial(total_count=1, probs=None, logits=None)``; ``entropy``,
    ``enumerate_support`` and ``sample`` need a constant integer ``total_count`` (one value for the first
    two, as torch's)."""

    has_enumerate_support = True
    support = ("integer_interval [0, total_count]", _within_total_count)

    def __init__(self, total_count: Any = 1, probs: Any = None, logits: Any = None,
                 validate_args: bool | None = None):
        super().__init__((), (), validate_args)
        self.total_count, self.probs, self.logits = binary_params("Binomial", probs, logits, self._validate_args,
                                                                  total_count=total_count)
        self._batch_shape = tuple(self.probs.shape)
        if self._validate_args:
            check("Binomial", "total_count", self.total_count, NONNEGATIVE_INTEGER)

    mean = property(lambda self: self.total_count * self.probs)
    mode = property(lambda self: minimum(floor((self.total_count + 1.0) * self.probs), self.total_count))
    variance = property(lambda self: self.total_count * self.probs * (1.0 - self.probs))

    def _count(self, what: str, homogeneous: bool) -> int:
        """The constant ``total_count`` (its largest value), refused if unknown or, if ``homogeneous``, mixed."""
        n = known(self.total_count)
        if n is None or (homogeneous and np.ptp(n) != 0):
            need = "one constant value" if homogeneous else "constant values"
            raise fail("Binomial", [self.total_count], f"{what} needs total_count of {need} (known at capture), "
                                                       f"got {'a run-time Tensor' if n is None else n}")
        top = int(np.max(n))
        if top > MAX_TOTAL_COUNT:
            raise fail("Binomial", [self.total_count], f"{what} takes total_count <= {MAX_TOTAL_COUNT}, got {top}")
        return top

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """The number of ``u < probs`` among ``total_count`` uniform draws."""
        n = self._count("sample", homogeneous=False)
        p = self._expanded(self.probs, sample_shape)
        u = rand_like(expand(unsqueeze(p, 0), max(n, 1), *([-1] * p.ndim)))
        trial = constant(np.arange(max(n, 1), dtype=to_numpy(p.dtype)).reshape((-1,) + (1,) * p.ndim))
        return sum_(cast((u < p) & (trial < self._expanded(self.total_count, sample_shape)), p.dtype), axis=0)

    def log_prob(self, value: Any) -> Tensor:
        v, n, logits = self._value(value, self.probs), self.total_count, self.logits
        clamped_by_zero = (clip(logits, 0.0) + logits - clip(logits, None, 0.0)) / 2.0
        normalize = n * clamped_by_zero + n * log1p(exp(-abs_(logits))) - lgamma(n + 1.0)
        return v * logits - lgamma(v + 1.0) - lgamma(n - v + 1.0) - normalize

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """``0, ..., total_count`` in the parameters' dtype, ``(total_count + 1, *batch_shape)``."""
        n = self._count("enumerate_support", homogeneous=True)
        values = constant(np.arange(n + 1, dtype=to_numpy(self.probs.dtype)))
        return enumerated(values, self.probs, len(self._batch_shape), expand)

    def entropy(self) -> Tensor:
        lp = self.log_prob(self.enumerate_support(False))
        return -sum_(exp(lp) * lp, axis=0)


class NegativeBinomial(Distribution):
    """``torch.distributions.NegativeBinomial(total_count, probs=None, logits=None)``: failures before
    ``total_count`` successes of probability ``1 - probs``."""

    support = NONNEGATIVE_INTEGER

    def __init__(self, total_count: Any, probs: Any = None, logits: Any = None, validate_args: bool | None = None):
        super().__init__((), (), validate_args)
        self.total_count, self.probs, self.logits = binary_params("NegativeBinomial", probs, logits,
                                                                  self._validate_args, HALF_OPEN_UNIT,
                                                                  total_count=total_count)
        self._batch_shape = tuple(self.probs.shape)
        if self._validate_args:
            check("NegativeBinomial", "total_count", self.total_count, NONNEGATIVE)

    mean = property(lambda self: self.total_count * exp(self.logits))
    mode = property(lambda self: clip(floor((self.total_count - 1.0) * exp(self.logits)), 0.0))
    variance = property(lambda self: self.mean / sigmoid(-self.logits))

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """``poisson(Gamma(total_count, exp(-logits)))``, as torch's: Gamma draws at least the dtype's smallest
        normal number."""
        g = gamma_draws(self._expanded(self.total_count, sample_shape)) * self._expanded(exp(self.logits),
                                                                                         sample_shape)
        return poisson(maximum(g, float(np.finfo(to_numpy(g.dtype)).tiny)))

    def log_prob(self, value: Any) -> Tensor:
        v, n = self._value(value, self.probs), self.total_count
        unnormalized = n * logsigmoid(-self.logits) + v * logsigmoid(self.logits)
        normalization = -lgamma(n + v) + lgamma(1.0 + v) + lgamma(n)
        return unnormalized - where(n + v == 0.0, 0.0, normalization)


__all__ = ["Binomial", "Geometric", "NegativeBinomial", "Poisson"]
