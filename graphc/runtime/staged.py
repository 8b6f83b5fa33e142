"""Data-parallel shards run stage by stage: a graph with exchanges (``gc.nn.SyncBatchNorm``'s
gathers) cut by ``passes/training/stages.py``, every shard through stage k, the marked
values exchanged across the shards, then stage k + 1. N shards then compute what one run on their
whole batch does. ``StagedRun.run`` runs the shards in one process; a data-parallel worker
(``distributed.replica``) runs its own with ``stage`` and ``receive``, the exchanges between workers.

Each shard's gradients are its share of the global loss's once weighted by its scale
(``scales``), as ``gc.Trainer(..., workers=N)`` weights the workers' gradients. A shard of share 0
(every label ignored: its own mean loss is 0/0) is seeded 0 (``LOSS_SEED``) and scaled 1: its
gradients are then the other shards' loss's, through its rows' part in the statistics, alone."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphc.errors import InputError
from graphc.passes.training.sync_batchnorm import LOSS_SEED


def scales(shares: Sequence[float]) -> list[float]:
    """What each shard's gradients (and its cotangents in an exchange) count times: its share of
    the global loss, or 1 for a share of 0 (seeded 0, its gradients are the global loss's)."""
    return [float(s) if s != 0 else 1.0 for s in shares]


def exchange(parts: Sequence[np.ndarray], scales: Sequence[float], rank: int, kind: str) -> np.ndarray:
    """The exchange of the shards' ``parts`` (each [1, ...]) that shard ``rank`` receives:
    ``"gather"``, them all stacked in rank order ([shards, ...]: every shard gets the same bits);
    ``"gather_grad"``, the adjoint of a gather, its row ``rank`` of the cotangents ([shards, ...]
    each) that each shard computed in units of the global loss over its scale (``scales``),
    weighted by the shards' scales, summed, over this shard's scale (its gradients are weighted
    by it again)."""
    if kind == "gather":
        return np.concatenate(parts)
    total = np.zeros_like(parts[0][rank:rank + 1])
    for part, scale in zip(parts, scales):
        total = total + part[rank:rank + 1] * np.asarray(scale, part.dtype)
    return total / np.asarray(scales[rank], total.dtype)


class StagedRun:
    """``model`` (an ONNX model, a ``gc.Model`` or an onnx-ir model) cut into stages, each
    prepared on ``backend`` (``options`` go to its ``prepare``). Its ``LOSS_SEED`` initializer,
    if any, becomes an input that ``feeds`` gives."""

    def __init__(self, model: Any, backend: str = "numpy", **options: Any):
        from graphc.backends import get_backend
        from graphc.passes.training.stages import split

        if isinstance(model, onnx.ModelProto):
            model = ir.serde.deserialize_model(model)
        model = getattr(model, "ir", model).clone()
        self.seed = model.graph.initializers.pop(LOSS_SEED, None)
        if self.seed is not None:  # an input without a default: a backend may fold an initializer's
            self.seed.const_value = None
            model.graph.inputs.append(self.seed)
        self.stages = split(model)
        self.output_names = [v.name for v in model.graph.outputs]
        runner = get_backend(backend)
        self._exes = [None if s.model is None else runner.prepare(ir.serde.serialize_model(s.model), **options)
                      for s in self.stages]

    def feeds(self, shard: Mapping[str, Any], share: float) -> dict[str, Any]:
        """``shard``'s feeds, with the backward's seed: 0 for a ``share`` of 0, else 1."""
        if self.seed is None:
            return dict(shard)
        return {**shard, LOSS_SEED: np.asarray(share != 0, self.seed.dtype.numpy())}

    def stage(self, k: int, env: MutableMapping[str, Any]) -> dict[str, np.ndarray]:
        """Run stage ``k`` on ``env`` (a shard's values by name, host arrays or device handles),
        adding its outputs; returns what its exchanges read, by name."""
        exe = self._exes[k]
        if exe is not None:
            host, _ = exe.run_bound({n: env[n] for n in exe.input_names if n in env}, exe.output_names)
            env.update(host)
        return {point.source: np.asarray(env[point.source]) for point in self.stages[k].exchanges}

    def receive(self, k: int, env: MutableMapping[str, Any], parts: Sequence[Mapping[str, np.ndarray]],
                scales: Sequence[float], rank: int) -> None:
        """Put into ``env`` (shard ``rank``'s) the exchanges after stage ``k`` of every shard's
        ``parts`` (``stage``'s, in rank order), the gradient ones weighted by ``scales``."""
        for point in self.stages[k].exchanges:
            env[point.target] = exchange([p[point.source] for p in parts], scales, rank, point.kind)

    def run(self, shards: Sequence[Mapping[str, np.ndarray]], shares: Sequence[float]) -> list[dict[str, np.ndarray]]:
        """Each shard's outputs, the shards (their feeds) run together; ``shares``: each one's
        share of the global loss (a mean loss: its rows over all rows; 0: it counts for nothing,
        its labels must still give a finite loss), which weight the gradient exchanges."""
        if len(shares) != len(shards) or not shards:
            raise InputError(f"StagedRun.run: expected one share per shard and at least one shard, got "
                             f"{len(shards)} shards and {len(shares)} shares")
        if not any(shares):
            raise InputError(f"StagedRun.run shares: expected one that is not 0, got {list(shares)}")
        envs = [self.feeds(feeds, share) for feeds, share in zip(shards, shares)]
        weights = scales(shares)
        for k in range(len(self.stages)):
            parts = [self.stage(k, env) for env in envs]
            for rank, env in enumerate(envs):
                self.receive(k, env, parts, weights, rank)
        return [{n: env[n] for n in self.output_names} for env in envs]
