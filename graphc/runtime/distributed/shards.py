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
    """``bounds`` with each shard whose labels count (not all ignored) but whose class weights sum
    to 0 joined to the shard before it (the first one to the shard after it), for a class-weighted
    mean cross-entropy (``loss``, the manifest's): the shard's own mean divides by a weight of 0
    (a NaN or inf the shard average could only drop), while it adds to the batch's weighted sum
    where its labels' weights are not all 0 (of both signs, as torch's may be, they cancel) or
    with label smoothing (its smoothing term). Labels of weight 0 alone, unsmoothed, add 0: such a
    shard counts for nothing and stays one."""
    options = loss.get("options") or {}
    labels = feeds.get(loss.get("label"))
    if labels is None or options.get("weight") is None or options.get("reduction", "mean") != "mean":
        return bounds
    classes = np.asarray(options["weight"], np.float64)

    def weightless(lo: int, hi: int) -> bool:
        part = {loss["label"]: labels[lo:hi]}
        if not examples(loss, part, hi - lo) or shard_weight(loss, part, hi - lo) != 0:
            return False
        counted = part[loss["label"]][part[loss["label"]] != options.get("ignore_index", -100)]
        return bool(options.get("label_smoothing")) or bool(classes[np.clip(counted, 0, len(classes) - 1)].any())

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
