"""Host-side checks of a cross-entropy's labels (a loss spec's or the model's own) and a binary cross-entropy's probabilities,
before a train step or an evaluation runs.

The graph gives a label outside ``[0, C)`` that is not the ignore index a loss of 0 that still
counts in the mean's divisor, where PyTorch raises ("Target 3 is out of bounds"), so the Trainer
reads the labels on the host first: a min/max over an int64 array against C (``class_count``: the
eval graph's, the batch's shapes or the class weights; where the model computes it, the Trainer
measures it by one inference forward per batch shapes).

PyTorch's cross_entropy and nll_loss take uint8 ("Byte") class labels as well as int64 and refuse
int8/int16/int32; a cross-entropy spec's label input is int64, so the Trainer, the DataLoader
check and ``graphc train`` take uint8 labels too, cast to int64 on the host (``int64_labels``: 8
bytes a label, per batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from graphc.errors import InputError
from graphc.runtime import averaging


def class_labels(manifest) -> frozenset[str]:
    """The label inputs that take uint8 arrays as torch does: a cross-entropy spec's int64 labels."""
    loss = manifest.loss
    if loss.get("kind") != "cross_entropy":
        return frozenset()
    return frozenset(e.name for e in manifest.graphs["train_step"].inputs
                     if e.name == loss.get("label") and e.dtype == "int64")


def int64_labels(arrays: Mapping[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """``arrays`` with the uint8 ones among ``names`` (``class_labels``) cast to int64."""
    return {name: np.asarray(a, dtype=np.int64) if name in names and getattr(a, "dtype", None) == np.uint8 else a
            for name, a in arrays.items()}


def class_count(manifest, feeds: Mapping[str, Any], whole: bool = False) -> Optional[int]:
    """C, the size of axis 1 of the cross-entropy's logits: the eval graph's static size, else the
    size of the batch input dim of that name in ``feeds`` (logits ``[N, K]`` of prototypes
    ``[K, D]``, or ``[N, N]`` of a contrastive loss), else the class weights' length; None where
    none tells. ``whole``: ``feeds`` are a loader's whole arrays, whose axis 0 is the data's
    length, not the batch's, so it binds no dim."""
    loss = manifest.loss
    shape = next((e.shape for e in manifest.graphs["eval"].outputs if e.name == loss.get("output")), None)
    dim = shape[1] if shape and len(shape) > 1 else None
    found = _dim_size(manifest.graphs["eval"].inputs, feeds, dim, whole)
    if found is not None:
        return found
    weight = (loss.get("options") or {}).get("weight")
    return len(weight) if weight is not None else None


def _dim_size(inputs, feeds: Mapping[str, Any], dim: Any, whole: bool) -> Optional[int]:
    """``dim`` if static, else the size of the dim of that name of one of ``inputs`` (entries with a
    ``name`` and a ``shape``: the eval graph's) in ``feeds`` (``whole``: not axis 0, the data's
    length), else None."""
    if isinstance(dim, int) or dim is None:
        return dim
    for entry in inputs:
        if entry.name not in feeds or not entry.shape:
            continue
        sizes = np.shape(feeds[entry.name])
        for axis, name in enumerate(entry.shape):
            if name == dim and axis < len(sizes) and not (whole and axis == 0):
                return int(sizes[axis])
    return None


def check_labels(manifest, feeds: Mapping[str, Any], what: str, whole: bool = False,
                 classes: Optional[int] = None, weight: Optional[float] = None) -> None:
    """A cross-entropy loss's labels are class indices in [0, C) or its ignore index (C:
    ``classes`` where the caller measured it, else ``class_count``). A batch whose every label is
    ignored, or (with class weights) whose counted labels all weigh 0, has a mean over nothing,
    0/0 (NaN in PyTorch, NaN or inf in the graph), which the step would write into every param
    (``weight``: the batch's ``averaging.shard_weight`` where the caller computed it)."""
    loss = manifest.loss
    if loss.get("kind") != "cross_entropy" or loss.get("label") not in feeds:
        return
    labels, options = np.asarray(feeds[loss["label"]]), loss.get("options", {})
    ignore = options.get("ignore_index", -100)
    if classes is None:
        classes = class_count(manifest, feeds, whole)
    counted = _in_range(labels, loss["label"], classes, ignore, what, "cross-entropy")
    if options.get("reduction", "mean") == "mean" and labels.size and not counted.any():
        raise InputError(f"{what}: every label in {loss['label']!r} is the ignore index {ignore}; the loss "
                         f"would be a mean over no example")
    if weight is None and labels.size and counted.any():
        weight = averaging.shard_weight(loss, {loss["label"]: labels}, len(labels))
    if labels.size and counted.any() and not weight:
        weights = options["weight"]
        raise InputError(f"{what}: the class weights of the labels in {loss['label']!r} that are not the ignore index "
                         f"{ignore} sum to 0 (weight={weights}); the loss would be a weighted mean over a weight of "
                         "0, 0/0")


def _in_range(labels: np.ndarray, name: str, classes: Optional[int], ignore: int, what: str, loss: str) -> np.ndarray:
    """Which of ``labels`` (input ``name``) are counted (not ``ignore``); an ``InputError`` naming the
    first that is neither ``ignore`` nor in [0, ``classes``) (None: not bounded above)."""
    counted = labels != ignore
    bad = counted & ((labels < 0) | (labels >= classes if classes is not None else False))
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        limit = classes if classes is not None else "C"
        raise InputError(f"{what}: label {name!r} holds {labels[at]} at {at}; {loss} labels are "
                         f"class indices in [0, {limit}) or the ignore index {ignore}")
    return counted


def check_batch_values(manifest, feeds: Mapping[str, Any], what: str, whole: bool = False) -> None:
    """``check_probabilities``, and the class labels the model's own ``cross_entropy`` /
    ``nll_loss`` read from a data input (``manifest.class_labels``; C static or the size of a batch
    input's dim, as ``class_count``'s ``whole``) in [0, C) or the ignore index:
    the graph counts any other label in the mean's divisor with a loss of 0, a wrong loss and
    gradient, where PyTorch raises ("Target 3 is out of bounds"). One pass over each such array."""
    check_probabilities(manifest, feeds, what)
    check_class_labels(manifest.class_labels, manifest.graphs["eval"].inputs, feeds, what, whole)


def check_class_labels(marks, inputs, feeds: Mapping[str, Any], what: str, whole: bool = False) -> None:
    """The labels in ``feeds`` of each (input, C, ignore index) of ``marks``
    (``marked_inputs.class_label_inputs``) in [0, C) or the ignore index, C static or the size of
    the dim of that name of ``inputs`` in ``feeds`` (``_dim_size``); else an ``InputError`` naming
    the first label out of range."""
    for name, classes, ignore in marks:
        if name not in feeds:
            continue
        labels, limit = np.asarray(feeds[name]), _dim_size(inputs, feeds, classes, whole)
        if labels.size and labels.min() >= 0 and (limit is None or labels.max() < limit):
            continue  # every label a class: a min and a max, half the time of the masks below
        _in_range(labels, name, limit, ignore, what, "cross_entropy / nll_loss")


def check_data(manifest, arrays: Mapping[str, Any], what: str) -> None:
    """``check_labels`` and ``check_batch_values`` of a data set's whole ``arrays`` (axis 0 its
    rows), ``what`` naming where they came from (``graphc train``'s ``--data FILE``)."""
    check_labels(manifest, arrays, what, whole=True)
    check_batch_values(manifest, arrays, what, whole=True)


def check_probabilities(manifest, feeds: Mapping[str, Any], what: str) -> None:
    """The batch inputs a ``binary_cross_entropy`` reads as probabilities (``manifest.probabilities``,
    its target mostly) hold values in [0, 1] only: the graph makes the loss NaN for any other (a
    NaN included), after the step has used it; PyTorch raises before ("all elements of target
    should be between 0 and 1"). One pass over each such array."""
    for name in manifest.probabilities:
        if name not in feeds:
            continue
        values = np.asarray(feeds[name])
        bad = ~((values >= 0) & (values <= 1))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InputError(f"{what}: {name!r} holds {values[at]} at {at}; binary_cross_entropy reads it as "
                             "probabilities, all between 0 and 1 (PyTorch raises too)")
