"""A data-parallel worker's gradients summed over one optimizer step's micro-batches, kept on
the worker until the step's one combine (``gc.Trainer(workers=N, accumulate=k)``; PyTorch DDP's
``no_sync``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

__all__ = ["LocalSums"]


class LocalSums:
    """Each micro-batch's shard gradients (the shard's mean) times the shard's weight
    (``averaging.shard_weight``), added up in float32 at least, as ``replica.weighted_sum``.
    ``add`` returns, after the step's last micro-batch, what ``Replica.apply`` combines: the sums
    over the weights' total (the worker's mean over all its rows of the step) with that total as
    its weight, so the workers' weighted average is the mean over every row of the step's k
    global batches, as one process with ``accumulate=k``. Where the weights total 0 but not every
    gradient was (class weights of both signs, each micro-batch's shard counting), the sums are the
    weighted sum itself, marked ``summed``: ``Replica._averaged`` divides it by the workers' total
    weight. A summed loss's shards weigh 1 and
    its average divides by 1: the gradients just add up. Gradients of a backward seeded with
    the shard's share (``divisor`` given: that of the worker's total weight for the step,
    ``DistributedAccumulatingTrainer._seed_shares``) come weighted: they are added at 1, and
    the sum times ``divisor`` over the total weight is the worker's mean."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._sums: dict[str, np.ndarray] = {}
        self._terms: dict[str, np.ndarray] = {}  # a scratch buffer per gradient for grad * weight
        self._dtypes: dict[str, np.dtype] = {}
        self._weight, self._seen = 0.0, False
        self._stats: dict[str, Any] = {}
        self._touched: dict[str, np.ndarray] = {}

    def add(self, part: Optional[Mapping[str, Any]], index: int, count: int,
            divisor: Optional[float] = None) -> Optional[dict]:
        """Add micro-batch ``index`` (of ``count``; 0 starts a step) given ``part``, the shard's
        ``Replica._outputs`` gradients (None: an empty shard; ``divisor``: seeded, see the class);
        after the last, return the step's (None where every shard of this worker was empty)."""
        if index == 0:
            self._reset()
        if part is not None:
            self._seen = True
            self._weight += part["weight"]
            self._stats = part["stats"] or self._stats  # rank 0's, after its latest micro-batch
            for name, flag in part["touched"].items():  # stepped where any micro-batch read it
                self._touched[name] = np.logical_or(self._touched.get(name, False), flag)
            with np.errstate(over="ignore", invalid="ignore"):  # a loss-scaled overflow is the update's to find
                for name, grad in part["grads"].items():
                    if name not in self._sums:
                        self._dtypes[name] = grad.dtype
                        self._sums[name] = np.zeros(grad.shape, np.result_type(grad.dtype, np.float32))
                        self._terms[name] = np.empty_like(self._sums[name])
                    if divisor is not None:  # seeded: already weighted, added at 1
                        np.add(self._sums[name], grad, out=self._sums[name], dtype=self._sums[name].dtype)
                    else:
                        self._sums[name] += np.multiply(grad, part["weight"], out=self._terms[name],
                                                        dtype=self._sums[name].dtype)
        if index + 1 < count or not self._seen:
            return None
        mean = self._weight if divisor is None else self._weight / divisor  # seeded mean loss: 1.0
        summed = not self._weight and bool(self._sums)  # class weights that cancel: no mean, a weighted sum
        if summed:
            mean = 1.0 if divisor is None else 1.0 / divisor
        with np.errstate(over="ignore", invalid="ignore"):
            grads = {name: (acc / mean).astype(self._dtypes[name], copy=False) for name, acc in self._sums.items()}
        return {"weight": self._weight, "grads": grads, "stats": self._stats, "touched": self._touched,
                **({"summed": True} if summed else {})}
