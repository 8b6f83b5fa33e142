"""Convolutions over tiny feature maps become matrix products over the whole batch in the
training graphs, where onnxruntime's CPU Conv, ConvTranspose and batch-swapped Conv run far
below GEMM speed (one small product per image).

A dense Conv whose output has at most ``MAX_PIXELS`` pixels becomes an im2col and one ``Gemm``:
the input's window slices as columns [N*P, Ci*K] (small: the map is tiny) against the weight as
it is, [Co, Ci*K] read transposed. Autodiff then gives both gradients as GEMMs too (dW against
the same columns, in the weight's own layout; dx through the slices back onto the input), and
nothing weight-sized is built. It replaced a dense product against ``Weff[m, p, c, q] =
sum_k W[m, c, k] T[p, q, k]`` (T the 0/1 tap table), whose Einsum building Weff, and its
gradient, took 21 and 16 ms per 512-channel 3x3 conv on 2x2 at batch 32 (2 threads). Trainer
steps interleaved (2 threads, batch 32, 64 px), the Weff product / im2col on the same convs /
im2col up to 4 output pixels, 1x1 convs included: ResNet-18 1.0 / 0.86 / 0.83; ResNet-50 (p4
without 1x1 = 1.0) 0.94-0.98 with 1x1; EfficientNet-B0 1.0 / 0.94 with 1x1; MobileNetV3-small
0.88 with 1x1 against without. Up to 16 output pixels (4x4 maps) ResNet-18 was 1.08x slower
than up to 4, up to 64 1.18x; at batch 2, 1.08x slower than the Conv (the threshold
``MIN_BATCH``).

A depthwise Conv becomes one per-channel product (``Einsum("ncq,cpq->ncp")`` against its small
dense [C, P, Q] matrix) where that does at most ``MAX_WORK`` times the multiply-adds of the
convolution itself (zero taps included in neither), so a 2x2 or 4x4 map with a 5x5 kernel
qualifies and a 7x7 one does not: EfficientNet-B0's 5x5 convs on 2x2 and 4x4 maps took 11-14 ms
each way as Convs. The eval and inference graphs keep the Conv.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import attr, static_shape
from graphc.passes.autodiff.rules_nn import out_dims, window
from graphc.passes.emit import Emitter

__all__ = ["MAX_PIXELS", "MAX_WORK", "MIN_BATCH", "densify_convs"]

MAX_PIXELS = 4
MAX_WORK = 2.0
MIN_BATCH = 16


def densify_convs(graph: ir.Graph, opset: int) -> int:
    """Rewrite, in place, each qualifying 2-D Conv of ``graph``; returns how many."""
    if opset < 12:  # Einsum
        return 0
    e = Emitter(graph, opset, "dense_conv")
    count = 0
    for node in list(graph):
        plan = _plan(node)
        if plan is not None:
            _rewrite(e, graph, node, *plan)
            count += 1
    return count


def _plan(node: ir.Node):
    """(the tap table, or None for a dense conv's im2col, and the output's spatial dims) of a
    Conv to rewrite; None for one to keep."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return None
    x, w = node.inputs[0], node.inputs[1]
    sx, sw = static_shape(x), static_shape(w)
    if (sx is None or sw is None or len(sx) != 4 or not all(isinstance(d, int) for d in [*sx, *sw])
            or sx[0] < MIN_BATCH or x.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE)):
        return None
    group = attr(node, "group", 1)
    kernel = list(sw[2:])
    spatial, strides, dilations, begin, end = window(None, node, x, kernel)
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
    if group == 1:
        return (None, out) if 0 < math.prod(out) <= MAX_PIXELS else None
    if not (group == sx[1] == sw[0] and sw[1] == 1):  # dense or depthwise only
        return None
    conv = _tap_count(spatial, out, kernel, strides, dilations, begin)
    if conv == 0 or math.prod(out) * math.prod(spatial) > MAX_WORK * conv:
        return None
    return _taps(spatial, out, kernel, strides, dilations, begin), out


def _tap_count(spatial, out, kernel, strides, dilations, begin) -> int:
    """How many (output pixel, tap) pairs meet the input: ``_taps(...).sum()`` counted per axis
    (validity is separable) without the table, which for a 64x64 map would hold 150 M entries
    (building it took 20 s of ResNet-18's ``generate`` at 128 px)."""
    return math.prod(sum(0 <= o * s - b + k * d < n for o in range(m) for k in range(kk))
                     for n, m, kk, s, d, b in zip(spatial, out, kernel, strides, dilations, begin))


def _taps(spatial, out, kernel, strides, dilations, begin) -> np.ndarray:
    """T[p, q, k] = 1 where input pixel q meets tap k of output pixel p (row-major pixels)."""
    t = np.zeros((math.prod(out), math.prod(spatial), math.prod(kernel)), np.float32)
    for (oh, ow) in np.ndindex(*out):
        for (kh, kw) in np.ndindex(*kernel):
            ih = oh * strides[0] - begin[0] + kh * dilations[0]
            iw = ow * strides[1] - begin[1] + kw * dilations[1]
            if 0 <= ih < spatial[0] and 0 <= iw < spatial[1]:
                t[oh * out[1] + ow, ih * spatial[1] + iw, kh * kernel[1] + kw] = 1.0
    return t


def _rewrite(e: Emitter, graph: ir.Graph, node: ir.Node, taps: np.ndarray | None, out: list[int]) -> None:
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    e.source = node.metadata_props.get("graphc.source")
    if taps is None:
        y = _im2col_gemm(e, node, x, w, b, out)
    else:  # depthwise: per channel [N, Q] x [P, Q]^T
        co, (p, q, k) = static_shape(w)[0], taps.shape
        weff = e.op("Einsum", e.op("Reshape", w, e.ints([co, k])), e.const(taps, x.dtype), equation="ck,pqk->cpq")
        y = e.op("Einsum", e.op("Reshape", x, e.ints([-1, co, q])), weff, equation="ncq,cpq->ncp")
        if b is not None:
            y = e.op("Add", y, e.unsqueeze(b, [1]))
        y = e.op("Reshape", y, e.ints([-1, co, *out]))
    y.shape, y.dtype = node.outputs[0].shape, node.outputs[0].dtype
    e.source = None
    node.outputs[0].replace_all_uses_with(y, replace_graph_outputs=True)
    graph.remove(node, safe=True)


def _im2col_gemm(e: Emitter, node: ir.Node, x: ir.Value, w: ir.Value, b: ir.Value | None, out: list[int]) -> ir.Value:
    """The Conv as the input's window slices, [N*P, Ci*K], times the weight [Co, Ci*K] read
    transposed, back to [N, Co, *out]."""
    co, ci, *kernel = static_shape(w)
    _, strides, dilations, begin, end = window(None, node, x, kernel)
    padded = e.op("Pad", x, e.ints([0, 0] + begin + [0, 0] + end)) if any(begin + end) else x
    axes, steps = e.ints([2, 3]), e.ints(strides)
    taps = []
    for offsets in np.ndindex(*kernel):
        starts = [o * d for o, d in zip(offsets, dilations)]
        ends = [first + (n - 1) * s + 1 for first, n, s in zip(starts, out, strides)]
        taps.append(e.unsqueeze(e.op("Slice", padded, e.ints(starts), e.ints(ends), axes, steps), [2]))
    cols = e.op("Concat", *taps, axis=2) if len(taps) > 1 else taps[0]  # [N, Ci, K, *out]
    cols = e.op("Reshape", e.op("Transpose", cols, perm=[0, 3, 4, 1, 2]), e.ints([-1, ci * math.prod(kernel)]))
    y = e.op("Gemm", cols, e.op("Reshape", w, e.ints([co, -1])), *([b] if b is not None else []), transB=1)
    return e.op("Transpose", e.op("Reshape", y, e.ints([-1, *out, co])), perm=[0, 3, 1, 2])
