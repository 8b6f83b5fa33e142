"""Scalars given the rank of the tensor they meet, in the training graphs.

onnxruntime's CPU provider broadcasts a size-1 operand of lower rank (a 0-d scalar, or a [1])
element by element when the other operand's last dim is 1: ``x / 4`` on a [32, 1152, 1, 1]
tensor took 0.43 ms, the same data as [32, 1152] or against a [1, 1, 1, 1] scalar 0.01 ms
(2 threads; a [1152] tensor against [] 0.01, [32, 1152, 2, 2] 0.04; 1 thread, 2 M floats:
[2048, 1024, 1, 1] 111 ms, [2048, 1024] 11). Gradients make such tensors all the time: a global
pool's gradient [N, C, 1, 1] scaled by 1/(H*W), squeeze-excite gates' Sigmoid and SiLU gradients
(``1 - s``), BatchNorm's per-channel [1, C, 1, 1] factors, a 1x1 conv weight's decay in the
update. EfficientNet-B0's train_step at batch 32 had 196 such nodes; with the scalars ranked its
Div kernels took 3.5 instead of 12.5 ms a step (64 px, 2 threads). Each such scalar gets the
other operand's rank here (all dims 1): a constant is rewritten, a computed one reshaped. Shapes
and values are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.values import fixed_array

__all__ = ["rank_scalars"]

_OPS = frozenset({"Add", "Sub", "Mul", "Div"})


def rank_scalars(graph: ir.Graph, opset: int) -> int:
    """Rewrite ``graph`` in place (see the module's docstring); returns how many operands."""
    e = Emitter(graph, opset, "rank_scalar")
    ranked: dict[tuple[ir.Value, int], ir.Value] = {}
    count = 0
    for node in list(graph):
        if node.op_type not in _OPS or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        for i, (small, big) in enumerate((node.inputs, node.inputs[::-1])):
            rank = _slow_pair_rank(small, big)
            if rank is None:
                continue
            if (small, rank) not in ranked:
                array = fixed_array(small)
                ranked[small, rank] = (e.const(array.reshape([1] * rank), small.dtype) if array is not None
                                       else e.op("Reshape", small, e.ints([1] * rank)))
            node.replace_input_with(i, ranked[small, rank])
            count += 1
            break
    return count


def _slow_pair_rank(small: ir.Value | None, big: ir.Value | None) -> int | None:
    """``big``'s rank when ``small`` is a size-1 operand of lower rank and ``big``'s last dim is
    1 (the slow broadcast); else None."""
    if small is None or big is None or small.shape is None or big.shape is None or not small.shape.is_static():
        return None
    if len(small.shape) >= len(big.shape) or int(np.prod([int(d) for d in small.shape])) != 1:
        return None
    last = big.shape[-1] if len(big.shape) >= 2 else None
    return len(big.shape) if isinstance(last, int) and last == 1 else None
