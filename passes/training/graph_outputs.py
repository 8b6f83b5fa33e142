"""Graph inputs and outputs of the training graphs: initializers made inputs with defaults, values
exposed under the names the manifest lists (``artifacts``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.training.loss_graph import LOSS
from graphc.passes.values import onnx_opset


def input_with_default(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name),
                     type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), shape=ir.Shape(array.shape))
    graph.register_initializer(value)
    graph.inputs.append(value)
    return value


def expose_inputs(graph: ir.Graph, names: Sequence[str]) -> None:
    """Make these initializers graph inputs (the initializer stays as the default)."""
    current = set(graph.inputs)
    for n in names:
        value = graph.initializers[n]
        if value not in current:
            graph.inputs.append(value)


def expose(graph: ir.Graph, value: ir.Value, name: str, like: ir.Value | None = None) -> str:
    """Give ``value`` the output name ``name``: rename it when it is a plain intermediate, else
    route it through an ``Identity``."""
    if value.producer() is not None and not value.is_graph_output() and not value.is_graph_input() \
            and value.name not in graph.initializers and not is_exposed_name(value.name):
        value.name = name
    else:
        value = Emitter(graph, onnx_opset(graph, 0), "out").op("Identity", value, name=name)
    if like is not None:
        value.dtype, value.shape = like.dtype, like.shape
    graph.outputs.append(value)
    return name


def is_exposed_name(name: str | None) -> bool:
    return bool(name) and (name == LOSS or name.endswith(".next") or name.endswith("_grad"))


def set_outputs(graph: ir.Graph, outputs: Sequence) -> None:
    """The graph's outputs, in the order of ``outputs`` (``artifacts.Output``s, by name)."""
    current = {v.name: v for v in graph.outputs}
    chosen = [current.get(o.name) or by_name(graph, o.name) for o in outputs]
    graph.outputs.clear()
    graph.outputs.extend(chosen)


def by_name(graph: ir.Graph, name: str) -> ir.Value:
    for v in graph.inputs:
        if v.name == name:
            return v
    if name in graph.initializers:
        return graph.initializers[name]
    for node in graph:
        for v in node.outputs:
            if v.name == name:
                return v
    raise KeyError(name)


__all__ = ["by_name", "expose", "expose_inputs", "input_with_default", "is_exposed_name", "set_outputs"]
