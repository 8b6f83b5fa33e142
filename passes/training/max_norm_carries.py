"""The parts of an embedding's ``max_norm`` write-backs that the inference and eval graphs do not need.

The training graphs step a param from the weight its lookups leave renormalised and send a later read's
gradient to the weight through a straight-through sum, ``new + (weight - detach(weight))``; a graph that is
never differentiated needs neither. ``strip`` makes each write-back's weight its new value (no whole-table
Sub and Add), drops an If's output of the weight that nothing reads, and drops the weight a Loop or Scan
carries when nothing reads it after the node, every read of it in the body (nested bodies excluded) is a
lookup with ``max_norm``, and all of them have the same ``max_norm`` and ``norm_type``: each lookup then
reads the weight as it was before the node. A row an earlier lookup renormalised comes out the same from
the weight as it was (the same ops on the same row), while torch renormalises the renormalised row again:
a no-op in float64 for rows whose norm is under 1e8, up to 1e-7/max_norm + 2 ulps in float32 (docs/api.md).
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from graphc.passes.values import MAX_NORM_KEY, MAX_NORM_LOOKUP_KEY, replace_value, stops_gradient

__all__ = ["strip"]


def strip(model: ir.Model) -> None:
    """``model`` (an inference or eval graph) without the write-backs it does not need (the module's
    docstring), in place."""
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if MAX_NORM_KEY in node.metadata_props:
            new = node.outputs[0]
            for use, at in list(new.uses()):
                if use.op_type == "Add" and at == 0 and _straight_through(use.inputs[1]):
                    replace_value(use.outputs[0], new)
    RemoveUnusedNodesPass()(model)
    for node in list(model.graph):
        if node.op_type in ("Loop", "Scan"):
            _drop_carries(node)
        elif node.op_type == "If":
            _drop_if_outputs(node)
    RemoveUnusedNodesPass()(model)


def _straight_through(value: ir.Value) -> bool:
    """Whether ``value`` is ``Sub(w, detach(w))``: zero, with ``w``'s gradient."""
    sub = value.producer()
    if sub is None or sub.op_type != "Sub":
        return False
    detached = sub.inputs[1].producer()
    return detached is not None and stops_gradient(detached) and detached.inputs[0] is sub.inputs[0]


def _drop_carries(node: ir.Node) -> None:
    """The carried weights of the Loop or Scan ``node`` that nothing reads after it and whose body only
    looks up with one ``max_norm`` and ``norm_type``, dropped: the lookups read the weight from before."""
    body = node.attributes["body"].as_graph()
    first_in, first_out = (2, 1) if node.op_type == "Loop" else (0, 0)
    states = len(node.inputs) - (2 if node.op_type == "Loop" else node.attributes.get_int("num_scan_inputs", 0))
    for j in reversed(range(states)):
        out = node.outputs[j]
        if out.uses() or out.is_graph_output():
            continue
        lookups = _lookups(body, body.inputs[first_in + j], body.outputs[first_out + j])
        if not lookups or len({g.metadata_props[MAX_NORM_LOOKUP_KEY] for g in lookups}) != 1:
            continue
        for gather in lookups:
            gather.replace_input_with(0, node.inputs[first_in + j])
        body.outputs.pop(first_out + j)
        body.inputs.pop(first_in + j)  # read now by the dead write-backs only, which strip removes
        node = _without(node, j, first_in + j)


def _lookups(body: ir.Graph, state: ir.Value, last: ir.Value) -> list[ir.Node] | None:
    """The ``max_norm`` lookups (their Gathers) of the carried weight ``state`` in ``body`` and of the
    values its write-backs make of it, the last of which the body outputs as ``last``; None where
    anything else reads them, no write-back leads to ``last``, or a nested body reads them."""
    lookups: list[ir.Node] = []
    todo, seen, reached, wrote = [state], set(), False, False
    while todo:
        value = todo.pop()
        if value in seen:
            continue
        seen.add(value)
        if value in body.outputs:
            if value is not last:
                return None
            reached = True
        for use, at in value.uses():
            if use.graph is not body:
                return None
            if use.op_type == "Gather" and at == 0 and MAX_NORM_LOOKUP_KEY in use.metadata_props:
                lookups.append(use)
            elif use.op_type == "Identity" or (use.op_type == "ScatterND" and at == 0 and _writes_back(use)):
                wrote = wrote or use.op_type == "ScatterND"
                todo.append(use.outputs[0])
            else:
                return None
    return lookups if reached and wrote else None


def _writes_back(scatter: ir.Node) -> bool:
    """Whether ``scatter``'s only reader is a write-back's new weight (marked ``MAX_NORM_KEY``)."""
    uses = scatter.outputs[0].uses()
    return len(uses) == 1 and MAX_NORM_KEY in uses[0].node.metadata_props


def _drop_if_outputs(node: ir.Node) -> None:
    """The outputs of the If ``node`` that carry a renormalised weight out and that nothing reads, dropped."""
    branches = [node.attributes[k].as_graph() for k in ("then_branch", "else_branch")]
    for j in reversed(range(len(node.outputs))):
        out = node.outputs[j]
        if out.uses() or out.is_graph_output() or not any(_renormed(b.outputs[j]) for b in branches):
            continue
        for branch in branches:
            branch.outputs.pop(j)
        node = _without(node, j)


def _renormed(value: ir.Value) -> bool:
    """Whether ``value`` is a write-back's new weight, or an Identity of one."""
    node = value.producer()
    if node is not None and node.op_type == "Identity" and MAX_NORM_KEY not in node.metadata_props:
        node = node.inputs[0].producer()
    return node is not None and MAX_NORM_KEY in node.metadata_props


def _without(node: ir.Node, output: int, input_: int | None = None) -> ir.Node:
    """``node`` replaced in its graph by one without its ``output``-th output (which nothing reads) and,
    where given, its ``input_``-th input."""
    inputs = [v for k, v in enumerate(node.inputs) if k != input_]
    new = ir.Node(node.domain, node.op_type, inputs, attributes=list(node.attributes.values()),
                  num_outputs=len(node.outputs) - 1, name=node.name, version=node.version)
    new.metadata_props.update(node.metadata_props)
    node.graph.insert_before(node, new)
    for old, value in zip([v for k, v in enumerate(node.outputs) if k != output], new.outputs):
        value.type, value.shape = old.type, old.shape
        name, old.name = old.name, None
        replace_value(old, value)
        value.name = name
    node.graph.remove(node, safe=True)
    return new
