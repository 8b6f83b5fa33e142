"""``gc.Trainer(..., accumulate=k)``: one optimizer step per ``k`` micro-batches (gradient
accumulation, torch's ``(loss / k).backward()`` every batch and ``optimizer.step()`` every k-th,
Lightning's ``accumulate_grad_batches``).

Each micro-batch runs the artifacts' ``gradients`` graph (the ``train_step`` graph is not built);
its gradients go into running sums on the backend's device by a small ``accumulate`` graph
(``graphc.passes.training.accumulate``), each times its *share*: the micro-batch's weight over
the step's total (``averaging.shard_weight``: its rows for a mean loss, its counted labels for a
cross-entropy with ``ignore_index`` or class weights), so the sum is the gradient of the mean
over all the step's rows and a partial last micro-batch weighs by its rows, as one batch of them
all would; a summed loss's gradients just add up. A model with hooks or ``gc.autograd.Function``s takes its share
as its backward's seed instead (``accumulate.WEIGHT``), and its gradients are added as they come: its hooks see the
weighted gradient, as torch's in its ``(loss * rows / step_rows).backward()`` loop. Then the optimizer ``update`` graph
(``compile.training.update_model``, the same optimizer emission as train_step's, data-parallel
training's) steps params and state once from the sums: clipping (``max_grad_norm``) sees the
accumulated gradient, loss scaling checks and unscales it, and ``step``, the lr scheduler and
``step_count`` advance once. BatchNorm running statistics are updated by every micro-batch in
turn, as torch's. Dropout noise is drawn per micro-batch from the Trainer's generator.

``step(batch)`` splits ``batch`` by rows into ``k`` micro-batches (``np.array_split``: sizes
differ by 1 at most); ``fit`` takes ``k`` consecutive loader batches per step (the loader's
``batch_size`` is the micro-batch), and an epoch whose batches do not divide by ``k`` ends with
a step of what is left, as torch loops that step on the last batch do. A step's micro-batches
run with Ctrl-C held back, so checkpoints fall on optimizer-step boundaries only (no partial
sums are saved) and a resume replays the same groups; checkpoints record ``k``
(``CheckpointMeta.accumulate``), and a full resume with another ``k`` is refused
(``resume_rules.check_accumulate``). With ``max_grad_norm``, ``History.step_grad_norms`` holds
each optimizer step's accumulated gradient norm before clipping (torch's ``clip_grad_norm_``
return). Weight averaging (generate's ``averaged=``) runs once per optimizer step, right after
the update (``weight_averaging.AfterUpdate``), on the params and BatchNorm statistics after all
``k`` micro-batches, as torch's ``ema.update_parameters(model)`` after ``optimizer.step()``.
Not here: ``cuda_graph``, embeddings with ``max_norm`` and SyncBatchNorm (all refused).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from graphc.errors import ArtifactsError, InputError
from graphc.model.dtypes import to_onnx
from graphc.passes.training.accumulate import WEIGHT
from graphc.passes.training.loss_scaling import state_names
from graphc.runtime import averaging, metrics as metrics_lib
from graphc.runtime.rows import batch_dim, by_rows
from graphc.runtime.session import check_options
from graphc.runtime.trainer import TRAINER_OPTIONS, TRAINING_OPTIONS, Trainer, without_initializers
from graphc.runtime.weight_averaging import AfterUpdate

__all__ = ["AccumulatingTrainer", "check_accumulable", "checked_accumulate", "counting", "micro_batches",
           "refuse_post_accumulate_hooks"]


def checked_accumulate(value: Any) -> int:
    """``accumulate``: an int >= 1, the micro-batches per optimizer step."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"accumulate must be an int >= 1 (micro-batches per optimizer step), got {value!r}")
    return int(value)


def refuse_post_accumulate_hooks(gradients: Any, trainer: str, why: str) -> None:
    """Refuse artifacts whose gradients graph (``gradients``, a proto) holds a parameter's post-accumulate grad hook
    (``grad_hooks.PostAccumulateHook``'s marker), naming the capture it came from: ``trainer`` (``accumulate=3``)
    runs it on a part of the step's gradient, ``why`` says where torch runs it instead."""
    from graphc.passes.values import AUTOGRAD_KEY

    records = [json.loads(p.value) for n in gradients.graph.node for p in n.metadata_props if p.key == AUTOGRAD_KEY]
    sources = sorted({r["source"] for r in records if r["class"] == "PostAccumulateHook"})
    if sources:
        raise ArtifactsError(f"gc.Trainer({trainer}): the model captured at {', '.join(sources)} has a "
                             "Parameter.register_post_accumulate_grad_hook, which its gradients graph runs on each "
                             f"part of the step's gradient; {why}, so a hook that is not linear would step elsewhere. "
                             "Train it with one worker and accumulate=1, or make it a param.register_hook hook")


def check_accumulable(manifest: Any, gradients: Any, k: int) -> None:
    """Refuse, saying why, artifacts (``manifest``, their ``gradients`` graph's proto) whose
    micro-batches cannot add up to one batch's step with ``accumulate=k``, in one process or on
    data-parallel workers."""
    from graphc.passes.values import EXCHANGE_KEY

    m, loss = manifest, manifest.loss
    if loss.get("kind") == "output":
        raise ArtifactsError(f"the loss is the model's scalar output {loss['output']!r}: whether it is a mean "
                             f"or a sum over the rows is unknown, so accumulate={k} cannot weigh the "
                             "micro-batches' gradients; generate the artifacts with a gc.losses spec "
                             "(gc.losses.mse, cross_entropy, ...)")
    if m.renormed:
        raise ArtifactsError(f"accumulate={k}: an embedding with max_norm renormalises {m.renormed} in place "
                             "each step; gradient accumulation does not support it")
    if any(p.key == EXCHANGE_KEY for n in gradients.graph.node for p in n.metadata_props):
        raise ArtifactsError(f"accumulate={k}: SyncBatchNorm's gradients graph exchanges statistics between "
                             "workers; gradient accumulation does not support it")
    refuse_post_accumulate_hooks(gradients, f"accumulate={k}", "torch runs it after each micro-batch's backward on "
                                 ".grad, the sum of the micro-batches so far")
    outputs = {e.name for e in m.graphs["gradients"].outputs}
    updated = set(m.feeds.values()) - set(state_names(m.loss_scale))  # not the loss scale: the update's
    stale = [e.name for e in m.graphs["gradients"].inputs
             if e.role == "state" and e.name in updated and f"{e.name}.next" not in outputs]
    if stale:
        raise ArtifactsError(f"the gradients graph does not output the updated BatchNorm statistics {stale} "
                             f"(artifacts from an older graphc): generate them again to train with accumulate={k}")


def micro_batches(batch: Mapping[str, np.ndarray], specs: list, batch_specs: list, k: int) -> list[dict[str, Any]]:
    """``batch`` split by rows into ``k`` micro-batches (``np.array_split``; fewer where it has
    fewer rows): the inputs of ``specs`` whose first dim is ``batch_specs``' batch dim."""
    dim = batch_dim(batch_specs)
    split = {s.name for s in specs if by_rows(s, dim, computed=True) and s.name in batch}
    if not split:
        raise InputError(f"accumulate={k}: no input of the training graphs starts with a symbolic batch dim "
                         f"({'; '.join(map(str, batch_specs))}), so step(batch) cannot split the batch into "
                         "micro-batches")
    rows = {len(batch[n]) for n in split}
    if len(rows) > 1:
        raise InputError(f"the batch's inputs {sorted(split)} have different numbers of rows "
                         f"({sorted(rows)}); they must share the batch dim {dim!r}")
    bounds = np.array_split(np.arange(rows.pop()), k)
    return [{n: (np.asarray(a)[b[0]:b[-1] + 1] if n in split else a) for n, a in batch.items()}
            for b in bounds if len(b)]


def counting(trainer: Trainer, batches: list[Mapping[str, Any]],
             of: Optional[int] = None) -> list[tuple[Mapping[str, Any], dict, int, float]]:
    """The micro-batches of a step that count in the loss, each with its feeds, rows and weight
    (``averaging.shard_weight``). One whose every label is the ignore index (or whose class
    weights sum to 0: ``Trainer._counts_nothing``) is left out with a warning naming it as ``fit``
    names a batch it skips without accumulation (``of``: the epoch's loader batches in ``fit``,
    None in ``step``); a step none of whose micro-batches counts is refused as a train step on the
    first (``Trainer._refuse_step``)."""
    parts = []
    for batch in batches:
        feeds = trainer._batch_feeds(batch, trainer.batch_specs)
        rows = len(next(iter(feeds.values()))) if feeds else 0
        parts.append((batch, feeds, rows, averaging.shard_weight(trainer.manifest.loss, batch, rows)))
    nothing = [trainer._counts_nothing(batch, rows, weight) for batch, _, rows, weight in parts]
    if all(nothing):
        trainer._refuse_step(parts[0][1])
    for index in (i for i, empty in enumerate(nothing) if empty):
        batch, _, rows, _ = parts[index]
        examples = averaging.examples(trainer.manifest.loss, batch, rows)
        warnings.warn(f"{trainer._counts_nothing_why(of, examples, (index, len(batches)))}; left out of the step "
                      "(its mean loss is 0/0)", stacklevel=4)
    return [part for part, empty in zip(parts, nothing) if not empty]


class AccumulatingTrainer(Trainer):
    """``Trainer`` stepping the optimizer once per ``accumulate`` micro-batches (module docstring)."""

    _prediction_graph = "gradients"  # each micro-batch's prediction gives the train metrics

    def __init__(self, artifacts_or_dir: Any, backend: str = "auto", *, seed: int = 0, metrics: Any = None,
                 tensorboard: Any = None, workers: int = 1, ray_address: Optional[str] = None,
                 accumulate: int = 1, **options: Any):
        from graphc.backends import get_backend
        from graphc.compile.training import CARRIED_ROLES, update_model, worker_gradients_model
        from graphc.passes.training.accumulate import accumulate_graph, narrow_graph

        k = checked_accumulate(accumulate)
        if options.get("cuda_graph"):
            raise ValueError(f"cuda_graph replays the train_step graph, which accumulate={k} does not run (it runs "
                             "the gradients and update graphs); leave out one of them")
        check_options(options, TRAINER_OPTIONS, "Trainer")
        resume_from = self._open(artifacts_or_dir, seed, metrics, tensorboard, k)
        self.manifest = m = self.manifest.in_model_order()  # what the gradients and update graphs take
        check_accumulable(m, self.artifacts.gradients.proto, k)
        self._backend = get_backend(backend)
        self.backend = self._backend.name
        self._options = {**TRAINING_OPTIONS, **options}
        carried = {e.name for e in m.graphs["train_step"].inputs if e.role in CARRIED_ROLES}
        grads = worker_gradients_model(self.artifacts).proto  # with loss scaling: the scaled loss's
        update = update_model(m, grad_norm=True).proto
        entries = m.graphs["gradients"]
        self._grad_names = [e.name for e in entries.outputs if e.role == "grad"]
        self._grad_inputs = {v.name for v in grads.graph.input}
        self._seeded = WEIGHT in self._grad_inputs  # a model with Functions: the backward seeded with the share
        self._stats = [e.name for e in entries.outputs if e.role == "state"]  # "<stat>.next"
        self._touched = [e.name for e in entries.outputs if e.role == "touched"]
        self._update_inputs = {v.name for v in update.graph.input}
        # with max_grad_norm, the update also outputs the accumulated gradient's norm before
        # clipping, under train_step's name (``self._grad_norm``): fit records it per step
        self._update_outputs = [v.name for v in update.graph.output if v.name != self._grad_norm]
        self._grads = self._backend.prepare(without_initializers(grads, carried), **self._options)
        self._train = self._backend.prepare(without_initializers(update, carried), **self._options)
        by_name = {e.name: e for e in entries.outputs}
        self._grad_types = [(n, to_onnx(by_name[n].dtype), by_name[n].shape) for n in self._grad_names]
        self._accumulate = self._backend.prepare(accumulate_graph(self._grad_types, m.opset), **self._options)
        self._averaging = None if m.averaging is None else AfterUpdate(m, self._backend, self._options)
        narrow = narrow_graph(self._grad_types, m.opset)  # half-float sums back to the gradients' type
        self._narrow = None if narrow is None else self._backend.prepare(narrow, **self._options)
        # device buffers written in every step (``run_bound``'s into): the gradients graph's, and two
        # sets for the sums, a micro-batch reading one and writing the other
        self._grad_buffers: dict[str, Any] = {}
        self._sum_sets: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self._narrowed: dict[str, Any] = {}
        self._graphed, self._in_place, self._feeds = None, set(), {}
        self._metric_sums: Optional[dict[str, float]] = None
        self._reset_state(self.artifacts.state)
        if resume_from is not None:
            self.load_checkpoint(resume_from)

    # -- steps ------------------------------------------------------------------------------------
    def step(self, batch: Mapping[str, np.ndarray]) -> float:
        """One optimizer step on ``batch`` split by rows into ``accumulate`` micro-batches (fewer
        where it has fewer rows); returns the loss of the whole batch (the micro-batches' weighted
        mean, or sum for a summed loss)."""
        return self._step_on(micro_batches(batch, [*self.batch_specs, *self.noise_specs], self.batch_specs,
                                          self.accumulate))

    def _step_on(self, batches: list[Mapping[str, np.ndarray]], of: Optional[int] = None) -> float:
        """One optimizer step on the micro-batches ``batches``: each one's gradients added into
        the sums by its share, then the update; returns the step's loss. A micro-batch that counts
        for nothing (every label ignored) is left out, with a warning (``counting``: ``of``)."""
        loss_spec = self.manifest.loss
        feeds = []
        for batch, f, rows, weight in counting(self, batches, of):
            self._refuse_step(f, weight)
            feeds.append((batch, f, weight, averaging.examples(loss_spec, batch, rows)))
        total = averaging.divisor(loss_spec, sum(w for _, _, w, _ in feeds), "the step's micro-batches")
        wanted = self._prediction is not None and self._prediction in self._fetch
        with self._interrupts:
            state, sums, touched, loss = self._state, {}, {}, 0.0
            self._metric_sums = {} if wanted else None
            for index, (batch, f, weight, examples) in enumerate(feeds):
                if self.noise_specs:
                    f.update(self._noise_feeds(batch, f))
                f.update({n: h for n, h in state.items() if n in self._grad_inputs})
                share = weight / total
                if self._seeded:  # the gradients come weighted (``accumulate.seed_weight``): add them as they are
                    f[WEIGHT] = np.asarray(share, np.float64)
                fetch = ["loss", *self._touched, *([self._prediction] if wanted else [])]
                host, device = self._grads.run_bound(f, fetch, [*self._grad_names, *self._stats],
                                                     into=self._grad_buffers)
                self._grad_buffers.update({n: device[n] for n in self._grad_names})
                for out in self._stats:  # BatchNorm running statistics: every micro-batch's in turn, as torch's
                    state[out[: -len(".next")]] = device[out]
                for name in self._touched:  # stepped where any micro-batch read it
                    touched[name] = np.logical_or(touched.get(name, False), host[name])
                loss += float(host["loss"]) * share
                sums = self._add(index, device, 1.0 if self._seeded else share)
                if wanted:
                    self._add_metrics(host, batch, examples)
            self._update({**self._narrowed_sums(sums), **touched})
            return loss

    def _add(self, index: int, grads: Mapping[str, Any], share: float) -> dict[str, Any]:
        """The running sums with micro-batch ``index``'s ``grads`` added times ``share``: read from
        one of ``_sum_sets`` and written into the other (each set's buffers bound as outputs from
        its second use on, so the sums allocate nothing after a step). The first micro-batch reads
        zeros of the sums' type, made once, where the set holds nothing yet (its sum is ignored)."""
        from graphc.passes.training.accumulate import ACC_SUFFIX, FIRST, SHARE, SUM_SUFFIX, sum_zeros

        read, write = self._sum_sets[(index + 1) % 2], self._sum_sets[index % 2]
        for name, elem, shape in self._grad_types:
            if name not in read:
                read[name] = self._accumulate.to_device(sum_zeros(elem, shape))
        feeds: dict[str, Any] = {SHARE: np.asarray(share, np.float64), FIRST: np.asarray(index == 0)}
        for name in self._grad_names:
            feeds[name], feeds[name + SUM_SUFFIX] = grads[name], read[name]
        outputs = [n + ACC_SUFFIX for n in self._grad_names]
        _, device = self._accumulate.run_bound(feeds, (), outputs, into={n + ACC_SUFFIX: write.get(n)
                                                                         for n in self._grad_names}, keep=True)
        write.update({name: device[name + ACC_SUFFIX] for name in self._grad_names})
        return dict(write)

    def _narrowed_sums(self, sums: dict[str, Any]) -> dict[str, Any]:
        """``sums`` as the update takes them: half-float gradients' float32 sums cast back."""
        if self._narrow is None:
            return sums
        from graphc.passes.training.accumulate import ACC_SUFFIX

        half = self._narrow.output_names
        _, device = self._narrow.run_bound({n + ACC_SUFFIX: sums[n] for n in half}, (), half,
                                           into={n: self._narrowed.get(n) for n in half}, keep=True)
        self._narrowed.update(device)
        return {**sums, **device}

    def _update(self, grads: Mapping[str, Any]) -> None:
        """The optimizer update from the accumulated ``grads``: params and state replaced."""
        state = self._state
        feeds = {**{n: h for n, h in state.items() if n in self._update_inputs}, **grads}
        host, device = self._train.run_bound(feeds, [self._grad_norm] if self._grad_norm else [], self._update_outputs)
        for out in self._update_outputs:
            state[out[: -len(".next")]] = device[out]
        if self._averaging is not None:  # torch's optimizer.step(); averaged.update_parameters(model)
            self._averaging.run(state)
        self._step_outputs = host
        self._in_model_order = {}
        self.step_count += 1

    def _add_metrics(self, host: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray], examples: int) -> None:
        loss = self.manifest.loss
        for name, value in metrics_lib.sums(loss, {loss["output"]: host[self._prediction]}, batch, self.metrics,
                                            examples).items():
            self._metric_sums[name] = self._metric_sums.get(name, 0.0) + value

    def _step_metric_sums(self, batch: Mapping[str, np.ndarray], examples: int) -> Optional[dict[str, float]]:
        """The train metrics of the step just run, summed over its micro-batches (``_add_metrics``)."""
        sums, self._metric_sums = self._metric_sums, None
        return sums
