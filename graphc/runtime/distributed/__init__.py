"""Scale out on Ray (``pip install "graphc[ray]"``): data-parallel training and batch inference.

* ``gc.Trainer(artifacts, workers=N, ray_address=None)`` trains on ``N`` Ray actors
  (``DistributedTrainer``, ``graphc.runtime.distributed.trainer``);
* ``gc.distributed.map_batches(model, data)`` runs a ``gc.Session`` per Ray worker over a
  ``ray.data.Dataset`` or a dict of arrays (``graphc.runtime.distributed.inference``).

Importing this package does not import Ray; using it without Ray raises ``gc.MissingDependency``.
"""

from __future__ import annotations

from graphc.runtime.distributed.cluster import WorkerLost
from graphc.runtime.distributed.inference import map_batches
from graphc.runtime.distributed.trainer import DistributedTrainer

__all__ = ["DistributedTrainer", "WorkerLost", "map_batches"]
