"""Double-precision MeanVarianceNormalization written out for onnxruntime, in a session's copy of a model.

onnxruntime 1.31 has no double kernel for MeanVarianceNormalization ("Could not find an
implementation for MeanVarianceNormalization(13)"), and so cannot load such a model. The session's
copy computes it in standard ops instead, as the numpy kernel does: ``y = (x - mean) / (std + 1e-9)``,
the mean and the (biased) standard deviation over ``axes`` (default [0, 2, 3]). Nodes in the main
graph only; float, float16 and bfloat16 ones run on onnxruntime's kernel.
"""

from __future__ import annotations

import numpy as np
import onnx

from graphc.backends.written_out import Writer
from graphc.model.file import ai_onnx_opset, tensor_types, with_nodes

__all__ = ["lower_double"]


def _is_mvn(node: onnx.NodeProto) -> bool:
    return node.op_type == "MeanVarianceNormalization" and node.domain in ("", "ai.onnx")


def lower_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when its main graph has no double MeanVarianceNormalization, else a copy with
    each written out (the module docstring)."""
    if not any(_is_mvn(node) for node in model.graph.node):
        return model
    types = tensor_types(model) or {}

    def double(node: onnx.NodeProto) -> bool:
        return _is_mvn(node) and types.get(node.input[0], (None,))[0] == onnx.TensorProto.DOUBLE

    if not any(double(node) for node in model.graph.node):
        return model
    opset = ai_onnx_opset(model)
    return with_nodes(model, [n for node in model.graph.node
                              for n in (_written_out(node, opset) if double(node) else [node])])


def _written_out(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), [0, 2, 3])
    w = Writer(node, "mvn", opset)
    centred = w.op("Sub", node.input[0], w.reduce_mean(node.input[0], axes))
    std = w.op("Sqrt", w.reduce_mean(w.op("Mul", centred, centred), axes))
    w.op("Div", centred, w.op("Add", std, w.const(1e-9, np.float64)), output=node.output[0])
    return w.nodes
