"""Pools whose ceil_mode would add a window starting past the input, rewritten with floor windows.

ONNX's shape formula for ceil_mode=1 counts a last window that starts in the end padding; the
kernels (onnxruntime, onnx.reference, PyTorch, graphc) drop it, as graphc's inferred shapes do.
onnxruntime re-runs onnx's formula when it loads a gradient graph and refuses the shapes graphc
recorded. The same windows with ceil_mode=0 and the end pad grown to reach the last one agree with
every formula: exact for MaxPool (pads are -inf) and LpPool (pads are 0), and for AveragePool
without count_include_pad (pads do not count); an AveragePool that counts pads is left as it is.
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.values import static_shape

__all__ = ["floor_ceil_pools"]


def _floor_end_pads(node: ir.Node, spatial: list[int]) -> list[int] | None:
    """The end pads that give ``node``'s windows with ceil_mode=0, or None when none is dropped."""
    a = node.attributes
    n = len(spatial)
    kernel = list(a.get_ints("kernel_shape"))
    strides = list(a.get_ints("strides", None) or [1] * n)
    dilations = list(a.get_ints("dilations", None) or [1] * n)
    pads = list(a.get_ints("pads", None) or [0] * (2 * n))
    ends, dropped = [], False
    for i in range(n):
        eff = (kernel[i] - 1) * dilations[i] + 1
        out = -(-(spatial[i] + pads[i] + pads[i + n] - eff) // strides[i]) + 1
        if (out - 1) * strides[i] >= spatial[i] + pads[i]:  # starts past the input: dropped
            out, dropped = out - 1, True
        # the pad that ends the last window; floor also gives ``out`` for up to strides - 1 less
        ends.append(max((out - 1) * strides[i] + eff - spatial[i] - pads[i], 0))
    return pads[:n] + ends if dropped else None


def floor_ceil_pools(model: ir.Model) -> int:
    """Rewrite, in place, each MaxPool, LpPool and AveragePool (count_include_pad=0) of the main
    graph with ceil_mode=1, explicit pads and static spatial dims whose last window would start
    past the input as ceil_mode=0 with the same windows; returns how many."""
    count = 0
    for node in model.graph:
        a = node.attributes
        if (node.op_type not in ("MaxPool", "LpPool", "AveragePool") or node.domain not in ("", "ai.onnx")
                or not a.get_int("ceil_mode", 0) or a.get_string("auto_pad", "NOTSET") != "NOTSET"
                or (node.op_type == "AveragePool" and a.get_int("count_include_pad", 0))):
            continue
        shape = static_shape(node.inputs[0])
        if shape is None or not all(isinstance(d, int) for d in shape[2:]):
            continue
        pads = _floor_end_pads(node, list(shape[2:]))
        if pads is not None:
            a["pads"] = ir.AttrInt64s("pads", pads)
            a["ceil_mode"] = ir.AttrInt64("ceil_mode", 0)
            count += 1
    return count
