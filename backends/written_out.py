"""One node written out in standard ops, in a backend's copy of a model (``batchnorm``, ``mvn``, ``pools``,
``scans``).

``Writer`` appends each new node to ``nodes`` (or to a list of the caller's, such as a branch's
body), names it after the node's first output and a tag, and stamps it with the node's metadata
(the user's line, for errors).
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["Writer"]


class Writer:
    def __init__(self, node: onnx.NodeProto, tag: str, opset: int):
        self.node, self.prefix, self.opset = node, f"{node.output[0] or node.name}/{tag}/", opset
        self.nodes: list[onnx.NodeProto] = []
        self._names = itertools.count()

    def op(self, op_type: str, *inputs: str, output: str | list[str] | None = None,
           into: list[onnx.NodeProto] | None = None, **attrs) -> str:
        """Append one node to ``into`` (default ``nodes``); returns its first output's name. Its outputs are
        ``output`` (one name or a list), else one fresh name."""
        name = f"{self.prefix}{next(self._names)}"
        outputs = output if isinstance(output, list) else [output or name]
        made = helper.make_node(op_type, list(inputs), outputs, name, **attrs)
        made.metadata_props.extend(self.node.metadata_props)
        (self.nodes if into is None else into).append(made)
        return outputs[0]

    def const(self, value, dtype) -> str:
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype)))

    def reduce_mean(self, v: str, axes: list[int]) -> str:
        """ReduceMean over ``axes`` keeping dims, the axes an input from opset 18."""
        if self.opset >= 18:
            return self.op("ReduceMean", v, self.const(axes, np.int64), keepdims=1)
        return self.op("ReduceMean", v, axes=axes, keepdims=1)
