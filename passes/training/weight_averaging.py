"""Weight averaging in train_step: torch.optim.swa_utils.AveragedModel's ``update_parameters``
after each optimizer step, as graph state.

``add(built, spec)`` gives train_step, for each trainable param and each buffer the eval graph
reads (BatchNorm statistics, written buffers), an input ``averaged.<name>`` (its initial value a
copy of the model's, as torch's ``deepcopy``) and the output ``averaged.<name>.next`` that feeds
it, plus the int64 count ``averaged.n_averaged``. At call ``t`` (``step + 1``, plus with loss
scaling the skipped steps: torch's loop calls ``update_parameters`` after a skipped
``scaler.step`` too) the copies are updated when ``t > start`` and ``(t - start) % every == 0``
(a skipped step's with the params as they were): the first update copies the new
params, the next ones apply the spec's formula to the new params (``<p>.next``), as torch's,
whose names the spec's ``fn`` takes:

* ``ema_multi`` (``get_ema_multi_avg_fn``): ``torch.lerp(avg, p, 1 - decay)``, lerp's two forms
  by its weight as torch's CPU kernel: ``avg + w*(p - avg)`` for ``w < 0.5``, else
  ``p - (p - avg)*(1 - w)``;
* ``ema`` (``get_ema_avg_fn``): ``decay*avg + (1 - decay)*p``;
* ``swa_multi`` (``get_swa_multi_avg_fn``): ``torch.lerp(avg, p, 1/(n + 1))``, the weight in float64;
* ``swa`` (``get_swa_avg_fn``, and torch's CPU default): ``avg + (p - avg)/(n + 1)``.

Buffers are averaged so with ``use_buffers``; without, each update copies them (torch's "keep the
buffers in sync"). Frozen params are constants: their average is themselves.

``averaging_graph(...)``: the same nodes as a graph of their own, which the Trainers that step by
the update graph (``accumulate=k``, data-parallel workers) run right after it, once an optimizer step.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.emit import Emitter
from graphc.passes.training import broadcasts
from graphc.passes.training.artifacts import STEP, Built, Output, tidy
from graphc.passes.training.graph_outputs import by_name, expose, input_with_default
from graphc.passes.training.loss_scaling import SKIPPED
from graphc.passes.values import onnx_opset

PREFIX = "averaged."
COUNT = PREFIX + "n_averaged"
FNS = ("ema_multi", "ema", "swa_multi", "swa")

__all__ = ["COUNT", "FNS", "PREFIX", "add", "averaged_names", "averaging_graph"]


def averaged_names(built_roles: Mapping[str, str], eval_roles: Mapping[str, str]) -> list[str]:
    """What is averaged: train_step's params, then the buffers the eval graph reads (its state inputs)."""
    return [*(n for n, r in built_roles.items() if r == "param"), *(n for n, r in eval_roles.items() if r == "state")]


def add(built: Built, spec: Mapping) -> list[str]:
    """The averaging of ``spec`` (``{"fn", "decay", "use_buffers", "start", "every"}``) added to
    ``built``'s train_step, in place (its roles, feeds and state too); returns the averaged names
    (``averaged_names``). A param train_step holds in another order of axes (``built.orders``) has
    its copy held so too (``Manifest._held``)."""
    graph = built.graphs["train_step"].graph
    inputs, outputs = built.roles["train_step"]
    names = averaged_names(inputs, built.roles["eval"][0])
    taken = [f"{PREFIX}{n}" for n in names if f"{PREFIX}{n}" in inputs or f"{PREFIX}{n}" in built.state]
    if COUNT in inputs or taken:
        raise PassError(f"weight averaging names its state {PREFIX}<name>, but the model already has "
                        f"{taken or [COUNT]}; rename that module")
    b = Emitter(graph, onnx_opset(graph, 0), "averaging")
    count = input_with_default(graph, COUNT, np.array(0, np.int64))
    calls = b.op("Add", _calls(b, graph, inputs), b.const(1, np.int64))
    outs = {v.name: v for v in graph.outputs}  # by_name scans every node: once, not once a name
    copies = ((name, inputs[name] == "param", input_with_default(graph, PREFIX + name, _held(built, name)),
               outs[f"{name}.next"] if f"{name}.next" in outs else by_name(graph, f"{name}.next")) for name in names)
    added = [Output(name, "state", name[: -len(".next")]) for name in _updates(b, graph, spec, calls, count, copies)]
    for name in names:
        built.state[PREFIX + name] = np.array(built.state[name], copy=True)
    built.state[COUNT] = np.array(0, np.int64)
    graph.sort()
    inputs.update({o.feeds: "state" for o in added})
    outputs.update({o.name: "state" for o in added})
    built.feeds.update({o.name: o.feeds for o in added})
    return names


def averaging_graph(opset: int, spec: Mapping, tensors: Sequence[ir.Value], params: Collection[str],
                    skipped: bool) -> ir.Model:
    """The averaging of ``spec`` as a graph of its own, run right after an optimizer step made by
    other graphs (``accumulate=k``'s and data-parallel workers' update): inputs ``tensors`` (typed
    values named as the averaged params, ``params``, and buffers: their values after the step), each
    one's copy ``averaged.<name>``, ``COUNT``, and ``STEP`` (and with ``skipped``, loss scaling's
    ``SKIPPED``) after the step, whose sum is the calls made, this one's included; outputs the copies'
    and the count's ``.next``, the same nodes as train_step's."""
    graph = ir.Graph([], [], nodes=[], opset_imports={"": opset}, name="averaging")
    b = Emitter(graph, opset, "averaging")
    count = _typed_input(graph, COUNT, ir.DataType.INT64, ())
    calls = _typed_input(graph, STEP, ir.DataType.INT64, ())
    if skipped:
        calls = b.op("Add", calls, _typed_input(graph, SKIPPED, ir.DataType.INT64, ()))
    copies = ((v.name, v.name in params, _typed_input(graph, PREFIX + v.name, v.dtype, v.shape),
               _typed_input(graph, v.name, v.dtype, v.shape)) for v in tensors)
    _updates(b, graph, spec, calls, count, copies)
    broadcasts.rank_scalars(graph, opset)
    model = ir.Model(graph, ir_version=10)
    tidy(model)
    return model


def _typed_input(graph: ir.Graph, name: str, dtype: ir.DataType, shape: Any) -> ir.Value:
    value = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))
    graph.inputs.append(value)
    return value


def _updates(b: Emitter, graph: ir.Graph, spec: Mapping, calls: ir.Value, count: ir.Value,
             copies: Iterable[tuple[str, bool, ir.Value, ir.Value]]) -> list[str]:
    """The averaged copies' update at train_step call ``calls`` (1 for the first), exposed as
    ``averaged.<name>.next`` and ``COUNT.next``; returns those names. ``copies``: (name, whether it
    is a param, its copy's value, its value after the step)."""
    after = b.op("Sub", calls, b.const(int(spec["start"]), np.int64))
    due = b.op("And", b.op("Greater", after, b.const(0, np.int64)),
               b.op("Equal", b.op("Mod", after, b.const(int(spec["every"]), np.int64)), b.const(0, np.int64)))
    first = b.op("Equal", count, b.const(0, np.int64))
    names = []
    for name, param, old, new in copies:
        averaged = _formula(b, spec, old, new, count) if param or spec["use_buffers"] else new
        value = b.op("Where", due, b.op("Where", first, new, averaged) if averaged is not new else new, old)
        names.append(expose(graph, value, f"{PREFIX}{name}.next", like=old))
    counted = b.op("Add", count, b.op("Cast", due, to=ir.DataType.INT64))
    names.append(expose(graph, counted, f"{COUNT}.next", like=count))
    return names


def _calls(b: Emitter, graph: ir.Graph, inputs: Mapping[str, str]) -> ir.Value:
    """train_step's calls before this one, torch's loop iterations: the optimizer steps taken
    (``step``), plus, with loss scaling, the steps it skipped (which ``step`` does not count)."""
    step = by_name(graph, STEP)
    if SKIPPED not in inputs:
        return step
    return b.op("Add", step, by_name(graph, SKIPPED))


def _held(built: Built, name: str) -> np.ndarray:
    """The copy's initial value as train_step holds ``name`` (in its ``built.orders``, if any)."""
    value = built.state[name]
    return np.ascontiguousarray(value.transpose(built.orders[name]) if name in built.orders else value)


def _formula(b: Emitter, spec: Mapping, avg: ir.Value, new: ir.Value, count: ir.Value) -> ir.Value:
    """The average after this update (not the first) of ``avg`` and the param's new value ``new``."""
    if not ir.DataType(avg.dtype).is_floating_point():
        raise PassError(f"weight averaging of {avg.name!r}: it is {avg.dtype}, not a float tensor")
    fn, diff = spec["fn"], b.op("Sub", new, avg)
    if fn == "ema":
        decay = float(spec["decay"])
        return b.op("Add", b.op("Mul", b.scalar(decay, avg), avg), b.op("Mul", b.scalar(1 - decay, avg), new))
    if fn == "ema_multi":
        w = 1 - float(spec["decay"])
        return (b.op("Add", avg, b.op("Mul", b.scalar(w, avg), diff)) if w < 0.5 else
                b.op("Sub", new, b.op("Mul", diff, b.scalar(1 - w, avg))))
    n1 = b.op("Cast", b.op("Add", count, b.const(1, np.int64)), to=ir.DataType.DOUBLE)
    if fn == "swa":
        return b.op("Add", avg, b.op("Div", diff, b.from_float64(n1, avg)))
    w = b.op("Div", b.const(1.0, np.float64), n1)  # swa_multi: lerp by a weight of 1/(n+1) <= 0.5
    low = b.op("Add", avg, b.op("Mul", b.from_float64(w, avg), diff))
    high = b.op("Sub", new, b.op("Mul", diff, b.from_float64(b.op("Sub", b.const(1.0, np.float64), w), avg)))
    return b.op("Where", b.op("Less", w, b.const(0.5, np.float64)), low, high)


def batch_statistics_graph(evaluation: ir.Model, stats: list[str]) -> ir.Model:
    """torch's ``update_bn`` forward: ``evaluation`` (the eval graph) with each BatchNormalization in
    training mode on its batch's statistics, outputs ``<stat>.batch`` for each of ``stats`` that is a running
    statistic (other buffers are left as they are): the batch mean and the unbiased batch variance (momentum 0), from which the caller
    keeps the cumulative average. Its data, param and statistic inputs are the eval graph's (no label);
    Dropout stays in inference mode."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    from graphc.model import COUNTER_KEY
    from graphc.passes.training import modes
    from graphc.passes.values import MOMENTUM_KEY

    model = evaluation.clone()
    graph = model.graph
    for node in list(graph):
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            modes.eps_as_attribute(graph, node)
            node.attributes["training_mode"] = ir.AttrInt64("training_mode", 1)
            node.attributes["momentum"] = ir.AttrFloat32("momentum", 0.0)  # ONNX's: the running stats' weight
            for key in (MOMENTUM_KEY, COUNTER_KEY):
                node.metadata_props.pop(key, None)
    updated = modes.lower_batchnorm(Emitter(graph, onnx_opset(graph, 0), "update_bn"), graph)
    graph.outputs.clear()
    for stat in (s for s in stats if s in updated):
        expose(graph, updated[stat], f"{stat}.batch", like=by_name(graph, stat))
    RemoveUnusedNodesPass()(model)
    for value in [v for v in graph.inputs if not v.uses()]:
        graph.inputs.remove(value)
    graph.sort()
    return model
