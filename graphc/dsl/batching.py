"""Unbatched inputs, as torch takes them: run as a batch of one, the batch dim dropped after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import lift, squeeze, unsqueeze
from graphc.dsl.tensor import Tensor

__all__ = ["batch_of_one", "batch_rank"]


def batch_rank(op: str, x: Tensor, layout: str) -> int:
    """The rank of ``(N, <layout>)``, which ``x`` must have, or one less (unbatched, as torch takes
    it); any other rank is refused, naming both layouts."""
    rank = layout.count(",") + 2
    if x.ndim not in (rank - 1, rank):
        raise op_error(op, [x], f"expects a ({layout}) or (N, {layout}) input, got rank {x.ndim}", user_source())
    return rank


def batch_of_one(op: str, x: Any, layout: str, fn: Callable[..., Tensor], *others: Tensor) -> Tensor:
    """``fn(x, *others)`` for ``x`` laid out ``(N, <layout>)``. An unbatched ``(<layout>)`` input runs
    as a batch of one (``others`` get the batch dim too) and the batch dim leaves the result where
    it has one (a loss reduced to a scalar has none); any other rank is refused (``batch_rank``)."""
    x = lift(x)
    if x.ndim == batch_rank(op, x, layout):
        return fn(x, *others)
    out = fn(unsqueeze(x, [0]), *(unsqueeze(t, [0]) for t in others))
    return out if out.shape == () else squeeze(out, [0])
