"""What the data-parallel driver iterates in ``fit`` over a ``gc.data.DataLoader`` (or
``RayDataLoader``) the workers hold: batch positions with shape stand-ins, not the data (each worker
reads its own rows); and a ``RayDataLoader`` run before the workers hold the CPUs its dataset needs
(``ray_data_first``)."""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import numpy as np

from graphc.runtime.data import DataLoader
from graphc.runtime.ray_data import RayDataLoader
from graphc.runtime.ray_waits import waits_at_most

__all__ = ["LoaderBatch", "ReadOnWorkers", "read_on_workers", "ray_data_first"]


def ray_data_first(fit: Callable) -> Callable:
    """``DistributedTrainer.fit`` that first runs each ``RayDataLoader`` it is given (``loader``,
    ``eval_loader``) not yet run, with the workers stopped meanwhile and started again from the
    same state: the dataset's read and map tasks ask for a CPU each (Ray Data's default), and
    workers that hold every CPU made them, and ``fit``, wait for ever. Every wait of the driver on
    a loader's Ray work in ``fit`` is bounded by the trainer's ``timeout_s`` (``ray_waits``)."""
    @functools.wraps(fit)
    def storing_first(trainer, *args, **kwargs):
        given = inspect.signature(fit).bind(trainer, *args, **kwargs).arguments
        waiting = [d for d in (given["loader"], given.get("eval_loader"))
                   if isinstance(d, RayDataLoader) and not d.stored]
        with waits_at_most(trainer.timeout_s):
            if waiting:
                tensors = trainer.state_dict()  # the pending update applied
                trainer.shutdown()
                try:
                    for data in waiting:
                        data.num_samples  # noqa: B018 - runs the dataset into the object store
                finally:
                    trainer._start(tensors)
            return fit(trainer, *args, **kwargs)
    return storing_first


READS = ("iter_epoch", "order", "batch", "column")  # what one process iterates by, the driver and workers read by


def read_on_workers(loader) -> bool:
    """Whether the workers read ``loader``'s batches themselves: a ``DataLoader`` or ``RayDataLoader``
    read as the class does (``READS``). A subclass's own ``batch`` (an augmentation, say) or ``order``
    would run on the workers, per shard, but not in one process's iteration: it runs on the driver."""
    return any(isinstance(loader, kind) and all(getattr(type(loader), m) is getattr(kind, m) for m in READS)
               for kind in (DataLoader, RayDataLoader))


class LoaderBatch(dict):
    """Batch ``index`` of ``epoch`` of the loader the workers hold: the ``labels`` arrays are the
    batch's own (so the driver skips a batch of ignored labels, as one process does), each other
    array's name maps to a zero-stride stand-in with the batch's shape and dtype, so the driver
    checks the batch and counts its rows without the data, which each worker reads for its own rows."""

    def __init__(self, loader: DataLoader, epoch: int, index: int, labels: set[str]):
        rows = min(loader.batch_size, loader.num_samples - index * loader.batch_size)
        super().__init__({n: loader.column(epoch, index, n) if n in labels else
                          np.broadcast_to(np.zeros((), a.dtype), (rows, *a.shape[1:]))
                          for n, a in loader.arrays.items()})
        self.epoch, self.index = epoch, index


class ReadOnWorkers:
    """``loader`` as ``Trainer._fit_epoch`` iterates it, yielding ``LoaderBatch`` positions."""

    def __init__(self, loader: DataLoader, labels: set[str]):
        self.loader, self.labels = loader, labels

    def __len__(self) -> int:
        return len(self.loader)

    def iter_epoch(self, epoch: int, start: int = 0):
        return (LoaderBatch(self.loader, epoch, index, self.labels) for index in range(start, len(self.loader)))
