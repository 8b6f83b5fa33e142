"""``gc.Trainer(..., workers=N)``: synchronous data parallelism on Ray.

Every global batch is cut into ``N`` contiguous shards (``shards.py``; sizes as ``numpy.array_split``: an
uneven batch gives the first shards one row more; with a BatchNorm that has one value per
channel per row, BatchNorm1d on ``[N, C]``, a train step's ``R``-row batch goes to the first
``min(N, R // 2)`` workers so no shard has 1 row, the others get none and count for nothing), one
per worker, a Ray actor holding the ``gradients`` and optimizer ``update`` graphs on its own backend
(``graphc.runtime.distributed.replica``). In ``fit`` with a ``gc.data.DataLoader`` (or ``RayDataLoader``: the
driver reads the labels alone, each worker its own rows, by Ray tasks, ``graphc.runtime.ray_data``) each worker
reads its own shard from its copy of the loader (put in Ray's object store once per ``fit``; the step
message is the batch's position and the shard's rows), so the global order is the loader's, as
in one process; ``step(batch)`` and evaluation send each worker its shard. One actor call per
worker and step: it applies the previous step's update, then computes its gradients, which
stay in the object store (``fit`` with ``max_grad_norm`` sends a second with it, which applies the
step's own update at once and returns its gradient norm before clipping for
``History.step_grad_norms``); each worker reads every worker's gradients and averages them itself,
weighted by each shard's share of the loss (its rows; for cross-entropy its labels that are not
``ignore_index``; 1 each for a summed loss), and the driver gets only the losses and, in ``fit``,
the train metrics: each worker computes them on its shard's training-mode prediction (a
``prediction`` output of the gradients graph) and sends, for the metrics that are means over
examples (``gc.metrics.splits``: every built-in), each one times its shard's examples, which
add up as one process adds up its batches; for any other metric (a user's, which may be a max)
it sends its prediction rows, and the driver computes it on the joined batch. So one step on
``N`` workers equals one single-process step on the same global batch, up to float rounding,
and every worker holds the same bits, where the forward keeps the rows apart (one that may mix
them gets a ``gc.DataParallelWarning``: ``mixed_rows``). A param an embedding with max_norm renormalises in place
(``manifest.renormed``) adds one call per worker and step before it: each worker reports the rows
its shard looks up, and every worker renormalises their union (``renorm_rows``), as one process.
A gradients graph with exchanges (``gc.nn.SyncBatchNorm``'s gathers) runs in stages: the workers with
rows make one call per stage, chained by the driver, the union rows going to the first.

Per-replica state follows PyTorch DDP: BatchNorm normalizes with each worker's batch statistics
(a SyncBatchNorm with the global batch's, exchanged between its stages);
the running statistics are rank 0's, copied to every worker after each step (DDP's
``broadcast_buffers``). Dropout noise is drawn per worker, from a generator seeded with
``(seed, step, rank)``: runs replay exactly at a given number of workers (resumed or not), and
differ, as in DDP, between different numbers of workers.

``fit`` keeps a copy of the last checkpoint (each epoch's start, after the scheduler's step): when a worker
dies, the workers are started again, loaded from it, and the run goes on, at most ``max_restarts`` times.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from graphc.runtime import metrics as metrics_lib
from graphc.runtime.distributed.averaged_copy import DriverAveraging
from graphc.runtime.distributed.batch_messages import BatchMessages
from graphc.runtime.distributed.cluster import WorkerLost, check_resources, connect, get, settled
from graphc.runtime.distributed.connection import Connection, DrivesWorkers
from graphc.runtime.averaging import divisor, examples
from graphc.runtime.distributed.loader_batches import LoaderBatch, ReadOnWorkers, read_on_workers, ray_data_first
from graphc.runtime.distributed.mixed_rows import warn_mixed_rows
from graphc.runtime.distributed.optimizer_shards import ShardPlan
from graphc.runtime.distributed.placement import actor_options, restartable, worker_names
from graphc.runtime.distributed.renorm_rows import EVAL_ROWS, ROWS, worker_graphs
from graphc.runtime.distributed.replica import Replica
from graphc.runtime.accumulating import refuse_post_accumulate_hooks
from graphc.runtime.distributed.trainable import check_data_parallel
from graphc.runtime.rows import batch_dim, by_rows, time_major
from graphc.errors import ArtifactsError, GraphcError
from graphc.model import complex_io
from graphc.model.dtypes import to_numpy
from graphc.runtime.history import History
from graphc.runtime.session import check_options
from graphc.runtime.trainer import BATCH_ROLES, TRAINER_OPTIONS, TRAINING_OPTIONS, Trainer, TrainingFailed, role_specs
from graphc.runtime.weight_averaging import averaged_names

__all__ = ["DistributedTrainer"]

STEP_SERIES = ("step_losses", "step_grad_norms")  # History's lists of one value per step


class DistributedTrainer(BatchMessages, DriverAveraging, Trainer, DrivesWorkers):
    """``Trainer`` whose steps run on ``workers`` Ray actors (see the module's docstring).

    Args beyond ``Trainer``'s: ``workers`` (>= 1), ``ray_address`` (a running cluster; default:
    the one this process joined, else a new local one), ``num_cpus`` / ``num_gpus`` that Ray
    reserves per worker, ``placement`` (which nodes: ``placement.py``), ``max_restarts`` (how many
    times ``fit`` restarts lost workers, on the nodes left),
    ``timeout_s`` (the longest a step or set-up may take), ``shard_optimizer`` (each worker steps and
    keeps the optimizer state of its share of the params alone: ``optimizer_shards``). ``options`` go to each worker's
    backend; onnxruntime runs one intra-op thread per worker unless ``threads`` says otherwise.
    """
    _routes_accumulate = True  # made directly with accumulate > 1: Trainer.__new__ makes the accumulating one

    _prediction_graph = "gradients"  # the workers' graph: its prediction output gives the train metrics

    def __init__(self, artifacts_or_dir: Any, backend: str = "auto", *, seed: int = 0, metrics: Any = None,
                 tensorboard: Any = None, workers: int = 1, ray_address: Optional[str] = None,
                 num_cpus: float = 1.0, num_gpus: float = 0.0, max_restarts: int = 3, timeout_s: float = 600.0,
                 placement: Any = "default", accumulate: int = 1, shard_optimizer: bool = False, **options: Any):
        from graphc.compile.training import update_model, worker_gradients_model

        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if options.get("cuda_graph"):
            raise ValueError("cuda_graph is an option of the one-process Trainer (workers=1); its workers run "
                             "the gradients and update graphs separately, without CUDA graphs")
        check_options(options, TRAINER_OPTIONS, "Trainer")
        resume_from = self._open(artifacts_or_dir, seed, metrics, tensorboard)
        self.manifest = m = self.manifest.in_model_order()  # the workers run the gradients and update graphs
        self.workers, self.max_restarts, self.timeout_s = workers, max_restarts, timeout_s
        self._check_data_parallel()
        a = self.artifacts
        self._plan = ShardPlan(m, workers) if shard_optimizer else None
        graphs = {"gradients": worker_gradients_model(a), "eval": a.eval,
                  **(self._plan.graphs() if self._plan else {"update": update_model(m, grad_norm=True)})}
        graphs.update(worker_graphs(graphs, self.manifest))
        self._renorm = ROWS in graphs  # a step first gathers the rows each worker's lookups renormalise
        self._ray = ray = connect(ray_address, "gc.Trainer(workers=...)")
        check_resources(ray, workers, num_cpus, num_gpus, timeout_s)
        self._actor = ray.remote(Replica).options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0,
                                                  **actor_options(placement))
        self._asks = (num_cpus, num_gpus)
        self._graphs = ray.put({**{k: m.proto.SerializeToString() for k, m in graphs.items()},
                                "manifest": self.manifest.model_dump_json().encode(),
                                **({"shards": json.dumps(self._plan.layout())} if self._plan else {})})
        self._backend_name, self._options = backend, {**TRAINING_OPTIONS, **options}
        eval_inputs = self.manifest.graphs["eval"].inputs
        self._eval_specs = role_specs(eval_inputs, BATCH_ROLES)
        self._split_rows()
        warn_mixed_rows(graphs["eval"], self.manifest, self._rows, workers)  # as the workers run it
        self._actors: Optional[list] = []  # by rank; None once shut down
        self._pending: list = []
        self._unread: list = []  # the last step's refs nothing reads (sharded: norms, shares), settled on a failure
        self._later: dict[str, np.ndarray] = {}  # carried tensors to set once the pending update is applied
        self._start(self.artifacts.state)
        if resume_from is not None:
            self.load_checkpoint(resume_from)

    def _check_data_parallel(self) -> None:
        """Refuse artifacts the workers cannot train as one process would (``trainable``)."""
        check_data_parallel(self.manifest, self.workers)
        if self.workers > 1:
            refuse_post_accumulate_hooks(self.artifacts.gradients.proto, f"workers={self.workers}",
                                         "whether that is torch DDP's gradient is not checked")

    def _split_rows(self) -> None:
        """Which inputs are cut into shards and which outputs joined by rows (``rows``); the
        eval outputs that are not (a scalar summary, say) are computed by one worker."""
        dim = batch_dim(self.batch_specs)
        if dim is None:
            raise ArtifactsError("no input of the training graphs starts with a symbolic batch dim "
                                 f"({'; '.join(str(s) for s in self.batch_specs)}), so a batch cannot be split "
                                 "between workers; capture the inputs with the rows first (gc.spec(dtype, ('N', ...)))")
        cut = time_major(self.artifacts.inference.ir.graph, dim) if self.workers > 1 else None
        if cut is not None:
            raise ArtifactsError(f"gc.Trainer(workers={self.workers}): {cut}")
        specs = [*self.batch_specs, *self._eval_specs, *self.noise_specs]
        self._rows = {s.name for s in specs if by_rows(s, dim, computed=True)}
        self._whole = [e.name for e in self.manifest.graphs["eval"].outputs
                       if e.role != "loss" and not by_rows(e, dim)]
        # a train-mode BatchNorm that has a value per channel per row (BatchNorm1d on [N, C]): a
        # shard of 1 row would make its running variance NaN on rank 0 (n/(n-1)) and its output
        # constant elsewhere, where one process takes the whole batch: shards of 2 rows or more
        self._pairs = any(name in self._rows and axis == 0 for name, axis in self.manifest.one_row_batchnorms.values())

    # -- workers ------------------------------------------------------------------------------------
    def _start(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Start the workers, prepare their graphs, load ``tensors`` (named per param)."""
        packed = self._ray.put(self._packed(tensors))
        self._session = Connection(self._ray)
        self._actors = [self._actor.remote(rank) for rank in range(self.workers)]
        self._who = [f"worker rank {rank}" for rank in range(self.workers)]
        started = self._get([r.setup.remote(self._graphs, self._backend_name, self._options) for r in self._replicas],
                            "starting the workers")
        self.backend, _, self._stages, _ = started[0]
        self._who, self._nodes = worker_names(self._ray, started), [node for *_, node in started]
        self._get([r.load.remote(packed) for r in self._replicas], "loading the workers' state")
        self._pending, self._unread, self._later, self._loader_sent, self._metrics_sent = [], [], {}, None, False
        self._step_metrics: Optional[dict[str, float]] = None

    @property
    def _replicas(self) -> list:
        if self._actors is None:
            raise GraphcError("this trainer was shut down (shutdown()), its workers are gone; make a new gc.Trainer, "
                              "from a checkpoint to go on")
        if not self._session.current():  # Ray would retry for seconds, then raise a bare Exception
            raise GraphcError("Ray was shut down (ray.shutdown()) since this trainer started its workers, and they "
                              "went with it; make a new gc.Trainer, from a checkpoint to go on")
        return self._actors

    def _get(self, refs: Any, what: str, bounds: Optional[list[tuple[int, int]]] = None) -> Any:
        """``get`` naming the workers that die, fail or are late by rank and pid, and by the rows of
        the batch each had where their ``bounds`` (``_messages``) are given (``refs``: one per worker
        from rank 0, or rank 0's)."""
        single = not isinstance(refs, list)
        who = self._who if bounds is None else [f"{name} on rows {lo}:{hi} of the batch" for name, (lo, hi)
                                                in zip(self._who, bounds)]
        got = get(self._ray, [refs] if single else refs, self.timeout_s, what, who)
        return got[0] if single else got

    def _sync(self) -> None:
        """Apply the last step's update, which the workers otherwise apply at the next step, then
        set what waited for it (``_later``)."""
        if self._pending:  # a worker lost since the step: the calls its objects failed read, the step's unread too
            refs = [r.apply.remote(self.step_count, *self._pending) for r in self._replicas]
            with settled(self._ray, refs + self._pending + self._unread):
                self._applied(refs)
            self._unread = []
        if self._later:
            self._get([r.set.remote(self._later) for r in self._replicas], "setting lr")
            self._later = {}

    def _applied(self, refs: list, sharded: Any = None) -> Optional[float]:
        """Wait for the workers' ``apply`` ``refs`` of the update to step ``step_count``; returns its
        gradient norm before clipping (every worker's is rank 0's), None without ``max_grad_norm``.
        ``sharded``: ``refs`` are the owners' norms; their new params stay pending."""
        norms = self._get(refs, f"the optimizer update of step {self.step_count}")
        if not sharded:
            self._pending = []
        return norms[0]

    def shutdown(self) -> None:
        """Stop the workers (they also stop when the trainer is garbage-collected); the trainer
        cannot be used after."""
        if self._session.current():  # else ray.shutdown() ended them
            for replica in self._actors or ():
                self._ray.kill(replica)
        self._actors, self._pending, self._unread = None, [], []

    def worker_pids(self) -> list[int]:
        """The process id of each worker, by rank."""
        return self._get([r.pid.remote() for r in self._replicas], "asking the workers' pids")

    def worker_states(self) -> list[dict[str, np.ndarray]]:
        """Every worker's carried tensors (named per param), by rank: they agree after each step.
        Sharded (``shard_optimizer``), as train_step takes them: each holds its shard's optimizer state alone."""
        self._sync()
        return self._get([r.state.remote(self._plan is not None) for r in self._replicas], "reading the workers' state")

    # -- steps --------------------------------------------------------------------------------------
    def _forward(self, data: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rank 0's forward of ``data`` as a whole, as one process's (``predict`` splits it)."""
        rows = next((len(a) for n, a in data.items() if n in self._rows), 0)
        return self._get(self._replicas[0].predict.remote(dict(data), rows), "measuring the logits' class count")

    def step(self, batch: Mapping[str, np.ndarray]) -> float:
        """One synchronous data-parallel step on the global ``batch``; returns its loss. A step
        that fails (or times out) changes nothing but the last update's place: the workers may
        have applied it, and apply it once whatever the driver sends again. A Ctrl-C is raised
        once the step is done, as in ``Trainer.step``."""
        messages, bounds = self._messages(batch, self.batch_specs, noise=True)
        metrics = self._prediction is not None and self._prediction in self._fetch  # fit's train metrics
        # fit records each step's gradient norm (max_grad_norm): the workers apply the update at once
        norm = self._grad_norm is not None and self._grad_norm in self._fetch
        for message in messages:
            message["metrics"] = metrics
        with self._interrupts:
            rows = [r.renorm_rows.remote(m) for r, m in zip(self._replicas, messages)] if self._renorm else []
            for message in messages:
                message["renorm_rows"] = len(rows)
            calls = self._step_calls(messages, rows)
            pending, update, shares = self._updates(calls, norm)
            made = [grads for _, *parts in calls for grads in parts] + pending + update + shares
            with settled(self._ray, made + self._pending + self._unread):  # the last update's: a worker died in it?
                infos = self._get([info for info, *_ in calls], f"training step {self.step_count + 1}", bounds)
            total = divisor(self.manifest.loss, sum(i["weight"] for i in infos))  # before the next step applies them
            self._pending, self._unread, self._later = pending, shares, {}
            self.step_count += 1
            if norm:  # a failed update stays pending: the next call sends it again, applied once
                with settled(self._ray, made):
                    self._step_outputs = {self._grad_norm: np.asarray(self._applied(update, sharded=self._plan))}
            if metrics:
                self._step_metrics = self._joined_metrics(batch, infos, sum(m["rows"] for m in messages))
            return sum(i["loss"] for i in infos) / total

    def _non_finite_cause(self, loader, batch: Mapping[str, np.ndarray]) -> str:
        """``Trainer``'s, on the batch's data: a ``LoaderBatch`` holds stand-ins (each worker reads
        its own rows), so the driver reads the batch now, once its loss is NaN or infinite."""
        if isinstance(batch, LoaderBatch):
            loader, batch = loader.loader, loader.loader.batch(batch.epoch, batch.index)
        return super()._non_finite_cause(loader, batch)

    def _row_holder(self, batch: Mapping[str, np.ndarray], name: str, row: int) -> str:
        if name not in self._rows:
            return ""
        bounds = self._bounds(self._batch_feeds(batch, self.batch_specs), train=True)
        rank, (lo, hi) = next((r, b) for r, b in enumerate(bounds) if b[0] <= row < b[1])
        return f"; in the shard of {self._who[rank]}, rows {lo}:{hi} of the batch"

    def _updates(self, calls: list, norm: bool) -> tuple[list, list, list]:
        """(what the next step's calls take, the refs whose first gives the norm before clipping where
        ``norm``, the other refs made) for the step ``calls``: every worker's gradients, and with ``norm``
        the update, made at once; sharded, the owners' updates, made at once (``ShardPlan.issue``), the
        norms unread without ``norm`` and the exchanged shares the others."""
        if self._plan is not None:
            updates, norms, shares = self._plan.issue(self._replicas, self.step_count + 1, calls)
            return (updates, norms, shares) if norm else (updates, [], norms + shares)
        grads = [g for _, g in calls]
        return grads, [r.apply.remote(self.step_count + 1, *grads) for r in self._replicas] if norm else [], []

    def _step_calls(self, messages: list[dict], rows: list) -> list:
        """Each worker's step call, given ``rows`` (every worker's ``renorm_rows`` refs) and the last
        gradients: one, or with a staged gradients graph (SyncBatchNorm), for the workers with rows,
        ``begin`` and an ``advance`` per later stage, each given every such worker's last object
        (``replica``'s docstring); returns the (info, gradients) refs."""
        step = [r.step.options(num_returns=self._returns) for r in self._replicas]
        if self._stages == 1:
            return [call.remote(m, *rows, *self._pending) for call, m in zip(step, messages)]
        busy = [rank for rank, m in enumerate(messages) if m["rows"]]
        parts = [self._replicas[rank].begin.remote(messages[rank], *rows, *self._pending) for rank in busy]
        for k in range(1, self._stages):
            last = {"num_returns": self._returns if k + 1 == self._stages else 1}
            parts = [self._replicas[rank].advance.options(**last).remote(*parts) for rank in busy]
        ends = dict(zip(busy, parts))
        return [ends[rank] if rank in ends else call.remote(m, *rows, *self._pending)
                for rank, (call, m) in enumerate(zip(step, messages))]

    @property
    def _returns(self) -> int:
        """How many objects a step call returns: its info and its gradients, sharded one per shard."""
        return 1 + (self.workers if self._plan is not None else 1)

    def _split_metrics(self) -> tuple[Optional[dict], dict]:
        """``self.metrics`` as (those the workers reduce per shard, ``metrics.splits``; None: the
        loss kind's defaults, all such, those the driver computes on the whole batch)."""
        if self.metrics is None:
            return None, {}
        means = {name: fn for name, fn in self.metrics.items() if metrics_lib.splits(fn)}
        return means, {name: fn for name, fn in self.metrics.items() if name not in means}

    def _joined_metrics(self, batch: Mapping[str, np.ndarray], infos: list[dict], rows: int) -> dict[str, float]:
        """The step's train metrics times the batch's examples, as ``metrics.sums`` on the whole
        batch: the workers' sums added in rank order, the other metrics on their joined prediction."""
        loss = self.manifest.loss
        joined: dict[str, float] = {}
        for info in infos:
            for name, value in info.get("metrics", {}).items():
                joined[name] = joined.get(name, 0.0) + value
        parts = [info["prediction"] for info in infos if "prediction" in info]
        if parts:
            joined.update(metrics_lib.sums(loss, {loss["output"]: np.concatenate(parts)}, batch,
                                           self._split_metrics()[1], examples(loss, batch, rows)))
        return joined if self.metrics is None else {name: joined[name] for name in self.metrics if name in joined}

    def _step_metric_sums(self, batch: Mapping[str, np.ndarray], examples: int) -> Optional[dict[str, float]]:
        sums, self._step_metrics = self._step_metrics, None
        return sums

    def predict(self, batch: Mapping[str, np.ndarray], *, averaged: bool = False) -> dict[str, np.ndarray]:
        """The eval graph on ``batch``, each worker on its shard: the loss (as the training loss's), the outputs in
        shard order (not by rows: rank 0 runs the whole batch), max_norm rows as in ``step``; ``averaged``: as Trainer's."""
        if averaged:
            averaged_names(self.manifest)  # refuses artifacts without
        self._sync()
        labels = self._label_names()
        specs = self._eval_specs if labels <= set(batch) else [s for s in self._eval_specs if s.name not in labels]
        messages, bounds = self._messages(batch, specs, noise=False, whole=bool(self._whole))
        rows = [r.renorm_rows.remote(m, EVAL_ROWS) for r, m in zip(self._replicas, messages)] if self._renorm else []
        refs = [r.predict.remote(m["shard"], m["rows"], *rows, averaged=averaged)
                for r, m in zip(self._replicas, messages)]
        done = [r for r in self._get(refs, "evaluation", bounds) if r is not None]
        out = {}
        if "loss" in done[0]:
            total = divisor(self.manifest.loss, sum(r["weight"] for r in done))
            entry = next(e for e in self.manifest.graphs["eval"].outputs if e.role == "loss")
            out["loss"] = np.asarray(sum(r["loss"] for r in done) / total, dtype=to_numpy(entry.dtype))
        for name in done[0]:
            if name not in ("loss", "weight"):
                parts = [r[name] for r in done]
                out[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return complex_io.complex_results(self.complex_outputs, out)

    def _eval_exe(self):
        return None  # the workers hold the eval graph; _eval_specs is set in __init__

    def _graph_rngs(self) -> dict[str, np.random.Generator]:
        return {}  # random ops inside the graphs draw on the workers, out of the driver's reach

    # -- state --------------------------------------------------------------------------------------
    def _reset_state(self, tensors: Mapping[str, np.ndarray], consume: bool = False) -> None:
        self._sync()
        packed = self._ray.put(self._packed(tensors, consume))
        self._get([r.load.remote(packed) for r in self._replicas], "loading the workers' state")

    def state_dict(self) -> dict[str, np.ndarray]:
        """Rank 0's carried tensors (every worker holds the same), named per param; sharded, each
        shard's optimizer state its owner's (``ShardPlan.joined``), the layout as unsharded."""
        self._sync()
        if self._plan is None:
            return self._get(self._replicas[0].state.remote(), "reading the state")
        states = self._get([r.state.remote(True) for r in self._replicas], "reading the workers' state")
        return self.manifest.unpack(self._plan.joined(states))

    def _carried(self, name: str) -> np.ndarray:
        return self.state_dict()[name]

    def _put_hyper(self, name: str, array: np.ndarray) -> None:
        """The lr (or momentum) of the next step: the last step's update, which the workers apply
        at the next step's start, keeps the lr it was computed at (the workers set this one after
        it), so a scheduler stepped after each step costs no extra call to the workers (2 workers,
        ort-cpu, TwoLayerNet at batch 64, lr set after every step: 2.0-3.8 ms a step, against
        5.2-5.4 ms applying the update and setting the lr by two calls first)."""
        self._later[name] = array
        if not self._pending:
            self._sync()

    # -- fault tolerance ----------------------------------------------------------------------------
    @ray_data_first
    def fit(self, loader, epochs: int, eval_loader=None, progress: bool = True, plot=None,
            checkpoint=None, checkpoint_every: Optional[int] = None, quiet: bool = False, log=None, scheduler=None,
            interval: Optional[str] = None) -> History:
        """``Trainer.fit``; a worker that dies makes the workers start again from the last
        checkpoint (kept in memory at each epoch's start, the scheduler's state with it), up to
        ``max_restarts`` times."""
        if scheduler is not None:
            self.scheduler = scheduler  # before _remember: a restart rewinds it
        self._remember()
        self._loader_sent = None  # the loader goes to the workers once per fit: its arrays may have changed
        self._metrics_sent = False  # so do the metrics: self.metrics may have changed
        self._history = History(backend=self.backend)
        start_step, earlier = self.step_count, History(backend=self.backend)
        for attempt in range(self.max_restarts + 1):
            try:
                history = super().fit(loader, epochs, eval_loader=eval_loader, progress=progress,
                                      plot=plot, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                                      quiet=quiet, log=log, interval=interval)
            except WorkerLost as exc:
                lost = exc
                if attempt == self.max_restarts:
                    break
                step, epoch = self._last["step"], self._last["epoch"]
                partial = self._history
                earlier.epochs += [e for e in partial.epochs if e.epoch <= epoch]
                for name in STEP_SERIES:  # the steps up to the checkpoint restarted from
                    setattr(earlier, name, (getattr(earlier, name) + getattr(partial, name))[: step - start_step])
                warnings.warn(f"{str(exc).rstrip('.')}; restarting the {self.workers} workers from step {step} "
                              f"(restart {attempt + 1} of {self.max_restarts})", stacklevel=2)
                self._restart(exc)
                continue
            history.epochs = earlier.epochs + history.epochs
            for name in STEP_SERIES:
                setattr(history, name, getattr(earlier, name) + getattr(history, name))
            return history
        self.shutdown()  # the workers left would hold their CPUs until the trainer is collected
        raise TrainingFailed(f"{str(lost).rstrip('.')}; gave up after {self.max_restarts} restart(s) of the workers")

    def _fit_epoch(self, loader, history: History, *args: Any) -> None:
        """The epoch as ``Trainer._fit_epoch``, from the state ``_remember`` keeps (the last
        epoch's scheduler step made); a ``gc.data.DataLoader`` or ``RayDataLoader`` (iterated as the class does) is
        read by the workers, the first time from the object store."""
        self._history = history
        self._remember()
        if read_on_workers(loader):
            if self._loader_sent is not loader:
                shared = self._ray.put(loader)
                self._get([r.use_loader.remote(shared) for r in self._replicas], "sending the data loader")
                self._loader_sent = loader
            loader = ReadOnWorkers(loader, self._label_names())
        if not self._metrics_sent and self._prediction in self._fetch:
            means, whole = self._split_metrics()
            self._get([r.use_metrics.remote(means, bool(whole)) for r in self._replicas], "sending the train metrics")
            self._metrics_sent = True
        super()._fit_epoch(loader, history, *args)

    def _remember(self) -> None:
        """Keep what a checkpoint now would hold, to restart from."""
        self._last = {"tensors": self.state_dict(), "step": self.step_count, "epoch": self.epoch,
                      "batch": self.batch_in_epoch, "rng": self.rng.bit_generator.state,
                      "progress": self._progress.model_copy(), "schedule": self.schedule_state()}

    def _restart(self, lost: WorkerLost) -> None:
        """Start the workers again from ``_last``, on the nodes left (``placement.restartable``)."""
        self.shutdown()
        try:
            restartable(self._ray, self._nodes, self.workers, *self._asks, self.timeout_s)
        except GraphcError as exc:
            raise TrainingFailed(f"{str(lost).rstrip('.')}; {exc}") from None
        last = self._last
        self._start(last["tensors"])
        self.step_count, self.epoch, self.batch_in_epoch = last["step"], last["epoch"], last["batch"]
        self.rng.bit_generator.state = last["rng"]
        self._progress = last["progress"].model_copy()
        self._load_schedule(last["schedule"])

    def __repr__(self) -> str:
        return (f"<gc.Trainer backend={self.backend!r} workers={self.workers} step={self.step_count} "
                f"epoch={self.epoch} {len(self.manifest.trainable)} trainable>")

