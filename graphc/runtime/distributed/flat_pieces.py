"""A worker's slice of a fused flat buffer (``shard_balance``): elements ``[first, end)`` of the
buffer's params laid end to end, as the update's ``flat.concat`` lays them.

The sharded update graph steps the slice as one 1-D param named ``piece_name(buffer)`` (its gradient
``<piece>_grad``, its state the buffer's own names, ``<buffer>.<slot>``, sliced), so a worker
gathers the slice of its params and gradients before its update (``gather``) and writes the new
slice back into its params after it, and into the other workers' when they take it (``scatter``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["PIECE_SUFFIX", "gather", "piece_name", "scatter", "spans"]

PIECE_SUFFIX = ".piece"


def piece_name(buffer: str) -> str:
    """The name the update graph gives a worker's slice of ``buffer`` (one per worker and buffer)."""
    return buffer + PIECE_SUFFIX


def spans(buffer: Any, first: int, end: int) -> list[tuple[str, int, int, int, int]]:
    """(param, its first and end element in the slice, where in the slice they go, its elements) of
    each param of ``buffer`` (a ``FlatBuffer``) with elements in ``[first, end)``."""
    out = []
    for param, offset, size in buffer.offsets():
        lo, hi = max(first, offset), min(end, offset + size)
        if lo < hi:
            out.append((param, lo - offset, hi - offset, lo - first, size))
    return out


def gather(buffer: Any, first: int, end: int, arrays: Mapping[str, np.ndarray], suffix: str = "") -> np.ndarray:
    """Elements ``[first, end)`` of ``buffer``'s ``<param><suffix>`` ``arrays`` end to end."""
    parts = [np.asarray(arrays[p + suffix]).reshape(-1)[lo:hi] for p, lo, hi, *_ in spans(buffer, first, end)]
    return np.concatenate(parts)


def scatter(buffer: Any, first: int, end: int, flat: np.ndarray,
            read: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """The params of ``buffer`` with elements ``[first, end)``, set there from the slice ``flat``: new
    arrays (a param the slice covers only in part copied from ``read(param)`` first)."""
    out = {}
    for param, lo, hi, at, size in spans(buffer, first, end):
        shape = buffer.shapes[buffer.params.index(param)]
        new = np.empty(shape, flat.dtype) if lo == 0 and hi == size else np.array(read(param), copy=True)
        new.reshape(-1)[lo:hi] = flat[at:at + hi - lo]
        out[param] = new
    return out
