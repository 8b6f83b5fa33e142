"""Where a data-parallel step cuts its global batch: each worker's shard as (first row, end row)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graphc.runtime.averaging import examples, shard_weight

__all__ = ["bounds_of", "joined", "spans"]


def bounds_of(rows: int, workers: int, whole: bool = False, pairs: bool = False) -> list[tuple[int, int]]:
    """(first row, end row) of each of ``workers`` shards of a ``rows``-row batch (``whole``: all on
    rank 0; ``pairs``: no shard of exactly 1 row, so ``rows // 2`` workers at most get rows and the
    others none, which count for nothing)."""
    shards = min(workers, max(rows // 2, 1)) if pairs else workers
    sizes = [len(part) for part in np.array_split(np.arange(rows), shards)] + [0] * (workers - shards)
    if whole:
        sizes = [rows] + [0] * (workers - 1)
    return spans(sizes)


def spans(sizes: list[int]) -> list[tuple[int, int]]:
    """(first row, end row) of consecutive shards of ``sizes`` rows from row 0."""
    ends = np.cumsum([0, *sizes])
    return [(int(lo), int(hi)) for lo, hi in zip(ends[:-1], ends[1:])]


def joined(loss: dict, bounds: list[tuple[int, int]], feeds: Mapping[str, np.ndarray]) -> list[tuple[int, int]]:
    """``bounds`` with each shard whose counted labels all have class weight 0 joined to the
    shard before it (the first one to the shard after it), for a class-weighted mean
    cross-entropy (``loss``, the manifest's) with label smoothing: there such a shard still adds
    its smoothing term to the batch's weighted sum, which its own mean divides by a weight of 0
    (an ``inf`` the shard average could only drop). Without smoothing it adds 0, and counts for
    nothing."""
    options = loss.get("options") or {}
    labels = feeds.get(loss.get("label"))
    if labels is None or options.get("weight") is None or not options.get("label_smoothing") or \
            options.get("reduction", "mean") != "mean":
        return bounds

    def weightless(lo: int, hi: int) -> bool:
        part = {loss["label"]: labels[lo:hi]}
        return examples(loss, part, hi - lo) > 0 and shard_weight(loss, part, hi - lo) == 0

    out: list[list[int]] = []
    for lo, hi in bounds:
        if hi > lo and out and weightless(lo, hi):
            out[-1][1] = hi
        elif hi > lo:
            out.append([lo, hi])
    if len(out) > 1 and weightless(*out[0]):
        out[0:2] = [[out[0][0], out[1][1]]]
    end = bounds[-1][1]
    return [(lo, hi) for lo, hi in out] + [(end, end)] * (len(bounds) - len(out))
