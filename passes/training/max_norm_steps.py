"""Data-parallel workers' graphs for an embedding with ``max_norm`` looked up inside a Loop's or Scan's body
(``gc.fori_loop``, ``gc.while_loop``, ``gc.scan``): each iteration renormalises the rows the whole batch
looks up at that iteration, as torch's Python loop over the whole batch does.

The rows graph runs the node again, cut down to what computes each body write-back's flat indices (the
iteration counter, the carried values and scanned inputs those read), and stacks them per iteration
(``<flat>.steps``: [steps, k, 1]); the workers take each iteration's union, padded with -1 to [steps, rows]
(``graphc/runtime/distributed/renorm_rows.py``), which the gradients graph takes as an input of that name:
the body reads its iteration's row (a Loop: Gather at the counter; a Scan: one more scanned input), drops the
-1s and renormalises and writes back those rows. Indices that read the weight the body renormalises, or a
carried value computed from a param, are known only in the forward: ``max_norm_shards`` refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
from graphc.passes.emit import Emitter
from graphc.passes.values import needed_values, subgraphs

from graphc.errors import ArtifactsError

__all__ = ["STEPS", "at_union", "body", "rows_outputs"]

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
        scatters = [n for n in inner if n.name in loops[node.name]]
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
    lead = 1 if loop else 0  # body outputs before the carried values: a Loop's condition
    first_in = 2 if loop else 0  # node and body inputs before them: a Loop's trip count and condition
    states = len(node.inputs) - (2 if loop else _scanned(node))
    wanted = [inner.outputs[0]] if loop else []
    keep: set[int] = set()
    while True:  # the carried values read, transitively, by the condition and ``flats``
        read = needed_values(inner, [*wanted, *flats, *(inner.outputs[lead + j] for j in keep)])[0]
        more = {j for j in range(states) if inner.inputs[first_in + j] in read} - keep
        if not more:
            break
        keep |= more
    kept = sorted(keep)
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
    b = Emitter(inner, e.opset, e.scope, names=e._names)
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
    """``{If, Loop or Scan of graph: the write-backs (``written``) its branches or body make}``; an ArtifactsError
    for one a body nested in another makes (the workers cannot yet agree on those rows before the forward)."""
    found: dict[ir.Node, list[ir.Node]] = {}
    for node in graph:
        for sub in subgraphs(node):
            for inner in ir.traversal.RecursiveGraphIterator(sub):
                if inner.op_type != "ScatterND" or not written(inner):
                    continue
                if inner.graph is not sub:
                    raise ArtifactsError(
                        f"an embedding with max_norm renormalises rows inside a body nested in another (in node "
                        f"{node.name!r}): the workers make a write-back at the union of their shards' rows in a "
                        "gc.cond branch or at each iteration of a gc.fori_loop/gc.while_loop/gc.scan body of the main "
                        "graph, not yet in a nested one; train with one worker")
                found.setdefault(node, []).append(inner)
    return found
