"""Pools with auto_pad SAME_* and dilations given explicit pads, in an onnxruntime session's copy of a model.

ONNX pads a SAME_* pool so that its output has ceil(input / stride) positions, counting the
window's dilated extent, (kernel - 1) * dilation + 1; onnxruntime 1.31 leaves the dilations out of
those pads and returns a smaller output (MaxPool, AveragePool and LpPool of kernel [3, 2],
dilations [2, 2] on 7 x 6: 5 x 5, not 7 x 6). The session's copy states the pads ONNX computes
(the odd one at the end for SAME_UPPER, at the start for SAME_LOWER) where the input's spatial dims
are static; nodes in the main graph only.
"""

from __future__ import annotations

import onnx
from onnx import helper

from graphc.model.file import tensor_types, with_nodes

__all__ = ["explicit_same_pads"]

_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def _dilated_same(node: onnx.NodeProto) -> bool:
    attrs = {a.name: a for a in node.attribute}
    return (node.op_type in _POOLS and node.domain in ("", "ai.onnx") and "auto_pad" in attrs
            and attrs["auto_pad"].s in (b"SAME_UPPER", b"SAME_LOWER") and "dilations" in attrs
            and any(d != 1 for d in attrs["dilations"].ints))


def explicit_same_pads(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when its main graph has no dilated SAME_* pool, else a copy in which each
    whose input's spatial dims are static has explicit pads (the module docstring)."""
    if not any(_dilated_same(node) for node in model.graph.node):
        return model
    types = tensor_types(model) or {}
    nodes = [_with_pads(node, types.get(node.input[0])) if _dilated_same(node) else node for node in model.graph.node]
    return with_nodes(model, nodes)


def _with_pads(node: onnx.NodeProto, typed) -> onnx.NodeProto:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    spatial = None if typed is None else typed[1][2:]
    if not spatial or any(not isinstance(d, int) for d in spatial):
        return node
    n = len(spatial)
    kernel, dilations = attrs["kernel_shape"], attrs["dilations"]
    strides = attrs.get("strides") or [1] * n
    begin, end = [], []
    for d, k, s, dil in zip(spatial, kernel, strides, dilations):
        total = max(0, (-(-d // s) - 1) * s + (k - 1) * dil + 1 - d)
        small = total // 2
        begin.append(small if attrs["auto_pad"] == b"SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    kept = [a for a in copy.attribute if a.name not in ("auto_pad", "pads")]
    del copy.attribute[:]
    copy.attribute.extend([*kept, helper.make_attribute("pads", begin + end)])
    return copy
