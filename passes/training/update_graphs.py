"""The optimizer update as graphs of their own, built from the spec and the params alone.

``update_graph``: train_step's update (params, gradients, state, step and lr in; the ``.next`` values
out), the same nodes: data-parallel workers run ``gradients`` on their shards and this on the
averaged gradients. For a sharded update (``gc.Trainer(workers=N, shard_optimizer=True)``) each
worker builds it for its own params (``shard``), with what the whole update reads off every
gradient given as inputs (``exchanged``): the total norm before clipping ``grad_norm.total`` and
loss scaling's ``loss_scale.found_inf``. ``norm_parts_graph`` gives each worker's share of those
(``grad_norm.part``: ``clipping.partial_norm``; ``loss_scale.found_inf``), which the workers exchange.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.training import broadcasts, clipping, flat, guarded_params, loss_scaling, optimizers, param_selection
from graphc.passes.training.artifacts import GRAD_NORM, append_optimizer, slots_of, tidy
from graphc.passes.training.graph_outputs import expose, input_with_default, set_outputs

__all__ = ["FOUND_INF", "NORM_PART", "TOTAL_NORM", "norm_parts_graph", "update_graph"]

TOTAL_NORM = "grad_norm.total"  # a sharded update's input: the norm of every gradient before clipping
NORM_PART = "grad_norm.part"  # norm_parts_graph's output: its gradients' share (``clipping.partial_norm``)
FOUND_INF = "loss_scale.found_inf"  # both's: an inf or NaN in the scaled gradients (input: anywhere)


def update_graph(opset: int, optimizer: dict, params: Sequence[ir.Value], groups: Sequence[flat.Group],
                 no_decay: Sequence[str] = (), lr_dtype: ir.DataType | None = None, loss_scale: dict | None = None,
                 gated: Sequence[str] = (), flagged: Sequence[str] = (), sources: Mapping[str, str] = {},
                 grad_norm: bool = False, norm_dtype: ir.DataType | None = None) -> ir.Model:
    """The optimizer update of train_step as a graph of its own: inputs the ``params`` (typed values named
    as the params), ``<param>_grad`` for each, the optimizer state (per ``groups`` buffer, or per param
    without), ``step`` and ``lr`` (train_step's ``lr_dtype``, by default ``optimizers.lr_dtype`` of the
    params'); outputs ``<param>.next``, the state's ``.next``, ``step.next`` as train_step's, and with
    ``grad_norm`` (and ``max_grad_norm``) its ``grad_norm`` (not for replicas: they carry every output).
    With ``loss_scale`` the gradients are the scaled loss's (``loss_scaling.scaled_gradients``): checked,
    unscaled and the step skipped as in train_step, the scale's state an input and output too.
    ``gated``: params train_step steps only when a step reads them, each with its own ``<param>.step`` (not
    in ``groups``); here those of ``flagged`` step where the bool input ``<param>.touched`` is (the workers'
    flags ORed), the others every step. ``no_decay``: params by name or source (``Manifest.sources``).
    ``norm_dtype``: a shard's update (``params`` some of the model's, maybe none): the total norm
    (``TOTAL_NORM``, of this dtype, with ``max_grad_norm``) and ``FOUND_INF`` (with ``loss_scale``) are
    inputs, every shard's (``norm_parts_graph``), and ``grad_norm`` is not an output."""
    graph = ir.Graph([], [], nodes=[], opset_imports={"": opset}, name="update")
    if loss_scale is not None:
        input_with_default(graph, loss_scaling.LOSS_SCALE, loss_scaling.initial_state(loss_scale)[loss_scaling.LOSS_SCALE])
    values, grads = _params_and_grads(graph, params)
    exchanged = {} if norm_dtype is None else _exchanged(graph, optimizer, loss_scale, norm_dtype)
    decays = param_selection.decays(list(values), no_decay, sources)
    slots = slots_of(optimizer, {p.name: p for p in params}, groups)
    outputs = append_optimizer(graph, opset, optimizer, values, grads, slots, decays, list(groups),
                               lr_dtype or optimizers.lr_dtype(p.dtype for p in params), loss_scale,
                               guarded_params.fed_guards(graph, gated, flagged), exchanged)
    set_outputs(graph, [o for o in outputs if (grad_norm and not exchanged) or o.role != GRAD_NORM])
    return _finished(graph, opset)


def norm_parts_graph(opset: int, optimizer: dict, params: Sequence[ir.Value], groups: Sequence[flat.Group],
                     loss_scale: dict | None, norm_dtype: ir.DataType) -> ir.Model:
    """A shard's share of what its update graph (``update_graph`` with ``norm_dtype``) is given: from
    ``<param>_grad`` of its ``params`` (and ``loss_scale``) it outputs ``FOUND_INF`` (with
    ``loss_scale``: an inf or NaN among them) and ``NORM_PART`` (with ``max_grad_norm``: their share of
    the norm of the gradients unscaled and value-clipped as the update has them, in ``norm_dtype``).
    ``params`` must not be empty: a shard of none has no share (0, False)."""
    graph = ir.Graph([], [], nodes=[], opset_imports={"": opset}, name="norm_parts")
    _, grads = _params_and_grads(graph, params, with_params=False)
    b = Emitter(graph, opset, "optim")
    grouped = {p for g in groups for p in g.params}
    updates = [flat.concat(Emitter(graph, opset, "optim/flat"), g, grads) for g in groups]
    updates += [grad for p, grad in grads.items() if p not in grouped]
    dtypes = [u.dtype for u in updates]
    if loss_scale is not None:
        scale = input_with_default(graph, loss_scaling.LOSS_SCALE,
                                   loss_scaling.initial_state(loss_scale)[loss_scaling.LOSS_SCALE])
        updates, found = loss_scaling.unscale(b, scale, updates, dtypes)
        expose(graph, found, FOUND_INF)
    if optimizer.get("max_grad_norm") is not None:
        clipped, _ = clipping.clip(b, {**optimizer, "max_grad_norm": None}, updates, dtypes)  # clip_grad_value only
        expose(graph, clipping.partial_norm(b, clipped, dtypes, optimizer.get("grad_norm_type", 2.0), norm_dtype),
               NORM_PART)
    return _finished(graph, opset)


def _params_and_grads(graph: ir.Graph, params: Sequence[ir.Value],
                      with_params: bool = True) -> tuple[dict[str, ir.Value], dict[str, ir.Value]]:
    """Inputs ``<param>`` (``with_params``) and ``<param>_grad`` typed as each of ``params``."""
    values, grads = {}, {}
    for p in params:
        values[p.name] = ir.Value(name=p.name, type=ir.TensorType(p.dtype), shape=p.shape)
        grads[p.name] = ir.Value(name=f"{p.name}_grad", type=ir.TensorType(p.dtype), shape=p.shape)
        graph.inputs.extend((values[p.name], grads[p.name]) if with_params else (grads[p.name],))
    return values, grads


def _exchanged(graph: ir.Graph, optimizer: dict, loss_scale: dict | None, norm_dtype: ir.DataType) -> dict:
    """The inputs a sharded update takes in place of reading every gradient: {role: input}. Plain
    inputs, always fed: onnxruntime's IOBinding refuses to bind an input that has an initializer
    (its session lists it among the overridable initializers, not the inputs)."""
    wanted = {"found_inf": (FOUND_INF, ir.DataType.BOOL)} if loss_scale is not None else {}
    if optimizer.get("max_grad_norm") is not None:
        wanted[GRAD_NORM] = (TOTAL_NORM, norm_dtype)
    out = {role: ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape([]))
           for role, (name, dtype) in wanted.items()}
    graph.inputs.extend(out.values())
    return out


def _finished(graph: ir.Graph, opset: int) -> ir.Model:
    broadcasts.rank_scalars(graph, opset)
    model = ir.Model(graph, ir_version=10)
    tidy(model)
    return model
