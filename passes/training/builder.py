"""A small node emitter for the training passes: appends ``ai.onnx`` nodes to an ``ir.Graph``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

# Ops whose ``axes`` moved from an attribute to an input at this opset.
_AXES_AS_INPUT_SINCE = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "ReduceMean": 18,
                        "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18}


class Builder:
    """Appends nodes at the end of ``graph`` (callers sort the graph afterwards), naming every
    value ``<prefix><op>_<n>`` so training graphs read well and names never collide, and
    recording each output's dtype (the loss and update code reads it back)."""

    def __init__(self, graph: ir.Graph, opset: int, prefix: str = "train/"):
        self.graph = graph
        self.opset = opset
        self.prefix = prefix
        self._count = 0
        self._consts: dict[tuple, ir.Value] = {}
        self._taken = {v.name for v in _all_values(graph)}

    def fresh(self, hint: str) -> str:
        while True:
            name = f"{self.prefix}{hint}_{self._count}"
            self._count += 1
            if name not in self._taken:
                self._taken.add(name)
                return name

    def op(self, op_type: str, *inputs: ir.Value | None, dtype: ir.DataType | None = None,
           name: str | None = None, **attrs) -> ir.Value:
        """One node with one output named ``name`` (default: the node's name); the output's
        dtype is ``dtype`` or follows from the op (Cast's ``to``, bool for comparisons, ...)."""
        attributes = {k: v for k, v in attrs.items() if v is not None}
        node_name = self.fresh(op_type)
        out = ir.Value(name=name or node_name)
        self._taken.add(out.name)
        node = ir.node(op_type, list(inputs), attributes, outputs=[out], name=node_name)
        out.dtype = dtype if dtype is not None else _infer_dtype(op_type, inputs, attributes)
        self.graph.append(node)
        return out

    def const(self, value, dtype: ir.DataType | np.dtype | None = None, hint: str = "const") -> ir.Value:
        """A ``Constant`` node holding ``value`` (cast to ``dtype``); equal constants are shared."""
        np_dtype = dtype.numpy() if isinstance(dtype, ir.DataType) else dtype
        array = np.asarray(value, dtype=np_dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key in self._consts:
            return self._consts[key]
        name = self.fresh(hint)
        out = ir.Value(name=name)
        self._taken.add(name)
        tensor = ir.tensor(array, name=name)
        node = ir.node("Constant", [], {"value": tensor}, outputs=[out], name=name)
        out.dtype = tensor.dtype
        out.shape = ir.Shape(array.shape)
        self.graph.append(node)
        self._consts[key] = out
        return out

    def scalar_like(self, value: float, like: ir.Value, hint: str = "c") -> ir.Value:
        return self.const(value, like.dtype, hint)

    def axes_op(self, op_type: str, x: ir.Value, axes: Sequence[int] | None, **attrs) -> ir.Value:
        """Reduce*/Squeeze/Unsqueeze with ``axes`` as an attribute or an input per the opset."""
        if axes is None:
            return self.op(op_type, x, **attrs)
        if self.opset >= _AXES_AS_INPUT_SINCE.get(op_type, 10**6):
            return self.op(op_type, x, self.const(list(axes), np.int64, "axes"), **attrs)
        return self.op(op_type, x, axes=list(axes), **attrs)


_BOOL_OPS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"})


def _infer_dtype(op_type: str, inputs, attributes) -> ir.DataType | None:
    if op_type == "Cast":
        return ir.DataType(attributes["to"])
    if op_type in _BOOL_OPS:
        return ir.DataType.BOOL
    if op_type in ("Shape", "Size"):
        return ir.DataType.INT64
    if op_type == "Where":
        inputs = inputs[1:]
    first = next((v for v in inputs if v is not None), None)
    return first.dtype if first is not None else None


def _all_values(graph: ir.Graph):
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in ir.traversal.RecursiveGraphIterator(graph):
        yield from node.outputs
