"""The ort-cpu session's copy of a model: its nodes moved onto faster kernels (``cpu_kernels``),
and without the reducing ScatterND nodes the CPU provider runs with a race (``race_free``)."""

from __future__ import annotations

from typing import Any

import onnx

from graphc.backends import nchwc, transposes
from graphc.model.inferred import TypesOf
from graphc.model.file import all_graphs

__all__ = ["cpu_kernels", "race_free"]


def cpu_kernels(model: onnx.ModelProto, blocked: bool, types_of: TypesOf) -> onnx.ModelProto:
    """The ort-cpu session's copy of ``model``, its nodes moved onto faster kernels: Transposes of
    few rows as Einsums (``transposes``) and, with ``blocked`` (level "all", whose layout
    transforms the NCHWc ops are), Convs with fed weights on the NCHWc kernels (``nchwc``); one
    shape inference for both (``types_of(model)``), and none where neither has a node to look at."""
    ops = {node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx")}
    if "Transpose" not in ops and not (blocked and "Conv" in ops):
        return model
    types = types_of(model)
    if types is None:
        return model
    model, _ = transposes.rewrite(model, types)
    if blocked:
        model, _ = nchwc.rewrite(model, nchwc.block_size(), types=types)
    return model


def race_free(model: onnx.ModelProto, options: Any) -> onnx.ModelProto:
    """``model`` without the reducing ScatterND nodes onnxruntime's CPU provider runs with a race
    (``graphc.passes.scatters``): those of the main graph are rewritten as ScatterElements (ranks
    from onnx's shape inference); where one is left (in a subgraph, or of unknown rank) the
    session runs single-threaded instead. ``model`` itself is not changed."""
    def reducing(graph: onnx.GraphProto) -> int:
        return sum(node.op_type == "ScatterND" and node.domain in ("", "ai.onnx") and any(
            a.name == "reduction" and a.s.decode() != "none" for a in node.attribute) for node in graph.node)

    outer = reducing(model.graph)
    left = sum(reducing(g) for g in all_graphs(model.graph) if g is not model.graph)
    if outer:
        import onnx_ir as ir

        from graphc.passes.scatters import scatter_nd_as_elements

        try:
            typed = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))
        except (onnx.shape_inference.InferenceError, ValueError):  # over 2 GiB, or inconsistent
            left += outer
        else:
            left += scatter_nd_as_elements(typed)[1]
            model = ir.serde.serialize_model(typed)
    if left:
        options.intra_op_num_threads = 1
    return model
