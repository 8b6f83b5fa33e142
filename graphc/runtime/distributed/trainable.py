"""Which training artifacts data-parallel workers can train as one process would."""

from __future__ import annotations

from typing import Any

from graphc.errors import ArtifactsError
from graphc.passes.training.loss_scaling import state_names

__all__ = ["check_data_parallel"]


def check_data_parallel(manifest: Any, workers: int) -> None:
    """Refuse, saying why, artifacts ``workers`` workers cannot train as one process would: a loss
    that is a scalar output (graphc cannot tell a mean from a sum, so shards cannot be combined)
    and a gradients graph from before it output the BatchNorm statistics' updates (they would
    stay frozen)."""
    loss = manifest.loss
    if loss.get("kind") == "output" and workers > 1:
        raise ArtifactsError(f"the loss is the model's scalar output {loss['output']!r}: how it grows with the "
                             "batch's rows (a mean? a sum?) is unknown, so the workers' shards cannot be combined "
                             "into the whole batch's loss and gradients; generate the artifacts with a gc.losses "
                             "spec (gc.losses.mse, cross_entropy, ...) to train data-parallel, or train with one "
                             "worker")
    grads = manifest.graphs["gradients"]
    outputs = {e.name for e in grads.outputs}
    # not the statistics of batchnorm="frozen", nor the loss scale (the update graph's)
    updated = set(manifest.feeds.values()) - set(state_names(manifest.loss_scale))
    stats = [e.name for e in grads.inputs if e.role == "state" and e.name in updated
             and f"{e.name}.next" not in outputs]
    if stats:
        raise ArtifactsError(f"the gradients graph does not output the updated BatchNorm statistics "
                             f"{stats} (artifacts from an older graphc): generate them again "
                             "(`graphc grad` / gc.training.generate) to train them data-parallel")
