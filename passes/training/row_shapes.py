"""Shapes of a subgraph's values for the ``row_axes`` rules, where the model records none: an
exporter's Loop body (torch.onnx's TorchScript exporter types only the body's inputs and outputs)
leaves the ranks of its values unknown, and an elementwise rule cannot place rows of unknown rank.

``BodyShapes.add(graph)`` runs onnx's shape inference (with data propagation) on a serialized copy
of the body whose outer values are declared as inputs of their types, small constant ones (an
Unsqueeze's axes, a Slice's starts) with their values; the shapes it finds are kept beside the
model, which stays as it was. ``shape_of`` reads them through ``SHAPES`` (set for one analysis)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextvars import ContextVar

import onnx
import onnx_ir as ir

from graphc.passes.autodiff.core import captured_values
from graphc.passes.evaluate import folded_array
from graphc.passes.values import StaticShape, static_shape

__all__ = ["SHAPES", "BodyShapes", "shape_of"]

SMALL = 64  # elements of an outer constant given to the inference with its value

# the analysis's BodyShapes (``row_mixing.mixing_nodes`` sets it); None outside one
SHAPES: ContextVar[BodyShapes | None] = ContextVar("SHAPES", default=None)


class BodyShapes(dict):
    """{value: (dtype, shape)} inferred for the untyped values of the subgraphs ``add`` is given
    (each once), with the model's ``opset_imports``."""

    def __init__(self, opset_imports: Mapping[str, int]):
        super().__init__()
        self.opset_imports = [onnx.helper.make_opsetid(d, v) for d, v in opset_imports.items()]
        self.done: set[ir.Graph] = set()

    def add(self, graph: ir.Graph) -> None:
        if graph in self.done:
            return
        self.done.add(graph)
        untyped = {v.name: v for node in graph for v in node.outputs if v.name and static_shape(v) is None}
        if not untyped:
            return
        proto = ir.serde.serialize_graph(graph)
        for value in (v for v in captured_values(graph) if v.name):  # the named outer values it reads (or outputs)
            shape, dtype = shape_of(value), _dtype_of(value)
            if dtype is None:  # (onnx takes no input of unknown type: its readers stay unknown)
                continue
            proto.input.append(onnx.helper.make_tensor_value_info(
                value.name, dtype, None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]))
            if shape is not None and all(isinstance(d, int) for d in shape) and math.prod(shape) <= SMALL:
                array = folded_array(value)
                if array is not None:
                    proto.initializer.append(onnx.numpy_helper.from_array(array, value.name))
        model = onnx.helper.make_model(proto, opset_imports=self.opset_imports)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):  # the rules see unknown ranks
            return
        for info in inferred.graph.value_info:
            value = untyped.get(info.name)
            if value is not None and info.type.tensor_type.HasField("shape"):
                dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                             for d in info.type.tensor_type.shape.dim)
                self[value] = (ir.DataType(info.type.tensor_type.elem_type) or None, dims)


def _found(value: ir.Value) -> tuple[ir.DataType | None, StaticShape | None]:
    shapes = SHAPES.get()
    return (None, None) if shapes is None else shapes.get(value, (None, None))


def shape_of(value: ir.Value) -> StaticShape | None:
    """``value``'s shape as the model records it, else as ``BodyShapes`` inferred it."""
    shape = static_shape(value)
    return _found(value)[1] if shape is None else shape


def _dtype_of(value: ir.Value) -> ir.DataType | None:
    return _found(value)[0] if value.dtype is None else value.dtype

