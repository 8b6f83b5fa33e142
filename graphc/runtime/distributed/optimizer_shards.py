"""``gc.Trainer(workers=N, shard_optimizer=True)``: each worker steps and keeps the optimizer state of
its own share of the params (ZeRO stage 1, torch's ``ZeroRedundancyOptimizer``).

The params are cut into ``N`` shards balanced by bytes (``ShardPlan``): the units are the fused
update's flat buffers (each whole: its state is one flat buffer per slot) and the params outside them,
the largest first to the least loaded worker (rank 0 first, and given a unit every step reads where
there is one, so the state all shards share, ``step`` and a scheduled momentum's running state, is
rank 0's, as every worker computes it). A worker's update graph steps its shard alone
(``compile.training.update_model(shard=...)``). A step's gradients leave each worker as ``N``
objects, one per shard (``Replica`` splits them), so a worker reads only its shard's gradients from
the others; it averages them as an unsharded worker does, steps its shard and returns its new params,
which every other worker takes before its next gradients (the all-gather, at the next step's call).
Where the update reads every gradient (``max_grad_norm``'s total norm, loss scaling's inf/NaN check)
the workers first exchange one share each (``update_graphs.norm_parts_graph``), then step: the same
total norm (``clipping.joined_norm``, which ``History.step_grad_norms`` records) and the same skip.
``state_dict`` and checkpoints join the owners' state into the unsharded layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from graphc.compile.training import CARRIED_ROLES, Manifest, update_args, update_model
from graphc.model import Model
from graphc.model.dtypes import to_numpy
from graphc.passes.training.guarded_params import STEP_SUFFIX

__all__ = ["ShardPlan", "shard_key"]


def shard_key(kind: str, rank: int) -> str:
    """The key of rank ``rank``'s graph ``kind`` (``update``, ``norm_parts``) among the workers' graphs."""
    return f"{kind}/{rank}"


class ShardPlan:
    """Which params (``params[rank]``) and optimizer state (``owned[rank]``: train_step's names)
    each of ``workers`` ranks steps and keeps, and each rank's graphs (``graphs``)."""

    def __init__(self, manifest: Manifest, workers: int):
        manifest = manifest.in_model_order()
        step = manifest.graphs["train_step"]
        entries = {e.name: e for e in step.inputs}
        params = [e.name for e in step.inputs if e.role == "param"]
        grouped = {p for buf in manifest.layout for p in buf.params}
        units = [list(buf.params) for buf in manifest.layout] + [[p] for p in params if p not in grouped]

        def size(unit: list[str]) -> int:
            return sum(math.prod(entries[p].shape) * np.dtype(to_numpy(entries[p].dtype)).itemsize for p in unit)

        gated = {p for p in params if p + STEP_SUFFIX in entries}
        order = sorted(units, key=lambda u: (-size(u), params.index(u[0])))
        first = next((u for u in order if u[0] not in gated), None)  # rank 0 steps a unit every step reads
        if first is not None:
            order = [first, *(u for u in order if u is not first)]
        loads, self.params = [0] * workers, [[] for _ in range(workers)]
        for unit in order:
            rank = min(range(workers), key=lambda r: (loads[r], r))
            loads[rank] += size(unit)
            self.params[rank] += unit
        self.bytes = loads
        self.manifest, self.workers = manifest, workers
        carried = {e.name for e in step.inputs if e.role in CARRIED_ROLES}
        self._args = [update_args(manifest, set(mine)) for mine in self.params]
        self._update = [update_model(manifest, args=args) for args in self._args]
        inputs = [{v.name for v in m.proto.graph.input} & carried for m in self._update]
        shared = set.intersection(*inputs)
        every = set(params)
        self.owned = [names - shared - every for names in inputs]  # optimizer state: one owner each

    @property
    def exchanges(self) -> bool:
        """Whether the update reads every gradient (a total norm, an inf/NaN check): the workers
        exchange their shares (``norm_parts``) before they step."""
        return self.manifest.optimizer.get("max_grad_norm") is not None or self.manifest.loss_scale is not None

    def graphs(self) -> dict[str, Any]:
        """Each rank's update graph (and, with ``exchanges``, its ``norm_parts`` graph), by ``shard_key``."""
        from graphc.passes.training import update_graphs

        out: dict[str, Any] = {}
        for rank, (mine, args, update) in enumerate(zip(self.params, self._args, self._update)):
            out[shard_key("update", rank)] = update
            if self.exchanges and mine:
                out[shard_key("norm_parts", rank)] = Model(update_graphs.norm_parts_graph(
                    self.manifest.opset, args["optimizer"], args["params"], args["groups"], self.manifest.loss_scale,
                    args["norm_dtype"]))
        return out

    def issue(self, replicas: list, step: int, calls: list) -> tuple[list, list]:
        """Make the owners' updates to ``step`` from the step ``calls`` (each worker's (info, one
        gradients object per shard) refs), without waiting: returns the refs of each rank's new params
        and of its total norm before clipping (None without ``max_grad_norm``)."""
        mine = [[parts[rank] for _, *parts in calls] for rank in range(self.workers)]
        if self.exchanges:
            shares = [r.reduce_shard.remote(step, *grads) for r, grads in zip(replicas, mine)]
            out = [r.apply_shard.options(num_returns=2).remote(step, *shares) for r in replicas]
        else:
            out = [r.update_shard.options(num_returns=2).remote(step, *grads) for r, grads in zip(replicas, mine)]
        return [params for params, _ in out], [norm for _, norm in out]

    def layout(self) -> dict[str, Any]:
        """What each worker is told (``Replica.setup``): every rank's params, and the state the others own."""
        return {"params": self.params, "owned": [sorted(names) for names in self.owned]}

    def joined(self, states: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The carried tensors (train_step's names) from every rank's (``Replica.state(packed=True)``):
        each rank's own optimizer state, the rest rank 0's (every worker holds every param)."""
        out = dict(states[0])
        for rank, state in enumerate(states[1:], 1):
            out.update({n: a for n, a in state.items() if n in self.owned[rank]})
        return out
