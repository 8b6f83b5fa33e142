"""How the losses and metrics of several batches (or of one batch's data-parallel shards)
combine into those of all their examples at once: each part counts by what its mean is over."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graphc.errors import InputError


def examples(loss: dict, batch: Mapping[str, np.ndarray], rows: int) -> int:
    """How many examples a batch's mean loss and metrics average over: for cross-entropy its
    labels that are not ``ignore_index`` (every position of ``[N, d1...]`` labels), else its rows."""
    if loss.get("kind") == "cross_entropy" and loss.get("label") in batch:
        ignore = (loss.get("options") or {}).get("ignore_index", -100)
        return int(np.count_nonzero(np.asarray(batch[loss["label"]]) != ignore))
    return rows


def shard_weight(loss: dict, shard: Mapping[str, np.ndarray], rows: int) -> float:
    """How much a shard's (or batch's) loss and gradients count in the average: its
    ``examples`` for a mean loss (for a cross-entropy with class weights, the sum of the
    weights of its labels not ignored: its mean's divisor), 1 for a summed loss."""
    options = loss.get("options") or {}
    if options.get("weight") is not None and options.get("reduction", "mean") == "mean" and loss.get("label") in shard:
        labels = np.asarray(shard[loss["label"]])
        counted = labels[labels != options.get("ignore_index", -100)]
        classes = np.asarray(options["weight"], np.float64)
        return float(classes[np.clip(counted, 0, len(classes) - 1)].sum())  # labels out of range: check_labels
    return weight(loss, examples(loss, shard, rows), rows)


def weight(loss: dict, count: int, rows: int) -> float:
    """``shard_weight`` of a part of ``rows`` rows whose ``examples`` are ``count``."""
    if summed(loss):
        return 1.0 if rows else 0.0
    return float(count)


def summed(loss: dict) -> bool:
    """Whether ``loss`` is summed (``reduction="sum"``): a total over its examples, not a mean."""
    return (loss.get("options") or {}).get("reduction") == "sum"


def epoch_weight(loss: dict, rows: int) -> int:
    """What the loss of a train step on ``rows`` rows counts by in its epoch's loss, the
    weighted sum over the epoch's rows: for a mean loss its rows (the epoch's mean over its
    samples, as Keras reports it); for a summed loss 1, so the epoch's is its total per row, as
    torch's examples report a summed loss (the set's sum / ``len(dataset)``): not growing with
    the batch size or the set, and on the scale of the epoch's eval loss (``Trainer._epoch_eval``)."""
    return 1 if summed(loss) else rows


def divisor(loss: dict, weight: float, what: str = "the batch") -> float:
    """What the shards' (or ``what``'s batches') summed weighted losses and gradients are divided
    by: their total weight for a mean loss, 1 for a summed one."""
    if weight == 0:  # class weights may be negative, as torch's: their sum too
        raise InputError(f"no sample of {what} counts in the loss (it has no rows, or every label is the "
                         "ignore_index, or their class weights sum to 0)")
    return 1.0 if summed(loss) else weight


def counted_labels(loss: dict, shard: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``shard`` with a cross-entropy's labels all set to one class that counts (not the
    ``ignore_index``, of the largest absolute class weight), so its own mean loss is finite: the
    feeds of a shard of weight 0 (``shard_weight``) that a data-parallel worker seeds 0
    (``runtime.staged``), whose labels then change nothing."""
    name, options = loss.get("label"), loss.get("options") or {}
    if loss.get("kind") != "cross_entropy" or name not in shard:
        return dict(shard)
    ignore = options.get("ignore_index", -100)
    weights = np.abs(np.asarray(options.get("weight") if options.get("weight") is not None else [1.0, 1.0]))
    if 0 <= ignore < len(weights):
        weights[ignore] = -1.0
    label = np.asarray(shard[name])
    return {**shard, name: np.full(label.shape, int(np.argmax(weights)), label.dtype)}
