"""What the data-parallel driver iterates in ``fit`` over a ``gc.data.DataLoader`` (or
``RayDataLoader``) the workers hold: batch positions with shape stand-ins, not the data (each worker
reads its own rows)."""

from __future__ import annotations

import numpy as np

from graphc.runtime.data import DataLoader
from graphc.runtime.ray_data import RayDataLoader

__all__ = ["LoaderBatch", "ReadOnWorkers", "read_on_workers"]


def read_on_workers(loader) -> bool:
    """Whether the workers read ``loader``'s batches themselves: a ``DataLoader`` or ``RayDataLoader``
    iterated as the class does (a subclass's own ``iter_epoch`` runs on the driver)."""
    return any(isinstance(loader, kind) and type(loader).iter_epoch is kind.iter_epoch
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
