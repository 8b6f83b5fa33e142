"""One node written out in standard ops, in a backend's copy of a model (``batchnorm``, ``mvn``).

``Writer`` appends each new node to ``nodes``, names it after the node's first output and a tag,
and stamps it with the node's metadata (the user's line, for errors).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["Writer"]


class Writer:
    def __init__(self, node: onnx.NodeProto, tag: str, opset: int):
        self.node, self.prefix, self.opset = node, f"{node.output[0]}/{tag}/", opset
        self.nodes: list[onnx.NodeProto] = []

    def op(self, op_type: str, *inputs: str, output: str | None = None, **attrs) -> str:
        """Append one node; returns its output's name (``output``, else a fresh one)."""
        name = f"{self.prefix}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output or name], name, **attrs))
        self.nodes[-1].metadata_props.extend(self.node.metadata_props)
        return self.nodes[-1].output[0]

    def const(self, value, dtype) -> str:
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype)))

    def reduce_mean(self, v: str, axes: list[int]) -> str:
        """ReduceMean over ``axes`` keeping dims, the axes an input from opset 18."""
        if self.opset >= 18:
            return self.op("ReduceMean", v, self.const(axes, np.int64), keepdims=1)
        return self.op("ReduceMean", v, axes=axes, keepdims=1)
