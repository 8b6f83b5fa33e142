"""What a data-parallel Trainer gives ``update_bn`` (``weight_averaging.recount_batchnorms``), which
runs on the driver, as torch's ``update_bn`` runs on one process's averaged model: the averaged
copy read from the workers (rank 0's: they hold the same), the workers' backend on the driver,
and the recomputed statistics set on every worker."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DriverAveraging"]


class DriverAveraging:
    """``DistributedTrainer``'s ``_backend``, ``_eval_state`` and ``_put_carried`` for ``update_bn``."""

    @property
    def _backend(self) -> Any:
        from graphc.backends import get_backend

        return get_backend(self.backend)

    def _eval_state(self, averaged: bool = False) -> dict[str, np.ndarray]:
        """The carried tensors the eval graph reads (``averaged``: their averaged copies), on the host."""
        from graphc.passes.training.weight_averaging import PREFIX

        state, prefix = self.state_dict(), PREFIX if averaged else ""
        return {e.name: state[prefix + e.name] for e in self.manifest.graphs["eval"].inputs if e.name in state}

    def _put_carried(self, name: str, array: np.ndarray) -> None:
        """Set the carried tensor ``name`` on every worker, once the pending update is applied."""
        self._sync()
        self._get([r.set.remote({name: array}) for r in self._replicas], f"setting {name}")
