"""Data-parallel workers' graphs for an embedding with ``max_norm`` looked up inside a Loop's or Scan's body
(``gc.fori_loop``, ``gc.while_loop``, ``gc.scan``): each iteration renormalises the rows the whole batch
looks up at that iteration, as torch's Python loop over the whole batch does.

The rows graph runs the node again, cut down to what computes each body write-back's flat indices (the
iteration counter, the carried values and scanned inputs those read), and stacks them per iteration
(``<flat>.steps``: [steps, k, 1]); the workers take each iteration's union, padded with -1 to [steps, rows]
(``graphc/runtime/distributed/renorm_rows.py``), which the gradients graph takes as an input of that name:
the body reads its iteration's row (a Loop: Gather at the counter; a Scan: one more scanned input), drops the
-1s and renormalises and writes back those rows. A write-back in a ``gc.cond`` branch in the body is made so
too: the rows graph computes its indices at every iteration, taken or not (``max_norm_branches.hoist``), and the
branch, where it runs, renormalises its iteration's union; its predicate must read no batch input (each worker
would take its own shard's branch at an iteration, not the whole batch's). Indices that read the weight the body
renormalises, or a carried value computed from a param, are known only in the forward: ``max_norm_shards``
refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
from graphc.passes.emit import Emitter
from graphc.passes.training.max_norm_branches import batch_read, hoist, where
from graphc.passes.values import needed_values, subgraphs

from graphc.errors import ArtifactsError

__all__ = ["STEPS", "at_union", "body", "in_bodies", "refuse_batch_predicates", "rows_outputs"]

STEPS = ".steps"  # a body write-back's flat indices per iteration: ``<flat>.steps``

_LOOPS = ("Loop", "Scan")


def body(node: ir.Node) -> ir.Graph:
    """The body graph of the Loop or Scan ``node``."""
    return node.attributes["body"].as_graph()


def rows_outputs(graph: ir.Graph, loops: dict[str, list[str]]) -> list[ir.Value]:
    """In ``graph`` (the rows graph, a clone), each Loop or Scan named in ``loops`` replaced by one computing
    only the flat indices of its body's write-backs (the ``ScatterND``\\ s named there), stacked per iteration;
    returns those outputs, named ``<flat>.steps``."""
    out: list[ir.Value] = []
    for node in [n for n in graph if n.name in loops]:
        inner = body(node)
        scatters = [n for n in ir.traversal.RecursiveGraphIterator(inner) if n.name in loops[node.name]]
        for cond, inside in _conds(inner, scatters).items():  # their indices at every iteration, taken or not
            hoist(inner, {cond.name: [s.name for s in inside]})
        stacked = _cut(node, [s.inputs[1] for s in scatters])
        for scatter, value in zip(scatters, stacked):
            value.name = f"{scatter.inputs[1].name}{STEPS}"
            value.type = ir.TensorType(ir.DataType.INT64)
            out.append(value)
    return out


def _cut(node: ir.Node, flats: Sequence[ir.Value]) -> list[ir.Value]:
    """A node inserted before ``node`` running its body for the carried values ``flats`` need, with
    ``flats`` its only scan outputs (returned); ``node`` itself removed (what read it goes unread)."""
    inner, loop = body(node), node.op_type == "Loop"
    lead, first_in, states = _layout(node)
    kept = _carried(node, [*([inner.outputs[0]] if loop else []), *flats])[0]  # the condition's too
    scanned = [] if loop else node.inputs[states:]
    head = [node.inputs[0], node.inputs[1] or _true(node)] if loop else []  # a Loop takes both (states or not)
    inputs = [*head, *(node.inputs[first_in + j] for j in kept), *scanned]
    body_in = [*inner.inputs[:first_in], *(inner.inputs[first_in + j] for j in kept), *inner.inputs[first_in + states:]]
    body_out = [*inner.outputs[:lead], *(inner.outputs[lead + j] for j in kept), *flats]
    inner.inputs.clear()
    inner.inputs.extend(body_in)
    inner.outputs.clear()
    inner.outputs.extend(body_out)
    new = ir.Node(node.domain, node.op_type, inputs, attributes=list(node.attributes.values()),
                  num_outputs=len(kept) + len(flats), name=f"{node.name}_rows", version=node.version)
    for j, value in zip(kept, new.outputs):
        value.name, value.type, value.shape = f"{node.outputs[j].name}_rows", node.outputs[j].type, node.outputs[j].shape
    node.graph.insert_before(node, new)
    for k in range(len(node.inputs)):  # no longer a reader of the values only it read
        node.replace_input_with(k, None)
    node.graph.remove(node)
    return list(new.outputs[len(kept):])


def _layout(node: ir.Node) -> tuple[int, int, int]:
    """The Loop's or Scan's body outputs before its carried values (a Loop's condition), node and body inputs
    before them (a Loop's trip count and condition) and the number of carried values."""
    loop = node.op_type == "Loop"
    return (1, 2, len(node.inputs) - 2) if loop else (0, 0, len(node.inputs) - _scanned(node))


def _carried(node: ir.Node, values: Sequence[ir.Value]) -> tuple[list[int], set[ir.Value]]:
    """The carried values of the Loop or Scan ``node`` (their positions) whose body computes ``values`` from them,
    at that iteration or an earlier one, and the values of the body (outer ones included) it computes them from."""
    inner, (lead, first_in, states) = body(node), _layout(node)
    keep: set[int] = set()
    while True:
        read = needed_values(inner, [*values, *(inner.outputs[lead + j] for j in keep)])[0]
        more = {j for j in range(states) if inner.inputs[first_in + j] in read} - keep
        if not more:
            return sorted(keep), read
        keep |= more


def _conds(inner: ir.Graph, written: Sequence[ir.Node]) -> dict[ir.Node, list[ir.Node]]:
    """``{If of the body inner: the write-backs of written its branches make}``."""
    found: dict[ir.Node, list[ir.Node]] = {}
    for node in inner:
        inside = [s for s in written if any(s.graph is sub for sub in subgraphs(node))]
        if node.op_type == "If" and inside:
            found[node] = inside
    return found


def refuse_batch_predicates(graph: ir.Graph, node: ir.Node, written: Sequence[ir.Node], data: Sequence[str]) -> None:
    """An ArtifactsError where an If in the body of the Loop or Scan ``node`` (of ``graph``, the main graph), whose
    branches make write-backs among ``written``, has a predicate that reads a batch input of ``data``: through
    the carried values, the scanned inputs or the outer values it reads."""
    inner, (_, first_in, states) = body(node), _layout(node)
    for cond, inside in _conds(inner, written).items():
        kept, read = _carried(node, [cond.inputs[0]])
        scanned = [node.inputs[k] for k in range(states, len(node.inputs)) if inner.inputs[first_in + k] in read] \
            if node.op_type == "Scan" else []
        outer = [v for v in read if v in graph.inputs or (v.producer() is not None and v.producer().graph is graph)]
        batch = [v.name for v in batch_read(graph, [*(node.inputs[first_in + j] for j in kept), *scanned, *outer],
                                            data)]
        if batch:
            param, at = where(inside)
            raise ArtifactsError(
                f"the embedding of {param!r} with max_norm at {at} renormalises rows in a gc.cond branch (node "
                f"{cond.name!r}) inside the body of node {node.name!r} (a gc.fori_loop/gc.while_loop/gc.scan) whose "
                f"predicate reads the batch ({batch}): each worker would compute it at each iteration from its own "
                "shard, one process from the whole batch, and the two differ in general, so the workers would "
                "renormalise rows one process does not; the workers compute a main-graph gc.cond's predicate from the "
                "whole batch, not yet one inside a loop's body; make the predicate read no batch input (the loop's "
                "counter, a param, a constant) or train with one worker")


def _true(node: ir.Node) -> ir.Value:
    """A bool Constant true inserted before ``node``: a Loop's condition where it has none (always true)."""
    const = ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(True))], name=f"{node.name}_true")
    const.outputs[0].name, const.outputs[0].type = f"{node.name}_true", ir.TensorType(ir.DataType.BOOL)
    const.outputs[0].shape = ir.Shape([])
    node.graph.insert_before(node, const)
    return const.outputs[0]


def _scanned(node: ir.Node) -> int:
    return node.attributes["num_scan_inputs"].as_int()


def at_union(graph: ir.Graph, e: Emitter, node: ir.Node, scatter: ir.Node,
             made_at: Callable[[Emitter, ir.Node, ir.Value], None]) -> None:
    """The write-back ``scatter`` in the body of ``node`` (a Loop or Scan of ``graph``) made at the rows of a
    new int64 input ``<flat>.steps`` [steps, rows] (-1: none): its iteration's row, without the -1s, goes to
    ``made_at(emitter, scatter, rows)``, which clones the renormalisation to read them."""
    inner = body(node)
    name = f"{scatter.inputs[1].name}{STEPS}"
    union = ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([None, f"{name}_rows"]))
    graph.inputs.append(union)
    b = Emitter(scatter.graph, e.opset, e.scope, names=e._names)  # the body's, or a gc.cond branch's in it
    if node.op_type == "Loop":
        row = b.op("Gather", union, inner.inputs[0], axis=0)
    else:
        row = ir.Value(name=e.fresh("union_row"), type=union.type, shape=ir.Shape([f"{name}_rows"]))
        inner.inputs.append(row)
        node.resize_inputs(len(node.inputs) + 1)
        node.replace_input_with(len(node.inputs) - 1, union)
        node.attributes["num_scan_inputs"] = ir.AttrInt64("num_scan_inputs", _scanned(node) + 1)
        for key in ("scan_input_axes", "scan_input_directions"):
            if key in node.attributes:
                node.attributes[key] = ir.AttrInt64s(key, [*node.attributes[key].as_ints(), 0])
    made_at(b, scatter, b.op("Compress", row, b.op("GreaterOrEqual", row, b.const(0, ir.DataType.INT64))))


def in_bodies(graph: ir.Graph, written: Callable[[ir.Node], bool]) -> dict[ir.Node, list[ir.Node]]:
    """``{If, Loop or Scan of graph: the write-backs (``written``) its branches or body make}`` (a Loop's or Scan's
    include those of an If's branches in its body); an ArtifactsError for one a body nested deeper makes (the
    workers cannot yet agree on those rows before the forward)."""
    found: dict[ir.Node, list[ir.Node]] = {}
    for node in graph:
        for sub in subgraphs(node):
            branches = {id(b) for n in sub if n.op_type == "If" for b in subgraphs(n)} if node.op_type in _LOOPS else set()
            for inner in ir.traversal.RecursiveGraphIterator(sub):
                if inner.op_type != "ScatterND" or not written(inner):
                    continue
                if inner.graph is not sub and id(inner.graph) not in branches:
                    raise ArtifactsError(
                        f"an embedding with max_norm renormalises rows inside a body nested in another (in node "
                        f"{node.name!r}): the workers make a write-back at the union of their shards' rows in a "
                        "gc.cond branch or at each iteration of a gc.fori_loop/gc.while_loop/gc.scan body of the main "
                        "graph, or of a gc.cond branch directly in such a body, not yet nested deeper (a loop in a "
                        "loop, a gc.cond in a gc.cond); train with one worker")
                found.setdefault(node, []).append(inner)
    return found
