"""A model's structure, without its weights: what a checkpoint records of the inference graph its
tensors were trained in, so graphs regenerated in its place as another model (the same tensor
names, another op) are refused rather than given its weights.

``of`` reads it: every node of the main graph as its op type and a short hash of its attributes
(subgraphs included) and of where its inputs come from (a graph input or initializer by name,
another node's output by that node's index), and one hash of the graph's inputs and outputs
(names, dtypes) and initializers (names, dtypes, shapes; not their values). Value names inside
the graph, node names, metadata and the ``seed`` of ONNX's random ops (drawn from the capture's
seed: the model captured with another seed is the same model) are left out, and so is the ai.onnx
opset, recorded beside: one model lowered alike at two opsets is the same structure, lowered
otherwise (GELU as one op from opset 20, as Erf and Muls before) it differs, and ``difference``,
which names the first thing two differ in, then names both opsets first.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

import numpy as np
import onnx_ir as ir
from pydantic import BaseModel, ConfigDict

__all__ = ["GraphStructure", "difference", "of"]

_HASH_CHARS = 8  # per node: a chance of 2**-32 that a changed node keeps its hash


class GraphStructure(BaseModel):
    """The structure ``of`` a model's graph, as a checkpoint header records it."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[str]  # per node of the main graph, in order: "OpType:hash" (``domain::OpType`` outside ai.onnx)
    values: str       # hash of its inputs, outputs and initializers: names, dtypes, initializer shapes
    opset: Optional[int] = None  # the ai.onnx opset it was generated at; None: not kept (a header from before)


def of(model: ir.Model) -> GraphStructure:
    """The structure of ``model``'s main graph."""
    graph = model.graph
    where: dict[ir.Value, str] = {}
    return GraphStructure(nodes=_nodes(graph, where, ""), values=_hash(_values(graph, where)),
                          opset=graph.opset_imports.get("", graph.opset_imports.get("ai.onnx")))


def difference(saved: GraphStructure, found: GraphStructure) -> Optional[str]:
    """What ``found`` (the graphs now) differs from ``saved`` (the graphs a checkpoint was saved
    with) in, first: a node, the number of nodes, or the inputs, outputs and initializers; led by
    both opsets where those differ too (regenerating at the checkpoint's opset shows whether the
    lowering is all that differs); None if they are the same."""
    problem = _first_difference(saved, found)
    if problem is None or None in (saved.opset, found.opset) or saved.opset == found.opset:
        return problem
    return (f"the graphs were generated at opset {found.opset}, the checkpoint at opset {saved.opset}, where ops "
            f"may be lowered otherwise (first difference: {problem}); regenerate them at opset {saved.opset} "
            f"(gc.capture(..., opset={saved.opset}), graphc capture --opset {saved.opset})")


def _first_difference(saved: GraphStructure, found: GraphStructure) -> Optional[str]:
    for index, (was, now) in enumerate(zip(saved.nodes, found.nodes)):
        if was != now:
            op_was, op_now = was.rpartition(":")[0], now.rpartition(":")[0]
            if op_was != op_now:
                return f"node {index} is {op_now} in the graphs, {op_was} when the checkpoint was saved"
            return f"node {index} ({op_now}) has other attributes or inputs than when the checkpoint was saved"
    if len(saved.nodes) != len(found.nodes):
        return f"the graphs have {len(found.nodes)} nodes, {len(saved.nodes)} when the checkpoint was saved"
    if saved.values != found.values:
        return ("the graphs' inputs, outputs or initializers differ in name, dtype or shape from those when the "
                "checkpoint was saved")
    return None


def _nodes(graph: ir.Graph, where: dict[ir.Value, str], scope: str) -> list[str]:
    """``graph``'s nodes as ``GraphStructure.nodes`` holds them; ``where`` (value -> how it is
    named here) gains its inputs, initializers and nodes' outputs, the latter by ``scope`` (where
    a subgraph is: its node's index and attribute), node index and output index."""
    for value in [*graph.inputs, *graph.initializers.values()]:
        where[value] = f"={value.name}"
    out = []
    for index, node in enumerate(graph):
        standard = node.domain in ("", "ai.onnx")  # where ``seed`` is a random op's only
        op = node.op_type if standard else f"{node.domain}::{node.op_type}"
        described = [op, node.overload, [where.get(v, "?") if v is not None else "" for v in node.inputs],
                     [_attribute(a, where, f"{scope}{index}.{name}/") for name, a in sorted(node.attributes.items())
                      if name != "seed" or not standard]]
        out.append(f"{op}:{_hash(described)[:_HASH_CHARS]}")
        for port, value in enumerate(node.outputs):
            where[value] = f"#{scope}{index}.{port}"
    return out


def _values(graph: ir.Graph, where: dict[ir.Value, str]) -> list:
    return [[(v.name, _dtype(v)) for v in graph.inputs], [(v.name, where.get(v, "?")) for v in graph.outputs],
            sorted((name, *_tensor_type(v)) for name, v in graph.initializers.items())]


def _attribute(attr: Any, where: dict[ir.Value, str], scope: str) -> list:
    """An attribute as data to hash: floats as float32 (as a file holds them), tensors by bytes,
    graphs by their own nodes and values."""
    if attr.is_ref():
        return [attr.name, "ref", attr.ref_attr_name]
    kind, value = attr.type, attr.value
    if kind in (ir.AttributeType.FLOAT, ir.AttributeType.FLOATS):
        value = np.asarray(value, np.float32).tobytes()
    elif kind in (ir.AttributeType.TENSOR, ir.AttributeType.TENSORS):
        tensors = value if kind == ir.AttributeType.TENSORS else [value]
        value = [(int(t.dtype), tuple(t.shape), t.tobytes()) for t in tensors]
    elif kind in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        graphs = value if kind == ir.AttributeType.GRAPHS else [value]
        value = [(_nodes(g, where, f"{scope}{i}/"), _values(g, where)) for i, g in enumerate(graphs)]
    elif kind in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
        value = list(value)
    return [attr.name, int(kind), value]


def _dtype(value: ir.Value | ir.TensorProtocol) -> Optional[int]:
    return None if value.dtype is None else int(value.dtype)


def _tensor_type(value: ir.Value) -> tuple:
    """An initializer's dtype and shape, from its tensor where it holds one, else from the value:
    one form either way (static dims as ints, symbolic ones by name), so a held tensor and an
    unheld value of the same type hash alike."""
    typed = value.const_value if value.const_value is not None else value
    shape = typed.shape
    return _dtype(typed), (None if shape is None else tuple(d if isinstance(d, int) else str(d) for d in shape))


def _hash(data: Any) -> str:
    return hashlib.sha256(repr(data).encode()).hexdigest()[:16]
