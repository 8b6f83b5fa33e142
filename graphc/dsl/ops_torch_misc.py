"""The last of torch's top-level tensor functions: ``nonzero_static``, the ``unsafe_`` splits (the
plain ones: a graph has no views to make unsafe), ``angle`` of real numbers and ``binomial`` sampling
(``gc.distributions.Binomial``'s sampler)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.distributions.counts import Binomial
from graphc.dsl.ops import cast, concat, detach, lift, scalar, where
from graphc.dsl.ops_array import chunk, full, split
from graphc.dsl.ops_math import isnan
from graphc.dsl.ops_reshape import split_with_sizes
from graphc.dsl.ops_scatter import nonzero
from graphc.dsl.ops_views import narrow
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES


def nonzero_static(input: Any, *, size: int, fill_value: int = -1) -> Tensor:
    """``torch.nonzero_static``: ``nonzero``'s int64 ``(count, rank)`` indices cut or padded with
    ``fill_value`` rows to exactly ``size`` rows."""
    x = lift(input)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise op_error("nonzero_static", [x], f"size must be an int >= 0, got {size!r}", user_source())
    rows = nonzero(x)
    padded = concat([rows, full((size, x.ndim), int(fill_value), "int64")], 0)
    return narrow(padded, 0, 0, size)


def unsafe_chunk(input: Any, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.unsafe_chunk``: ``gc.chunk``."""
    return chunk(input, chunks, dim)


def unsafe_split(input: Any, split_size: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.unsafe_split``: ``gc.split`` by ``split_size``."""
    return split(input, split_size, dim)


def unsafe_split_with_sizes(input: Any, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.unsafe_split_with_sizes``: ``gc.split_with_sizes``."""
    return split_with_sizes(input, split_sizes, dim)


def angle(input: Any) -> Tensor:
    """``torch.angle`` of real numbers: pi where negative, else 0, NaN kept; integers give float32, as
    torch's default dtype. The gradient is 0."""
    x = lift(input)
    if x.dtype not in FLOAT_DTYPES:
        x = cast(x, "float32")
    return where(isnan(x), detach(x), where(x < scalar(0, x), scalar(math.pi, x), scalar(0, x)))


def binomial(count: Any, prob: Any, generator: Any = None) -> Tensor:
    """``torch.binomial(count, prob)``: draws of the number of successes in ``count`` trials of
    probability ``prob`` (float Tensors of one dtype; ``count`` known at capture, as
    ``gc.distributions.Binomial.sample`` needs)."""
    c, p = lift(count), lift(prob)
    if c.dtype not in FLOAT_DTYPES or c.dtype != p.dtype:
        raise op_error("binomial", [c, p], f"count and prob must be floating point of one dtype, got {c.dtype} and "
                       f"{p.dtype}", user_source())
    if generator is not None:
        raise op_error("binomial", [c, p], "generator is not supported: draws come from gc.capture's seed",
                       user_source())
    return Binomial(total_count=c, probs=p).sample()


__all__ = ["angle", "binomial", "nonzero_static", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes"]
