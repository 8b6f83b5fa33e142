"""Scalars given the rank of the tensor they meet, in the training graphs.

onnxruntime's CPU provider broadcasts a size-1 operand of lower rank (a 0-d scalar, or a [1])
element by element when the other operand's last dim is 1: ``x / 4`` on a [32, 1152, 1, 1]
tensor took 0.43 ms, the same data as [32, 1152] or against a [1, 1, 1, 1] scalar 0.01 ms
(2 threads; a [1152] tensor against [] 0.01, [32, 1152, 2, 2] 0.04; 1 thread, 2 M floats:
[2048, 1024, 1, 1] 111 ms, [2048, 1024] 11); comparisons and Where alike (``x > 3`` 0.82 vs
0.03 ms, a Where with a scalar branch 1.05 vs 0.03). Gradients make such tensors all the time: a
global pool's gradient [N, C, 1, 1] scaled by 1/(H*W), squeeze-excite gates' Sigmoid, SiLU and
hard-sigmoid gradients (``1 - s``, ``x > 3``), BatchNorm's per-channel [1, C, 1, 1] factors, a 1x1
conv weight's decay in the update. EfficientNet-B0's train_step at batch 32 had 196 such nodes; with the scalars ranked its
Div kernels took 3.5 instead of 12.5 ms a step (64 px, 2 threads). Each such scalar gets the
rank of what it meets here (all dims 1): a constant is rewritten, a computed one reshaped.
Shapes and values are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.values import const_array

__all__ = ["rank_scalars"]

# ops that broadcast their inputs against each other and do nothing else with their shapes
# (measured slow so: the four arithmetic ops, Pow, Max, Greater, Where; the rest alike)
_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Greater", "Less",
                  "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Where"})


def rank_scalars(graph: ir.Graph, opset: int) -> int:
    """Rewrite ``graph`` in place (see the module's docstring); returns how many operands."""
    e = Emitter(graph, opset, "rank_scalar")
    ranked: dict[tuple[ir.Value, int], ir.Value] = {}
    count = 0
    for node in list(graph):
        if node.op_type not in _OPS or node.domain not in ("", "ai.onnx"):
            continue
        rank = _trailing_one_rank(node)
        for i, small in enumerate(node.inputs):
            if rank is None or not _lower_rank_scalar(small, rank):
                continue
            if (small, rank) not in ranked:
                array = const_array(small) if not small.is_graph_input() else None  # a fed one may differ
                ranked[small, rank] = (e.const(array.reshape([1] * rank), small.dtype) if array is not None
                                       else e.op("Reshape", small, e.ints([1] * rank)))
            node.replace_input_with(i, ranked[small, rank])
            count += 1
    return count


def _trailing_one_rank(node: ir.Node) -> int | None:
    """The rank of ``node``'s broadcast shape when it is 2 or more and ends in a static 1 (read off
    its output, or its highest-rank input where the output's shape is not recorded); else None.
    (A scalar given either rank broadcasts to the same output.)"""
    shape = node.outputs[0].shape
    if shape is None:
        shape = max((v.shape for v in node.inputs if v is not None and v.shape is not None), key=len, default=None)
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int) or shape[-1] != 1:
        return None
    return len(shape)


def _lower_rank_scalar(value: ir.Value | None, rank: int) -> bool:
    """A static size-1 operand of rank below ``rank``."""
    if value is None or value.shape is None or not value.shape.is_static() or len(value.shape) >= rank:
        return False
    return int(np.prod([int(d) for d in value.shape])) == 1
