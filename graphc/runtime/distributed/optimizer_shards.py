"""``gc.Trainer(workers=N, shard_optimizer=True)``: each worker steps and keeps the optimizer state of
its own share of the params (ZeRO stage 1, torch's ``ZeroRedundancyOptimizer``).

The params are cut into ``N`` shards balanced by bytes (``ShardPlan``, ``shard_balance``): the params
outside the fused update's flat buffers whole, the largest first to the least loaded worker (rank 0
first, and given a unit every step reads where there is one, so the state all shards share, ``step``
and a scheduled momentum's running state, is rank 0's, as every worker computes it), then the flat
buffers cut at element boundaries to even the loads: a worker steps a buffer it holds whole per param,
as unsharded, and a slice of one as a 1-D param of its own (``flat_pieces``), its state that slice of
the buffer's. A worker's update graph steps its shard alone (``compile.training.update_model(args=...)``). A step's gradients leave each worker as ``N``
objects, one per shard (``Replica`` splits them), so a worker reads only its shard's gradients from
the others; it averages them as an unsharded worker does, steps its shard and returns its new params,
which every other worker takes before its next gradients (the all-gather, at the next step's call).
Where the update reads every gradient (``max_grad_norm``'s total norm, loss scaling's inf/NaN check)
the workers first exchange one share each (``update_graphs.norm_parts_graph``), then step: the same
total norm (``clipping.joined_norm``, which ``History.step_grad_norms`` records) and the same skip.
``state_dict`` and checkpoints join the owners' state into the unsharded layout (per param), so a
checkpoint resumes on any number of workers, sharded or not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

import onnx_ir as ir

from graphc.compile.training import CARRIED_ROLES, Manifest, update_args, update_model
from graphc.model import Model
from graphc.model.dtypes import to_numpy, to_onnx
from graphc.passes.training import flat
from graphc.passes.training.guarded_params import STEP_SUFFIX
from graphc.runtime.distributed.flat_pieces import piece_name
from graphc.runtime.distributed.shard_balance import Buffer, balance

__all__ = ["ShardPlan", "shard_key"]


def shard_key(kind: str, rank: int) -> str:
    """The key of rank ``rank``'s graph ``kind`` (``update``, ``norm_parts``) among the workers' graphs."""
    return f"{kind}/{rank}"


class ShardPlan:
    """Which whole params (``params[rank]``), slices of flat buffers (``pieces[rank]``: ``{buffer:
    (first, end)}`` elements) and optimizer state (``owned[rank]``: train_step's names, a split buffer's
    held by each of its slices' ranks) each of ``workers`` ranks steps and keeps, its bytes
    (``bytes[rank]``), and each rank's graphs (``graphs``)."""

    def __init__(self, manifest: Manifest, workers: int):
        manifest = manifest.in_model_order()
        step = manifest.graphs["train_step"]
        entries = {e.name: e for e in step.inputs}
        params = [e.name for e in step.inputs if e.role == "param"]
        grouped = {p for buf in manifest.layout for p in buf.params}

        def itemsize(name: str) -> int:
            return np.dtype(to_numpy(entries[name].dtype)).itemsize

        units = [([p], math.prod(entries[p].shape) * itemsize(p)) for p in params if p not in grouped]
        gated = {p for p in params if p + STEP_SUFFIX in entries}
        order = sorted(units, key=lambda u: (-u[1], params.index(u[0][0])))
        first = next((u for u in order if u[0][0] not in gated), None)  # rank 0 steps a unit every step reads
        if first is not None:
            order = [first, *(u for u in order if u is not first)]
        buffers = [Buffer(b.name, sum(size for *_, size in b.offsets()), itemsize(b.params[0])) for b in manifest.layout]
        shares = balance(order, buffers, workers, lead=first is None)
        self.buffers = {b.name: b for b in manifest.layout}
        elements = {b.name: b.elements for b in buffers}
        for mine, pieces in zip(shares.params, shares.pieces):  # a whole buffer: stepped per param, as unsharded
            for name, (lo, hi) in list(pieces.items()):
                if hi - lo == elements[name]:
                    mine += self.buffers[name].params
                    del pieces[name]
        self.params, self.pieces, self.bytes = shares.params, shares.pieces, shares.bytes
        self.manifest, self.workers = manifest, workers
        carried = {e.name for e in step.inputs if e.role in CARRIED_ROLES}
        self._args = [self._update_args(set(mine), pieces) for mine, pieces in zip(self.params, self.pieces)]
        self._update = [update_model(manifest, args=args) for args in self._args]
        inputs = [{v.name for v in m.proto.graph.input} & carried for m in self._update]
        sliced = {name for pieces in self.pieces for buf in pieces for name, _ in self.buffers[buf].tensors()}
        shared = set.intersection(*inputs) - sliced
        every = set(params)
        self.owned = [names - shared - every for names in inputs]  # optimizer state: one owner each, or a slice

    def _update_args(self, mine: set[str], pieces: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
        """``update_args`` of the params ``mine`` and, for each of ``pieces``, its slice of a flat
        buffer as one 1-D param (``flat_pieces``) in a buffer of its own, named as the buffer."""
        args = update_args(self.manifest, mine)
        for name, (lo, hi) in pieces.items():
            buf, dtype = self.buffers[name], ir.DataType(to_onnx(self.buffers[name].dtype))
            value = ir.Value(name=piece_name(name), type=ir.TensorType(dtype), shape=ir.Shape([hi - lo]))
            args["params"].append(value)
            args["groups"].append(flat.Group(name, dtype, [value.name], [(hi - lo,)], buf.weight_decay))
        return args

    @property
    def exchanges(self) -> bool:
        """Whether the update reads every gradient (a total norm, an inf/NaN check): the workers
        exchange their shares (``norm_parts``) before they step."""
        return self.manifest.optimizer.get("max_grad_norm") is not None or self.manifest.loss_scale is not None

    def graphs(self) -> dict[str, Any]:
        """Each rank's update graph (and, with ``exchanges``, its ``norm_parts`` graph), by ``shard_key``."""
        from graphc.passes.training import update_graphs

        out: dict[str, Any] = {}
        for rank, (args, update) in enumerate(zip(self._args, self._update)):
            out[shard_key("update", rank)] = update
            if self.exchanges and args["params"]:
                out[shard_key("norm_parts", rank)] = Model(update_graphs.norm_parts_graph(
                    self.manifest.opset, args["optimizer"], args["params"], args["groups"], self.manifest.loss_scale,
                    args["norm_dtype"]))
        return out

    def issue(self, replicas: list, step: int, calls: list) -> tuple[list, list, list]:
        """Make the owners' updates to ``step`` from the step ``calls`` (each worker's (info, one
        gradients object per shard) refs), without waiting: returns the refs of each rank's new params,
        of its total norm before clipping (None without ``max_grad_norm``) and of its exchanged share
        (``reduce_shard``; none without an exchange), which a failed step settles."""
        mine = [[parts[rank] for _, *parts in calls] for rank in range(self.workers)]
        shares = []
        if self.exchanges:
            shares = [r.reduce_shard.remote(step, *grads) for r, grads in zip(replicas, mine)]
            out = [r.apply_shard.options(num_returns=2).remote(step, *shares) for r in replicas]
        else:
            out = [r.update_shard.options(num_returns=2).remote(step, *grads) for r, grads in zip(replicas, mine)]
        return [params for params, _ in out], [norm for _, norm in out], shares

    def layout(self) -> dict[str, Any]:
        """What each worker is told (``Replica.setup``): every rank's params, and the state the others own."""
        return {"params": self.params, "pieces": self.pieces, "owned": [sorted(names) for names in self.owned]}

    def joined(self, states: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The carried tensors (train_step's names) from every rank's (``Replica.state(packed=True)``):
        each rank's own optimizer state (a split buffer's slices end to end), the rest rank 0's (every
        worker holds every param)."""
        out = dict(states[0])
        for rank, state in enumerate(states[1:], 1):
            out.update({n: a for n, a in state.items() if n in self.owned[rank]})
        for name, buf in self.buffers.items():
            holders = [rank for rank, pieces in enumerate(self.pieces) if name in pieces]
            if holders:
                out.update({tensor: np.concatenate([states[rank][tensor] for rank in holders])
                            for tensor, _ in buf.tensors()})
        return out
