"""One node written out in standard ops, in a backend's copy of a model (``batchnorm``, ``narrow_casts``, ``integers``,
``doubles``, ``mvn``, ``pools``, ``scans``).

``Writer`` appends each new node to ``nodes`` (or to a list of the caller's, such as a branch's
body), names it after the node's first output and a tag, and stamps it with the node's metadata
(the user's line, for errors); ``constant(name)`` reads an initializer's (not fed) or a Constant node's
value (``lower_doubles`` gives the model's ``constant_tensors``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphc.model.file import ai_onnx_opset, all_graphs, constant_tensors
from graphc.model.inferred import TypesOf, tensor_types

__all__ = ["Writer", "log1p", "lower_doubles", "lower_written", "replace_nodes"]


class Writer:
    def __init__(self, node: onnx.NodeProto, tag: str, opset: int,
                 constants: Mapping[str, onnx.TensorProto] | None = None):
        self.node, self.prefix, self.opset = node, f"{node.output[0] or node.name}/{tag}/", opset
        self._constants = constants or {}
        self.nodes: list[onnx.NodeProto] = []
        self._names = itertools.count()

    def op(self, op_type: str, *inputs: str, output: str | list[str] | None = None,
           into: list[onnx.NodeProto] | None = None, **attrs) -> str:
        """Append one node to ``into`` (default ``nodes``); returns its first output's name. Its outputs are
        ``output`` (one name or a list), else one fresh name."""
        name = f"{self.prefix}{next(self._names)}"
        outputs = output if isinstance(output, list) else [output or name]
        made = helper.make_node(op_type, list(inputs), outputs, name, **attrs)
        made.metadata_props.extend(self.node.metadata_props)
        (self.nodes if into is None else into).append(made)
        return outputs[0]

    def const(self, value, dtype) -> str:
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype)))

    def constant(self, name: str) -> np.ndarray | None:
        """The value of the initializer or Constant node ``name``; None where it is neither (or ``name`` is "")."""
        tensor = self._constants.get(name) if name else None
        return None if tensor is None else numpy_helper.to_array(tensor)

    def log1p(self, u: str) -> str:
        """log(1 + u) of a double ``u`` (``log1p``)."""
        return log1p(self, u)

    def expm1(self, v: str) -> str:
        """exp(v) - 1 of a double ``v``, as (u - 1) v / log(u), u = exp(v) (Kahan): accurate near 0."""
        one = self.const(1.0, np.float64)
        u = self.op("Exp", v)
        below = self.op("Sub", u, one)
        ratio = self.op("Div", self.op("Mul", below, v), self.op("Log", u))
        # u - 1 == -1 (v far below 0): -1 itself; u infinite: u; u == 1: v
        held = self.op("Where", self.op("Equal", below, self.const(-1.0, np.float64)), below, ratio)
        held = self.op("Where", self.op("IsInf", u), u, held)
        return self.op("Where", self.op("Equal", u, one), v, held)

    def reduce_mean(self, v: str, axes: list[int]) -> str:
        """ReduceMean over ``axes`` keeping dims, the axes an input from opset 18."""
        if self.opset >= 18:
            return self.op("ReduceMean", v, self.const(axes, np.int64), keepdims=1)
        return self.op("ReduceMean", v, axes=axes, keepdims=1)


def log1p(w, u):
    """log(1 + u) of a double ``u``, as log(1 + u) * u / ((1 + u) - 1) (Goldberg): accurate near 0. ``w``
    writes the ops: a ``Writer`` (``u`` a name) or a passes ``Emitter`` (``u`` an ``ir.Value``)."""
    one = w.const(1.0, np.float64)
    wv = w.op("Add", u, one)
    scale = w.op("Where", w.op("IsInf", u), one, w.op("Div", u, w.op("Sub", wv, one)))
    return w.op("Where", w.op("Equal", wv, one), u, w.op("Mul", w.op("Log", wv), scale))


Lowering = Callable[[Writer, onnx.NodeProto, dict], None]


def lower_doubles(model: onnx.ModelProto, lowerings: Mapping[str, Lowering],
                  keep: Callable[[onnx.NodeProto], bool] | None = None, types_of: TypesOf = tensor_types
                  ) -> onnx.ModelProto:
    """``lower_written`` of the nodes of an op in ``lowerings`` with a double first input (and not one ``keep``
    keeps); ``types_of``: ``lower_written``'s."""
    return lower_written(model, lowerings, lambda node, types: types.get(node.input[0], (None,))[0] ==
                         onnx.TensorProto.DOUBLE and not (keep and keep(node)), types_of=types_of)


def lower_written(model: onnx.ModelProto, lowerings: Mapping[str, Lowering],
                  selected: Callable[[onnx.NodeProto, dict], bool], prefix: str | None = None,
                  types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """``model`` itself when no node of it (in any graph: Loop and Scan bodies, If branches) is of an ai.onnx op in
    ``lowerings`` that ``selected(node, types)`` picks, else a copy with each such node replaced by what
    ``lowerings[op_type](writer, node, types)`` writes (``types``: ``types_of(model, subgraphs=True)``, by default
    ``tensor_types``; the writer's names begin with ``prefix``, else the op type); the others run as they are."""
    if not any(node.op_type in lowerings and node.domain in ("", "ai.onnx")
               for graph in all_graphs(model.graph) for node in graph.node):
        return model
    types = types_of(model, subgraphs=True) or {}

    def chosen(node: onnx.NodeProto) -> bool:
        return node.op_type in lowerings and node.domain in ("", "ai.onnx") and selected(node, types)

    opset, constants = ai_onnx_opset(model), constant_tensors(list(all_graphs(model.graph)))

    def write(node: onnx.NodeProto) -> list[onnx.NodeProto]:
        writer = Writer(node, prefix or node.op_type.lower(), opset, constants)
        lowerings[node.op_type](writer, node, types)
        return writer.nodes

    return replace_nodes(model, chosen, write)


def replace_nodes(model: onnx.ModelProto, selected: Callable[[onnx.NodeProto], bool],
                  write: Callable[[onnx.NodeProto], list[onnx.NodeProto]]) -> onnx.ModelProto:
    """``model`` itself when ``selected`` picks no node of it (in any graph), else a copy with each
    node it picks replaced by ``write(node)``'s nodes."""
    if not any(selected(node) for graph in all_graphs(model.graph) for node in graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    # inner graphs first: rewriting a graph copies its nodes, so a body must be rewritten while its node is in place
    for graph in reversed(list(all_graphs(out.graph))):
        if not any(selected(node) for node in graph.node):
            continue
        nodes = [new for node in graph.node for new in (write(node) if selected(node) else [node])]
        del graph.node[:]
        graph.node.extend(nodes)
    return out
