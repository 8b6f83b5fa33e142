"""How ``DistributedTrainer`` cuts a global batch into its workers' step or evaluation messages:
each worker's shard (or where to read it), its rows and Dropout noise shapes, and the bounds of
each shard's rows; and the refusal of a cross-entropy whose class count follows the rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from graphc.errors import ArtifactsError
from graphc.runtime.distributed.loader_batches import LoaderBatch
from graphc.runtime.distributed.shards import bounds_of, joined

__all__ = ["BatchMessages"]


class BatchMessages:
    """``DistributedTrainer``'s batch cutting (see the module's docstring)."""

    def _messages(self, batch: Mapping[str, np.ndarray], specs, noise: bool, whole: bool = False,
                  counted: Optional[tuple[dict, float]] = None) -> tuple[list[dict], list[tuple[int, int]]]:
        """Each worker's part of ``batch``: its shard (or, for a ``LoaderBatch``, where to read
        it; inputs not by rows whole), its rows and the shapes of the Dropout noise it draws; and
        the bounds of each worker's rows (``_bounds``). ``counted``: the batch's ``_batch_feeds``
        of ``specs`` and its weight where the caller has them (a micro-batch's: ``accumulating.counting``)."""
        feeds, weight = counted or (self._batch_feeds(batch, specs), None)
        read = isinstance(batch, LoaderBatch)
        if noise:  # a train step
            self._refuse_step(feeds, weight)
        given = {s.name: np.asarray(batch[s.name]) for s in self.noise_specs if s.name in batch and noise and not read}
        bounds = self._bounds(feeds, noise, whole)
        self._refuse_split_classes(feeds, bounds)
        out = []
        for lo, hi in bounds:
            message: dict[str, Any] = {"rows": hi - lo, "step": self.step_count, "seed": self._seed, "set": self._later}
            if read:
                message["read"] = (batch.epoch, batch.index, lo, hi)
                shard = {n: a[lo:hi] for n, a in batch.items()}  # shape stand-ins: no data
            else:
                message["shard"] = shard = {n: a[lo:hi] if n in self._rows else a
                                            for n, a in {**feeds, **given}.items()}
            if noise and self.noise_specs and hi > lo:
                message["noise"] = self._noise_shapes(shard, shard)
            out.append(message)
        return out, bounds

    def _bounds(self, feeds: Mapping[str, np.ndarray], train: bool, whole: bool = False) -> list[tuple[int, int]]:
        """(first row, end row) of each worker's shard of the batch ``feeds``, for a train step or
        (not ``train``) an evaluation; ``whole``: all on rank 0."""
        rows = next((len(a) for n, a in feeds.items() if n in self._rows), 0)
        return joined(self.manifest.loss, bounds_of(rows, self.workers, whole, pairs=train and self._pairs), feeds)

    def _refuse_split_classes(self, feeds: Mapping[str, np.ndarray], bounds: list[tuple[int, int]]) -> None:
        """Refuse a cross-entropy whose class count C follows the rows a worker gets (logits
        ``[N, N]`` of a contrastive loss, or a C the model computes from them): each worker's
        logits would then hold other classes than the whole batch's, and its loss a label >= its
        own C as 0, so the shards could not make the whole batch's loss, predictions or step."""
        loss = self.manifest.loss
        shards = [(lo, hi) for lo, hi in bounds if hi > lo]
        if loss.get("kind") != "cross_entropy" or len(shards) < 2:
            return
        whole = self._classes(feeds)
        for rank, (lo, hi) in enumerate(shards):
            part = self._classes({n: a[lo:hi] if n in self._rows else a for n, a in feeds.items()})
            if part != whole:
                raise ArtifactsError(f"the cross-entropy's logits {loss['output']!r} have {whole} classes for the "
                                     f"batch's {bounds[-1][1]} rows but {part} for the {hi - lo} rows of worker "
                                     f"rank {rank}: the class dim follows the rows, so the workers' losses cannot make"
                                     " the whole batch's (a label past a shard's classes counts 0); use workers=1")
