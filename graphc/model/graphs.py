"""Walking a model's graphs: every subgraph (If branches, Loop and Scan bodies, local functions), and the
names a node reads."""

from __future__ import annotations

from collections.abc import Iterator

import onnx

__all__ = ["all_graphs", "function_graphs", "model_graphs", "node_subgraphs", "reads"]


def node_subgraphs(nodes) -> Iterator[tuple[onnx.NodeProto, onnx.GraphProto]]:
    """(node, graph) for every graph attribute of ``nodes`` (If branches, Loop/Scan bodies) and, after
    each, the ones nested in it, outer first."""
    for node in nodes:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield node, sub
                yield from node_subgraphs(sub.node)


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it (If branches, Loop/Scan bodies), outer first."""
    yield graph
    yield from (sub for _, sub in node_subgraphs(graph.node))


def function_graphs(function: onnx.FunctionProto) -> list[onnx.GraphProto]:
    """A local function's nodes (and their subgraphs) as graphs, its inputs as the first one's inputs."""
    graph = onnx.helper.make_graph(list(function.node), function.name, [], [])
    graph.input.extend(onnx.helper.make_empty_tensor_value_info(name) for name in function.input)
    return list(all_graphs(graph))


def model_graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """Every graph of ``model`` (``all_graphs`` of the main graph, then its local functions' ``function_graphs``):
    where onnxruntime's rewrites reach, since it inlines local functions first."""
    return list(all_graphs(model.graph)) + [g for f in model.functions for g in function_graphs(f)]


def reads(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads: its inputs and those of the nodes of its subgraphs (If branches,
    Loop and Scan bodies, nested ones too; what they read from the outer scope, with their own
    names, which cannot clash with the outer ones). Not "": an omitted optional input, which an
    omitted optional output also is, reads nothing."""
    inner = (name for _, sub in node_subgraphs([node]) for n in sub.node for name in n.input)
    return {name for name in (*node.input, *inner) if name}
