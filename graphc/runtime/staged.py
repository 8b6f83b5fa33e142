"""Data-parallel shards run in one process, stage by stage: a graph with all-reduce points
(``gc.nn.SyncBatchNorm``'s training graphs) cut by ``passes/training/stages.py``, every shard
through stage k, the marked values exchanged across the shards, then stage k + 1. N shards then
compute what one run on their whole batch does; a data-parallel worker runs the same stages with
the same exchange between workers.

Each shard's gradients are its share of the global loss's once weighted by its share
(``exchange``), as ``gc.Trainer(..., workers=N)`` weights the workers' gradients."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphc.errors import InputError


def exchange(parts: Sequence[np.ndarray], shares: Sequence[float], rank: int, kind: str) -> np.ndarray:
    """The all-reduce of the shards' ``parts`` that shard ``rank`` receives: ``"sum"``, their sum
    (in rank order: every shard gets the same bits); ``"grad"``, the gradient of a sum, which each
    shard computed from its own loss (seed 1): the cotangents weighted by the shards' ``shares``
    of the global loss, summed, over this shard's share (its gradients are weighted by it again)."""
    total = np.zeros_like(parts[0])
    for part, share in zip(parts, shares):
        total = total + (part if kind == "sum" else part * np.asarray(share, part.dtype))
    return total if kind == "sum" else total / np.asarray(shares[rank], total.dtype)


class StagedRun:
    """``model`` (an ONNX model, a ``gc.Model`` or an onnx-ir model) cut into stages, each
    prepared on ``backend`` (``options`` go to its ``prepare``)."""

    def __init__(self, model: Any, backend: str = "numpy", **options: Any):
        from graphc.backends import get_backend
        from graphc.passes.training.stages import split

        if isinstance(model, onnx.ModelProto):
            model = ir.serde.deserialize_model(model)
        model = getattr(model, "ir", model)
        self.stages = split(model)
        self.output_names = [v.name for v in model.graph.outputs]
        runner = get_backend(backend)
        self._exes = [None if s.model is None else runner.prepare(ir.serde.serialize_model(s.model), **options)
                      for s in self.stages]

    def run(self, shards: Sequence[Mapping[str, np.ndarray]], shares: Sequence[float]) -> list[dict[str, np.ndarray]]:
        """Each shard's outputs, the shards (their feeds) run together; ``shares``: each one's
        share of the global loss (a mean loss: its rows over all rows), which weights the
        gradient exchanges (``exchange``)."""
        if len(shares) != len(shards) or not shards:
            raise InputError(f"StagedRun.run: expected one share per shard and at least one shard, got "
                             f"{len(shards)} shards and {len(shares)} shares")
        if any(s <= 0 for s in shares):
            raise InputError(f"StagedRun.run shares: expected each > 0, got {list(shares)}")
        envs = [dict(feeds) for feeds in shards]
        for stage, exe in zip(self.stages, self._exes):
            if exe is not None:
                for env in envs:
                    env.update(exe.run({n: env[n] for n in exe.input_names if n in env}))
            for point in stage.exchanges:
                parts = [np.asarray(env[point.source]) for env in envs]
                for rank, env in enumerate(envs):
                    env[point.target] = exchange(parts, shares, rank, point.kind)
        return [{n: env[n] for n in self.output_names} for env in envs]
