"""Pads given an ``axes`` input, written with the pads of every axis in an onnxruntime session's copy.

onnxruntime 1.31's TransposeOptimizer (every optimization level but "disable") moves a Transpose
through a Pad that has the ``axes`` input (opset 18) and then indexes the pads past their end:
``Transpose -> Pad(axes) -> Transpose`` failed at run time ("indices element out of data bounds"
in a Gather it wrote), whatever the axes. A Pad that lists every axis's pads, and no ``axes``, is
moved right. So the copy states them so where the axes and pads are constants and the input's
rank is known (nodes in the main graph); the model itself is not changed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from graphc.backends.written_out import Writer
from graphc.model.file import ai_onnx_opset, constant_tensors, with_nodes
from graphc.model.inferred import TypesOf, tensor_types

__all__ = ["without_axes"]


def _has_axes(node: onnx.NodeProto) -> bool:
    return node.op_type == "Pad" and node.domain in ("", "ai.onnx") and len(node.input) > 3 and bool(node.input[3])


def without_axes(model: onnx.ModelProto, types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """A copy of ``model`` in which each main-graph Pad given ``axes``, its pads and axes constants and
    its input's rank known, lists every axis's pads instead; ``model`` itself where there is none.
    ``types_of``: how it gets ``tensor_types`` (``SharedTypes`` along a session's rewrites)."""
    if not any(_has_axes(node) for node in model.graph.node):
        return model
    consts = {name: numpy_helper.to_array(t) for name, t in constant_tensors([model.graph]).items()}
    types, opset = types_of(model) or {}, ai_onnx_opset(model)
    nodes, written_out = [], False
    for node in model.graph.node:
        rank = len(types[node.input[0]][1]) if _has_axes(node) and node.input[0] in types else None
        if rank is None or node.input[1] not in consts or node.input[3] not in consts:
            nodes.append(node)
            continue
        pads, axes = consts[node.input[1]].astype(np.int64), consts[node.input[3]].astype(np.int64) % rank
        full = np.zeros(2 * rank, np.int64)
        full[axes], full[axes + rank] = pads[:len(axes)], pads[len(axes):]
        w = Writer(node, "full_pads", opset)
        written = onnx.NodeProto()
        written.CopyFrom(node)
        del written.input[:]
        written.input.extend([node.input[0], w.const(full, np.int64), *([node.input[2]] if node.input[2] else [])])
        nodes += [*w.nodes, written]
        written_out = True
    return with_nodes(model, nodes) if written_out else model
