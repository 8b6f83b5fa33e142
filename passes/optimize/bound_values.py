"""The values a ``gc.autograd.Function``'s backward is bound to, kept through the pipeline below level 3."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from graphc.passes.optimize.pipeline import all_nodes
from graphc.passes.values import AUTOGRAD_DOMAIN, AUTOGRAD_KEY, autograd_bound_names, fresh_name, subgraphs

__all__ = ["keep_bound_values"]


@contextlib.contextmanager
def keep_bound_values(model: ir.Model) -> Iterator[None]:
    """While the pipeline runs, the values the Function records bind by name (``inputs``, ``reads``) are
    extra outputs of the graph that makes them, as the pipeline keeps every output under its name (no pass
    folds one away, renames it or merges it with another): the backward still reads them after
    ``gc.optimize`` (a saved ``x * 1.0`` that ``x*1`` elimination would fold into ``x``, a saved value only
    the backward reads, which dead-node removal would drop), and so are the markers (one whose output
    nothing reads too). A value an If branch, Loop or Scan body makes is an extra output of that body
    (``_keep_in_bodies``). Graph inputs are kept anyway, and a model without the backwards
    (``AUTOGRAD_DOMAIN``'s functions: training artifacts) has none to keep. Afterwards the outputs are the
    model's own again."""
    if AUTOGRAD_DOMAIN not in model.opset_imports:
        yield
        return
    graph = model.graph
    kept = _made_in(graph, _bound_names(graph))
    graph.outputs.extend(kept)
    with _keep_in_bodies(graph):
        try:
            yield
        finally:
            # a slice assignment, not ``del``: onnx-ir 1.1's ``del`` leaves the values marked graph outputs
            # (the serializer then writes no value_info for them)
            graph.outputs[len(graph.outputs) - len(kept):] = []


def _bound_names(graph: ir.Graph) -> set[str]:
    """The names the Function records in ``graph`` and its subgraphs bind, and their markers' outputs (the
    backward's zero gradient for an output nothing reads takes its marker's shape)."""
    return {name for node in all_nodes(graph) if (text := node.metadata_props.get(AUTOGRAD_KEY)) is not None
            for name in (*autograd_bound_names(json.loads(text)), node.outputs[0].name)}


def _made_in(graph: ir.Graph, names: set[str]) -> list[ir.Value]:
    """The values named in ``names`` that ``graph``'s initializers or nodes make, but for its inputs and outputs."""
    values = [*graph.initializers.values(), *(v for node in graph for v in node.outputs)] if names else []
    return list(dict.fromkeys(v for v in values
                              if v.name in names and not v.is_graph_output() and not v.is_graph_input()))


@contextlib.contextmanager
def _keep_in_bodies(graph: ir.Graph) -> Iterator[None]:
    """The bound values each If branch, Loop or Scan body under ``graph`` makes, as extra body outputs
    while the pipeline runs: a Loop's or Scan's extra scan outputs, an If's extra outputs (the other
    branch giving an empty constant of the dtype in their place); the node gets as many extra outputs,
    unread. Bodies binding nothing are left as they are."""
    taken = {v.name for node in all_nodes(graph) for v in (*node.inputs, *node.outputs) if v is not None}
    undo: list[tuple[ir.Node, int, list[tuple[ir.Graph, int]], dict[str, ir.Attr]]] = []
    placeholders: list[ir.Node] = []
    for node in all_nodes(graph):
        bodies = subgraphs(node) if node.op_type in ("If", "Loop", "Scan") and node.domain in ("", "ai.onnx") else []
        kept = [_made_in(body, _bound_names(body)) for body in bodies]
        if not any(kept):
            continue
        attrs = {k: a for k in ("scan_output_axes", "scan_output_directions") if (a := node.attributes.get(k))}
        undo.append((node, len(node.outputs), [(body, len(body.outputs)) for body in bodies], attrs))
        extra = [v for values in kept for v in values]
        for body, values in zip(bodies, kept):
            body.outputs.extend(v if v in values else _placeholder(body, v, taken, placeholders) for v in extra)
        node.resize_outputs(len(node.outputs) + len(extra))
        for value, out in zip(extra, node.outputs[-len(extra):]):
            out.name, out.dtype = fresh_name(taken, f"{value.name}_kept"), value.dtype
        for key, a in attrs.items():  # a Scan's extra scan outputs: along axis 0, forward
            node.attributes[key] = ir.AttrInt64s(key, [*a.value, *[0] * len(extra)])
    try:
        yield
    finally:
        for node, count, bodies, attrs in reversed(undo):
            for body, n in bodies:
                body.outputs[n:] = []
            node.resize_outputs(count)
            node.attributes.update(attrs)
        for node in placeholders:  # where no pass folded it into something else
            if node.graph is not None and not node.outputs[0].uses() and not node.outputs[0].is_graph_output():
                node.graph.remove(node, safe=True)


def _placeholder(body: ir.Graph, value: ir.Value, taken: set[str], made: list[ir.Node]) -> ir.Value:
    """An empty constant of ``value``'s dtype made in If branch ``body`` (and added to ``made``), for the
    other branch's ``value``."""
    dtype = (value.dtype or ir.DataType.FLOAT).numpy()
    node = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(np.zeros((0,), dtype)))],
                   name=fresh_name(taken, f"{value.name}_placeholder"))
    node.outputs[0].name = node.name
    body.append(node)
    made.append(node)
    return node.outputs[0]
