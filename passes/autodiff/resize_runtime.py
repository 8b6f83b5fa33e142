"""Resize's gradient along axes whose sizes are known only at run time (an upsampling in a fully
convolutional net captured with ``("N", C, "H", "W")``).

As with static sizes (``separable.axis_matrix``) each axis' [out, in] interpolation matrix is
read off the node's own Resize, here at run time: the in x in identity (EyeLike) laid along the
axis and a carrier axis of scale 1, resized with the node's attributes and its scale (or the
output's run-time size) on that axis. Every mode and coordinate transform is then the forward's
own. Nearest upsampling by whole factors is a block sum instead (a Reshape to [..., H, k, ...]
from x's run-time dims, a ReduceSum).
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, node_attrs

__all__ = ["runtime_matrix", "block_sum"]


def _dim(g: GradBuilder, t: ir.Value, axis: int) -> ir.Value:
    """t's size along ``axis`` as an int64 [1], from Shape at run time."""
    return g.op("Slice", g.op("Shape", t), g.ints([axis]), g.ints([axis + 1]))


def runtime_matrix(g: GradBuilder, node: ir.Node, dy: ir.Value, axis: int, rank: int, scale: float | None,
                   roi: tuple[float, float]) -> ir.Value:
    """The [out, in] matrix of ``node`` (a Resize) along ``axis``, sized at run time: by
    ``scale`` (the node's scales), or where None by the output's size there (its sizes)."""
    x = node.inputs[0]
    carrier = rank - 1 if axis != rank - 1 else rank - 2
    n = _dim(g, x, axis)
    eye = g.op("EyeLike", g.op("ConstantOfShape", g.op("Concat", n, n, axis=0),
                               value=ir.tensor([0.0], dtype=dy.dtype or ir.DataType.FLOAT)))
    basis = g.unsqueeze(eye, [i for i in range(rank) if i not in (axis, carrier)])  # symmetric: either order
    if g.opset < 11:  # Resize-10: (X, scales)
        extra = [g.const([scale if i == axis else 1.0 for i in range(rank)], ir.DataType.FLOAT)]
    else:
        full_roi = [0.0] * rank + [1.0] * rank
        full_roi[axis], full_roi[axis + rank] = roi
        extra = [g.const(full_roi, ir.DataType.FLOAT)]
        if scale is not None:
            extra.append(g.const([scale if i == axis else 1.0 for i in range(rank)], ir.DataType.FLOAT))
        else:
            sizes = [g.ints([1])] * rank
            sizes[axis], sizes[carrier] = _dim(g, dy, axis), n
            extra += [None, g.op("Concat", *sizes, axis=0)]
    attrs = {k: v.decode() if isinstance(v, bytes) else v
             for k, v in node_attrs(node, drop=("axes", "keep_aspect_ratio_policy", "extrapolation_value")).items()}
    resized = g.op("Resize", basis, *extra, **attrs)  # [in, out] along (carrier, axis), ones elsewhere
    if carrier < axis:  # [in, out]
        return g.transpose(g.op("Reshape", resized, g.op("Concat", n, g.ints([-1]), axis=0)), [1, 0])
    return g.op("Reshape", resized, g.op("Concat", g.ints([-1]), n, axis=0))


def block_sum(g: GradBuilder, dy: ir.Value, x: ir.Value, factors: dict[int, int], rank: int) -> ir.Value:
    """dx of a nearest Resize by whole ``factors`` {axis: k} (each input element copied to a
    k-block): dy as [..., d, k, ...] (x's run-time dims) summed over the blocks."""
    shape = g.op("Shape", x)
    parts, summed = [], []
    for a in range(rank):
        parts.append(g.op("Slice", shape, g.ints([a]), g.ints([a + 1])))
        if a in factors:
            parts.append(g.ints([factors[a]]))
            summed.append(len(parts) - 1)
    return g.reduce("ReduceSum", g.op("Reshape", dy, g.op("Concat", *parts, axis=0)), summed, keepdims=False)
