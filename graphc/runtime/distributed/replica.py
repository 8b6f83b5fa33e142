"""One data-parallel worker: the gradients and update graphs on its own backend, its params on
that backend's device. Plain Python: ``DistributedTrainer`` runs it as a Ray actor.

One call per step (``step``): the worker first applies the previous step's update, then runs
``gradients`` on its shard of this step's global batch (params bound from the device) and
returns two objects: a few bytes for the driver (its loss and weight and, in ``fit``, its train
metrics as sums over its examples, ``use_metrics``) and its gradients with
their weight, which stay in Ray's object store. The next call gets every worker's gradients
refs as arguments: Ray hands each worker the others' objects (shared memory on one node, pulled
from the node that made them otherwise), and each worker sums them in rank order, each times its
share of the total weight (``weighted_sum``), so every worker applies the bit-identical average and runs the optimizer
``update`` graph, params and optimizer state staying on the device. The driver never holds the
gradients. BatchNorm running statistics are replaced by rank 0's (PyTorch DDP's
``broadcast_buffers``). A param read only under control flow is stepped where any worker's
``<param>.touched`` is true (DDP's ``find_unused_parameters``).

A gradients graph with exchanges (``gc.nn.SyncBatchNorm``'s gathers) runs in stages
(``runtime.staged``): ``begin`` makes ``step``'s start (``_started``), runs stage 0 and returns what
its exchanges read (with the shard's weight); each ``advance`` gets every worker's such object from
the last one (the same object-store hand-over as the gradients), exchanges and runs the next stage;
the last returns what ``step`` does. The driver chains the calls without waiting on any. The union
of the rows an embedding's max_norm renormalises (``renorm_rows``) goes to ``begin`` as to ``step``.

The shard is either sent (``step(batch)`` with arrays) or read by the worker from its own copy
of the ``gc.data.DataLoader`` (``fit``: the loader goes to the object store once, the step
message names the batch and the rows).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import onnx

from graphc.compile.training import CARRIED_ROLES
from graphc.passes.training.accumulate import WEIGHT
from graphc.passes.training.weight_averaging import PREFIX
from graphc.runtime import metrics as metrics_lib
from graphc.runtime.averaging import counted_labels, divisor, examples, shard_weight
from graphc.runtime.distributed.local_sums import LocalSums
from graphc.runtime.distributed.renorm_rows import EVAL_ROWS, RENORMED, ROWS, union
from graphc.runtime.distributed.replica_shards import ShardedUpdate
from graphc.runtime.labels import class_labels, int64_labels
from graphc.runtime.staged import scales
from graphc.runtime.trainer import predict_model, without_initializers
from graphc.runtime.weight_averaging import AfterUpdate


class Replica(ShardedUpdate):
    """The graphs of one worker. ``setup``'s ``graphs`` holds serialized ``gradients``, ``update`` and
    ``eval`` models (with an embedding's max_norm, their ``renorm_rows`` graphs too) and the
    manifest's JSON."""

    def __init__(self, rank: int):
        self.rank = rank
        self._loader = None
        self._applied: Optional[int] = None  # the step whose update ``apply`` made last

    def setup(self, graphs: Mapping[str, bytes], backend: str,
              options: Mapping[str, Any]) -> tuple[str, int, int, str]:
        """Prepare the graphs on ``backend`` (here, on this worker's node); returns its name,
        this worker's process id, the gradients graph's number of stages and its Ray node's id
        (hex; "" outside Ray)."""
        from graphc.backends import get_backend
        from graphc.compile.training import Manifest
        from graphc.passes.values import EXCHANGE_KEY
        from graphc.runtime.staged import StagedRun

        self.manifest = m = Manifest.model_validate_json(graphs["manifest"])
        rank = self.rank
        self._backend = get_backend(backend)
        self._options = dict(options)
        if self._backend.name.startswith("ort"):
            self._options.setdefault("threads", 1)  # one core per worker: the driver packs them
        self._protos = {k: onnx.load_from_string(v) for k, v in graphs.items() if k not in ("manifest", "shards")
                        if "/" not in k or k.endswith(f"/{rank}")}
        others = self._shard_protos(self._protos, json.loads(graphs["shards"]) if "shards" in graphs else None)
        carried = [e for e in m.graphs["train_step"].inputs if e.role in CARRIED_ROLES and e.name not in others]
        self._carried = {e.name for e in carried}
        self._stats = [e.name for e in m.graphs["gradients"].outputs if e.role == "state"]  # "<stat>.next"
        self._grad_outputs = [e.name for e in m.graphs["gradients"].outputs if e.role in ("loss", "grad")]
        self._touched = [e.name for e in m.graphs["gradients"].outputs if e.role == "touched"]
        self._grad_inputs = {e.name for e in m.graphs["gradients"].inputs}
        self._prediction = next((e.name for e in m.graphs["gradients"].outputs if e.role == "prediction"), None)
        self._means: Optional[dict] = None  # the train metrics a shard reduces (``use_metrics``)
        self._whole = False
        gradients = self._protos["gradients"]
        staged = any(p.key == EXCHANGE_KEY for n in gradients.graph.node for p in n.metadata_props)
        self._staged = StagedRun(without_initializers(gradients, self._carried), self._backend.name,
                                 **self._options) if staged else None
        self._grads = None if staged else self._prepare("gradients")
        self._rows = {key: self._prepare(key) for key in (ROWS, EVAL_ROWS) if key in self._protos}
        self._renormed = [v.name for v in gradients.graph.output if v.name.endswith(RENORMED)]
        self._update = self._prepare("update")
        self._averaging = None if m.averaging is None else AfterUpdate(m, self._backend, self._options)
        self._update_inputs = {v.name for v in self._protos["update"].graph.input}
        # with accumulate=k the update also outputs the combined gradient's norm (``apply`` returns it)
        norms = {e.name for e in m.graphs["train_step"].outputs if e.role == "grad_norm"}
        self._norm = [v.name for v in self._protos["update"].graph.output if v.name in norms]
        self._update_outputs = [v.name for v in self._protos["update"].graph.output if v.name not in norms]
        self._sums = LocalSums()
        self._evals: dict[str, tuple] = {}  # "eval" / "predict": (executable, inputs, outputs)
        self._labels = {e.name for e in m.graphs["eval"].inputs if e.role == "label"}
        self._class_labels = class_labels(m)  # uint8 arrays the loader holds, cast to int64
        self._state: dict[str, Any] = {}
        self._spare: dict[str, Any] = {}
        ray = sys.modules.get("ray")  # imported where Ray runs this worker
        node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else ""
        return self._backend.name, os.getpid(), len(self._staged.stages) if staged else 1, node

    def _prepare(self, key: str):
        return self._backend.prepare(without_initializers(self._protos[key], self._carried), **self._options)

    def pid(self) -> int:
        return os.getpid()

    def load(self, packed: Mapping[str, np.ndarray]) -> None:
        """Put the carried tensors (as train_step takes them: ``Manifest.pack``) on the device."""
        self._state = {n: self._update.to_device(np.asarray(self._own(n, packed[n]))) for n in self._carried}
        self._spare, self._applied = {}, None

    def use_loader(self, loader: Any) -> None:
        """Keep ``loader`` (a ``gc.data.DataLoader``; its arrays are read-only views of the
        object store's copy) to read shards from."""
        self._loader = loader

    def use_metrics(self, means: Optional[Mapping[str, Any]], whole: bool) -> None:
        """The train metrics a step asked for them (``metrics``) reports: ``means`` (None: the
        loss kind's defaults) as the shard's sums over its examples, and with ``whole`` the
        shard's prediction too, for the metrics the driver computes on the whole batch."""
        self._means, self._whole = means, whole

    def state(self, packed: bool = False) -> dict[str, np.ndarray]:
        """Host copies of the carried tensors, named per param (``packed``: as train_step takes them;
        a sharded update's worker holds its own shard's optimizer state alone, so only so)."""
        host = {n: np.array(self._update.to_host(h), copy=True) for n, h in self._state.items()}
        return host if packed else self.manifest.unpack(host)

    def _shard(self, message: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The shard of ``message``: ``shard`` (arrays) or ``read`` (epoch, batch, first row, end
        row of the loader's batch)."""
        if "read" in message:  # the loader's own arrays: uint8 class labels cast here, as one process's
            epoch, index, lo, hi = message["read"]
            return int64_labels(self._loader.batch(epoch, index, slice(lo, hi)), self._class_labels)
        return dict(message["shard"])

    def renorm_rows(self, message: Mapping[str, Any], graph: str = ROWS) -> dict[str, np.ndarray]:
        """The rows each max_norm write-back of the gradients graph (``graph``: ``ROWS``) or the eval
        graph (``EVAL_ROWS``) looks up in this worker's shard of ``message``, ``{}`` for an empty shard."""
        if message["rows"] == 0:
            return {}
        shard = self._shard(message)
        inputs = {v.name for v in self._protos[graph].graph.input}
        host, _ = self._rows[graph].run_bound({n: a for n, a in shard.items() if n in inputs},
                                              [v.name for v in self._protos[graph].graph.output])
        return host

    def step(self, message: Mapping[str, Any], *gathered: Optional[dict]) -> tuple[dict, Optional[dict]]:
        """``_started``, then this worker's gradients on its shard. Returns ({loss, weight},
        gradients); with ``metrics`` set, the first also holds the shard's train metrics
        (``_metrics``). A micro-batch of ``accumulate=k`` (``message["micro"]``: its index and k)
        adds its gradients into the worker's ``LocalSums`` instead, returned after the last (the
        backward seeded with ``message["share"]`` where given). A staged gradients graph runs by
        ``begin`` and ``advance`` instead, but for an empty shard."""
        shard, rows, renorm = self._started(message, gathered)
        info, grads = {"loss": 0.0, "weight": 0.0}, None
        if rows:
            feeds = self._grad_feeds(shard, renorm)
            if "share" in message:  # seeded with the shard's share of this worker's step (``LocalSums``)
                feeds[WEIGHT] = np.asarray(message["share"], np.float64)
            host, _ = self._grads.run_bound(feeds, self._wanted(message))
            info, grads = self._outputs(host, message, shard, rows)
        if "micro" not in message:
            return (info, *self._parts(grads))
        if grads is not None and grads["stats"]:  # rank 0's statistics, read by its next micro-batch
            self._take_stats(grads["stats"])
        index, count = message["micro"]
        sums = self._sums.add(grads, index, count, message.get("divisor"))
        return (info, *self._parts(sums)) if index + 1 == count else (info, sums)

    def _started(self, message: Mapping[str, Any], gathered: tuple) -> tuple[dict, int, dict]:
        """A step's start: ``gathered`` holds every worker's ``renorm_rows`` (their number
        ``message["renorm_rows"]``), then ``previous`` (every worker's last gradients, if any).
        Apply ``previous``, set the carried tensors in ``set`` (an lr a scheduler changed since
        ``previous`` was computed), read the shard (``_shard``) and draw its ``noise`` shapes from
        the generator seeded ``(seed, step, rank)``; returns the shard, its rows and, for a shard
        with rows, the union of the rows its max_norm write-backs renormalise (``{}`` without)."""
        split = message.get("renorm_rows", 0)
        if gathered[split:]:
            self.apply(message["step"], *gathered[split:])
        self.set(message.get("set", {}))
        shard, rows = self._shard(message), message["rows"]
        if message.get("noise"):
            index = message.get("micro", (0,))[0]  # a step's later micro-batches draw anew; the first as k=1's
            rng = np.random.default_rng([message["seed"], message["step"], self.rank, *([index] if index else [])])
            shard.update({n: rng.random(shape, dtype=np.float32) for n, shape in message["noise"].items()})
        return shard, rows, union(gathered[:split]) if split and rows else {}

    def _grad_feeds(self, shard: Mapping[str, np.ndarray], renorm: Mapping[str, np.ndarray]) -> dict:
        """The gradients graph's feeds: the shard, the carried tensors (on the device), the union rows
        (inputs of the workers' graph, not the manifest's)."""
        return {**{n: a for n, a in {**shard, **self._state}.items() if n in self._grad_inputs}, **renorm}

    def _wanted(self, message: Mapping[str, Any]) -> list[str]:
        """The gradients graph's outputs a step returns: loss and gradients, rank 0's statistics and
        renormalised params, the prediction for train metrics."""
        wanted = message.get("metrics") and self._prediction is not None
        return [*self._grad_outputs, *self._touched, *(self._stats + self._renormed if self.rank == 0 else ()),
                *([self._prediction] if wanted else [])]

    def begin(self, message: Mapping[str, Any], *gathered: Optional[dict]) -> dict:
        """``_started``, then stage 0 of the staged gradients graph on the shard (rows > 0);
        returns {rank, weight, parts: what stage 0's exchanges read}. A shard of weight 0 is fed
        labels that count and seeded 0 (``runtime.staged``)."""
        shard, rows, renorm = self._started(message, gathered)
        weight = shard_weight(self.manifest.loss, shard, rows)
        feeds = counted_labels(self.manifest.loss, shard) if weight == 0 else shard
        self._env = self._staged.feeds(self._grad_feeds(feeds, renorm), weight)
        self._at, self._run = 0, (message, shard, rows, weight)
        return {"rank": self.rank, "weight": weight, "parts": self._staged.stage(0, self._env)}

    def advance(self, *gathered: dict) -> Any:
        """The exchanges after every worker's last stage (``gathered``: their ``begin`` or
        ``advance`` objects, in rank order), then the next stage: its object, or after the last
        stage, ``step``'s return, the gradients with the scale they count by."""
        weights = [g["weight"] for g in gathered]
        shares = scales([w / divisor(self.manifest.loss, sum(weights)) for w in weights])
        me = next(i for i, g in enumerate(gathered) if g["rank"] == self.rank)
        self._staged.receive(self._at, self._env, [g["parts"] for g in gathered], shares, me)
        self._at += 1
        parts = self._staged.stage(self._at, self._env)
        message, shard, rows, weight = self._run
        if self._at + 1 < len(self._staged.stages):
            return {"rank": self.rank, "weight": weight, "parts": parts}
        host = {n: np.asarray(self._env[n]) for n in self._wanted(message)}
        self._env = {}
        info, grads = self._outputs(host, message, shard, rows)
        if weight == 0:  # its loss is 0 for the batch, but its gradients count (seeded 0)
            grads = {**grads, "grads": host}  # the gradients: what _outputs left
        return (info, *self._parts({**grads, "scale": shares[me]}))

    def _outputs(self, host: dict, message: Mapping[str, Any], shard: Mapping[str, np.ndarray],
                 rows: int) -> tuple[dict, dict]:
        """``step``'s return from the gradients graph's ``host`` outputs on the shard."""
        wanted = message.get("metrics") and self._prediction is not None
        weight = shard_weight(self.manifest.loss, shard, rows)
        loss = float(host.pop("loss"))
        stats = {n: host.pop(n) for n in list(host) if n in self._stats or n in self._renormed}
        touched = {n: host.pop(n) for n in self._touched}  # read even where no label counts, as DDP's forward
        info = self._metrics(host.pop(self._prediction), shard, rows) if wanted else {}
        if weight == 0:  # every label ignored: the shard's mean loss is 0/0, it counts for nothing
            return {**info, "loss": 0.0, "weight": 0.0}, {"weight": 0.0, "grads": {}, "stats": stats,
                                                          "touched": touched}
        return {**info, "loss": loss * weight, "weight": weight}, {"weight": weight, "grads": host, "stats": stats,
                                                                   "touched": touched}

    def _metrics(self, prediction: np.ndarray, shard: Mapping[str, np.ndarray], rows: int) -> dict:
        """The shard's train metrics that are means (``metrics.splits``) as sums over its
        examples, which add up over shards as one process adds up batches, and, for any other,
        its ``prediction`` (its rows: the driver joins the shards' and computes them on the batch)."""
        loss = self.manifest.loss
        info: dict[str, Any] = {"metrics": metrics_lib.sums(loss, {loss["output"]: prediction}, shard, self._means,
                                                            examples(loss, shard, rows))}
        if self._whole:
            info["prediction"] = prediction
        return info

    def apply(self, step: int, *gathered: Optional[dict]) -> Optional[float]:
        """The optimizer update on the weighted average of every worker's gradients (rank
        order, so every worker computes the same bits; a staged step's gradients count by their
        ``scale``). First BN statistics and max_norm's renormalised params become rank 0's: the
        update steps a param from its ``<param>.renormed`` value (so these must come before it)
        and neither reads nor writes the statistics. The update that brings the state to ``step``
        is made once: the driver sends it again after a failed call, which this worker may have
        applied before failing. Then, with weight averaging, the averaged copies advance
        (``AfterUpdate``): every worker holds the whole model after it, a sharded one too, so each
        averages its own copy, the same bits. Returns the combined gradient's norm where the update
        outputs it."""
        if self._applied == step:
            return None
        self._applied = step
        if self._shards is not None:  # sharded: the owners stepped each shard, ``gathered`` holds their params
            norm = self.take(gathered)
        else:
            norm = self._run_update(self._averaged(gathered))
        if self._averaging is not None:  # every param and statistic as after the step: average them here
            self._averaging.run(self._state)
        return norm

    def _averaged(self, gathered: tuple) -> dict[str, Any]:
        """The update's feeds: the carried tensors and every worker's gradients (``gathered``: by
        rank, None for an empty shard) averaged by their weights, after rank 0's statistics are taken."""
        self._take_stats(gathered[0]["stats"])
        done = [g for g in gathered if g is not None and (g["weight"] != 0 or "scale" in g or "summed" in g)]
        total = divisor(self.manifest.loss, sum(g["weight"] for g in done))
        feeds = {n: h for n, h in self._state.items() if n in self._update_inputs}
        # "scale": a staged step's share; "summed": a weighted sum (``LocalSums``), not a mean
        shares = [g.get("scale", (1.0 if "summed" in g else g["weight"]) / total) for g in done]
        for name in done[0]["grads"]:
            feeds[name] = weighted_sum([g["grads"][name] for g in done], shares)
        for name in (n for n in self._touched if n in self._update_inputs):  # stepped where any worker read it
            feeds[name] = np.logical_or.reduce([g["touched"][name] for g in gathered if g is not None])
        return feeds

    def _run_update(self, feeds: Mapping[str, Any]) -> Optional[float]:
        """Run the update on ``feeds``, its outputs becoming the carried tensors; returns its norm output."""
        host, device = self._update.run_bound(feeds, self._norm, self._update_outputs, into=self._spare)
        spare = {}
        for out in self._update_outputs:
            name = out[: -len(".next")]
            spare[out] = self._state[name]
            self._state[name] = device[out]
        self._spare = spare
        return float(host[self._norm[0]]) if self._norm else None

    def _take_stats(self, stats: Mapping[str, Any]) -> None:
        """Set rank 0's ``stats`` (``"<stat>.next"``, ``"<param>.renormed"``) as the carried tensors."""
        for out, value in stats.items():
            self._state[out[: -len(RENORMED if out.endswith(RENORMED) else ".next")]] = self._update.to_device(value)

    def set(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Replace some carried tensors (``lr``, say) as given."""
        for name, value in tensors.items():
            self._state[name] = self._update.to_device(np.asarray(value))

    def predict(self, shard: Mapping[str, np.ndarray], rows: int, *gathered: dict,
                averaged: bool = False) -> Optional[dict]:
        """The eval graph on the shard: its outputs and the loss scaled by the shard's weight;
        without the labels, the eval graph less the loss (``predict``). Rank 0 runs even an
        empty shard: a 0-row batch's outputs have 0 rows, as in one process. ``gathered``: every
        worker's ``renorm_rows`` of the eval graph, whose union its write-backs renormalise.
        ``averaged``: with the averaged copies of the params and buffers."""
        if rows == 0 and self.rank:
            return None
        key = "eval" if self._labels <= set(shard) else "predict"
        if key not in self._evals:
            proto = self._protos["eval"]
            if key == "predict":  # strips the carried initializers off the eval proto too, as its prepare would
                proto = predict_model(proto, self.manifest, self._carried)
            self._evals[key] = (self._backend.prepare(without_initializers(proto, self._carried), **self._options),
                                {v.name for v in proto.graph.input}, [v.name for v in proto.graph.output])
        exe, inputs, outputs = self._evals[key]
        feeds = {n: a for n, a in shard.items() if n in inputs}
        prefix = PREFIX if averaged else ""  # every param and buffer the eval graph reads has a copy
        feeds.update({n: self._state[prefix + n] for n in self._state if n in inputs})
        feeds.update(union(gathered) if gathered else {})
        host, _ = exe.run_bound(feeds, outputs)
        weight = shard_weight(self.manifest.loss, shard, rows)
        if "loss" in host:
            host["loss"] = float(host["loss"]) * weight if weight else 0.0
        return {**host, "weight": weight}


def weighted_sum(parts: list[np.ndarray], shares: list[float]) -> np.ndarray:
    """``sum(part * share)`` in order, in the parts' dtype, added up in float32 at least: a half
    float gradient times its shard's example count overflowed (a float16 weight gradient of 300
    times 512 labels is inf) where the one-process mean is finite. An inf or NaN stays one,
    without numpy's warnings: a loss-scaled step's overflow is the update graph's to find."""
    acc = np.zeros(parts[0].shape, np.result_type(parts[0].dtype, np.float32))
    term = np.empty_like(acc)  # one scratch buffer: this runs per gradient, every step
    with np.errstate(over="ignore", invalid="ignore"):
        for part, share in zip(parts, shares):
            acc += np.multiply(part, share, out=term, dtype=acc.dtype)
        return acc.astype(parts[0].dtype, copy=False)
