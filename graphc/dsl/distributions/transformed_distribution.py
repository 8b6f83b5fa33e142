"""``torch.distributions.TransformedDistribution(base_distribution, transforms)``: draws of the base pushed
through the transforms; ``log_prob`` inverts them and adds each one's log-abs-det-Jacobian with torch's event-dim
bookkeeping, ``cdf``/``icdf`` go through monotone transforms (flipped where their sign is negative)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from graphc.dsl.distributions import constraints
from graphc.dsl.distributions.base import Distribution, check, event_dims_match, fail, param_dtype, sum_rightmost
from graphc.dsl.distributions.independent import Independent
from graphc.dsl.distributions.transform_base import ComposeTransform, Transform, transform_list
from graphc.dsl.ops import cast, constant, detach
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import to_numpy


class TransformedDistribution(Distribution):
    """``TransformedDistribution(base_distribution, transforms)``: ``transforms`` a Transform or a list of them;
    the event shape is the largest the base and the transforms need, the base expanded (and made ``Independent``)
    where the transforms read more dims, as torch's."""

    def __init__(self, base_distribution: Distribution, transforms: Any, validate_args: bool | None = None):
        if not isinstance(base_distribution, Distribution):
            raise fail("TransformedDistribution", [], f"base_distribution must be a gc.distributions Distribution, "
                                                      f"got {type(base_distribution).__name__}")
        self.transforms = [transforms] if isinstance(transforms, Transform) else transform_list(
            "TransformedDistribution", "transforms", transforms)
        base_shape = base_distribution.batch_shape + base_distribution.event_shape
        base_event_dim = len(base_distribution.event_shape)
        chain = ComposeTransform(self.transforms)
        if len(base_shape) < chain.domain.event_dim:
            raise fail("TransformedDistribution", [], f"base_distribution's shape {base_shape} has fewer dims than "
                                                      f"the transforms' event dim {chain.domain.event_dim}")
        forward_shape = chain.forward_shape(base_shape)
        expanded = chain.inverse_shape(forward_shape)
        if tuple(base_shape) != tuple(expanded):
            base_distribution = base_distribution.expand(expanded[:len(expanded) - base_event_dim])
        if chain.domain.event_dim > base_event_dim:
            base_distribution = Independent(base_distribution, chain.domain.event_dim - base_event_dim)
        self.base_dist = base_distribution
        event_dim = max(chain.codomain.event_dim, base_event_dim + chain.codomain.event_dim - chain.domain.event_dim)
        cut = len(forward_shape) - event_dim
        super().__init__(forward_shape[:cut], forward_shape[cut:], validate_args)

    has_rsample = property(lambda self: self.base_dist.has_rsample)

    @property
    def support(self) -> Any:
        if not self.transforms:
            return self.base_dist.support
        support = self.transforms[-1].codomain
        extra = len(self.event_shape) - support.event_dim
        return constraints.independent(support, extra) if extra > 0 else support

    def expand(self, batch_shape: Any) -> TransformedDistribution:
        """The base expanded to the batch shape the transforms map onto ``batch_shape``."""
        new_shape = tuple(batch_shape) if isinstance(batch_shape, (tuple, list)) else (batch_shape,)
        shape = new_shape + self.event_shape
        for t in reversed(self.transforms):
            shape = t.inverse_shape(shape)
        new = copy.copy(self)
        new.base_dist = self.base_dist.expand(shape[:len(shape) - len(self.base_dist.event_shape)])
        new._batch_shape = new_shape
        return new

    def _forward(self, x: Tensor) -> Tensor:
        for t in self.transforms:
            x = t(x)
        return x

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """The base's draw (``sample``, so a family drawn by rejection works too) transformed, without gradient."""
        return detach(self._forward(self.base_dist.sample(sample_shape)))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self._forward(self.base_dist.rsample(sample_shape))

    def _lifted(self, value: Any, validate: bool) -> Tensor:
        """``value`` in the parameters' dtype; its shape and, if constant, its support checked when ``validate``."""
        dtype = param_dtype(self)
        if isinstance(value, Tensor):
            value = value if str(value.dtype) == dtype else cast(value, dtype)
        else:
            value = constant(np.asarray(value, to_numpy(dtype)))
        if validate and self._validate_args:
            event_dims_match(self._name(), value, self._batch_shape + self._event_shape)
            check(self._name(), "value", value, self.support, self)
        return value

    def log_prob(self, value: Any) -> Tensor:
        """``base.log_prob(x) - sum log|dy/dx|`` along the inverted chain, each term summed over the event dims
        it leaves out."""
        y = self._lifted(value, True)
        event_dim, total = len(self.event_shape), None
        for t in reversed(self.transforms):
            x = t.inv(y)
            event_dim += t.domain.event_dim - t.codomain.event_dim
            term = -sum_rightmost(t.log_abs_det_jacobian(x, y), event_dim - t.domain.event_dim)
            total = term if total is None else total + term
            y = x
        base = sum_rightmost(self.base_dist.log_prob(y), event_dim - len(self.base_dist.event_shape))
        return base if total is None else total + base

    def _monotonized(self, p: Tensor) -> Tensor:
        """``p``, or ``1 - p`` where the chain decreases (``sign * (p - 0.5) + 0.5``)."""
        sign = 1
        for t in self.transforms:
            sign = sign * t.sign
        return p if isinstance(sign, int) and sign == 1 else sign * (p - 0.5) + 0.5

    def cdf(self, value: Any) -> Tensor:
        value = self._lifted(value, False)
        for t in reversed(self.transforms):
            value = t.inv(value)
        return self._monotonized(self.base_dist.cdf(value))

    def icdf(self, value: Any) -> Tensor:
        return self._forward(self.base_dist.icdf(self._monotonized(self._lifted(value, False))))

    def __repr__(self) -> str:
        return (f"TransformedDistribution(base_dist={self.base_dist!r}, transforms={self.transforms!r}, "
                f"batch_shape={self._batch_shape}, event_shape={self._event_shape})")


class TransformedFamily(TransformedDistribution):
    """A family torch defines as a TransformedDistribution (``isinstance`` holds; its ``transforms`` property gives
    torch's) that keeps its own constructor, closed forms, ``sample``, ``expand`` and repr."""

    __init__, __repr__ = Distribution.__init__, Distribution.__repr__
    sample, expand = Distribution.sample, Distribution.expand


__all__ = ["TransformedDistribution", "TransformedFamily"]
