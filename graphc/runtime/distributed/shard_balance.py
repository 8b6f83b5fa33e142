"""How ``ShardPlan`` cuts the params between workers, balanced by bytes.

Two kinds of unit: a param outside the fused update's flat buffers (``fused=False``, a param stepped
only on some steps, Adafactor's) goes whole to one worker, the largest first to the least loaded
(rank 0 first, and given first a unit every step reads where there is one: ``first``); the flat
buffers are then poured, end to end in layout order, into the ranks in rank order, each rank taking
bytes up to a common level (water-filling), cut at element boundaries. A buffer's update is one
chain of elementwise nodes over its flat vector, and its state one flat vector per slot, so a
contiguous slice of it is a shard of its own: the loads end within an element of the level, or
above it where a whole param alone passes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Buffer", "Shares", "balance"]


@dataclass
class Buffer:
    """A flat buffer as ``balance`` sees it: its name, elements and bytes per element."""

    name: str
    elements: int
    itemsize: int


@dataclass
class Shares:
    """Each rank's whole params (``params``), its slices of buffers (``pieces``: ``{buffer: (first,
    end)}`` in elements) and its bytes (``bytes``)."""

    params: list[list[str]]
    pieces: list[dict[str, tuple[int, int]]]
    bytes: list[int] = field(default_factory=list)


def balance(units: Sequence[tuple[list[str], int]], buffers: Sequence[Buffer], workers: int,
            lead: bool = False) -> Shares:
    """Cut ``units`` ((params, bytes), each whole, in the order they are placed: ``first`` first, then
    the largest) and ``buffers`` between ``workers`` ranks, as the module's docstring says. ``lead``:
    rank 0 takes at least one element of the buffers (none of ``units`` is read every step)."""
    loads, params = [0] * workers, [[] for _ in range(workers)]
    for names, size in units:
        rank = min(range(workers), key=lambda r: (loads[r], r))
        loads[rank] += size
        params[rank] += names
    quotas = _poured(loads, sum(b.elements * b.itemsize for b in buffers))
    if lead and buffers:
        quotas[0] = max(quotas[0], buffers[0].itemsize)
    starts = [sum(b.elements * b.itemsize for b in buffers[:k]) for k in range(len(buffers) + 1)]
    cuts = [0, *(_boundary(buffers, starts, sum(quotas[:r + 1])) for r in range(workers - 1)), starts[-1]]
    pieces: list[dict[str, tuple[int, int]]] = [{} for _ in range(workers)]
    for rank, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        for buf, start in zip(buffers, starts):
            first, end = max(lo, start), min(hi, start + buf.elements * buf.itemsize)
            if first < end:
                pieces[rank][buf.name] = ((first - start) // buf.itemsize, (end - start) // buf.itemsize)
                loads[rank] += end - first
    return Shares(params, pieces, loads)


def _boundary(buffers: Sequence[Buffer], starts: list[int], at: float) -> int:
    """The element boundary of the buffers laid end to end (``starts``: each one's first byte) nearest
    to byte ``at``."""
    k = max(k for k, start in enumerate(starts[:-1]) if start <= at) if buffers else 0
    size = buffers[k].itemsize if buffers else 1
    return min(starts[-1], starts[k] + round((at - starts[k]) / size) * size)


def _poured(loads: list[int], total: int) -> list[float]:
    """The bytes each rank takes of ``total`` so that the ranks' loads rise to one level where they
    are below it (water-filling): none for a rank above it."""
    if not total:
        return [0.0] * len(loads)
    below = sorted(loads)
    level, filled = 0.0, 0
    for k, load in enumerate(below, 1):
        filled += load
        level = (total + filled) / k
        if k == len(below) or level <= below[k]:
            break
    return [max(0.0, level - load) for load in loads]
