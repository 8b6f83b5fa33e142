"""Convolutions over tiny feature maps become one dense matrix product in the training graphs.

On a 2x2 map a 3x3 convolution links every output pixel to every input pixel: it is a linear
map from Ci*Q to Co*P values (Q input, P output pixels) whose matrix holds each weight tap
where it applies, ``Weff[m, p, c, q] = sum_k W[m, c, k] T[p, q, k]`` with T the constant 0/1
tap table. As ``Gemm(x, Weff)`` the forward, the input gradient and the weight gradient
(``dW = Einsum(dWeff, T)``, what autodiff derives) are each one GEMM, where onnxruntime's
CPU Conv, ConvTranspose and batch-swapped Conv run far below GEMM speed on such maps: ResNet-18
at batch 32 on 64 px images (512 channels on 2x2 in its last stage), per 3x3 conv 15-17 ms
forward, 26-31 ms input gradient, 14-16 ms weight gradient. A depthwise Conv becomes one
per-channel product the same way (``Einsum("ncq,cpq->ncp")``): its 5x5 convs on 2x2 and 4x4
maps took EfficientNet-B0 11-14 ms each way. Measured steps (batch 32, 64 px, interleaved):
ResNet-18 705 -> 615 ms, EfficientNet-B0 577 -> 435, MobileNetV3-small 191 -> 142.

Only where the dense product does at most ``MAX_WORK`` times the multiply-adds the convolution
itself does (zero taps included in neither), so a 2x2 map qualifies and a 7x7 one does not, and
for a static batch of ``MIN_BATCH`` or more: building Weff (and its gradient) costs as much as
the products of 9 samples, so at batch 2 it made ResNet-18's step slower (117 -> 181 ms) where
at batch 32 it made it faster (700 -> 564 ms). With MAX_WORK 3 (4x4 maps too) batch 32 got
slower again (746 ms). The eval and inference graphs keep the Conv.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import attr, static_shape
from graphc.passes.autodiff.rules_nn import out_dims, window
from graphc.passes.emit import Emitter

__all__ = ["MAX_WORK", "MIN_BATCH", "densify_convs"]

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
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return None
    x, w = node.inputs[0], node.inputs[1]
    sx, sw = static_shape(x), static_shape(w)
    if (sx is None or sw is None or len(sx) != 4 or not all(isinstance(d, int) for d in [*sx, *sw])
            or sx[0] < MIN_BATCH or x.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE)):
        return None
    group = attr(node, "group", 1)
    if group != 1 and not (group == sx[1] == sw[0] and sw[1] == 1):  # dense or depthwise only
        return None
    kernel = list(sw[2:])
    spatial, strides, dilations, begin, end = window(None, node, x, kernel)
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
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


def _rewrite(e: Emitter, graph: ir.Graph, node: ir.Node, taps: np.ndarray, out: list[int]) -> None:
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    co, cg = static_shape(w)[:2]
    ci = static_shape(x)[1]
    p, q, k = taps.shape
    table = e.const(taps, x.dtype)
    e.source = node.metadata_props.get("graphc.source")
    if cg == ci:  # dense: [N, Ci*Q] x [Co*P, Ci*Q]^T
        weff = e.op("Einsum", e.op("Reshape", w, e.ints([co, ci, k])), table, equation="mck,pqk->mpcq")
        w2 = e.op("Reshape", weff, e.ints([co * p, ci * q]))
        bias = e.op("Reshape", e.op("Expand", e.unsqueeze(b, [1]), e.ints([co, p])), e.ints([co * p])) if b is not None else None
        y = e.op("Gemm", e.op("Reshape", x, e.ints([-1, ci * q])), w2, bias, transB=1)
    else:  # depthwise: per channel [N, Q] x [P, Q]^T
        weff = e.op("Einsum", e.op("Reshape", w, e.ints([co, k])), table, equation="ck,pqk->cpq")
        y = e.op("Einsum", e.op("Reshape", x, e.ints([-1, ci, q])), weff, equation="ncq,cpq->ncp")
        if b is not None:
            y = e.op("Add", y, e.unsqueeze(b, [1]))
    y = e.op("Reshape", y, e.ints([-1, co, *out]))
    y.shape, y.dtype = node.outputs[0].shape, node.outputs[0].dtype
    e.source = None
    node.outputs[0].replace_all_uses_with(y, replace_graph_outputs=True)
    graph.remove(node, safe=True)
