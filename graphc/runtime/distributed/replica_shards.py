"""A data-parallel worker's side of a sharded optimizer update (``optimizer_shards``): the
``Replica`` methods that split its gradients by shard, step its own shard and take the others'.
A shard's slice of a flat buffer (``flat_pieces``) is gathered from the params before its update and
written back after it, by its owner and by every worker that takes it; its state is that slice alone.

Calls per step, which the driver chains without waiting on any: ``step`` returns the worker's
gradients as one object per shard; ``update_shard`` (given every worker's object for this worker's
shard) averages them as ``Replica.apply`` does, steps the shard and returns its new params; or, where
the update reads every gradient, ``reduce_shard`` returns this shard's share of the total norm and
inf/NaN check and ``apply_shard`` (given every worker's share) steps; the next ``step`` (or ``apply``)
takes every other shard's new params (``take``)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from graphc.passes.training.clipping import joined_norm
from graphc.passes.training.guarded_params import TOUCHED_SUFFIX
from graphc.passes.training.update_graphs import FOUND_INF, NORM_PART, TOTAL_NORM
from graphc.runtime.distributed.flat_pieces import gather, piece_name, scatter, spans
from graphc.runtime.distributed.optimizer_shards import shard_key
from graphc.runtime.distributed.renorm_rows import RENORMED

__all__ = ["ShardedUpdate"]


class ShardedUpdate:
    """``Replica``'s sharded update; ``_shards`` is None for an unsharded one."""

    _shards: Optional[dict] = None

    def _shard_protos(self, protos: dict, layout: Optional[dict]) -> set[str]:
        """Take this rank's update (and ``norm_parts``) graph out of ``protos`` (every rank's, by
        ``shard_key``), where ``layout`` (``ShardPlan.layout``) is given; returns the carried tensors
        other ranks keep (this worker leaves them out)."""
        self._shards = layout
        if layout is None:
            return set()
        mine = {shard_key(kind, self.rank): kind for kind in ("update", "norm_parts")}
        for key in [k for k in protos if "/" in k]:
            proto = protos.pop(key)
            if key in mine:
                protos[mine[key]] = proto
        self._mine = set(layout["params"][self.rank])
        buffers = {b.name: b for b in self.manifest.layout}
        self._pieces = {rank: {piece_name(name): (buffers[name], lo, hi) for name, (lo, hi) in pieces.items()}
                        for rank, pieces in enumerate(layout["pieces"])}
        self._slices = {tensor: (lo, hi) for buf, lo, hi in self._pieces[self.rank].values()
                        for tensor, _ in buf.tensors()}  # this rank's slices of split buffers' state
        self._feeds: dict[str, Any] = {}
        parts = protos.get("norm_parts")  # a shard of params only: its inputs and outputs
        self._parts_io = (({v.name for v in parts.graph.input}, [v.name for v in parts.graph.output])
                          if parts is not None else None)
        dtype = next((v.type.tensor_type.elem_type for v in protos["update"].graph.input if v.name == TOTAL_NORM), None)
        self._norm_dtype = _numpy_dtype(dtype) if dtype else None  # a shard of no params' share of the norm
        mine = set(layout["owned"][self.rank])
        return {n for rank, names in enumerate(layout["owned"]) if rank != self.rank for n in names} - mine

    def _own(self, name: str, array: np.ndarray) -> np.ndarray:
        """What this worker keeps of the carried tensor ``name`` (train_step's ``array``): its slice of
        a split buffer's state, else all of it."""
        if self._shards is None or name not in self._slices:
            return array
        lo, hi = self._slices[name]
        return np.asarray(array)[lo:hi]

    def _parts(self, grads: Optional[dict]) -> tuple:
        """``grads`` (``_outputs``' or ``LocalSums``') as one object per shard: its params' gradients
        (a slice of a split buffer's as one, ``<piece>_grad``), touched flags and renormalised values, each with the weight (and a staged step's scale) and
        the BatchNorm statistics (rank 0's); unsharded, as it is."""
        if self._shards is None:
            return (grads,)
        if grads is None:
            return (None,) * len(self._shards["params"])
        out = []
        for rank, params in enumerate(self._shards["params"]):
            pieces = self._pieces[rank].items()
            spanned = [p for buf, lo, hi in self._pieces[rank].values() for p, *_ in spans(buf, lo, hi)]
            names = {n for p in params for n in (f"{p}_grad", p + TOUCHED_SUFFIX)} | {
                p + RENORMED for p in [*params, *spanned]}
            stats = {n: a for n, a in grads["stats"].items() if not n.endswith(RENORMED) or n in names}
            mine = {n: a for n, a in grads["grads"].items() if n in names}
            mine.update({f"{piece}_grad": gather(buf, lo, hi, grads["grads"], "_grad") for piece, (buf, lo, hi)
                         in pieces if grads["grads"]})  # none: a shard whose labels all count for nothing
            out.append({**grads, "grads": mine, "stats": stats,
                        "touched": {n: a for n, a in grads["touched"].items() if n in names}})
        return tuple(out)

    def reduce_shard(self, step: int, *gathered: Optional[dict]) -> dict:
        """Every worker's gradients of this shard (``_parts``) averaged, kept for ``apply_shard``;
        returns this shard's ``norm_parts`` (found_inf, its share of the norm: False and 0 for a shard
        of no params)."""
        self._feeds = feeds = self._averaged(gathered)
        for piece, (buf, lo, hi) in self._pieces[self.rank].items():  # after the renormalised params are taken
            host = {p: self._update.to_host(self._state[p]) for p, *_ in spans(buf, lo, hi)}
            feeds[piece] = self._state[piece] = self._update.to_device(gather(buf, lo, hi, host))
        if not {FOUND_INF, TOTAL_NORM} & self._update_inputs:
            return {}
        if not self._mine and not self._pieces[self.rank]:
            return {FOUND_INF: False,
                    NORM_PART: np.zeros((), self._norm_dtype) if self._norm_dtype is not None else None}
        if not hasattr(self, "_norm_parts"):
            self._norm_parts = self._prepare("norm_parts")
        inputs, outputs = self._parts_io
        host, _ = self._norm_parts.run_bound({n: a for n, a in self._feeds.items() if n in inputs}, outputs)
        return {FOUND_INF: bool(host[FOUND_INF]) if FOUND_INF in host else False, NORM_PART: host.get(NORM_PART)}

    def apply_shard(self, step: int, *shares: dict) -> tuple[dict, Optional[float]]:
        """Step this shard on ``reduce_shard``'s average, given every worker's share (none: an update
        that reads no gradient but its own); returns (this shard's new params, the total norm before
        clipping or None)."""
        feeds, norm = self._feeds, None
        if FOUND_INF in self._update_inputs:
            feeds[FOUND_INF] = np.array(any(s[FOUND_INF] for s in shares))
        if TOTAL_NORM in self._update_inputs:
            norm = joined_norm([s[NORM_PART] for s in shares], self.manifest.optimizer.get("grad_norm_type", 2.0))
            feeds[TOTAL_NORM] = norm
        self._feeds = {}
        self._run_update(feeds)
        new = {p: self._update.to_host(self._state[p]) for p in self._mine}
        for piece in self._pieces[self.rank]:  # not a carried tensor: gathered again next step. Copied before
            # its handle goes: onnxruntime's to_host is a view of the handle's memory, garbage once it is freed
            new[piece] = np.array(self._update.to_host(self._state[piece]), copy=True)
            del self._state[piece]
        self._scatter(self.rank, new)
        return new, None if norm is None else float(norm)

    def update_shard(self, step: int, *gathered: Optional[dict]) -> tuple[dict, Optional[float]]:
        """``reduce_shard`` then ``apply_shard``, for an update that reads no gradient but its own."""
        self.reduce_shard(step, *gathered)
        return self.apply_shard(step)

    def take(self, updates: tuple) -> None:
        """Set every other shard's new params (``apply_shard``'s, in rank order)."""
        for rank, update in enumerate(updates):
            if rank != self.rank:
                for name, value in update.items():
                    if name not in self._pieces[rank]:
                        self._state[name] = self._update.to_device(np.asarray(value))
                self._scatter(rank, update)

    def _scatter(self, rank: int, update: dict) -> None:
        """Write rank ``rank``'s new slices of split buffers (in ``update``) into the params."""
        def read(param: str) -> np.ndarray:
            return self._update.to_host(self._state[param])

        for piece, (buf, lo, hi) in self._pieces[rank].items():
            for name, value in scatter(buf, lo, hi, np.asarray(update[piece]), read).items():
                self._state[name] = self._update.to_device(value)


def _numpy_dtype(elem_type: int) -> np.dtype:
    import onnx

    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)
