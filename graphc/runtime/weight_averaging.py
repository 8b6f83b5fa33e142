"""The Trainer's side of weight averaging (``gc.optim.swa_utils``): which carried tensors hold
the averaged copy, the copy as the params and buffers the eval graph and export take, the
averaging run after an optimizer step that train_step does not make (``AfterUpdate``), and
``update_bn``'s pass over the data (``recount_batchnorms``)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from graphc.errors import ArtifactsError

__all__ = ["AfterUpdate", "averaged_names", "as_model", "recount_batchnorms"]


def averaged_names(manifest: Any) -> list[str]:
    """The params and buffers ``manifest``'s train_step keeps an averaged copy of; an
    ``ArtifactsError`` for artifacts that average nothing."""
    if manifest.averaging is None:
        raise ArtifactsError("these training artifacts keep no averaged weights: generate them with "
                             "gc.training.generate(..., averaged=gc.optim.swa_utils.AveragedModel(...)), or "
                             "graphc grad --averaged swa|ema:DECAY")
    return list(manifest.averaging["names"])


def as_model(manifest: Any, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``tensors`` (a ``state_dict()``) with each averaged param and buffer in the model's own name."""
    from graphc.passes.training.weight_averaging import PREFIX

    return {**tensors, **{n: tensors[PREFIX + n] for n in averaged_names(manifest)}}


class AfterUpdate:
    """train_step's averaging as a graph of its own (``weight_averaging.averaging_graph``), prepared
    on ``backend`` for ``manifest`` (in the model's order), which the Trainers that step by the
    update graph (``accumulate=k``, data-parallel workers) run once after each optimizer step: the
    copies and their count advance once a step, by the schedule train_step's follow (its calls,
    loss scaling's skipped ones too)."""

    def __init__(self, manifest: Any, backend: Any, options: Mapping[str, Any]):
        import onnx_ir as ir

        from graphc.model.dtypes import to_onnx
        from graphc.passes.training.loss_scaling import SKIPPED
        from graphc.passes.training.weight_averaging import averaging_graph

        entries = {e.name: e for e in manifest.graphs["train_step"].inputs}
        tensors = [ir.Value(name=n, type=ir.TensorType(ir.DataType(to_onnx(entries[n].dtype))),
                            shape=None if entries[n].shape is None else ir.Shape(entries[n].shape))
                   for n in averaged_names(manifest)]
        params = {v.name for v in tensors if entries[v.name].role == "param"}
        proto = ir.to_proto(averaging_graph(manifest.opset, manifest.averaging, tensors, params, SKIPPED in entries))
        self._exe = backend.prepare(proto, **options)
        self._inputs = [v.name for v in proto.graph.input]
        self._outputs = [v.name for v in proto.graph.output]

    def run(self, state: dict[str, Any]) -> None:
        """Advance the copies in ``state`` (the carried tensors after the step, by name), in place."""
        _, device = self._exe.run_bound({n: state[n] for n in self._inputs}, (), self._outputs)
        for out in self._outputs:
            state[out[: -len(".next")]] = device[out]


def recount_batchnorms(trainer: Any, batches: Iterable[Mapping[str, np.ndarray]]) -> None:
    """``update_bn``: the averaged BatchNorm statistics of ``trainer`` set to the cumulative average
    (torch's ``momentum=None``: ``running = (1 - 1/k)*running + (1/k)*batch`` at batch ``k``, in
    float64) of each batch's mean and unbiased variance, computed with the averaged weights. No
    batch: they stay as they were, as torch's (which resets them first)."""
    import onnx_ir as ir

    from graphc.passes.training.weight_averaging import PREFIX, batch_statistics_graph
    from graphc.runtime.trainer import without_initializers

    names = averaged_names(trainer.manifest)
    trainer._eval_exe()
    labels = trainer._label_names()
    specs = [s for s in trainer._eval_specs if s.name not in labels]
    graph = batch_statistics_graph(trainer.artifacts.eval.ir, [n for n in names if n not in trainer.manifest.trainable])
    outputs = [v.name for v in graph.graph.outputs]
    inputs = {v.name for v in graph.graph.inputs}
    # params and statistics fed, not initialized (as the Trainer's eval graph): no second copy of them
    exe = trainer._backend.prepare(without_initializers(ir.to_proto(graph), inputs), **trainer._options)
    running: dict[str, np.ndarray] = {}
    count = 0
    state = trainer._eval_state(averaged=True)  # nothing below changes it before the last batch
    for batch in batches:
        feeds = {**trainer._batch_feeds(batch, specs), **state}
        host, _ = exe.run_bound({n: v for n, v in feeds.items() if n in inputs}, outputs)
        count += 1
        for out in outputs:
            stat, value = out.removesuffix(".batch"), np.asarray(host[out], np.float64)
            running[stat] = value if count == 1 else (1 - 1 / count) * running[stat] + (1 / count) * value
    for stat, value in running.items():
        trainer._put_carried(PREFIX + stat, value.astype(trainer._carried(PREFIX + stat).dtype))
