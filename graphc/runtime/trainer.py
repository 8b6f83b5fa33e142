# Over 500 lines: the Trainer's fit/evaluate loop and the resume, interrupt and checkpoint
# bookkeeping that shares its state (issue 13 moves graph rewriting out of it).
"""`gc.Trainer`: run training artifacts on a backend, keeping params and state on its device.

    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    trainer = gc.Trainer(arts, backend="auto")
    history = trainer.fit(gc.data.DataLoader({"x": x, "y": y}, batch_size=64), epochs=5)
    trainer.save_checkpoint("ckpt/")       # resume later with trainer.load_checkpoint("ckpt/")
    trainer.export_inference("model.onnx")

Every train_step input whose manifest role is param, state or hyper is *carried*: it lives on
the backend's device as a handle (an ``OrtValue`` on onnxruntime, the array itself on numpy)
and each step's ``X.next`` output replaces it (``manifest.feeds``). Per step only the batch
goes in and only the loss comes out (in ``fit`` also the prediction the train metrics read,
format 3 on). On onnxruntime the outputs are written into two sets of buffers used in turn (a
step reads one and writes the other, each pair bound once: ``run_bound(keep=True)``), so a step
allocates no param or state buffer; an output
that nothing reads after its producer writes it (the optimizer state, most params:
``graphc.passes.training.in_place``) goes into its input's own buffer, one copy instead of two.
With the fused update (``manifest.layout``) the optimizer state is carried as flat buffers;
``state_dict()`` and checkpoints name it per param all the same. On ort-cuda, ``cuda_graph=True``
replays the step as CUDA graphs (``graphc.runtime.cuda_graph``). On the CPU its sessions count
denormal floats as zero (``flush_denormals``, ``TRAINING_OPTIONS``; ``flush_denormals=False``
keeps IEEE denormals).

Training-mode Dropout reads its randomness from ``noise`` inputs (``dropout_noise.<k>``): each
step the Trainer draws them, in manifest order, with ``self.rng.random(shape, dtype=float32)``
from its ``numpy.random.Generator`` (PCG64, ``seed`` option, default 0), the shape's symbolic
dims bound by the batch (dims the model computes: by the artifacts' ``noise_shapes`` graph,
``gc.training``). The generator's state is saved in checkpoints, so a resumed run draws
the same masks, and the draws are the same on every backend. A batch that holds an array under a
noise input's name feeds it instead (no draw).

Exact resume: ``fit`` runs each step and its bookkeeping (step and batch counters, the epoch's
running loss) with Ctrl-C held back until they are done (``graphc.runtime.interrupts``), so the
checkpoint saved on an interrupt is consistent; ``fit(checkpoint_every=N)`` also saves every N
steps, for runs killed outright. A resumed epoch's printed loss covers all its batches.

Test hook: the environment variable ``GRAPHC_TEST_SIGNAL_AT_STEP=INT:17`` (or ``TERM:17``, ``KILL:17``)
makes ``fit`` send itself that signal right after step 17, before the step's bookkeeping, the
spot where an interrupt used to lose or repeat a batch; the interrupt tests use it. Unset, it
costs nothing.
"""

from __future__ import annotations

import gc as pygc
import math
import numbers
import os
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import onnx

from graphc.errors import ArtifactsError, GraphcError, InputError
from graphc.fileio import made_folders
from graphc.model import complex_io, structure
from graphc.model.dtypes import TensorSpec, to_numpy
from graphc.passes.training import adam_moments
from graphc.passes.training.in_place import in_place_outputs
from graphc.passes.training.loss_scaling import LOSS_SCALE, SKIPPED
from graphc.passes.training.scheduled import MOMENTUM, momentum_value
from graphc.runtime import averaging, checkpoint as ckpt, checkpoint_folder, momentum as momentum_lib, resume_rules
from graphc.runtime import metrics as metrics_lib, params_only
from graphc.runtime.data import (DataLoader, check_eval_loader, check_training_loader, check_whole, eval_batches,
                                 first_non_finite, replays, streams_closed)
from graphc.runtime.feeds import check_one, dtype_name
from graphc.runtime.cuda_graph import GraphedStep, random_nodes
from graphc.runtime.history import EpochRecord, History
from graphc.runtime.interrupts import DeferredInterrupt
from graphc.runtime.labels import check_batch_values, check_data, check_labels, class_count, class_labels, int64_labels
from graphc.runtime.rows import batch_dim, by_rows
from graphc.runtime.session import SESSION_OPTIONS, check_options
from graphc.runtime.weight_averaging import as_model, averaged_names

__all__ = ["History", "Trainer", "TrainingFailed", "TrainingInterrupted"]

BATCH_ROLES = ("data", "label")
NOISE_ROLE = "noise"
SIGNAL_HOOK_ENV = "GRAPHC_TEST_SIGNAL_AT_STEP"
# Backend options every session of a Trainer (its workers' too) gets unless the caller says
# otherwise. Denormals flushed to zero, as TensorFlow and XLA train on the CPU: a value below
# 1.2e-38 in float32 takes onnxruntime's CPU kernels up to 6x as long (softmax over logits that
# span 100 or more, a sigmoid's far tail, the squares of tiny gradients), and changes nothing a
# step's result can show. bench_zoo's GPT at batch 32: its LogSoftmax 22.5 -> 4.7 ms and the
# backward's Exp 22.0 -> 4.6, the step 0.94x (interleaved, 2 threads).
# onnxruntime's other session settings stay at its defaults; measured on ResNet-18's Trainer steps
# at batch 32, 64 px (2 threads, interleaved, the Trainer with the setting built second unless
# said): thread spinning off 1.061x, ``session.dynamic_block_base`` 4 1.029x and 2 1.000x, the
# parallel executor (2 inter-op threads) 2.21x, the pool's thread pinned to the second core
# (``session.intra_op_thread_affinities``) 0.992x and 1.003x, built first 1.002x.
TRAINING_OPTIONS = {"flush_denormals": True}
# what ``Trainer(..., **options)`` takes: a Session's options, CUDA graphs, the memory pattern
TRAINER_OPTIONS = SESSION_OPTIONS | {"cuda_graph", "mem_pattern"}


class TrainingFailed(GraphcError, RuntimeError):
    """Training cannot go on: the loss became NaN or infinite."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``fit(checkpoint=...)`` at ``step``: ``saved`` is the checkpoint written
    there, or None, with ``reason`` saying why it could not be (a second Ctrl-C tore the step)."""

    def __init__(self, step: int, saved: Optional[Path], reason: str = ""):
        super().__init__(f"at step {step}: " + (f"saved {saved}" if saved is not None else f"not saved: {reason}"))
        self.step, self.saved, self.reason = step, saved, reason


def role_specs(entries, roles) -> list[TensorSpec]:
    return [TensorSpec(name=e.name, dtype=e.dtype, shape=e.shape) for e in entries if e.role in roles]


def checked_lr(value: Any) -> float:
    """A learning rate to set between steps: a finite number >= 0 (0 for a schedule's warmup).
    A NaN or infinite one turns every param to NaN at the next step, a negative one ascends."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < math.inf:
        raise ValueError(f"lr must be a finite number >= 0, got {value!r}")
    return float(value)


def check_batches(loader: Any, what: str) -> None:
    """``loader`` gives at least one batch: ``fit`` and ``evaluate_loader`` would else report an
    epoch or an evaluation of nothing (a NaN loss, or no metrics at all)."""
    if len(loader) == 0:
        rows, size = getattr(loader, "num_samples", "?"), getattr(loader, "batch_size", "?")
        drop = ", the last partial one dropped" if getattr(loader, "drop_last", False) else ""
        raise ValueError(f"the {what} gives no batch: {rows} rows in batches of {size}{drop}")


def refuse_empty(feeds: Mapping[str, Any], what: str) -> None:
    """An input of the batch with no values (a zero-row batch): ``what`` (a train step, an
    evaluation) would average its loss over nothing, and a step would still apply weight decay
    and count itself. The backends disagree on such a loss, too: onnxruntime gives 0, numpy NaN."""
    for name, array in feeds.items():
        if np.size(array) == 0:
            raise InputError(f"{what} needs at least one example; the batch's {name!r} is empty "
                             f"(shape {tuple(np.shape(array))})")


def refuse_one_row(manifest, feeds: Mapping[str, Any]) -> None:
    """A train step on a batch that gives a train-mode BatchNorm one value per channel
    (``Manifest.one_row_batchnorms``): its running variance would turn NaN (n/(n-1) = 1/0) with a
    finite loss. PyTorch raises on it too."""
    for bn, (name, axis) in manifest.one_row_batchnorms.items():
        if name in feeds and np.ndim(feeds[name]) > axis and np.shape(feeds[name])[axis] == 1:
            raise InputError(f"a train step needs more than 1 value per channel in BatchNorm {bn!r}: the batch's "
                             f"{name!r} has 1 row (shape {tuple(np.shape(feeds[name]))}); its running variance "
                             "would become NaN (PyTorch raises too). Train on 2 rows or more "
                             "(gc.data.DataLoader(..., drop_last=True) drops a last batch of 1)")


def _one_row_batch(manifest, loader) -> None:
    """Refuse, before the first step, a loader that gives a batch of 1 row to a model with a
    BatchNorm ``refuse_one_row`` would refuse it for (a last partial batch of 1 included)."""
    if not manifest.one_row_batchnorms:
        return
    size, rows = loader.batch_size, loader.num_samples
    if size == 1 or (not loader.drop_last and rows % size == 1):
        raise ValueError(f"the training loader gives a batch of 1 row ({rows} rows in batches of {size}), on which "
                         f"BatchNorm {next(iter(manifest.one_row_batchnorms))!r} has 1 value per channel and its "
                         "running variance would become NaN (PyTorch raises too): use drop_last=True or another "
                         "batch size")


def without_initializers(proto: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """``proto`` (a fresh copy: ``Model.proto`` serializes anew) without the initializers named
    in ``names`` (they are fed), edited in place: no second copy of the weights."""
    keep = [t for t in proto.graph.initializer if t.name not in names]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    return proto


def predict_model(eval_proto: onnx.ModelProto, manifest, carried: set[str]) -> onnx.ModelProto:
    """The eval graph less the loss and the label inputs, ``carried`` inputs fed (not
    initialized): the model's outputs from its data inputs and the current params."""
    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    entries = manifest.graphs["eval"]
    model = ir.from_proto(without_initializers(eval_proto, carried))
    graph = model.graph
    keep = {e.name for e in entries.outputs if e.role != "loss"}
    for value in [v for v in graph.outputs if v.name not in keep]:
        graph.outputs.remove(value)
    RemoveUnusedNodesPass()(model)
    labels = {e.name for e in entries.inputs if e.role == "label"}
    for value in [v for v in graph.inputs if v.name in labels and not v.uses()]:
        graph.inputs.remove(value)
    return ir.to_proto(model)


class Trainer:
    """Train ``artifacts_or_dir`` (``TrainingArtifacts``, an artifact dir or a checkpoint dir
    written by a Trainer) on ``backend``; ``options`` go to the backend's ``prepare`` (for
    onnxruntime e.g. ``threads=2``). ``metrics``: what ``evaluate`` reports beside the loss
    (names or callables, see ``gc.metrics``; None: the loss kind's defaults). ``tensorboard``:
    a directory ``fit`` writes TensorBoard event files to (``graphc.runtime.tensorboard``).
    ``workers > 1`` or a ``ray_address`` train data-parallel on Ray
    (``graphc.runtime.distributed.DistributedTrainer``, which takes more options).
    ``accumulate=k`` (> 1) steps the optimizer once per k micro-batches, gradients accumulated
    (``graphc.runtime.accumulating.AccumulatingTrainer``; with workers,
    ``graphc.runtime.distributed.accumulating.DistributedAccumulatingTrainer``)."""

    _prediction_graph = "train_step"  # the graph whose prediction output the train metrics read

    def __new__(cls, *args: Any, workers: int = 1, ray_address: Optional[str] = None, accumulate: int = 1,
                **kwargs: Any):
        from graphc.runtime.accumulating import AccumulatingTrainer, checked_accumulate
        from graphc.runtime.distributed.connection import DrivesWorkers

        accumulate = checked_accumulate(accumulate)
        if cls is Trainer and (workers != 1 or ray_address) or cls.__dict__.get("_routes_accumulate"):
            from graphc.runtime.distributed.accumulating import DistributedAccumulatingTrainer
            from graphc.runtime.distributed.trainer import DistributedTrainer

            cls = DistributedTrainer if accumulate == 1 else DistributedAccumulatingTrainer
        elif cls is Trainer and accumulate != 1:
            cls = AccumulatingTrainer
        if kwargs.get("shard_optimizer") and not issubclass(cls, DrivesWorkers):
            raise ValueError("shard_optimizer=True splits the optimizer update and state between data-parallel "
                             "workers: it needs workers > 1 (or a ray_address); one process has none to split")
        return super().__new__(cls)

    def __init__(self, artifacts_or_dir: Any, backend: str = "auto", *, seed: int = 0, metrics: Any = None,
                 tensorboard: Union[str, os.PathLike, None] = None, workers: int = 1,
                 ray_address: Optional[str] = None, accumulate: int = 1, **options: Any):
        from graphc.backends import get_backend

        check_options(options, TRAINER_OPTIONS, "Trainer")
        resume_from = self._open(artifacts_or_dir, seed, metrics, tensorboard)
        self._backend = get_backend(backend)
        self.backend = self._backend.name
        cuda_graph = bool(options.pop("cuda_graph", False))
        self._options = {**TRAINING_OPTIONS, **options}
        # train_step runs without onnxruntime's memory pattern: measured (CPU, 1 thread, Trainer
        # steps interleaved in one process) ResNet-18 at batch 2 0.93x the step time, at batch 32
        # 0.90x and 0.92x the peak RSS (1029 -> 950 MB); and on the CPU from an arena that grows by
        # what is asked (ResNet-50 at batch 32: 0.95x the peak RSS; ``backends.onnxruntime``'s
        # ``_exact_cpu_arena``). Other backends ignore the options.
        proto = without_initializers(self.artifacts.train_step.proto, set(self._entries))
        step_options = {**({"keep_recomputation": True} if self.manifest.recompute else {}),
                        "mem_pattern": False, "exact_arena": True, **self._options}
        self._train = self._backend.prepare(proto, **step_options, optimized_graph=True)
        # written into their input's buffer: judged on the graph onnxruntime runs, where it gives
        # it, else on ours; the CUDA graphs' session, built later from fixed shapes, must pass both
        ran = getattr(self._train, "optimized_graph", None)
        if ran is None:
            self._in_place = in_place_outputs(proto.graph, self._feeds)
        else:
            self._in_place = in_place_outputs(ran, self._feeds, optimized=True)
            if cuda_graph:
                self._in_place &= in_place_outputs(proto.graph, self._feeds)
            self._train.optimized_graph = None  # judged: not kept
        # cuda_graph: batches of the first batch's shapes replay CUDA graphs (graphc.runtime.cuda_graph)
        self._graphed = GraphedStep(self._backend, proto, self.artifacts.train_step.ir.graph,
                                    [s.name for s in self.batch_specs + self.noise_specs],
                                    step_options) if cuda_graph else None
        del proto
        # Read from a folder, the artifacts are ours to forget (read again if used again): the
        # graphs go (their reference cycles collected) before the state is read, and the state is
        # packed piece by piece as it is dropped (``graphc.tensorfile`` reads it without a second
        # copy), so the weights are never held three times. Peak RSS, 2 threads: ResNet-50 at
        # batch 32 1617 -> 1333 MB (forgetting at all), at batch 2 954 -> 778 MB (this order: the
        # peak is now the steps' own).
        owned = self.artifacts_path is not None
        if owned:
            self.artifacts.release()
            pygc.collect()
        state = self.artifacts.state
        if owned:
            self.artifacts.release()
        self._reset_state(state, consume=owned)
        del state
        if resume_from is not None:
            self.load_checkpoint(resume_from)

    def _open(self, artifacts_or_dir: Any, seed: int, metrics: Any = None,
              tensorboard: Union[str, os.PathLike, None] = None, accumulate: int = 1) -> Optional[Path]:
        """Read the artifacts and their interface, start the loop counters (``accumulate``: the
        micro-batches per optimizer step, set before a checkpoint is loaded, which checks its k
        against it); returns the checkpoint to resume from when ``artifacts_or_dir`` is one."""
        from graphc.compile import training
        from graphc.compile.training import CARRIED_ROLES

        resume_from = None
        self.artifacts_path: Optional[Path] = None
        if isinstance(artifacts_or_dir, (str, os.PathLike)):
            path = Path(artifacts_or_dir)
            checkpoint_folder.check_training_source(path)
            if not (path / training.MANIFEST_FILE).is_file() and ckpt.resolve(path).is_file():
                resume_from, path = path, checkpoint_folder.find_artifacts(path) or path
                if path == resume_from:
                    raise FileNotFoundError(_without_artifacts(path, ckpt.read_meta(path).artifacts))
            if not (path / training.MANIFEST_FILE).is_file():
                raise FileNotFoundError(f"{artifacts_or_dir}: no training artifacts here "
                                        f"(no {training.MANIFEST_FILE}); write them with "
                                        "gc.training.generate(...).save(dir) or `graphc grad`")
            self.artifacts = training.load(path)
            self.artifacts_path = path.resolve()
        else:
            self.artifacts = artifacts_or_dir
        self.manifest = m = self.artifacts.manifest
        step_graph = m.graphs["train_step"]
        self.batch_specs = role_specs(step_graph.inputs, BATCH_ROLES)
        # a complex input takes a complex array (or its pair), a complex output is given complex (``complex_io``)
        self.complex_inputs, self.complex_outputs = complex_io.complex_names(
            self.artifacts.train_step.ir.metadata_props)
        self._batch_names = [s.name for s in self.batch_specs]
        self._class_labels = class_labels(m)  # take uint8 arrays, cast to int64, as torch's cross_entropy
        self._class_counts: dict[tuple, int] = {}  # batch shapes -> a measured C (``_measured_classes``)
        self.noise_specs = role_specs(step_graph.inputs, (NOISE_ROLE,))
        self._entries = {e.name: e for e in step_graph.inputs if e.role in CARRIED_ROLES}
        self._expected = m.carried()
        self._roles = {name: e.role for name, e in self._expected.items()}
        self._feeds = dict(m.feeds)  # train_step output -> carried input
        self._device_outputs = list(self._feeds)
        # the training-mode prediction the train metrics read (format 3 on); fit fetches it
        self._prediction = next((e.name for e in m.graphs[self._prediction_graph].outputs
                                 if e.role == "prediction"), None)
        # with max_grad_norm, each step's total gradient norm before clipping; fit records it
        self._grad_norm = next((e.name for e in step_graph.outputs if e.role == "grad_norm"), None)
        self._fetch: tuple[str, ...] = ("loss",)
        self._step_outputs: Optional[dict[str, np.ndarray]] = None
        self._eval = self._predict = None
        self.metrics = metrics_lib.resolve(metrics if metrics is not None else (m.metrics or None))
        metrics_lib.check_fits(self.metrics, m.loss.get("kind", ""))
        self.tensorboard = None if tensorboard is None else Path(tensorboard)
        self._state: dict[str, Any] = {}
        self._checked: set[tuple] = set()
        self.step_count = 0  # optimizer steps
        self.accumulate = accumulate  # micro-batches per optimizer step (``AccumulatingTrainer``)
        self.epoch = 0
        self.batch_in_epoch = 0
        check_whole("seed", seed, 0)
        self.rng, self._seed = np.random.default_rng(seed), seed
        self._loader_state: Optional[ckpt.LoaderState] = None
        self._progress = ckpt.EpochProgress()  # running sums of the epoch under way
        self._skips_seen: Optional[int] = None  # in fit with loss scaling: skipped steps when last tallied
        self._interrupts = DeferredInterrupt()
        # learning-rate schedules (gc.optim.lr_scheduler): the one param group they read and write
        # (lr as the Python float last set), the scheduler fit steps and when, and the state a
        # checkpoint held for a scheduler not attached yet
        self.lr_group: dict[str, float] = {}
        self._scheduler = None
        self.scheduler_interval = "epoch"
        self._pending_schedule: Optional[dict[str, Any]] = None
        self.resumed_from = resume_from  # the checkpoint given in place of the artifacts, if one was
        # the checkpoint file load_checkpoint(fresh_optimizer=True) or (changed_model=True) read: saves may replace it
        self._restarted_from: Optional[Path] = None
        self._structure: Optional[structure.GraphStructure] = None  # of the inference graph, read at the first save
        return resume_from

    def _packed(self, tensors: Mapping[str, np.ndarray], consume: bool = False) -> dict[str, np.ndarray]:
        """``tensors`` (named per param) as the carried train_step inputs; every one must be there.
        ``consume``: ``tensors`` is a dict no one else holds (``Manifest.pack``)."""
        missing = [n for n in self._expected if n not in tensors]
        if missing:
            raise ValueError(f"no initial value for train_step input(s) {missing} in the artifacts' state")
        problem = ckpt.mismatch(self._expected, {n: (dtype_name(tensors[n].dtype), list(np.shape(tensors[n])))
                                                 for n in self._expected})
        if problem is not None:  # a state file edited or swapped: it trained in its own dtype, or failed mid-step
            from graphc.compile.training import STATE_FILE

            where = self.artifacts_path / STATE_FILE if self.artifacts_path else "the artifacts' state"
            raise ArtifactsError(f"{where} {problem}; it is not these training graphs' state")
        retyped = ckpt.hypers_as_declared(tensors, self._expected)  # an lr saved as float32 for float64 graphs
        if retyped:
            tensors = tensors if consume else dict(tensors)
            tensors.update(retyped)
        return self.manifest.pack(tensors, consume=consume)

    def _reset_state(self, tensors: Mapping[str, np.ndarray], consume: bool = False) -> None:
        given = set(tensors)
        packed = self._packed(tensors, consume)
        self._train.forget_bindings()  # they hold the old handles
        # the flat buffers pack made are ours: a host device keeps them instead of a second copy
        self._state = {n: self._train.to_device(np.asarray(packed.pop(n)), owned=n not in given)
                       for n in self._entries}
        self._spare: dict[str, Any] = {}  # last step's inputs: where the next step writes
        self._in_model_order: dict[bool, dict[str, np.ndarray]] = {}  # see _eval_state; by averaged

    # -- running -----------------------------------------------------------------------------------
    def _batch_feeds(self, batch: Mapping[str, np.ndarray], specs: list[TensorSpec]) -> dict[str, Any]:
        try:
            feeds = {spec.name: np.asarray(batch[spec.name]) for spec in specs}
            feeds = int64_labels(complex_io.pairs_of(specs, self.complex_inputs, feeds), self._class_labels)
        except KeyError as exc:
            spec = next(s for s in specs if s.name == exc.args[0])
            raise InputError(f"the batch has no {spec.name!r} for the model input {spec}; "
                             f"batch keys: {', '.join(sorted(batch))}") from None
        key = tuple((name, a.dtype.str, a.shape) for name, a in feeds.items())
        if key not in self._checked:  # a loader gives few distinct shapes: check each once
            dims: dict = {}
            for spec in specs:
                check_one(spec, feeds[spec.name].shape, dtype_name(feeds[spec.name].dtype), dims)
            self._checked.add(key)
        return feeds

    def step(self, batch: Mapping[str, np.ndarray]) -> float:
        """One train step on ``batch`` (data and label arrays by name; a complex input's a complex
        array of its dtype or its ``[..., 2]`` pair, as ``gc.Session.run``'s); returns the loss. A
        Ctrl-C during the step is raised once the step is done (params, state, RNG and
        ``step_count`` all advanced), never half way."""
        feeds = self._batch_feeds(batch, self.batch_specs)
        self._refuse_step(feeds)
        with self._interrupts:
            if self.noise_specs:
                feeds.update(self._noise_feeds(batch, feeds))
            feeds.update(self._state)
            state, spare = self._state, {}
            into = {**self._spare, **{out: state[self._feeds[out]] for out in self._in_place}}
            if self._graphed is not None and self._graphed.accepts(feeds):
                for out in self._device_outputs:  # a graph writes every output into a buffer bound before
                    if out not in into:
                        into[out] = self._train.empty_like(state[self._feeds[out]])
                host, device = self._graphed.run(feeds, self._fetch, self._device_outputs, into)
            else:
                host, device = self._train.run_bound(feeds, self._fetch, self._device_outputs, into=into, keep=True)
            self._step_outputs = host
            for out, name in self._feeds.items():
                if out not in self._in_place:
                    spare[out] = state[name]
                state[name] = device[out]
            self._spare, self._in_model_order = spare, {}
            self.step_count += 1
            return float(host["loss"])

    def _refuse_step(self, feeds: Mapping[str, np.ndarray], weight: Optional[float] = None) -> None:
        """Refuse a train step on ``feeds`` that has no row, a BatchNorm batch of 1 row,
        cross-entropy labels outside [0, C) (C measured where only a forward tells it) or weighing
        0 in all (``weight``: their ``averaging.shard_weight`` where the caller has it), the model's
        own cross-entropy labels out of range, or binary cross-entropy probabilities outside [0, 1]; the
        data-parallel Trainer checks its global batch the same way before any worker steps."""
        refuse_empty(feeds, "a train step")
        refuse_one_row(self.manifest, feeds)
        check_labels(self.manifest, feeds, "a train step", classes=self._classes(feeds), weight=weight)
        check_batch_values(self.manifest, feeds, "a train step")

    def _classes(self, feeds: Mapping[str, np.ndarray]) -> Optional[int]:
        """A cross-entropy's C on ``feeds`` as one process sees it (``labels.class_count``, or
        measured); None for any other loss."""
        if self.manifest.loss.get("kind") != "cross_entropy":
            return None
        found = class_count(self.manifest, feeds)
        return found if found is not None else self._measured_classes(feeds)

    def _measured_classes(self, feeds: Mapping[str, np.ndarray]) -> int:
        """A cross-entropy's C where neither the graphs nor the batch's shapes tell it (a class dim
        computed inside the model): axis 1 of the logits of an inference-mode forward of the
        batch, run once per batch shapes."""
        key = tuple((name, np.shape(a)) for name, a in feeds.items())
        if key not in self._class_counts:
            data = {name: a for name, a in feeds.items() if name not in self._label_names()}
            self._class_counts[key] = int(np.shape(self._forward(data)[self.manifest.loss["output"]])[1])
        return self._class_counts[key]

    def _forward(self, data: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inference-mode outputs of one forward of ``data`` as a whole (``predict``)."""
        return self.predict(data)

    def _noise_feeds(self, batch: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This step's Dropout noise: taken from ``batch``, else drawn from ``self.rng`` in
        manifest order with the shapes ``_noise_shapes`` gives."""
        out = {s.name: np.asarray(batch[s.name], dtype=np.float32) for s in self.noise_specs if s.name in batch}
        out.update({name: self.rng.random(shape, dtype=np.float32)
                    for name, shape in self._noise_shapes(batch, feeds).items()})
        return out

    def _noise_shapes(self, batch: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray]) -> dict[str, tuple]:
        """The shape of each noise input ``batch`` does not hold, in manifest order: its spec's
        with symbolic dims bound by the batch's arrays (``feeds``)."""
        dims: dict[str, int] = {}
        for spec in self.batch_specs:
            for d, size in zip(spec.shape or (), feeds[spec.name].shape):
                if isinstance(d, str):
                    dims.setdefault(d, int(size))
        out = {}
        probed = None
        for spec in self.noise_specs:
            if spec.name in batch:
                continue
            if spec.shape is not None and all(isinstance(d, int) or d in dims for d in spec.shape):
                out[spec.name] = tuple(d if isinstance(d, int) else dims[d] for d in spec.shape)
            else:  # a dim the batch does not name (an imported model's computed shape): measure it
                if probed is None:
                    probed = self._graph_noise_shapes(feeds, spec.name)
                out[spec.name] = probed[spec.name]
        return out

    def _graph_noise_shapes(self, feeds: Mapping[str, np.ndarray], name: str) -> dict[str, tuple[int, ...]]:
        """The shapes of the noise inputs whose dims the batch does not name, for this batch's
        shapes: what the artifacts' ``noise_shapes`` graph computes from the batch, run on numpy
        (cached per batch shape); ``name``: a noise input that needs it, for the error where there
        is none."""
        from graphc.passes.training.noise import SHAPE_SUFFIX

        entry = self.manifest.graphs.get("noise_shapes")
        if entry is None:
            raise ArtifactsError(f"cannot size the Dropout noise input {name!r} from the batch, and these "
                                 f"artifacts (format {self.manifest.format}) have no noise_shapes graph that would; "
                                 "regenerate them (gc.training.generate(...).save(dir) or `graphc grad`), or feed "
                                 "the noise in the batch under those names")
        key = tuple((e.name, feeds[e.name].shape) for e in entry.inputs)
        cache = self.__dict__.setdefault("_noise_shape_cache", {})
        if key not in cache:
            if getattr(self, "_noise_shape_exe", None) is None:  # numpy: a data-parallel driver has no session
                from graphc.backends import get_backend

                self._noise_shape_exe = get_backend("numpy").prepare(self.artifacts.noise_shapes.proto)
            host, _ = self._noise_shape_exe.run_bound({e.name: feeds[e.name] for e in entry.inputs},
                                                      [e.name for e in entry.outputs])
            cache[key] = {e.name.removesuffix(SHAPE_SUFFIX): tuple(int(d) for d in host[e.name]) for e in entry.outputs}
        return cache[key]

    def _eval_exe(self):
        if self._eval is None:
            entries = self.manifest.graphs["eval"].inputs
            self._eval_specs = role_specs(entries, BATCH_ROLES)
            self._eval_carried = [e.name for e in entries if e.name in self._state]
            self._eval_outputs = [e.name for e in self.manifest.graphs["eval"].outputs]
            self._eval = self._backend.prepare(
                without_initializers(self.artifacts.eval.proto, set(self._eval_carried)), **self._options)
        return self._eval

    def _label_names(self) -> set[str]:
        return {e.name for e in self.manifest.graphs["eval"].inputs if e.role == "label"}

    def _predict_exe(self):
        """The eval graph less the loss and the label inputs: the model's outputs from its data
        inputs and the current params."""
        if self._predict is None:
            self._eval_exe()
            proto = predict_model(self.artifacts.eval.proto, self.manifest, set(self._eval_carried))
            self._predict_specs = [s for s in self._eval_specs if s.name not in self._label_names()]
            self._predict_outputs = [v.name for v in proto.graph.output]
            self._predict = self._backend.prepare(proto, **self._options)
        return self._predict

    def predict(self, batch: Mapping[str, np.ndarray], *, averaged: bool = False) -> dict[str, np.ndarray]:
        """The model's outputs on ``batch`` (inference mode, current params; ``averaged``: the
        averaged copy's, ``gc.optim.swa_utils``): only the data inputs are needed; when the batch
        also holds every label, ``loss`` too. A complex output comes back as a complex array."""
        exe = self._eval_exe()
        if not self._label_names() <= set(batch):
            exe, specs, outputs = self._predict_exe(), self._predict_specs, self._predict_outputs
        else:
            specs, outputs = self._eval_specs, self._eval_outputs
        feeds = self._batch_feeds(batch, specs)
        feeds.update(self._eval_state(averaged))
        host, _ = exe.run_bound(feeds, outputs)
        return complex_io.complex_results(self.complex_outputs, host)

    def _eval_state(self, averaged: bool = False) -> dict[str, Any]:
        """The carried tensors the eval graph reads (``averaged``: their averaged copies), in the
        model's order: the params train_step holds in another order (``manifest.orders``)
        transposed back on the host, once a step."""
        prefix = ""
        if averaged:
            from graphc.passes.training.weight_averaging import PREFIX

            averaged_names(self.manifest)  # refuses artifacts without
            prefix = PREFIX
        feeds = {n: self._state[prefix + n] for n in self._eval_carried}
        if self.manifest.orders:
            if averaged not in self._in_model_order:  # dropped by each step and each new state
                from graphc.compile.training import to_model_order

                self._in_model_order[averaged] = {n: to_model_order(self._train.to_host(feeds[n]), order)
                                                  for n, order in self.manifest.orders.items()}
            feeds.update(self._in_model_order[averaged])
        return feeds

    def evaluate(self, batch: Mapping[str, np.ndarray], *, averaged: bool = False) -> dict[str, float]:
        """Loss on ``batch`` (inference mode; ``averaged``: with the averaged weights) and the metrics (``self.metrics``, else the loss
        kind's defaults: accuracy and top-5 accuracy for a classifier, MSE and MAE for a
        regression; see ``gc.metrics``)."""
        missing = sorted(self._label_names() - set(batch))
        if missing:
            raise InputError(f"evaluate needs the label input(s) {', '.join(missing)} in the batch; batch keys: "
                             f"{', '.join(sorted(batch))} (predict needs the data inputs only)")
        given = {s.name: batch[s.name] for s in self.batch_specs if s.name in batch}
        refuse_empty(given, "an evaluation")
        check_labels(self.manifest, given, "an evaluation")
        check_batch_values(self.manifest, given, "an evaluation")
        out = self.predict(batch, averaged=averaged)
        if self.manifest.loss.get("kind") == "cross_entropy" and class_count(self.manifest, given) is None:
            # a C only the run tells: checked before the loss or a metric is read
            check_labels(self.manifest, given, "an evaluation", classes=np.shape(out[self.manifest.loss["output"]])[1])
        return {"loss": float(out["loss"]), **metrics_lib.compute(self.manifest.loss, out, batch, self.metrics)}

    def evaluate_loader(self, loader, *, averaged: bool = False) -> dict[str, float]:
        """``evaluate`` over every batch of ``loader`` (``averaged``: with the averaged weights) (a ``gc.data.DataLoader``, or any iterable of
        batch dicts: ``graphc.runtime.data.eval_batches``): the loss and metrics of the whole set as
        one batch. Each batch counts by what its mean is over (``graphc.runtime.averaging``):
        its rows, for cross-entropy its labels that are not ``ignore_index`` (with class weights,
        their weights' sum), so a batch of ignored labels only counts for nothing (a mean loss's is
        not even computed: it is a mean over no example, which ``evaluate`` refuses); summed losses
        add up. A batch whose counted labels weigh 0 in all is evaluated joined to the batch before
        it (the first ones to the one after): its own mean divides by 0, yet its labels count in the
        metrics and, with label smoothing, its smoothing term in the set's weighted sum."""
        return self._evaluated(loader, averaged)[0]

    def _epoch_eval(self, loader) -> dict[str, float]:
        """``evaluate_loader(loader)`` as an epoch's record holds it: a summed loss per row (the
        set's total / its rows), on the scale of the epoch's train loss (``averaging.epoch_weight``)."""
        result, rows = self._evaluated(loader)
        if averaging.summed(self.manifest.loss):
            result["loss"] /= rows
        return result

    def _evaluated(self, loader, averaged: bool = False) -> tuple[dict[str, float], int]:
        """``evaluate_loader(loader)`` and the rows of the batches it counted."""
        if isinstance(loader, DataLoader):
            check_batches(loader, "eval loader")
        loss_spec = self.manifest.loss
        loss_sum = weight = count = 0.0
        total_rows = 0
        totals: dict[str, float] = {}
        group: list[tuple[int, Mapping[str, Any], float]] = []  # (number, batch, weight) evaluated as one: a
        group_weight = group_count = 0.0  # batch that weighs and the weightless ones next to it

        def add() -> None:
            nonlocal loss_sum, weight, count
            result = self.evaluate(group[0][1] if len(group) == 1 else self._joined_batch(group), averaged=averaged)
            loss_sum, weight = loss_sum + result.pop("loss") * group_weight, weight + group_weight
            count += group_count
            for key, value in result.items():  # a summed loss's batch of ignored labels only: NaN metrics, counted 0
                totals[key] = totals.get(key, 0.0) + (value * group_count if group_count else 0.0)

        for index, batch in enumerate(eval_batches(loader), start=1):
            rows = len(next(iter(batch.values())))
            n = averaging.examples(loss_spec, batch, rows)
            w = averaging.shard_weight(loss_spec, batch, rows)
            if not (n or w):
                continue
            total_rows += rows
            if w and group_weight:
                add()
                group, group_weight, group_count = [], 0.0, 0.0
            group.append((index, batch, w))
            group_weight, group_count = group_weight + w, group_count + n
        if group_weight:
            add()
        return {"loss": loss_sum / averaging.divisor(loss_spec, weight, "the eval loader"),
                **{key: value / count if count else float("nan") for key, value in totals.items()}}, total_rows

    def _joined_batch(self, group: list[tuple[int, Mapping[str, Any], float]]) -> dict[str, Any]:
        """The (number, batch, weight) of ``group`` as one batch of the eval graph's inputs: those
        whose first dim is the batch dim joined by rows, the others the first batch's."""
        self._eval_exe()
        dim = batch_dim(self._eval_specs)
        if dim is None:
            number = next(n for n, _, w in group if not w)
            raise InputError(f"batch {number} of the eval loader: the class weights of its labels that are not ignored "
                             "sum to 0, so it is evaluated joined to a neighbouring batch, but no input of the eval "
                             f"graph has a symbolic batch dim to join them by ({', '.join(map(str, self._eval_specs))})")
        batches = [b for _, b, _ in group]
        return {s.name: np.concatenate([np.asarray(b[s.name]) for b in batches]) if by_rows(s, dim, computed=True)
                else batches[0][s.name] for s in self._eval_specs if s.name in batches[0]}

    # -- the loop -------------------------------------------------------------------------------------
    def fit(self, loader, epochs: int, eval_loader=None, progress: bool = True,
            plot: Union[str, os.PathLike, None] = None,
            checkpoint: Union[str, os.PathLike, None] = None, checkpoint_every: Optional[int] = None,
            quiet: bool = False, log: Union[str, os.PathLike, None] = None, scheduler=None,
            interval: Optional[str] = None) -> History:
        """Train from ``loader``, a ``gc.data.DataLoader`` (whose order a checkpoint replays), until
        ``epochs`` epochs are done (counted from the first, so a resumed trainer continues where its
        checkpoint stopped); ``eval_loader`` is what ``evaluate_loader`` takes. Prints a progress
        bar within each epoch (not with ``progress=False``) and one line per epoch with the mean
        train loss (a summed loss's per row, as its eval loss: ``averaging.epoch_weight``), the
        train metrics (``self.metrics`` computed from each step's own
        training-mode prediction, as Keras does: no extra pass; not for artifacts before format 3)
        and the eval loss and metrics (neither with ``quiet=True``);
        appends the same per epoch to ``log`` (``.jsonl`` or ``.csv``,
        ``gc.runtime.history.EpochLog``). Saves ``checkpoint`` after each epoch, with
        ``checkpoint_every=N`` every N steps too (what a killed run resumes from), and on Ctrl-C
        once the step under way is done, then raises ``TrainingInterrupted`` (a
        ``KeyboardInterrupt``); a loss-curve PNG goes to ``plot`` when given. A batch of ignored
        cross-entropy labels only (a mean over no example) is skipped with a warning: no step, no
        loss, its rows not counted. Raises ``TrainingFailed`` on a NaN/inf loss; a ``checkpoint``
        that could not be written or holds other training graphs' checkpoint, or a ``plot`` or
        ``log`` that could not be written, fails before the first step. ``scheduler``: a
        ``gc.optim.lr_scheduler`` scheduler of this Trainer (kept as ``self.scheduler``, which a
        later fit steps too), stepped after each epoch (``interval="epoch"``, the default) or
        after each step (``"step"``), ReduceLROnPlateau with the epoch's eval loss (its train loss
        without ``eval_loader``; with ``"step"``, the step's loss); checkpoints save its state."""
        from graphc.runtime.history import EpochLog, check_plot
        from graphc.runtime.lr_base import check_covers
        from graphc.runtime.progress import TrainProgress

        check_whole("epochs", epochs, 0, " (the epoch to train to)")
        if checkpoint_every is not None and int(checkpoint_every) < 1:
            raise ValueError(f"checkpoint_every must be >= 1 steps, got {checkpoint_every}")
        if checkpoint_every is not None and checkpoint is None:
            raise ValueError("checkpoint_every needs checkpoint, the folder to save in")
        check_training_loader(loader)
        if interval not in (None, "epoch", "step"):
            raise ValueError(f"interval must be 'epoch' or 'step' (when the scheduler steps), got {interval!r}")
        if scheduler is not None:
            self.scheduler = scheduler
        if interval is not None:
            self.scheduler_interval = interval
        if self.epoch < epochs:
            check_batches(loader, "training loader")
            _one_row_batch(self.manifest, loader)
            if isinstance(loader, DataLoader):  # a RayDataLoader's rows are checked batch by batch, as read
                check_data(self.manifest, loader.arrays, "the training loader")  # rows, not batch rows
            if self._scheduler is not None:
                check_covers(self._scheduler, self.scheduler_interval, epochs, self.epoch,
                             self.steps_for(self.batch_in_epoch), self.steps_for(len(loader)))
        if isinstance(eval_loader, DataLoader):
            check_batches(eval_loader, "eval loader")
            check_data(self.manifest, eval_loader.arrays, "the eval loader")
        elif eval_loader is not None:
            check_eval_loader(eval_loader, passes=epochs - self.epoch)
        if checkpoint is not None:
            checkpoint_folder.check_owner(checkpoint, self._expected, self._restarted_from,
                                          structure=self._inference_structure())
            self._warn_unsaved_randomness()
        if plot is not None:
            check_plot(plot)
        loader.check_against(self.batch_specs, self._class_labels, self.complex_inputs)
        if replays(eval_loader):
            self._eval_exe()
            eval_loader.check_against(self._eval_specs, self._class_labels, self.complex_inputs)
        self._use_loader(loader)
        self._fetch = ("loss", *([self._prediction] if self._train_metrics_wanted() else []),
                       *([self._grad_norm] if self._grad_norm else []))
        epoch_log = EpochLog(log, self.epoch) if log is not None else None
        board = self._board()
        from graphc.runtime.lr_scheduler import lr_group

        history = History(backend=self.backend)
        self._skips_seen = self.skipped_steps
        if board is not None:
            board.discard()  # steps an earlier fit held and never saved: a rewound run trains them again
            board.start(self.step_count + 1)  # and those written after the checkpoint resumed: shown no more

        def save() -> None:  # TensorBoard's steps go out first: a resume from this checkpoint writes the rest once
            if board is not None:
                board.flush()
            self.save_checkpoint(checkpoint)

        with streams_closed(loader, eval_loader), self._saved_on_interrupt(checkpoint, board), \
                self._interrupts.armed(), \
                TrainProgress(epochs, len(loader), bar=progress and not quiet, lines=not quiet) as bar:
            while self.epoch < epochs:
                self._fit_epoch(loader, history, bar, board, save if checkpoint_every else None, checkpoint_every)
                metrics = self._epoch_eval(eval_loader) if eval_loader is not None else {}
                with self._interrupts:  # the epoch's line is printed and counted once, or not at all
                    record = self._end_epoch(metrics)
                    record.lr = lr_group(self)["lr"] if "lr" in self._entries else None  # as set, not float32's
                    if self._scheduler is not None and self.scheduler_interval == "epoch":
                        self._step_scheduler(metrics["loss"] if "loss" in metrics else record.loss)
                    history.epochs.append(record)
                    if board is not None:
                        board.epoch(record, self.step_count, float("nan") if record.lr is None else record.lr)
                    bar.epoch_done(record)
                    if epoch_log is not None:
                        epoch_log.write(record)
                if checkpoint is not None:
                    save()
        loader.epoch = self.epoch
        self._fetch, self._skips_seen = ("loss",), None
        if plot is not None:
            history.plot(plot)
        return history

    @contextmanager
    def _saved_on_interrupt(self, checkpoint: Union[str, os.PathLike, None], board=None) -> Iterator[None]:
        """A Ctrl-C inside writes the steps ``board`` (TensorBoard's writer) holds and saves
        ``checkpoint`` (the state is whole: steps hold Ctrl-C to their end), and becomes
        ``TrainingInterrupted``."""
        try:
            yield
        except KeyboardInterrupt as exc:
            if board is not None:  # the steps done so far: a later fit or a resume goes on after them
                board.flush()
            if checkpoint is None:
                raise
            try:
                saved, reason = self.save_checkpoint(checkpoint), ""
            except ckpt.CheckpointError as error:  # a second Ctrl-C cut a step short
                saved, reason = None, str(error)
            raise TrainingInterrupted(self.step_count, saved, reason).with_traceback(exc.__traceback__) from None

    def _board(self):
        """The TensorBoard writer of ``self.tensorboard`` (None without one), opened on first use
        with the model graph written; closed with the Trainer."""
        if self.tensorboard is None:
            return None
        if getattr(self, "_tensorboard_writer", None) is None:
            import weakref

            from graphc.runtime.tensorboard import TensorBoardWriter

            writer = TensorBoardWriter(self.tensorboard)
            writer.graph(self.artifacts.inference.proto)
            weakref.finalize(self, writer.close)
            self._tensorboard_writer = writer
        return self._tensorboard_writer

    def _fit_epoch(self, loader, history: History, bar, board, save, every: Optional[int]) -> None:
        """The rest of epoch ``self.epoch``: its batches from ``self.batch_in_epoch`` on, each
        step's loss held by ``board`` (TensorBoard's writer, or None)."""
        hook = _signal_hook()
        sums = self._progress
        bar.start_epoch(self.epoch, self.batch_in_epoch, sums.mean_loss())
        last = time.perf_counter()
        first = self._batch_names[0] if self._batch_names else None
        for batches in self._step_groups(loader):
            sizes = [len(b[first]) if first in b else 0 for b in batches]  # one missing: the step says which
            rows = sum(sizes)
            examples = sum(averaging.examples(self.manifest.loss, b, n)
                           for b, n in zip(batches, sizes))  # once: the skip test, the train metrics
            if all(self._counts_nothing(b, n) for b, n in zip(batches, sizes)):
                self._skip(len(loader), examples, len(batches))
                bar.step(sums.mean_loss(0.0), sums.samples / max(sums.seconds, 1e-9), len(batches))
                last = time.perf_counter()
                continue
            batch = batches[0]
            with self._interrupts:
                loss = self._step_on(batches, len(loader))
                if hook is not None and self.step_count == hook[1]:
                    signal.raise_signal(hook[0])
                # with loss scaling, its inf/NaN gradients skip the step (torch's loop goes on): the
                # loss counts in no mean and the epoch's record counts the step as skipped
                scaled_away = not math.isfinite(loss) and self._skips_seen is not None
                if not math.isfinite(loss) and not scaled_away:
                    raise TrainingFailed(f"the loss became {loss} at step {self.step_count} (epoch {self.epoch + 1}, "
                                         f"batch {self.batch_in_epoch + 1}); {self._non_finite_cause(loader, batch)}")
                norm = float(self._step_outputs[self._grad_norm]) if self._grad_norm else None
                if norm is not None:
                    history.step_grad_norms.append(norm)
                if not scaled_away:
                    self._add_train_metrics(batch, examples)
                now = time.perf_counter()
                self.batch_in_epoch += len(batches)
                if not scaled_away:
                    sums.steps += 1
                    sums.loss_sum += loss * averaging.epoch_weight(self.manifest.loss, rows)
                    sums.samples += rows
                sums.seconds += now - last
                history.step_losses.append(loss)
                if board is not None:
                    board.step(self.step_count, loss, norm)
                if self._scheduler is not None and self.scheduler_interval == "step":
                    self._step_scheduler(loss)
            bar.step(sums.mean_loss(0.0), sums.samples / max(sums.seconds, 1e-9), len(batches))
            if save is not None and self.step_count % every == 0:
                save()
            last = time.perf_counter()  # the save's time is not train time

    def steps_for(self, batches: int) -> int:
        """Optimizer steps ``batches`` loader batches make: one per ``self.accumulate``, the last of
        those left."""
        return -(-batches // self.accumulate)

    def _step_groups(self, loader) -> Iterator[list[Mapping[str, np.ndarray]]]:
        """The rest of the epoch's batches, ``self.accumulate`` to an optimizer step (the last
        group what is left)."""
        group: list[Mapping[str, np.ndarray]] = []
        for batch in loader.iter_epoch(self.epoch, self.batch_in_epoch):
            group.append(batch)
            if len(group) == self.accumulate:
                yield group
                group = []
        if group:
            yield group

    def _step_on(self, batches: list[Mapping[str, np.ndarray]], of: Optional[int] = None) -> float:
        """One optimizer step on ``batches`` (one batch here; micro-batches: ``AccumulatingTrainer``),
        ``fit``'s loader batches from ``self.batch_in_epoch`` on of an epoch of ``of`` (None: ``step``'s)."""
        return self.step(batches[0])

    def _non_finite_cause(self, loader, batch: Mapping[str, np.ndarray]) -> str:
        """What a NaN or infinite loss of the batch at ``self.batch_in_epoch`` comes from, as far as
        the host sees: the batch's first NaN or infinity (its data row named), which the step
        carried into the loss as torch's would, else the training itself."""
        found = first_non_finite({name: batch[name] for name in self._batch_names if name in batch})
        if found is None:
            return "lower the learning rate or check the data"
        name, at, value = found
        row = loader.sample(self.epoch, self.batch_in_epoch, at[0]) if at else None
        where = f" (row {row} of the loader's data{self._row_holder(batch, name, at[0])})" if at else ""
        return (f"the batch's {name!r} holds {value} at {at}{where}, which the step carried into the loss and the "
                "params, as torch's would: clean the data (np.isfinite) before training")

    def _row_holder(self, batch: Mapping[str, np.ndarray], name: str, row: int) -> str:
        """Which worker ran row ``row`` of ``batch``'s input ``name``, said after the data's row:
        none here (one process); data-parallel workers name the shard's."""
        return ""

    def _step_scheduler(self, loss: float) -> None:
        """Step ``self.scheduler``: ReduceLROnPlateau watching ``loss``, the others by one."""
        from graphc.runtime.lr_scheduler import ReduceLROnPlateau

        if isinstance(self._scheduler, ReduceLROnPlateau):
            self._scheduler.step(loss)
        else:
            self._scheduler.step()

    def _counts_nothing(self, batch: Mapping[str, np.ndarray], rows: int, weight: Optional[float] = None) -> bool:
        """Whether ``batch`` (``rows`` rows) holds no example a mean loss counts: cross-entropy
        labels that are all the ignore index, or whose class weights sum to 0. Its loss is 0/0, NaN
        as PyTorch's (inf in the graph with label smoothing), and so is its gradient in the graph
        (0 * inf, where PyTorch's is 0). ``weight``: its ``averaging.shard_weight`` where the caller
        has it (None: computed here)."""
        return rows > 0 and not (averaging.shard_weight(self.manifest.loss, batch, rows) if weight is None else weight)

    def _skip(self, batches: int, examples: int, count: int = 1) -> None:
        """Pass over the ``count`` batches at ``self.batch_in_epoch`` (of ``batches``), whose ``examples``
        labels not ignored weigh 0 in all, with no step, saying so."""
        import warnings

        with self._interrupts:
            warnings.warn(f"{self._counts_nothing_why(batches, examples)}; skipped (no step: its mean "
                          "loss is 0/0, NaN, and would make every param NaN)", stacklevel=4)
            self.batch_in_epoch += count

    def _counts_nothing_why(self, batches: Optional[int], examples: int,
                            micro: Optional[tuple[int, int]] = None) -> str:
        """Where and why a batch counts for nothing (``_counts_nothing``): ``fit``'s loader batch at
        ``self.batch_in_epoch`` of ``batches`` (None: ``step``'s own batch), or micro-batch
        ``micro[0]`` (from 0) of ``micro[1]`` of the step there, holding ``examples`` labels not ignored."""
        loss = self.manifest.loss
        options = loss.get("options", {})
        ignore = options.get("ignore_index", -100)
        why = (f"the class weights of its labels in {loss['label']!r} sum to 0 (weight={options.get('weight')})"
               if examples else f"every label in {loss['label']!r} is the ignore index {ignore}")
        part = "" if micro is None else f"micro-batch {micro[0] + 1} of {micro[1]}"
        if batches is None:
            return f"{part}: {why}"
        where = f"epoch {self.epoch + 1}, batch {self.batch_in_epoch + (micro[0] if micro else 0) + 1} of {batches}"
        return f"{where}{f' ({part})' if part else ''}: {why}"

    def _train_metrics_wanted(self) -> bool:
        """Whether fit computes train metrics: there are metrics, and the train_step graph gives
        the prediction they read (else said once: older artifacts lack it)."""
        if self.metrics == {} or not self.manifest.loss.get("label"):
            return False
        if self._prediction is None and not self.__dict__.get("_prediction_warned"):
            import warnings

            self._prediction_warned = True
            warnings.warn(f"these training artifacts (format {self.manifest.format}) have no "
                          f"{self._prediction_graph} prediction output, so fit reports no train metrics (eval "
                          "metrics still); regenerate them (gc.training.generate(...).save(dir) or `graphc grad`) "
                          "for train metrics", stacklevel=4)
        return self._prediction is not None

    def _add_train_metrics(self, batch: Mapping[str, np.ndarray], examples: int) -> None:
        """Add the metrics of the step just run times the ``examples`` they are a mean over
        (``averaging.examples``: rows, or labels not ignored) to the epoch's running sums
        (divided by all the epoch's examples at its end, as ``evaluate_loader``)."""
        sums = self._step_metric_sums(batch, examples)
        if sums is None:
            return
        progress = self._progress
        for name, value in sums.items():
            progress.metric_sums[name] = progress.metric_sums.get(name, 0.0) + value
        progress.metric_examples += examples

    def _step_metric_sums(self, batch: Mapping[str, np.ndarray], examples: int) -> Optional[dict[str, float]]:
        """The step just run's metrics from its own prediction, times ``examples``
        (``metrics.sums``); None when it fetched no prediction."""
        outputs, self._step_outputs = self._step_outputs, None
        if outputs is None or self._prediction not in outputs:
            return None
        return metrics_lib.sums(self.manifest.loss, outputs, batch, self.metrics, examples)

    def _end_epoch(self, metrics: dict[str, float]) -> EpochRecord:
        """The record of the epoch just trained (its whole run of batches, resumed or not); the
        loop position moves to the next epoch."""
        self._tally_skips()
        sums = self._progress
        record = EpochRecord(epoch=self.epoch + 1, loss=sums.mean_loss(float("nan")),
                             steps=sums.steps, samples=sums.samples, seconds=sums.seconds,
                             samples_per_s=sums.samples / sums.seconds if sums.seconds > 0 else 0.0, eval=metrics,
                             metrics={k: v / sums.metric_examples for k, v in sums.metric_sums.items()}
                             if sums.metric_examples else {},
                             loss_scale=self.loss_scale, skipped_steps=sums.skipped_steps or 0
                             if self.manifest.loss_scale is not None else None)
        self.epoch, self.batch_in_epoch, self._progress = self.epoch + 1, 0, ckpt.EpochProgress()
        return record

    def loader_mismatch(self, loader) -> Optional[str]:
        """How ``loader``'s settings differ from those the restored checkpoint's run used (a
        resume with it would not replay that run's batches), or None."""
        return _used_other(self._loader_changes(_loader_state(loader)))

    def _loader_changes(self, now: ckpt.LoaderState) -> list[str]:
        """``resume_rules.loader_changes`` from the restored checkpoint's run's loader settings to
        ``now`` (none where no run was restored)."""
        if self._loader_state is None or not (self.epoch or self.batch_in_epoch):
            return []
        return resume_rules.loader_changes(self._loader_state, now)

    def _use_loader(self, loader) -> None:
        now = _loader_state(loader)  # fingerprints the data: once
        diffs = self._loader_changes(now)
        resume_rules.check_position(self._loader_state, diffs, self.epoch, self.batch_in_epoch)
        if diffs:
            import warnings

            warnings.warn(f"resuming with a different data loader: {_used_other(diffs)}; the run will not replay "
                          "exactly", stacklevel=3)
        self._loader_state = now

    # -- state ----------------------------------------------------------------------------------------
    @property
    def params(self) -> dict[str, np.ndarray]:
        """Host copies of every model param: trained ones from the device, frozen ones as given."""
        out = {n: a for n, a in self.state_dict().items() if self._roles.get(n) == "param"}
        frozen = self.artifacts.inference.params
        out.update({n: frozen[n] for n in self.manifest.frozen if n in frozen})
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of everything carried from step to step (params, optimizer state, step,
        lr), named per param whatever the layout."""
        return self.manifest.unpack({n: self._host(h) for n, h in self._state.items()})

    def _host(self, handle: Any) -> np.ndarray:
        # A private copy: on numpy the handle *is* the live array the next step reads.
        return np.array(self._train.to_host(handle), copy=True)

    def _carried(self, name: str) -> np.ndarray:
        """A host copy of the carried tensor ``name`` (``lr``, ``loss_scale``, ...; a
        DistributedTrainer reads rank 0's)."""
        return self._host(self._state[name])

    @property
    def loss_scale(self) -> Optional[float]:
        """The current loss scale (torch's ``scaler.get_scale()``) of artifacts generated with
        ``loss_scale``; None without loss scaling."""
        return None if self.manifest.loss_scale is None else float(self._carried(LOSS_SCALE))

    @property
    def skipped_steps(self) -> Optional[int]:
        """How many steps loss scaling skipped (inf or NaN gradients) since step 0; None without
        loss scaling (or for artifacts generated before it counted them)."""
        return int(self._carried(SKIPPED)) if SKIPPED in self._entries else None

    def _tally_skips(self) -> None:
        """Add the steps skipped since the last tally to the epoch's (``fit`` with loss scaling)."""
        if self._skips_seen is None:
            return
        total = self.skipped_steps
        self._progress.skipped_steps = (self._progress.skipped_steps or 0) + total - self._skips_seen
        self._skips_seen = total

    @property
    def lr(self) -> float:
        return float(self._carried("lr"))

    @lr.setter
    def lr(self, value: float) -> None:
        array = np.asarray(checked_lr(value), dtype=to_numpy(self._entries["lr"].dtype))
        self.lr_group["lr"] = float(value)  # what a scheduler reads back, unrounded (torch's group["lr"])
        self._put_hyper("lr", array)

    @property
    def momentum(self) -> float:
        """SGD's or RMSprop's momentum, or the Adam family's beta1, that the next step uses: the
        train_step's ``momentum`` input where the artifacts were generated with
        ``scheduled=("momentum",)`` (then settable, as ``lr``), else the spec's constant."""
        return float(self._carried(MOMENTUM)) if MOMENTUM in self._entries else momentum_value(self.manifest.optimizer)

    @momentum.setter
    def momentum(self, value: float) -> None:
        self._set_momentum(value)

    def _set_momentum(self, value: float, below_one: bool = True) -> None:
        """``momentum``'s setter; a scheduler's beta1 may pass 1 (``below_one=False``), as torch's."""
        optimizer = self.manifest.optimizer
        value = momentum_lib.checked(optimizer, MOMENTUM in self._entries, value, below_one=below_one)
        momentum_lib.record(self.lr_group, optimizer, value)  # torch's group["momentum"] or group["betas"][0]
        self._put_hyper(MOMENTUM, np.asarray(value, np.float64))

    def _put_hyper(self, name: str, array: np.ndarray) -> None:
        """Set the hyper-parameter ``name`` (``lr``, ``momentum``) for the next step."""
        self._put_carried(name, array)

    def _put_carried(self, name: str, array: np.ndarray) -> None:
        """Replace the carried tensor ``name`` (a hyper-parameter, ``update_bn``'s averaged
        statistics) with ``array``, on the device."""
        handle = self._state[name]
        if hasattr(handle, "update_inplace"):  # into the buffer the CUDA graphs and kept bindings read
            handle.update_inplace(array)
        else:
            self._state[name] = self._train.to_device(array)

    @property
    def scheduler(self):
        """The lr scheduler (``gc.optim.lr_scheduler``) ``fit`` steps and checkpoints save, or None.
        Set (by ``fit(scheduler=...)`` or by hand) on a Trainer resumed from a checkpoint that
        saved one, it takes that state: its step count, lr and, for LambdaLR, all but the function."""
        return self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler) -> None:
        from graphc.runtime.lr_scheduler import LRScheduler, lr_group

        if scheduler is not None and not (isinstance(scheduler, LRScheduler) and scheduler.trainer is self):
            raise ValueError(f"scheduler: expected a gc.optim.lr_scheduler scheduler made on this Trainer "
                             f"(StepLR(trainer, ...)), got {scheduler!r}")
        pending, self._scheduler = self._pending_schedule, scheduler
        if scheduler is not None and pending is not None:
            self._pending_schedule = None
            if pending["kind"] != type(scheduler).__name__:
                raise ValueError(f"scheduler: the checkpoint this Trainer resumed saved a {pending['kind']}'s state, "
                                 f"not a {type(scheduler).__name__}'s; resume with the same scheduler")
            self.lr_group.clear()
            self.lr_group.update(pending["group"])
            scheduler.load_state_dict(pending["state"])
            self.lr = self.lr_group["lr"]  # constructing it set the initial lr; back to the saved one
            if MOMENTUM in self._entries:  # and a cycled momentum: its saved value (a scheduler's: may pass 1)
                self._set_momentum(momentum_lib.current(lr_group(self), self.manifest.optimizer), below_one=False)

    def schedule_state(self) -> str:
        """The JSON a checkpoint saves of the scheduler: its kind, ``state_dict()``, the lr group
        and ``scheduler_interval`` (the state a resumed Trainer still holds for one not yet given,
        if no other was); "" without one."""
        import json

        if self._scheduler is None:
            return "" if self._pending_schedule is None else json.dumps(self._pending_schedule)
        return json.dumps({"kind": type(self._scheduler).__name__, "interval": self.scheduler_interval,
                           "recipe": getattr(self._scheduler, "recipe", None), "group": self.lr_group,
                           "state": self._scheduler.state_dict()})

    def _warn_unsaved_randomness(self) -> None:
        """Warn (once) where checkpoints cannot replay the graph's own random draws: a backend
        other than numpy keeps its generator's state out of reach."""
        if "train_step" in self._graph_rngs() or self.__dict__.get("_rng_warned"):
            return
        import warnings

        self._rng_warned = True
        ops = sorted({n.op_type for n in random_nodes(self.artifacts.train_step.ir.graph)})
        if ops:
            warnings.warn(f"the train_step graph draws random numbers itself ({', '.join(ops)}); {self.backend} keeps "
                          "that generator's state out of reach, so a run resumed from a checkpoint will not replay "
                          "them exactly (the numpy backend's is saved)", stacklevel=3)

    def save_checkpoint(self, path: Union[str, os.PathLike]) -> Path:
        """Write params, optimizer state, step, loop position, the epoch's running sums and RNG
        states to ``path`` (a ``.safetensors`` file, or a directory that also holds the training
        graphs, replaced with it where other graphs are there: ``checkpoint_folder``)
        atomically; a folder it makes for them is removed again if the save fails or is
        interrupted. A checkpoint of other training graphs there is not overwritten."""
        if self._interrupts.torn:
            raise ckpt.CheckpointError("a second Ctrl-C cut a training step short, so the state is not consistent; "
                                       f"not saving it over {path} (the last checkpoint written there stays)")
        target, beside = checkpoint_folder.check_owner(path, self._expected, self._restarted_from,
                                                       structure=self._inference_structure())
        self._tally_skips()
        try:
            with made_folders(target.parent), checkpoint_folder.graphs_beside(
                    target, self.artifacts, beside, self._inference_structure()) as graphs:
                meta = ckpt.CheckpointMeta(
                    step=self.step_count, epoch=self.epoch, batch_in_epoch=self.batch_in_epoch,
                    progress=self._progress, loader=self._loader_state, rng=self.rng.bit_generator.state,
                    seed=self._seed, graph_rng={key: rng.bit_generator.state for key, rng in self._graph_rngs().items()},
                    roles=dict(self._roles), backend=self.backend, artifacts=str(self.artifacts_path or ""),
                    interface=self.manifest.interface(), schedule=self.schedule_state(),
                    optimizer=self.manifest.optimizer, graphs=graphs, accumulate=self.accumulate,
                    structure=self._inference_structure())
                return ckpt.save(target, self.state_dict(), meta)
        except OSError as exc:  # disk full, read-only, ...: say what was lost and what is kept
            raise ckpt.save_failed(exc, target, self.step_count) from exc

    def _inference_structure(self) -> structure.GraphStructure:
        """The inference graph's ``model.structure``, which checkpoints record; read once, from the
        artifact directory where the Trainer read its graphs (their weights are not loaded)."""
        if self._structure is None:
            self._structure = (checkpoint_folder.structure_of(self.artifacts_path) if self.artifacts_path is not None
                               else structure.of(self.artifacts.inference.ir))
        return self._structure

    def load_checkpoint(self, path: Union[str, os.PathLike], *, changed_optimizer: bool = False,
                        fresh_optimizer: bool = False, changed_model: bool = False) -> None:
        """Restore what ``save_checkpoint`` wrote; the next steps replay the original run. A
        checkpoint trained with another optimizer kind or constants (weight decay, betas, ...) is
        a ``CheckpointError`` unless ``changed_optimizer``, one of another trainable set or
        ``accumulate`` always (``graphc.runtime.resume_rules``), one saved with another inference
        graph (another model of the same tensor names, or another opset's lowering:
        ``checkpoint_folder.refuse_other_model``) unless ``changed_model``. ``fresh_optimizer``:
        take only the checkpoint's params and buffers, and start as a new run of these graphs
        (``_restart``)."""
        if fresh_optimizer:
            if changed_optimizer:
                raise ValueError("changed_optimizer carries the checkpoint's optimizer state over, fresh_optimizer "
                                 "starts it afresh: pass one of them")
            return self._restart(path, changed_model)
        tensors, meta = ckpt.load(path)
        resume_rules.check_resume(path, meta, tensors, self.manifest, self._expected, changed_optimizer,
                                  accumulate=self.accumulate)
        tensors = adam_moments.moments_as_sums(tensors, self.manifest.optimizer, self._expected)
        if changed_optimizer and meta.optimizer:  # Adam's moment sums to the graphs' betas
            tensors = adam_moments.moments_rebased(tensors, meta.optimizer, self.manifest.optimizer)
        roles = {adam_moments.sum_name(n, self._expected): r for n, r in meta.roles.items()}
        problem = ckpt.mismatch(self._expected, {n: (dtype_name(a.dtype), list(a.shape)) for n, a in tensors.items()},
                                roles)
        if problem is not None:
            raise ckpt.CheckpointError(f"{path}: the checkpoint {problem}; it was saved from different training graphs")
        self._refuse_other_model(path, meta, changed_model)  # the same tensors, in another model
        # set once the load is sure to succeed: a refused load leaves saves refusing that checkpoint
        self._restarted_from = ckpt.resolve(path).resolve() if changed_model else None
        self._reset_state(tensors, consume=True)
        self.step_count, self.epoch, self.batch_in_epoch = meta.step, meta.epoch, meta.batch_in_epoch
        self._progress = ckpt.batch_weighted(meta, averaging.summed(self.manifest.loss))
        self._loader_state = meta.loader
        if meta.rng:
            self.rng.bit_generator.state = meta.rng
        if meta.seed is not None:
            self._seed = meta.seed
        self._load_schedule(meta.schedule)
        if "eval" in meta.graph_rng and "train_step" in self._graph_rngs():  # a backend whose generators we reach
            self._eval_exe()
        for key, rng in self._graph_rngs().items():
            if key in meta.graph_rng:
                rng.bit_generator.state = meta.graph_rng[key]

    def _restart(self, path: Union[str, os.PathLike], changed_model: bool) -> None:
        """``load_checkpoint(path, fresh_optimizer=True)``: the checkpoint's params and buffers
        (``graphc.runtime.params_only``), the rest as the graphs' initial state, the step, epoch,
        loader position, epoch sums and lr schedule those of a new run (the RNGs as they are, as
        torch's ``load_state_dict`` leaves them). ``save_checkpoint`` may then replace the
        checkpoint at ``path``, whose state belongs to other graphs."""
        tensors, meta = ckpt.load(path)
        start = params_only.restart(path, tensors, meta, self.manifest, self.artifacts.state)
        self._refuse_other_model(path, meta, changed_model)
        if self.artifacts_path is not None:
            self.artifacts.release()
        self._reset_state(start, consume=True)
        self.step_count = self.epoch = self.batch_in_epoch = 0
        self._progress, self._loader_state = ckpt.EpochProgress(), None
        self.lr_group.clear()
        self._pending_schedule = None
        self._restarted_from = ckpt.resolve(path).resolve()

    def _refuse_other_model(self, path: Union[str, os.PathLike], meta: ckpt.CheckpointMeta,
                            changed_model: bool) -> None:
        """``checkpoint_folder.refuse_other_model`` for these graphs, unless ``changed_model``."""
        if meta.structure is not None and not changed_model:
            graphs = f"at {self.artifacts_path}" if self.artifacts_path is not None else "given in memory"
            checkpoint_folder.refuse_other_model(
                path, meta.structure, self._inference_structure(), graphs,
                "Load it into its own graphs, or pass changed_model=True to load its tensors into these graphs "
                "though their model computes otherwise (a model changed on purpose, as for fine-tuning)")

    def _load_schedule(self, text: str) -> None:
        """Restore the lr group and scheduler state a checkpoint saved: into ``self.scheduler`` if
        one is set, else kept until one is (a checkpoint without any leaves the lr as saved)."""
        import json

        self.lr_group.clear()
        saved = json.loads(text) if text else None
        self._pending_schedule = saved
        if saved is not None:
            self.scheduler_interval = saved["interval"]
            if self._scheduler is not None:
                self.scheduler = self._scheduler

    def _graph_rngs(self) -> dict[str, np.random.Generator]:
        """The generators the backend draws the train_step and eval graphs' random ops from,
        where it has them in reach (the numpy backend)."""
        found = {key: getattr(exe, "rng", None) for key, exe in (("train_step", self._train), ("eval", self._eval))}
        return {key: rng for key, rng in found.items() if isinstance(rng, np.random.Generator)}

    def export_inference(self, path: Union[str, os.PathLike], opset: Optional[int] = None,
                         dtype: Optional[str] = None, keep_io_types: bool = False,
                         allow_uncalibrated: bool = False, averaged: bool = False) -> Path:
        """Write the inference model with the trained params (``averaged``: the averaged copy,
        ``gc.optim.swa_utils``) folded in, optimized (level 3);
        ``dtype`` "float16" or "bfloat16" converts it (``gc.convert_float``; ``keep_io_types``:
        its float32 inputs and outputs stay float32, for clients that send float32). A fake
        quantization whose observer never saw data raises ``UncalibratedError`` unless
        ``allow_uncalibrated``."""
        from graphc.compile.export import inference_model

        tensors = as_model(self.manifest, self.state_dict()) if averaged else self.state_dict()
        return inference_model(self.artifacts, tensors, opset=opset, dtype=dtype,
                               keep_io_types=keep_io_types, allow_uncalibrated=allow_uncalibrated).save(path)

    def __repr__(self) -> str:
        return (f"<gc.Trainer backend={self.backend!r} step={self.step_count} epoch={self.epoch} "
                f"{len(self.manifest.trainable)} trainable>")


def _without_artifacts(path: Path, recorded: str) -> str:
    """Why the checkpoint ``path`` alone cannot start a Trainer: no training graphs beside it, and
    none where its header says (``recorded``), and how to load it."""
    from graphc.compile.training import MANIFEST_FILE

    where = (f"of the training artifacts in {recorded}, which hold none now (no {MANIFEST_FILE})" if recorded else
             "that records no training artifacts (saved from artifacts held in memory)")
    return (f"{path} is a checkpoint {where}; load it into a Trainer of its artifacts: trainer = "
            f"gc.Trainer(artifacts); trainer.load_checkpoint({str(path)!r})")


def _loader_state(loader) -> ckpt.LoaderState:
    fingerprint = getattr(loader, "fingerprint", None)
    return ckpt.LoaderState(seed=loader.seed, batch_size=loader.batch_size, shuffle=loader.shuffle,
                            drop_last=loader.drop_last, num_samples=loader.num_samples,
                            data=fingerprint() if callable(fingerprint) else "")


def _used_other(diffs: list[str]) -> Optional[str]:
    return f"the checkpoint's run used a loader with {', '.join(diffs)}" if diffs else None


def _signal_hook() -> Optional[tuple[int, int]]:
    """(signal, step) from the test hook ``GRAPHC_TEST_SIGNAL_AT_STEP`` (``INT:17``, ``TERM:17``,
    ``KILL:17``), if set."""
    text = os.environ.get(SIGNAL_HOOK_ENV)
    if not text:
        return None
    name, _, step = text.partition(":")
    if name not in ("INT", "TERM", "KILL") or not step.isdigit():
        raise ValueError(f"{SIGNAL_HOOK_ENV}={text!r}: expected INT:STEP, TERM:STEP or KILL:STEP, e.g. INT:17")
    return int(getattr(signal, f"SIG{name}")), int(step)
