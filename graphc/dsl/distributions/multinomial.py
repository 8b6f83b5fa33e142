"""``torch.distributions.Multinomial(total_count=1, probs=None, logits=None)``: counts of ``total_count`` draws
of a Categorical over the last dim (event shape ``(K,)``, K static), with torch's formulas; ``sample`` counts
``total_count`` Gumbel-max draws, ``entropy`` sums the Binomial marginals over ``1 .. total_count``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions.base import Distribution, fail, sample_shape_of
from graphc.dsl.distributions.counts import MAX_TOTAL_COUNT, NONNEGATIVE_INTEGER, Binomial
from graphc.dsl.distributions.discrete import Categorical
from graphc.dsl.ops import cast, exp, where
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import expand, one_hot
from graphc.dsl.ops_special import lgamma
from graphc.dsl.tensor import Tensor


def _counts(v: np.ndarray, d: Multinomial) -> Any:
    """Nonnegative integer counts summing to at most ``total_count`` per event (torch's ``constraints.multinomial``)."""
    return NONNEGATIVE_INTEGER[1](v, d) & (v.sum(-1, keepdims=True) <= d.total_count)


class Multinomial(Distribution):
    """``Multinomial(total_count=1, probs=None, logits=None)``: ``total_count`` a Python int (one for the whole
    batch, as torch's); ``log_prob`` reads each value's own count (its sum), as torch's; only ``sample`` caps it at
    ``MAX_TOTAL_COUNT``."""

    support = ("multinomial", _counts)

    def __init__(self, total_count: int = 1, probs: Any = None, logits: Any = None,
                 validate_args: bool | None = None):
        if isinstance(total_count, bool) or not isinstance(total_count, (int, np.integer)) or total_count < 0:
            raise fail("Multinomial", [], f"total_count must be a Python int >= 0 (one count for the batch, as "
                                          f"torch's), got {total_count!r}")
        self.total_count = int(total_count)
        self._categorical = Categorical(probs, logits, validate_args)
        k = self._categorical.static_events("Multinomial")
        super().__init__(self._categorical.batch_shape, (k,), validate_args)

    probs = property(lambda self: self._categorical.probs)
    logits = property(lambda self: self._categorical.logits)
    mean = property(lambda self: self.probs * float(self.total_count))
    variance = property(lambda self: float(self.total_count) * self.probs * (1.0 - self.probs))

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """The one-hot sum of ``total_count`` Categorical draws (zeros where it is 0)."""
        shape = self._shape(sample_shape)
        if self.total_count == 0:
            return expand(self.probs * 0.0, *shape)
        if self.total_count > MAX_TOTAL_COUNT:
            raise fail("Multinomial", [], f"total_count must be <= {MAX_TOTAL_COUNT} (sample draws that many "
                                          f"Categoricals), got {self.total_count}")
        draws = self._categorical.sample((self.total_count, *sample_shape_of("Multinomial", sample_shape)))
        return sum_(cast(one_hot(draws, self.event_shape[0]), self.probs.dtype), axis=0)

    def log_prob(self, value: Any) -> Tensor:
        """``lgamma(n + 1) - sum lgamma(x + 1) + sum x logits`` (``n = sum x``; a ``-inf`` logit times a zero
        count adds 0)."""
        v = self._value(value, self.logits)
        logits = where((v == 0.0) & (self.logits == -math.inf), 0.0, self.logits)
        return lgamma(sum_(v, axis=-1) + 1.0) - sum_(lgamma(v + 1.0), axis=-1) + sum_(logits * v, axis=-1)

    def entropy(self) -> Tensor:
        """``n H(Categorical) - lgamma(n + 1) + sum_k sum_{x=1..n} Binomial(n, p_k).pmf(x) lgamma(x + 1)``."""
        n = self.total_count
        term1 = float(n) * self._categorical.entropy() - math.lgamma(n + 1)
        if n == 0:
            return term1
        binomial = Binomial(n, probs=self.probs, validate_args=False)
        support = binomial.enumerate_support(False)[1:]
        return term1 + sum_(exp(binomial.log_prob(support)) * lgamma(support + 1.0), axis=[0, -1])


__all__ = ["Multinomial"]
