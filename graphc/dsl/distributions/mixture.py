"""``torch.distributions.MixtureSameFamily(mixture_distribution, component_distribution)``: a Categorical choice
among ``K`` components of one family (the component distribution's rightmost batch dim), as in mixture density
networks; ``log_prob`` is the logsumexp of the components' log densities and log weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.distributions.base import Distribution, event_dims_match, fail, known
from graphc.dsl.distributions.discrete import Categorical
from graphc.dsl.ops import constant, detach, reshape
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import expand, gather, logsumexp
from graphc.dsl.ops_reshape import squeeze, unsqueeze
from graphc.dsl.tensor import Tensor
from graphc.passes.infer import InferenceError, broadcast


class MixtureSameFamily(Distribution):
    """``MixtureSameFamily(mixture_distribution, component_distribution)``: batch shape the component's without its
    last dim, event shape the component's; no ``rsample``, mode or entropy, as torch's."""

    def __init__(self, mixture_distribution: Categorical, component_distribution: Distribution,
                 validate_args: bool | None = None):
        name = "MixtureSameFamily"
        if not isinstance(mixture_distribution, Categorical):
            raise fail(name, [], f"mixture_distribution must be a gc.distributions Categorical, got "
                                 f"{type(mixture_distribution).__name__}")
        if not isinstance(component_distribution, Distribution):
            raise fail(name, [], f"component_distribution must be a gc.distributions Distribution, got "
                                 f"{type(component_distribution).__name__}")
        comp_batch, mix_batch = component_distribution.batch_shape, mixture_distribution.batch_shape
        if not comp_batch:
            raise fail(name, [], "component_distribution needs a batch dim for the components, got batch_shape ()")
        try:
            broadcast(mix_batch, comp_batch[:-1])
        except InferenceError:
            raise fail(name, [], f"mixture_distribution.batch_shape {mix_batch} does not broadcast with "
                                 f"component_distribution.batch_shape[:-1] {comp_batch[:-1]}") from None
        km, kc = mixture_distribution.num_events, comp_batch[-1]
        if km != kc:
            raise fail(name, [], f"mixture_distribution has {km} components but component_distribution.batch_shape[-1]"
                                 f" is {kc}")
        self.mixture_distribution, self.component_distribution = mixture_distribution, component_distribution
        super().__init__(comp_batch[:-1], component_distribution.event_shape, validate_args)

    support = property(lambda self: self.component_distribution.support)

    def _weights(self, t: Tensor) -> Tensor:
        """``t`` (``(*batch, K)``, the mixture's) with ones for the event dims, so it meets the components'."""
        return reshape(t, [*t.shape, *([1] * len(self.event_shape))]) if self.event_shape else t

    def _pad(self, x: Tensor) -> Tensor:
        """``x`` with the component dim before its event dims (a constant stays one, for the components' checks)."""
        axis, value = -1 - len(self.event_shape), known(x)
        if value is not None and value.shape == tuple(x.shape):
            return constant(np.expand_dims(value, axis))
        return unsqueeze(x, axis)

    def _sum_components(self, t: Tensor) -> Tensor:
        return sum_(t, axis=-1 - len(self.event_shape))

    @property
    def mean(self) -> Tensor:
        return self._sum_components(self._weights(self.mixture_distribution.probs) * self.component_distribution.mean)

    @property
    def variance(self) -> Tensor:
        """The mean of the components' variances plus the variance of their means."""
        probs, comp = self._weights(self.mixture_distribution.probs), self.component_distribution
        comp_mean = comp.mean
        spread = comp_mean - self._pad(self._sum_components(probs * comp_mean))
        return self._sum_components(probs * comp.variance) + self._sum_components(probs * spread * spread)

    def _x(self, value: Any) -> Tensor:
        x = self._prob(value, self.mixture_distribution.logits)
        if self._validate_args:
            event_dims_match(self._name(), x, self._batch_shape + self._event_shape)
        return self._pad(x)

    def log_prob(self, value: Any) -> Tensor:
        """``logsumexp(component.log_prob(x) + log_softmax(mixture.logits))`` over the components."""
        logits = self.mixture_distribution.logits
        log_weights = logits - logsumexp(logits, -1, keepdim=True)
        return logsumexp(self.component_distribution.log_prob(self._x(value)) + log_weights, -1)

    def cdf(self, value: Any) -> Tensor:
        return sum_(self.component_distribution.cdf(self._x(value)) * self.mixture_distribution.probs, axis=-1)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """Each draw the component a draw of the mixture picks (a gather of all the components' draws)."""
        comp = self.component_distribution.sample(sample_shape)
        index = self.mixture_distribution.expand(self._batch_shape).sample(sample_shape)
        k_dim = comp.ndim - 1 - len(self.event_shape)
        index = reshape(index, [*index.shape, 1, *([1] * len(self.event_shape))])
        index = expand(index, *([-1] * (k_dim + 1)), *self.event_shape)
        return detach(squeeze(gather(comp, k_dim, index), k_dim))

    def __repr__(self) -> str:
        return f"MixtureSameFamily({self.mixture_distribution!r}, {self.component_distribution!r})"


__all__ = ["MixtureSameFamily"]
