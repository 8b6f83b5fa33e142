"""Build the four training graphs (train_step, gradients, eval, inference) from a model.

``build(model, loss, optimizer, ...)`` works on a copy of the model:

1. weights kept in ``Constant`` nodes become initializers (``imports``); shapes are inferred;
2. ``inference``: the forward graph in inference mode (``modes``, ``buffer_updates``);
3. the loss graph (captured by ``graphc.compile.training`` from ``gc.losses``) is spliced after a
   model output, with a new label input, or a scalar output is taken as the loss; either way
   the loss value is named ``loss`` (``loss_graph``, which first frees the names ``loss``,
   ``step`` and ``lr`` in the model);
4. ``eval``: loss graph in inference mode, trainable params and BN statistics as inputs;
5. ``gradients``: loss graph in training mode, ``autodiff.backward`` to the trainable params,
   outputs ``loss``, ``<param>_grad``, ``<stat>.next`` for each BatchNorm statistic or written buffer
   and, for a loss with a label, the model output it reads (role ``prediction``)
   (training-mode Dropout becomes standard ops on one ``dropout_noise.<k>`` input per node,
   drawn by the caller);
6. ``train_step``: the gradients graph plus optimizer state inputs, ``step``, ``lr`` and the
   update nodes (``optimizers``); outputs ``loss`` and ``X.next`` for each param/state ``X``.
   Fused (the default), the update runs once over each of a few flat groups of params, with
   the optimizer state as flat buffers (``flat``); else once per param.

``update_graphs.update_graph`` builds the optimizer update alone (params, gradients, state, step and
lr in; the ``.next`` values out), the same nodes as train_step's: data-parallel workers run
``gradients`` on their shards and apply it to the averaged gradients.

No DSL here: the caller (``graphc.compile.training``) turns specs into the plain arguments below.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveInitializersFromInputsPass, RemoveUnusedNodesPass, ShapeInferencePass

from graphc.errors import PassError
from graphc.model.file import clip_bounds_like_input
from graphc.passes.autodiff.autograd_functions import refuse_dropped
from graphc.passes.autodiff.core import DEFAULT_OPSET, backward
from graphc.passes.autodiff.model import expand_for_autodiff, fill_unknown_ranks, fold_integer_values
from graphc.passes.emit import Emitter
from graphc.passes.infer import correct_onnx_inference
from graphc.passes.precision.autocast import autocast_in_place
from graphc.passes.training import accumulate, broadcasts, buffer_updates, clipping, dense_conv, flat, imports
from graphc.passes.training import loss_scaling, modes
from graphc.passes.training import buffer_mutations, guarded_params, optimizers, param_selection, sync_batchnorm, taps_params
from graphc.passes.training import max_norm, max_norm_carries, noise as noise_shapes, padding_rows, reductions
from graphc.passes.training import export_records, recompute as recomputation, torch_gradients
from graphc.passes.training.graph_outputs import by_name, expose, expose_inputs, input_with_default, set_outputs
from graphc.passes.training.loss_graph import LOSS, LossArgs, append_loss, free_names
from graphc.passes.training.scheduled import MOMENTUM, momentum_scheduled, running_state, scheduled_inputs
from graphc.passes.values import drop_autograd_functions, exchange_kind, holds_autograd_functions, onnx_opset

MIN_OPSET = 17  # graphc's lowest opset; older models are upgraded to it
STEP = "step"
LR = "lr"
PREDICTION = "prediction"  # train_step output role: the model output the loss reads (training mode)
GRAD_NORM = "grad_norm"  # train_step output (and role) with max_grad_norm: the total gradient norm before clipping


@dataclass(frozen=True)
class Output:
    """A graph output as the code that creates it declares it: its role and, for a train_step
    output that the next step reads, the input it ``feeds``."""

    name: str
    role: str
    feeds: str | None = None


@dataclass
class Built:
    graphs: dict[str, ir.Model]  # train_step, gradients, eval, inference[, noise_shapes]
    roles: dict[str, tuple[dict[str, str], dict[str, str]]]  # graph -> (input name -> role, output name -> role)
    feeds: dict[str, str]
    trainable: list[str]
    frozen: list[str]
    constants: dict[str, str]  # float initializers the exporter made, not params: name -> why
    state: dict[str, np.ndarray]
    model_outputs: list[str]
    opset: int
    layout: list[flat.Group]  # the flat param buffers (empty: one update per param), params in the model's order
    slots: dict[str, tuple[str, ...]]  # each param's and buffer's optimizer state: ``<name>.<slot>`` (``slots_of``)
    orders: dict[str, list[int]]  # params train_step holds in another axis order (``taps_params``)
    one_row_batchnorms: dict[str, tuple[str, int]]  # train-mode BatchNorms a 1-row batch makes NaN (``modes``)
    renormed: list[str]  # params an embedding's max_norm renormalises, stepped from that value (``max_norm``)
    sources: dict[str, str]  # tensors folded from one parameter by moving its elements: name -> it (``param_selection``)


def build(model: ir.Model, loss: LossArgs, optimizer: dict,
          trainable: Iterable[str] | None = None, frozen: Iterable[str] = (), fused: bool = True,
          recompute: bool = False, params: Iterable[str] = (), batchnorm: str = "train", device: str = "cpu",
          nchwc: int = 0, loss_scale: dict | None = None, autocast: tuple[str, dict[str, str]] | None = None
          ) -> Built:
    """The training graphs of ``model``; ``optimizer`` is the spec as JSON (``{"kind": "sgd", "lr":
    ..., ...}``); ``nchwc``: the CPU's NCHWc channel block the backward may count on (0: none);
    ``loss_scale``: loss scaling's spec as JSON (``loss_scaling``), or None; ``autocast``: (the low
    dtype, the op types run in it) for train_step's and gradients' forward (``precision.autocast``)."""
    refuse_dropped(model)
    base = _prepare(model)
    one_row = modes.one_row_batchnorms(base.graph) if batchnorm != "frozen" else {}
    export_records.warn(base, batchnorm)
    order = {name: i for i, name in enumerate(model.graph.initializers)}  # promoted constants last
    opset = onnx_opset(base, 0)
    bn_stats = buffer_updates.with_written(base.graph, modes.batchnorm_stats(base.graph))  # + buffers written
    data = [v.name for v in base.graph.inputs if not v.is_initializer()]
    model_outputs = [v.name for v in base.graph.outputs]

    inference = base.clone()
    buffer_updates.inference_mode(inference.graph)
    max_norm_carries.strip(inference)
    padding_rows.freeze_padding_rows(base.graph)  # after the clone: inference keeps the plain lookup

    free_names(base.graph, _reserved(loss, optimizer, loss_scale))
    label = append_loss(base.graph, opset, loss)  # base is our copy: the loss goes straight in
    chosen = param_selection.select(base, bn_stats, trainable, frozen, params, order, optimizer.get("no_decay") or ())
    params, frozen_all, constants, decays = chosen.trainable, chosen.frozen, chosen.constants, chosen.decays
    renormed = max_norm.renormed(base.graph, opset, params)  # stepped from their renormalised values
    imports.warn_shared_normalization_params(base.graph, params)
    imports.warn_folded_parameters(base, params, chosen.notes)

    evaluation, eval_outputs = _eval_graph(base, params, bn_stats, model_outputs)
    # momentum=None BatchNorms' counters: state of the training graphs only (eval reads none)
    bn_stats = [*bn_stats, *(modes.add_batch_counters(base.graph) if batchnorm != "frozen" else [])]
    noise: list[str] = []
    slot = [v.name for v in base.graph.outputs].index(loss.output)
    args = (opset, params, bn_stats, noise, recompute, batchnorm, device, nchwc, loss_scale,
            (slot, loss.output) if label else None, autocast)
    plain = sync_batchnorm.unmarked(base)  # train_step runs in one process: plain BatchNorm, 10 % faster
    step, gradients, grads, bn_next, grad_outputs, taps = _backward_graphs(base if plain is None else plain, *args)
    if plain is not None:  # the workers' gradients graph: written out around its exchanges
        gradients = _backward_graphs(base, *args[:3], [], *args[4:])[1]
    # a pass that replaces the prediction (dense_conv) keeps its output slot, not its name
    step.graph.outputs[slot].name = loss.output
    gated = guarded_params.guards(step.graph, by_name(step.graph, LOSS), params)
    if gated:  # the workers' flags, ORed before their update (DDP's find_unused_parameters)
        flags = guarded_params.expose_touched(gradients.graph, opset, by_name(gradients.graph, LOSS), params, gated)
        grad_outputs = [*grad_outputs, *(Output(name, "touched") for name in flags)]
        set_outputs(gradients.graph, grad_outputs)
    # a param stepped only on some steps keeps its own state: out of the flat buffers
    per_param = optimizer["kind"] in optimizers.PER_PARAM  # Adafactor: by param, in the model's axis order
    groups = flat.plan(base.graph, [p for p in params if p not in gated], decays) if fused and not per_param else []
    orders = taps_params.store(step.graph, opset, {} if per_param else taps, grads)  # after gradients is cloned
    held = [replace(g, shapes=[tuple(s[i] for i in orders[p]) if p in orders else s for p, s in zip(g.params, g.shapes)])
            for g in groups]

    slots = slots_of(optimizer, {p: gradients.graph.initializers[p] for p in params}, groups)
    param_values = {p: by_name(step.graph, renormed[p]) if p in renormed else step.graph.initializers[p] for p in grads}
    lr_dtype = optimizers.lr_dtype(v.dtype for v in param_values.values())
    step_outputs = [Output(LOSS, "loss"),
                    *append_optimizer(step.graph, opset, optimizer, param_values, grads, slots, decays, held, lr_dtype,
                                       loss_scale, gated),
                    *(Output(expose(step.graph, value, f"{stat}.next", like=step.graph.initializers[stat]), "state",
                             stat) for stat, value in bn_next.items()),
                    # the training-mode prediction the loss reads: the Trainer's train metrics
                    *([Output(loss.output, PREDICTION)] if label else [])]
    set_outputs(step.graph, step_outputs)

    grouped = {p for g in groups for p in g.params}
    updated = [g.name for g in groups] + [p for p in params if p not in grouped]  # what optimizer state is kept for
    role_of_input = {**{n: "data" for n in data}, **({label: "label"} if label else {}), **{n: "param" for n in params},
                     **{f"{p}.{s}": "state" for p in [*params, *updated] for s in slots[p]},
                     **{n: "state" for n in guarded_params.own_state(gated, optimizer)},
                     STEP: "state", **{n: "state" for n in running_state(optimizer)},
                     **{n: "state" for n in loss_scaling.state_names(loss_scale)},
                     **{n: "state" for n in bn_stats}, LR: "hyper",
                     **{n: "hyper" for n in scheduled_inputs(optimizer)},
                     **{n: "noise" for n in noise}, accumulate.WEIGHT: "weight"}
    graphs = {"train_step": step, "gradients": gradients, "eval": evaluation, "inference": inference}
    for key, m in graphs.items():
        m.graph.name = f"{model.graph.name or 'model'}_{key}"
        _order_inputs(m.graph, list(role_of_input))
        if key != "inference":  # the model as given
            broadcasts.rank_scalars(m.graph, opset)
        if device == "cuda" and key != "inference":
            reductions.split_reductions(m.graph, opset)
        tidy(m)
    outputs = {"train_step": step_outputs, "gradients": grad_outputs, "eval": eval_outputs,
               "inference": [Output(o, "loss" if o == LOSS else "output") for o in model_outputs]}
    batch = [*data, *([label] if label else [])]
    unbound = noise_shapes.unbound(step.graph, noise, batch)
    if unbound:  # noise a trainer cannot size from the batch's dims: a graph that computes it
        graphs["noise_shapes"] = noise_shapes.shape_graph(step, noise, unbound, batch, [*params, *bn_stats])
        graphs["noise_shapes"].graph.name = f"{model.graph.name or 'model'}_noise_shapes"
        outputs["noise_shapes"] = [Output(f"{n}{noise_shapes.SHAPE_SUFFIX}", "noise_shape") for n in unbound]
    # inputs and outputs apart: a model output may be one of its inputs, passed through
    roles = {key: ({v.name: role_of_input[v.name] for v in m.graph.inputs}, {o.name: o.role for o in outputs[key]})
             for key, m in graphs.items()}
    feeds = {o.name: o.feeds for o in step_outputs if o.feeds is not None}
    state = _initial_state(gradients.graph, params, bn_stats, slots, optimizer, lr_dtype)
    state.update(guarded_params.own_state(gated, optimizer))
    state.update(loss_scaling.initial_state(loss_scale))
    return Built(graphs, roles, feeds, params, frozen_all, constants, state, model_outputs, opset, groups, slots,
                 orders, one_row, list(renormed), chosen.sources)


def _eval_graph(base: ir.Model, params: Sequence[str], bn_stats: Sequence[str],
                model_outputs: Sequence[str]) -> tuple[ir.Model, list[Output]]:
    """Inference-mode forward and loss; params and BN statistics are inputs with defaults."""
    evaluation = base.clone()
    buffer_updates.inference_mode(evaluation.graph)
    expose_inputs(evaluation.graph, [*params, *bn_stats])
    outputs = [Output(LOSS, "loss"), *(Output(o, "output") for o in model_outputs if o != LOSS)]
    set_outputs(evaluation.graph, outputs)
    max_norm_carries.strip(evaluation)
    return evaluation, outputs


def _backward_graphs(step: ir.Model, opset: int, params: Sequence[str], bn_stats: Sequence[str],
                     noise: list[str], recompute: bool = False, batchnorm: str = "train", device: str = "cpu",
                     nchwc: int = 0, loss_scale: dict | None = None, prediction: tuple[int, str] | None = None,
                     autocast: tuple[str, dict[str, str]] | None = None):
    """Training mode and the backward pass, in ``step`` itself; returns (step, the gradients
    graph cloned from it, {param: gradient value in step}, {BN stat: its updated value}, the
    gradients graph's outputs, {param: (its taps-outer chain's value, that value's gradient)}
    for the params ``taps_params`` may hold in the chain's order). ``prediction``: the output
    slot and name of the model output a labelled loss reads, which the gradients graph outputs
    too (role ``prediction``: data-parallel workers' train metrics).
    Dropout becomes ops on new noise inputs (their names are appended to ``noise``) before
    autodiff, so the gradient flows through plain Mul/Cast. ``batchnorm="frozen"`` keeps
    BatchNormalization in inference mode (running statistics in, none updated). With
    ``loss_scale`` the backward is the scaled loss's (``loss_scaling.seed``): train_step unscales
    its gradients in the update, the gradients graph before its outputs. ``autocast``: (dtype, op
    types' kinds) run with autocast's dtype flow between Casts, before the function ops' expansion (an Attention or an
    LSTM the policy leaves alone keeps its inner MatMuls in float32)."""
    if batchnorm == "frozen":
        modes.set_inference_mode(step.graph, ops=("BatchNormalization",))
    # ops without a gradient rule that ONNX defines as functions (Mish, RMSNormalization,
    # Attention, ...) are differentiated through their bodies, RNN/GRU/LSTM unrolled (the eval
    # and inference graphs, cloned before, keep the ops themselves)
    expose_inputs(step.graph, [*params, *bn_stats])  # first: no pass may take their initial values as constants
    if autocast is not None:
        _autocast(step, *autocast)
    expanded = expand_for_autodiff(step)
    modes.set_training_mode(Emitter(step.graph, opset, "mode"), step.graph, noise, batchnorm=batchnorm != "frozen")
    synced = sync_batchnorm.write_out(Emitter(step.graph, opset, "sync_bn"), step.graph)  # before autodiff
    dense_conv.densify_convs(step.graph, opset, device)
    step.graph.sort()
    _infer_shapes(step)
    sync_batchnorm.widen(step.graph, opset)
    if expanded:
        fill_unknown_ranks(step)  # a body's shape arithmetic can hide ranks from inference
    forward = {node.name for node in step.graph}
    convs = [node for node in step.graph if node.op_type == "Conv" and node.domain in ("", "ai.onnx")]
    chains = taps_params.chains(step.graph, params)
    loss_value, seed_scale = by_name(step.graph, LOSS), None
    if loss_scale is not None:
        scale = input_with_default(step.graph, loss_scaling.LOSS_SCALE,
                                   loss_scaling.initial_state(loss_scale)[loss_scaling.LOSS_SCALE])
        seed_scale = loss_scaling.seed(Emitter(step.graph, opset, "loss_scale"), scale, loss_value)

    def scaled(factor: ir.Value, scope: str) -> ir.Value:  # the seed's scale times ``factor``
        return factor if seed_scale is None else Emitter(step.graph, opset, scope).op("Mul", seed_scale, factor)

    if any(exchange_kind(node) for node in step.graph):  # a data-parallel worker seeds 0 a shard that counts nothing
        seed_scale = scaled(sync_batchnorm.loss_seed(step.graph, loss_value), "sync_bn")
    if holds_autograd_functions(step):  # a hook sees the micro-batch's weighted gradient (``accumulate.seed_weight``)
        seed_scale = scaled(accumulate.seed_weight(Emitter(step.graph, opset, "accumulate"), loss_value), "accumulate")
    found = backward(step.graph, loss_value, [*(step.graph.initializers[p] for p in params), *chains.values()],
                     device, nchwc, seed_scale, step.functions)
    grads = {p: found[p] for p in params}
    before = set(step.graph)
    if device == "cpu":
        dense_conv.gather_convs(step.graph, convs, opset, nchwc)
    bn_next = {**synced, **modes.lower_batchnorm(Emitter(step.graph, opset, "bn"), step.graph, device),
               **buffer_updates.updated_values(step.graph)}  # the buffers the forward writes
    forward |= {node.name for node in step.graph if node not in before}
    step.graph.sort()
    recomputation.recompute(step.graph, forward, opset, everywhere=recompute)  # checkpoint regions always
    gradients = step.clone()
    graph = gradients.graph
    stats = [Output(expose(graph, by_name(graph, v.name), f"{stat}.next", like=graph.initializers[stat]), "state",
                    stat) for stat, v in bn_next.items()]  # a data-parallel run keeps rank 0's (as DDP)
    grad_values = [by_name(graph, g.name) for g in grads.values()]
    if loss_scale is not None:
        grad_values, _ = loss_scaling.unscale(Emitter(graph, opset, "loss_scale"), by_name(graph, loss_scaling.LOSS_SCALE),
                                              grad_values, [graph.initializers[p].dtype for p in grads], check=False)
    outputs = [Output(LOSS, "loss"),
               *(Output(expose(graph, g, f"{p}_grad", like=graph.initializers[p]), "grad")
                 for p, g in zip(grads, grad_values)), *stats]
    if prediction is not None:
        slot, name = prediction
        graph.outputs[slot].name = name  # a pass that replaces the prediction (dense_conv) keeps its slot
        outputs.append(Output(name, PREDICTION))
    set_outputs(graph, outputs)
    return step, gradients, grads, bn_next, outputs, {p: (t, found[t.name]) for p, t in chains.items()}


def _autocast(step: ir.Model, dtype: str, kinds: dict[str, str]) -> None:
    if not autocast_in_place(step.graph, step.opset_imports, dtype, kinds, loss=LOSS):
        lowered = sorted(op for op, how in kinds.items() if how == "lower")
        warnings.warn(f"autocast={dtype!r} ran nothing in {dtype}: the model has no float32 "
                      f"{'/'.join(lowered)} node; its training graphs compute as without autocast", stacklevel=4)


def _order_inputs(graph: ir.Graph, order: Sequence[str]) -> None:
    """Inputs in the manifest's reading order: data, label, params, optimizer state, step, BN
    statistics, lr, Dropout noise."""
    rank = {name: i for i, name in enumerate(order)}
    ordered = sorted(graph.inputs, key=lambda v: rank.get(v.name, -1))
    graph.inputs.clear()
    graph.inputs.extend(ordered)


def _prepare(model: ir.Model) -> ir.Model:
    """A copy of ``model`` at opset >= 17, weights in initializers (not graph inputs, as IR < 4 exports list
    them), shared weights that constant folding copied computed again from the weight (``imports.retie_folded_copies``),
    params an export merged for equal values apart again (``imports.untie_merged_params``), torch's ``detach`` a
    stop-gradient and an embedding's ``scale_grad_by_freq`` its gradient's scale (``torch_gradients``), a dynamo
    export's buffer mutations buffer writes (``buffer_mutations``), BatchNorm statistics own, shapes inferred."""
    opset = onnx_opset(model, 0)
    base = _upgrade(model, opset) if opset < MIN_OPSET else model.clone()
    RemoveInitializersFromInputsPass()(base)
    imports.promote_constant_weights(base)
    imports.retie_folded_copies(base)
    imports.untie_merged_params(base)
    torch_gradients.mark(base)
    buffer_mutations.mark_buffer_mutations(base)
    modes.own_batchnorm_stats(base.graph)
    _infer_shapes(base)
    if fold_integer_values(base):  # exporters' computed pads/shapes: static shapes downstream
        _infer_shapes(base)
    if fill_unknown_ranks(base):
        _infer_shapes(base)
    return base


def _upgrade(model: ir.Model, opset: int) -> ir.Model:
    """Old exports (opset 6 to 16) go through onnx's version converter to opset 17, graphc's
    lowest (gradient rules and update graphs use ops as opset 17 defines them, e.g. ScatterElements
    with ``reduction``, Dropout with a ``training_mode`` input)."""
    import onnx

    try:
        proto = onnx.version_converter.convert_version(ir.serde.serialize_model(model), MIN_OPSET)
        clip_bounds_like_input(proto)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError/ConvertError
        raise PassError(f"training graphs need ai.onnx opset >= {MIN_OPSET}; the model uses opset {opset} "
                        f"and onnx's version converter could not upgrade it: {exc}") from exc
    return ir.serde.deserialize_model(proto)


_SEQUENCE_MAKERS = frozenset({"SplitToSequence", "SequenceConstruct", "SequenceEmpty", "SequenceInsert",
                              "SequenceErase"})


def _reserved(loss: LossArgs, optimizer: dict, loss_scale: dict | None = None) -> dict[str, str]:
    """The names the training graphs add, and what for: the step count, the learning rate, the
    loss (unless the model's own loss output has that name), with ``max_grad_norm`` the norm and
    with ``loss_scale`` its state."""
    reserved = {STEP: "the step count, a train_step input", LR: "the learning rate, a train_step input",
                sync_batchnorm.LOSS_SEED: "the backward's seed factor of a graph with SyncBatchNorms",
                **{n: "loss scaling's state, a train_step input" for n in loss_scaling.state_names(loss_scale)}}
    if momentum_scheduled(optimizer):
        reserved[MOMENTUM] = "the scheduled momentum (beta1), a train_step input"
    reserved.update({n: "the optimizer's running scalar state, a train_step input" for n in running_state(optimizer)})
    if optimizer.get("max_grad_norm") is not None:
        reserved[GRAD_NORM] = "the gradients' total norm, a train_step output"
    if loss.output != LOSS:
        reserved[LOSS] = "the loss, an output of every training graph"
    return reserved


def _infer_shapes(model: ir.Model) -> None:
    """ONNX shape inference, in place (autodiff needs ranks; the loss needs the logits' shape)."""
    for node in model.graph:  # onnx_ir's merge would type an untyped sequence as a tensor
        if node.op_type in _SEQUENCE_MAKERS and node.outputs[0].type is None:
            node.outputs[0].type = ir.SequenceType(ir.TensorType(ir.DataType.UNDEFINED))
    try:
        ShapeInferencePass(check_type=False, strict_mode=False)(model)
    except Exception:  # noqa: BLE001 - inference is a help: values it cannot type stay untyped
        pass
    correct_onnx_inference(model.graph, onnx_opset(model, DEFAULT_OPSET))


def slots_of(optimizer: dict, params: Mapping[str, ir.Value], groups: Sequence[flat.Group]) -> dict[str, tuple[str, ...]]:
    """Each param's (``params``: name -> its value) and flat group's ``optimizers.state_slots``."""
    return {**{name: optimizers.state_slots(optimizer, p.dtype, len(p.shape)) for name, p in params.items()},
            **{g.name: optimizers.state_slots(optimizer, g.dtype, 1) for g in groups}}


def append_optimizer(graph, opset, hyper, params, grads, slots, decays, groups, lr_dtype,
                      loss_scale: dict | None = None, gated: dict | None = None,
                      exchanged: Mapping[str, ir.Value] = {}) -> list[Output]:
    """Optimizer inputs (state, step, lr of ``lr_dtype``) and update nodes for ``params`` (name ->
    value), per flat buffer of ``groups`` or, with none, per param (``slots``: each one's state
    slots, ``slots_of``); returns the ``.next`` outputs.
    ``loss_scale``: the gradients are the scaled loss's, unscaled here and the step skipped where
    one is not finite (``loss_scaling``; the graph already has the ``loss_scale`` input).
    ``gated``: {param not in ``groups``: its ``guarded_params.guards``}: each counts its own step,
    and where its guards are not empty is held, state and step, on a step that does not read it.
    ``exchanged``: a sharded update's inputs that stand for every shard's gradients (``update_graphs``):
    ``found_inf`` (with ``loss_scale``) and the total norm ``grad_norm`` (with ``max_grad_norm``)."""
    b = Emitter(graph, opset, "optim")
    step = input_with_default(graph, STEP, np.array(0, dtype=np.int64))
    lr = input_with_default(graph, LR, np.array(hyper["lr"], dtype=lr_dtype.numpy()))
    scheduled = {n: input_with_default(graph, n, v) for n, v in scheduled_inputs(hyper).items()}
    t = b.op("Add", step, b.const(1, np.int64))
    running = {n: input_with_default(graph, n, v) for n, v in running_state(hyper).items()}
    ctx = optimizers.StepContext(b, lr, t, scheduled.get(MOMENTUM), running)
    groups_by_name = {g.name: g for g in groups}
    read_param = optimizers.needs_param(hyper)
    views = Emitter(graph, opset, "optim/flat") if groups else None
    grouped = {p for g in groups for p in g.params}
    updates = [(g.name, flat.concat(views, g, params) if read_param else None, flat.concat(views, g, grads),
                g.weight_decay) for g in groups]
    updates += [(p, params[p], grad, decays[p]) for p, grad in grads.items() if p not in grouped]
    dtypes = [(u[2] if u[0] in groups_by_name else params[u[0]]).dtype for u in updates]
    scaler = None
    if loss_scale is not None:  # torch's scaler.unscale_, before any clipping
        scaler = loss_scaling.Scaler(b, loss_scale, by_name(graph, loss_scaling.LOSS_SCALE))
        updates = [(name, param, g, decay) for (name, param, _, decay), g in
                   zip(updates, scaler.unscale([u[2] for u in updates], dtypes, exchanged.get("found_inf")))]
    # torch's clip_grad_*_ between backward and step, on every gradient at once (if the spec asks)
    clipped, norm = clipping.clip(b, hyper, [u[2] for u in updates], dtypes, exchanged.get(GRAD_NORM))
    updates = [(name, param, g, decay) for (name, param, _, decay), g in zip(updates, clipped)]
    new_params, state_next, gates = {}, [], guarded_params.Gates(b, scaler.found_inf if scaler else None,
                                                                    running_state(hyper))
    for name, param, grad, decay in updates:
        like = grad if name in groups_by_name else params[name]  # a flat group's gradient is typed by flat.concat
        state = {s: ir.Value(name=f"{name}.{s}", type=ir.TensorType(like.dtype),
                             shape=ir.Shape(optimizers.state_shape(hyper, s, like.shape))) for s in slots[name]}
        graph.inputs.extend(state.values())
        own = gates.own_step(graph, ctx, name, (gated or {}).get(name))
        upd = optimizers.step(own.ctx, hyper if decay else {**hyper, "weight_decay": 0.0}, grad, state, param)
        delta, shrink = gates.held_step(own.skip, upd.delta, upd.shrink)
        if name in groups_by_name:  # the group's step split into its params' pieces, applied to the params as fed
            new_params.update(flat.apply(views, groups_by_name[name], params, delta, shrink))
        else:
            new_params[name] = optimizers.apply(b, param, delta, shrink)
        state_next += [Output(expose(graph, gates.kept(own.skip, state[s], upd.state[s]), f"{name}.{s}.next", like=state[s]),
                              "state", f"{name}.{s}") for s in slots[name]]
        state_next += [Output(expose(graph, value, f"{n}.next", like=old), "state", n) for n, old, value in own.next()]
    param_next = [Output(expose(graph, new_params[p], f"{p}.next", like=params[p]), "param", p) for p in params]
    return [*param_next, *state_next,
            Output(expose(graph, gates.kept(gates.found_inf, step, t), f"{STEP}.next", like=step), "state", STEP),
            # all params gated: no update pushed the shared running state, held as it is
            *(Output(expose(graph, gates.kept(gates.found_inf, value, ctx.running_next.get(name, value)),
                            f"{name}.next", like=value), "state", name) for name, value in running.items()),
            *(_scaler_outputs(graph, scaler) if scaler else []),
            *([Output(expose(graph, norm, GRAD_NORM), GRAD_NORM)] if norm is not None else [])]


def _scaler_outputs(graph: ir.Graph, scaler: loss_scaling.Scaler) -> list[Output]:
    """The next values of the loss scale, the growth tracker of a dynamic scale and the skipped
    steps' count (the inputs of the last two added)."""
    initial = loss_scaling.initial_state(scaler.spec)
    inputs = {loss_scaling.LOSS_SCALE: scaler.scale,
              **{n: input_with_default(graph, n, initial[n]) for n in initial if n != loss_scaling.LOSS_SCALE}}
    return [Output(expose(graph, value, f"{name}.next", like=inputs[name]), "state", name)
            for name, value in scaler.update(inputs.get(loss_scaling.TRACKER), inputs[loss_scaling.SKIPPED]).items()]


def _initial_state(graph, params, bn_stats, slots, hyper, lr_dtype: ir.DataType) -> dict[str, np.ndarray]:
    state = {n: np.array(graph.initializers[n].const_value.numpy()) for n in [*params, *bn_stats]}
    state.update({f"{p}.{s}": optimizers.initial_state(hyper, s, state[p]) for p in params for s in slots[p]})
    state[STEP] = np.array(0, dtype=np.int64)
    state[LR] = np.array(hyper["lr"], dtype=lr_dtype.numpy())
    state.update(scheduled_inputs(hyper))
    state.update(running_state(hyper))
    return state


def tidy(model: ir.Model) -> None:
    model.graph.sort()
    RemoveUnusedNodesPass()(model)
    drop_autograd_functions(model)  # backwards of gc.autograd.Functions: in train_step and gradients now
    for value in model.graph.outputs:  # the checker wants a type and shape on every output
        if value.shape is None or value.dtype is None:
            _infer_shapes(model)
            break
