"""Data-parallel workers' graphs for params an embedding with ``max_norm`` renormalises in place: every
worker renormalises, at each write-back, the rows the whole global batch looks up there, as one process does.

Torch's ``embedding_renorm_`` scales each row looked up, once per lookup, from that row's value alone, so
worker and one process agree on a row whenever they agree on which rows a lookup renormalises. Each
worker runs ``rows`` on its shard (the flat indices each write-back scatters at, in graph order), the
workers take the union of every shard's (``numpy.unique``), and ``gradients`` renormalises and writes
back exactly those rows at each write-back: a tied layer, a later lookup and the update then read the
weight one process holds, bit for bit, and ``<param>.renormed`` gives the value train_step steps from.
A write-back inside a Loop's or Scan's body (or an If's branch there) is made per iteration at that
iteration's union (``max_norm_steps``); one inside an If's branch, where the branch runs, the predicate
computed from the whole batch (``max_norm_branches``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import onnx_ir as ir
from graphc.passes.emit import Emitter
from graphc.passes.training import max_norm, max_norm_branches, max_norm_steps
from graphc.passes.training.graph_outputs import by_name, expose
from graphc.passes.values import MAX_NORM_KEY, ancestors, needed_values, onnx_opset, subgraphs
from onnx_ir.passes.common import RemoveUnusedNodesPass

from graphc.errors import ArtifactsError

__all__ = ["RENORMED", "ShardedRenorm", "sharded"]

RENORMED = ".renormed"  # a param's value after the forward's write-backs: ``<param>.renormed``


@dataclass
class ShardedRenorm:
    """``rows``: shard data -> the flat indices of each write-back, its outputs named as ``graph``'s
    inputs that take their union; ``graph``: the given graph renormalising those unions."""

    rows: ir.Model
    graph: ir.Model


def sharded(model: ir.Model, params: Sequence[str], data: Sequence[str], renormed: bool) -> ShardedRenorm:
    """``model`` (a gradients or eval graph) with each write-back of ``params`` made at the union of the
    shards' rows (the module's docstring); ``renormed``: also output each param's last value as
    ``<param>.renormed``. ``data``: the inputs a shard holds; an ArtifactsError for a write-back whose
    indices read anything else (a param: the workers cannot agree on the rows before the forward), that a
    body nested in another makes (but an If's branch in a loop's body, whose predicate reads no ``data``), or
    that an If's branch makes where its predicate reads ``data`` through a control-flow node."""
    model = model.clone()
    graph, opset = model.graph, onnx_opset(model, 0)
    last = max_norm.renormed(graph, opset, params)  # writes back what capture dropped
    bodies = max_norm_steps.in_bodies(graph, lambda n: _written(n, params))
    _refuse_mapped(graph, params, bodies)
    loops = {n: written for n, written in bodies.items() if n.op_type != "If"}
    branches = {n: written for n, written in bodies.items() if n.op_type == "If"}
    for node, written in loops.items():
        max_norm_steps.refuse_batch_predicates(graph, node, written, data)
    whole = sorted({v.name for n in branches for v in max_norm_branches.batch_read(graph, [n.inputs[0]], data)})
    scatters = [n for n in graph if n.op_type == "ScatterND" and _written(n, params)]
    rows = model.clone()
    flat = {n.name: n.inputs[1].name for n in scatters}
    rows.graph.outputs.clear()
    rows.graph.outputs.extend(by_name(rows.graph, name) for name in flat.values())
    rows.graph.outputs.extend(max_norm_steps.rows_outputs(rows.graph, _names(loops)))
    rows.graph.outputs.extend(max_norm_branches.hoist(rows.graph, _names(branches)))
    for out in rows.graph.outputs:  # [indices, 1] int64 (a body's: [steps, indices, 1]): Reshape gives no shape
        out.shape = out.shape or ir.Shape([None, None, 1] if out.name.endswith(max_norm_steps.STEPS) else [None, 1])
    for name in whole:  # the batch inputs a branch's predicate reads, for the workers to concatenate
        expose(rows.graph, by_name(rows.graph, name), f"{name}{max_norm_branches.WHOLE}", like=by_name(rows.graph, name))
    _prune(rows.graph)
    RemoveUnusedNodesPass()(rows)  # in the bodies
    _keep_inputs(rows.graph, data)
    e = Emitter(graph, opset, "renorm_union")
    for node in scatters:
        _at_union(graph, e, node, flat[node.name])
    for node, written in loops.items():
        for scatter in written:
            max_norm_steps.at_union(graph, e, node, scatter, _made_at)
    for scatter in (s for written in branches.values() for s in written):
        _at_union(graph, Emitter(scatter.graph, opset, e.scope, names=e._names), scatter, scatter.inputs[1].name)
    graph.sort()
    max_norm_branches.whole_batch(graph, e, branches, data)
    if renormed:
        for param, name in last.items():
            expose(graph, by_name(graph, name), f"{param}{RENORMED}", like=by_name(graph, param))
    graph.sort()
    RemoveUnusedNodesPass()(model)
    return ShardedRenorm(rows, model)


def _names(bodies: dict[ir.Node, list[ir.Node]]) -> dict[str, list[str]]:
    return {n.name: [s.name for s in written] for n, written in bodies.items()}


def _refuse_mapped(graph: ir.Graph, params: Sequence[str], loops: Collection[ir.Node]) -> None:
    """An ArtifactsError for a main-graph write-back of ``params`` neither a ScatterND's (through Identities)
    nor the weight an If, Loop or Scan of ``loops`` carries out: a gc.vmap body's that maps the weight (an ensemble's tables)."""
    whole = sorted({max_norm.param_of(n) for n in graph if max_norm.param_of(n) in params
                    and MAX_NORM_KEY in n.metadata_props and _source(n.inputs[0]) not in loops
                    and _source(n.inputs[0]).op_type != "ScatterND"})
    if whole:
        raise ArtifactsError(f"an embedding with max_norm renormalises {whole} inside a gc.vmap body that maps "
                             "the weight (an ensemble's tables): the workers make a write-back at the union of "
                             "their shards' rows, not yet each member's; train with one worker")


def _source(value: ir.Value) -> ir.Node | None:
    """The node that makes the weight ``value``: through plain Identities, and through a straight-through
    sum ``new + (w - detach(w))`` whose ``new`` scatters rows into a 2-D table, is an If's 2-D output (an
    unrolled loop's last weight is one; a gc.vmap body's stack of tables is 3-D) or another such sum, through
    Identities (a gc.cond's in an unrolled loop's body)."""
    node = value.producer()
    while node is not None and node.op_type in ("Identity", "Add") and node.inputs[0].producer() is not None:
        new = node.inputs[0].producer()
        if node.op_type == "Identity" and MAX_NORM_KEY in node.metadata_props:
            shape = node.inputs[0].shape
            if new.op_type not in ("ScatterND", "If", "Add", "Identity") or shape is None or len(shape) != 2:
                break
        elif node.op_type == "Add" and MAX_NORM_KEY not in new.metadata_props:
            break
        node = new
    return node


def _written(scatter: ir.Node, params: Sequence[str]) -> bool:
    """Whether ``scatter`` is a write-back of one of ``params``: its result marked ``MAX_NORM_KEY`` or
    its rows those of a lookup whose write-back capture dropped (``max_norm.renormed`` appends it)."""
    rows = scatter.inputs[2].producer() if len(scatter.inputs) == 3 else None
    source = rows.inputs[0].producer() if rows is not None and rows.op_type == "Reshape" else None
    return any(max_norm.param_of(n) in params for n in [source, *(use for use, _ in scatter.outputs[0].uses())])


def _prune(graph: ir.Graph) -> None:
    """Remove the nodes of ``graph`` its outputs are not computed from, each detached from the values it and its
    subgraphs read (onnx_ir's RemoveUnusedNodesPass counts a removed If's branch reads as uses, which keep their
    producers: the predicate of an If whose write-backs' indices ``hoist`` moved out)."""
    read = needed_values(graph, graph.outputs)[0]
    dead = [n for n in graph if not any(v in read for v in n.outputs)]
    for node in dead:
        for inner in [node, *(n for sub in subgraphs(node) for n in ir.traversal.RecursiveGraphIterator(sub))]:
            for k in range(len(inner.inputs)):
                inner.replace_input_with(k, None)
    graph.remove(dead)


def _keep_inputs(graph: ir.Graph, data: Sequence[str]) -> None:
    used = [v for v in graph.inputs if v.uses()]
    other = [v.name for v in used if v.name not in data]
    if other:
        raise ArtifactsError(f"the rows an embedding with max_norm renormalises depend on {other}, not only on the "
                             "batch (directly, or through a loop's carried values a body's lookup reads its indices "
                             "from), so the workers cannot agree on them before the forward; train with one worker")
    graph.inputs.clear()
    graph.inputs.extend(used)


def _at_union(graph: ir.Graph, e: Emitter, scatter: ir.Node, name: str) -> None:
    """``scatter`` made at the rows of a new int64 input ``name`` [rows] (``_made_at``)."""
    flat = scatter.inputs[1]
    flat.name = None  # the name goes to the input
    e.name_value(flat)
    union = ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([f"{name}_rows"]))
    graph.inputs.append(union)
    _made_at(e, scatter, union)


def _made_at(e: Emitter, scatter: ir.Node, union: ir.Value) -> None:
    """``scatter`` (``ScatterND(weight, Reshape(Cast(indices), [-1, 1]), Reshape(scaled, [-1, dim]))``)
    made at the rows ``union`` (int64 [rows], read in the graph ``e`` appends to, ``scatter``'s):
    ``scaled``'s nodes from ``indices`` cloned to read it, shaped [rows, 1, ...] to the rank of ``indices``
    (the same ops, so the same bits on the rows a shard looks up)."""
    flat, rows = scatter.inputs[1], scatter.inputs[2]
    indices = flat.producer().inputs[0].producer().inputs[0]
    scaled = rows.producer().inputs[0]
    read = e.op("Reshape", union, e.ints([-1] + [1] * (len(indices.shape) - 1)))  # its rank, for the axes
    read = read if indices.dtype == ir.DataType.INT64 else e.op("Cast", read, to=indices.dtype)
    clones = {indices: read}
    e.copy(_between(scatter.graph, indices, scaled), clones)
    scatter.replace_input_with(1, e.op("Unsqueeze", union, e.ints([1])))
    scatter.replace_input_with(2, e.op("Reshape", clones[scaled], rows.producer().inputs[1]))


def _between(graph: ir.Graph, source: ir.Value, target: ir.Value) -> list[ir.Node]:
    """The nodes on a path from ``source`` to ``target``, in graph order."""
    before = ancestors([target])
    after = {source}
    out = []
    for node in graph:
        if node in before and any(v in after for v in node.inputs):
            out.append(node)
            after.update(node.outputs)
    return out
