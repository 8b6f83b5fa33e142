"""``gradient_model``: a model whose outputs add ``<param>_grad`` (what ``gc.grad`` returns)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import FLOAT_TYPES
from graphc.passes.autodiff.core import backward
from graphc.passes.autodiff.registry import RULES, settings_only
from graphc.passes.functions import expand_functions


def infer_shapes(model: ir.Model) -> ir.Model:
    """A copy of ``model`` with inferred value shapes and types (the original if inference fails)."""
    proto = ir.serde.serialize_model(model)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # noqa: BLE001  (inference is best effort: rules fall back to Shape ops)
        pass
    return ir.serde.deserialize_model(proto)


def gradient_model(model: ir.Model, loss: str, wrt: Sequence[str] | None = None) -> ir.Model:
    """A new model: ``model``'s inputs plus each ``wrt`` parameter as an input (its initializer
    is the default), and ``model``'s outputs plus ``"<param>_grad"`` for each.

    ``loss`` names a scalar float output. ``wrt`` names initializers (or float graph inputs);
    by default every floating-point initializer except those read only as op settings
    (``registry.SETTING_INPUTS``: clamp bounds, Resize scales, ...). The input model is not
    modified.
    """
    new = infer_shapes(model)
    if expand_functions(new, lambda node: node.op_type not in RULES):  # their body's ops have rules
        new = infer_shapes(new)
    graph = new.graph
    outputs = {v.name: v for v in graph.outputs}
    if loss not in outputs:
        raise GraphError(f"loss {loss!r} is not an output of the model; outputs: {sorted(outputs)}")
    if wrt is None:
        wrt = [name for name, v in graph.initializers.items() if v.dtype in FLOAT_TYPES and not settings_only(v)]
    inputs = {v.name: v for v in graph.inputs}
    params = []
    for name in wrt:
        value = graph.initializers.get(name) or inputs.get(name)
        if value is None:
            raise GraphError(f"cannot differentiate with respect to {name!r}: no initializer or input "
                             f"has that name; initializers: {sorted(graph.initializers)}")
        params.append(value)
    taken = {v.name for v in graph.outputs} | {v.name for v in graph.inputs}
    for p in params:
        if f"{p.name}_grad" in taken:
            raise GraphError(f"output name {p.name + '_grad'!r} is already used in the model")
    grads = backward(graph, outputs[loss], params)
    for p in params:
        if not p.is_graph_input():
            graph.inputs.append(p)
        node = ir.node("Identity", [grads[p.name]], name=f"{p.name}_grad/Identity")
        node.outputs[0].name = f"{p.name}_grad"
        node.outputs[0].shape, node.outputs[0].type = p.shape, p.type
        graph.append(node)
        graph.outputs.append(node.outputs[0])
    return new
