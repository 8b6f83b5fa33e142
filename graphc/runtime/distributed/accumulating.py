"""``gc.Trainer(..., workers=N, accumulate=k)``: gradient accumulation on data-parallel workers.

An optimizer step takes ``k`` micro-batches (``fit``: ``k`` consecutive loader batches, the
epoch's last step what is left; ``step(batch)``: ``batch`` split by rows into ``k``), each a
global batch cut into the workers' shards as ``DistributedTrainer``'s. Every worker adds its
shards' gradients, each times its weight (``averaging.shard_weight``), into sums it keeps
(``local_sums``; PyTorch DDP's ``no_sync``): no gradient leaves a worker between micro-batches.
A model with hooks or ``gc.autograd.Function``s (``accumulate.WEIGHT``) has its backward seeded with the
shard's share of its worker's step instead (``_seed_shares``) and its gradients added as they come,
so a hook sees the worker's local weighted gradient, as torch's under DDP's ``no_sync`` loop.
After the last, the workers combine their sums once (``Replica.apply``: each reads every
worker's, weighted by its share of the step's total weight) and the optimizer update runs once,
so a step equals one process's ``accumulate=k`` step on the same micro-batches (and torch's
accumulation loop): clipping (``max_grad_norm``) sees the accumulated gradient, whose norm
before clipping ``History.step_grad_norms`` records, loss scaling checks and unscales it once,
and ``step_count`` and the lr scheduler advance once. The driver sends a step's calls without
waiting between them (each worker runs its calls in order) and the combine with them, then
waits once.

BatchNorm normalises each shard with its own statistics, as ``workers=N`` without accumulation;
the running statistics are rank 0's, updated by each of its shards in turn, and copied to every
worker at the combine. Dropout noise is drawn per worker and micro-batch, seeded ``(seed, step,
rank, index)`` (the first micro-batch as ``k=1``). Checkpoints fall on optimizer-step
boundaries and record ``k``; a full resume with another ``k`` is refused, as in one process.
Refused, as in one process (``accumulating.check_accumulable``): SyncBatchNorm (its exchanges
would run per micro-batch) and embeddings with ``max_norm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from graphc.passes.training.accumulate import WEIGHT
from graphc.runtime.accumulating import AccumulatingTrainer, check_accumulable, checked_accumulate, counting
from graphc.runtime.averaging import divisor, shard_weight
from graphc.runtime.distributed.cluster import settled
from graphc.runtime.distributed.trainer import DistributedTrainer

__all__ = ["DistributedAccumulatingTrainer"]


class DistributedAccumulatingTrainer(DistributedTrainer):
    """``DistributedTrainer`` stepping the optimizer once per ``accumulate`` micro-batches (module
    docstring). ``combines`` counts the workers' combines (one per optimizer step)."""

    def __init__(self, *args: Any, accumulate: int = 1, **kwargs: Any):
        self._k = checked_accumulate(accumulate)
        self.combines = 0
        super().__init__(*args, accumulate=self._k, **kwargs)

    def _open(self, *args: Any) -> Any:
        # DistributedTrainer.__init__ opens with k=1 (Trainer.__new__ makes this class wherever k > 1)
        return super()._open(*args, self._k)

    def _check_data_parallel(self) -> None:
        super()._check_data_parallel()
        check_accumulable(self.manifest, self.artifacts.gradients.proto, self.accumulate)
        self._seeded = WEIGHT in {e.name for e in self.manifest.graphs["gradients"].inputs}

    step = AccumulatingTrainer.step  # the batch split into micro-batches, then this class's _step_on

    def _step_on(self, batches: list[Mapping[str, np.ndarray]], of: Optional[int] = None) -> float:
        """One optimizer step on the global micro-batches ``batches``; returns the step's loss (the
        micro-batches' weighted mean, or sum for a summed loss; ``of``: ``counting``'s)."""
        metrics = self._prediction is not None and self._prediction in self._fetch  # fit's train metrics
        counted = counting(self, batches, of)
        batches = [batch for batch, *_ in counted]
        plans = [self._messages(batch, self.batch_specs, noise=True, counted=(feeds, weight))
                 for batch, feeds, _, weight in counted]
        for index, (messages, _) in enumerate(plans):
            for message in messages:
                message.update(metrics=metrics, micro=(index, len(batches)))
        if self._seeded:
            self._seed_shares([feeds for _, feeds, _, _ in counted], [bounds for _, bounds in plans],
                              [messages for messages, _ in plans])
        what = f"training step {self.step_count + 1}"
        with self._interrupts:
            # the first micro-batch's calls take a sharded update's new params (unsharded, none are pending)
            calls = [[r.step.options(num_returns=self._returns if index + 1 == len(plans) else 2).remote(
                m, *([] if index else self._pending)) for r, m in zip(self._replicas, messages)]
                for index, (messages, _) in enumerate(plans)]
            pending, combine, shares = self._updates(calls[-1], True)
            made = [grads for call in calls for _, *parts in call for grads in parts]  # unsharded: pending too
            with settled(self._ray, made + pending + combine + shares + self._pending):
                infos = [self._get([info for info, *_ in call], f"{what}, micro-batch {index + 1} of {len(batches)}",
                                   bounds) for index, (call, (_, bounds)) in enumerate(zip(calls, plans))]
                norms = self._get(combine, f"the optimizer update of step {self.step_count + 1}")
            self._pending = pending if self._plan is not None else []
            self.combines += 1
            total = divisor(self.manifest.loss, sum(i["weight"] for part in infos for i in part),
                            "the step's micro-batches")
            self._step_outputs = {self._grad_norm: np.asarray(norms[0])} if self._grad_norm else None
            self.step_count += 1
            if metrics:
                self._step_metrics = self._summed_metrics(batches, infos, plans)
            return sum(i["loss"] for part in infos for i in part) / total

    def _seed_shares(self, feeds: list[dict], bounds: list[list[tuple[int, int]]], messages: list[list[dict]]) -> None:
        """Give each worker's micro-batch messages (``messages``; the micro-batches' ``feeds`` cut at ``bounds``)
        the ``share`` its backward is seeded with, its shard's weight (``averaging.shard_weight``) over the
        ``divisor`` of the worker's total for the step, which ``LocalSums`` then adds at 1: torch's DDP rank
        running ``(loss * shard_rows / its_step_rows).backward()`` under ``no_sync`` (a summed loss: 1)."""
        loss = self.manifest.loss
        label = loss.get("label")
        weights = [[shard_weight(loss, {label: f[label][lo:hi]} if label in f else {}, hi - lo) for lo, hi in cut]
                   for f, cut in zip(feeds, bounds)]
        for rank in range(len(messages[0])):
            total = sum(w[rank] for w in weights)
            scale = divisor(loss, total) if total else 1.0  # every shard of the worker counts nothing
            for w, parts in zip(weights, messages):
                parts[rank].update(share=w[rank] / scale, divisor=scale)

    def _summed_metrics(self, batches: list, infos: list[list[dict]], plans: list) -> dict[str, float]:
        """The step's train metrics times its examples: each micro-batch's (``_joined_metrics``) added."""
        summed: dict[str, float] = {}
        for batch, part, (messages, _) in zip(batches, infos, plans):
            for name, value in self._joined_metrics(batch, part, sum(m["rows"] for m in messages)).items():
                summed[name] = summed.get(name, 0.0) + value
        return summed
