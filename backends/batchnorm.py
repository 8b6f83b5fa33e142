"""Training-mode BatchNormalization written out for onnxruntime, in a session's copy of a model.

onnxruntime 1.31's CPU session gets a BatchNormalization with ``training_mode=1`` wrong under
its graph optimizations (any level but "disable") where, as in a fresh BatchNorm, bias and
running mean are equal constants (zeros) and the running statistics are not read: a
``gc.capture(..., training=True)`` BatchNorm2d came out 1.1 off torch, its channel means 0.1, not
0 (right with a running mean of 0.25, or with optimizations off); onnxruntime documents no
training-mode kernel outside its training builds. The session's copy computes
the batch statistics in standard ops instead, as the numpy kernel does: ``y = (x - mean) /
sqrt(var + eps) * scale + bias`` (biased variance; a float64 eps and momentum the float32
attributes round from the node's metadata, ``exact_attributes``) and, where they are read, the
running statistics ``m * running + (1 - m) * batch``. Training graphs from ``gc.training.generate`` have
no such node (``passes/training/modes.py`` lowers them itself), so this leaves them as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphc.backends.written_out import Writer
from graphc.errors import BackendError
from graphc.model.file import ai_onnx_opset, with_nodes
from graphc.model.inferred import TypesOf, tensor_types
from graphc.passes.values import exact_attributes

__all__ = ["lower_training_mode"]


def _training_mode(node: onnx.NodeProto) -> bool:
    return node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") and any(
        a.name == "training_mode" and a.i for a in node.attribute)


def lower_training_mode(model: onnx.ModelProto, backend: str, types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """``model`` itself when its main graph has no training-mode BatchNormalization, else a copy
    with each written out (the module docstring); ``BackendError`` where an input's type is
    unknown. ``types_of``: how it gets ``tensor_types`` (``SharedTypes`` along a session's rewrites)."""
    if not any(_training_mode(node) for node in model.graph.node):
        return model
    types = types_of(model) or {}
    nodes = []
    for node in model.graph.node:
        nodes += _written_out(node, types, ai_onnx_opset(model), backend) if _training_mode(node) else [node]
    return with_nodes(model, nodes)


def _written_out(node: onnx.NodeProto, types: dict, opset: int, backend: str) -> list[onnx.NodeProto]:
    x, scale, bias, mean_in, var_in = node.input[:5]
    if x not in types or mean_in not in types:
        raise BackendError(f"{backend} cannot run the training-mode BatchNormalization {node.name!r}: the type of "
                           f"its input {x!r} or of its running mean {mean_in!r} is unknown")
    (elem, dims), stat_elem = types[x], types[mean_in][0]
    attrs = exact_attributes(node, {"epsilon": 1e-5, "momentum": 0.9,
                                    **{a.name: helper.get_attribute_value(a) for a in node.attribute}})
    eps, m = attrs["epsilon"], attrs["momentum"]
    axes = [0, *range(2, len(dims))]
    w = Writer(node, "bn_train", opset)
    op, const = w.op, w.const
    x_type = helper.tensor_dtype_to_np_dtype(elem)
    mean = w.reduce_mean(x, axes)  # keeps dims: [1, C, 1, ...]
    centred = op("Sub", x, mean)
    var = w.reduce_mean(op("Mul", centred, centred), axes)
    per_channel = const([-1] + [1] * (len(dims) - 2), np.int64)
    normed = op("Div", centred, op("Sqrt", op("Add", var, const(eps, x_type))))
    y = op("Add", op("Mul", normed, op("Reshape", scale, per_channel)), op("Reshape", bias, per_channel))
    outputs = [y]
    stat_type = helper.tensor_dtype_to_np_dtype(stat_elem)
    for batch, running in ((mean, mean_in), (var, var_in))[:len(node.output) - 1]:
        batch = op("Reshape", batch, const([-1], np.int64))
        if stat_elem != elem:
            batch = op("Cast", batch, to=stat_elem)
        outputs.append(op("Add", op("Mul", running, const(m, stat_type)), op("Mul", batch, const(1 - m, stat_type))))
    for old, new in zip(node.output, outputs):
        if old:
            op("Identity", new, output=old)
    return w.nodes
