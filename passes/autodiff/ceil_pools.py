"""Pools whose ceil_mode adds no window to floor mode, rewritten with ceil_mode=0.

ONNX's shape formula for ceil_mode=1 counts a last window that starts in the end padding; the
kernels (onnxruntime, onnx.reference, PyTorch, graphc) drop it, as graphc's inferred shapes do.
onnxruntime re-runs onnx's formula when it loads a gradient graph and refuses the shapes graphc
recorded. Where ceil mode slides the same windows as floor mode (``infer.ceil_adds_nothing``, the
rule the DSL captures pools by), ceil_mode=0 gives them with the same pads, and every formula
agrees.
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.infer import ceil_adds_nothing
from graphc.passes.values import static_shape

__all__ = ["floor_ceil_pools"]


def floor_ceil_pools(model: ir.Model) -> int:
    """Rewrite, in place, each MaxPool, LpPool and AveragePool of the main graph with ceil_mode=1,
    explicit pads and static spatial dims whose ceil windows are its floor windows as ceil_mode=0
    (inside the padded input, so an AveragePool counts the same pads); returns how many."""
    count = 0
    for node in model.graph:
        a = node.attributes
        if (node.op_type not in ("MaxPool", "LpPool", "AveragePool") or node.domain not in ("", "ai.onnx")
                or not a.get_int("ceil_mode", 0) or a.get_string("auto_pad", "NOTSET") != "NOTSET"):
            continue
        shape = static_shape(node.inputs[0])
        if shape is None or not all(isinstance(d, int) for d in shape[2:]):
            continue
        n = len(shape) - 2
        if ceil_adds_nothing(shape[2:], a.get_ints("kernel_shape"), a.get_ints("strides", None) or [1] * n,
                             a.get_ints("dilations", None) or [1] * n, a.get_ints("pads", None) or [0] * (2 * n)):
            a["ceil_mode"] = ir.AttrInt64("ceil_mode", 0)
            count += 1
    return count
