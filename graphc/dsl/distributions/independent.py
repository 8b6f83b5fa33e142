"""``torch.distributions.Independent(base, reinterpreted_batch_ndims)``: the base's rightmost batch dims
read as event dims, so ``log_prob`` and ``entropy`` sum over them."""

from __future__ import annotations

from typing import Any

from graphc.dsl.distributions.base import Distribution, fail, sum_rightmost
from graphc.dsl.tensor import Tensor


class Independent(Distribution):
    """``Independent(base_distribution, reinterpreted_batch_ndims)``."""

    def __init__(self, base_distribution: Distribution, reinterpreted_batch_ndims: int,
                 validate_args: bool | None = None):
        if not isinstance(base_distribution, Distribution):
            raise fail("Independent", [], f"base_distribution must be a gc.distributions Distribution, got "
                                         f"{type(base_distribution).__name__}")
        n, batch = reinterpreted_batch_ndims, base_distribution.batch_shape
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(batch):
            raise fail("Independent", [], f"reinterpreted_batch_ndims must be an int in [0, {len(batch)}] (the base's "
                                         f"batch rank, batch_shape {batch}), got {n!r}")
        self.base_dist, self.reinterpreted_batch_ndims = base_distribution, n
        split = len(batch) - n
        super().__init__(batch[:split], batch[split:] + base_distribution.event_shape, validate_args)

    has_rsample = property(lambda self: self.base_dist.has_rsample)
    mean = property(lambda self: self.base_dist.mean)
    mode = property(lambda self: self.base_dist.mode)
    variance = property(lambda self: self.base_dist.variance)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value: Any) -> Tensor:
        return sum_rightmost(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self) -> Tensor:
        return sum_rightmost(self.base_dist.entropy(), self.reinterpreted_batch_ndims)


__all__ = ["Independent"]
