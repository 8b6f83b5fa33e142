"""Convolutions over small feature maps become matrix products over the whole batch in the
training graphs, where onnxruntime's CPU Conv, ConvTranspose and batch-swapped Conv run far
below GEMM speed (one small product per image).

A dense Conv whose output has at most ``MAX_PIXELS`` pixels (and whose tap matrix at most
``MAX_TAPS`` entries) becomes an im2col and one ``Gemm``: the input's window values as columns
[N*P, Ci*K] against the weight as it is, [Co, Ci*K] read transposed (on the CPU the product made
transposed where the weight is the larger operand, ``_packs_columns``). The columns are one MatMul
of x [N*Ci, Q] by a constant 0/1 tap matrix [Q, P*K] (for a plain 1x1 conv a Transpose), so
autodiff gives every gradient as a matrix product too: dW against the same columns in the weight's
own layout, dx through the tap matrix back onto the input (the col2im), and nothing weight-sized is
built. Measured (onnxruntime CPU, 2 threads, 64 px, Trainer steps interleaved one by one), in the
order tried:

* the old rewrite, a product against ``Weff[m, p, c, q] = sum_k W[m, c, k] T[p, q, k]`` built by
  Einsum each step (21 + 16 ms per 512-channel 3x3 conv on 2x2 at batch 32), replaced by the
  im2col as Pad, window Slices and Concat, on maps of up to 4 output pixels: ResNet-18 at batch
  32 0.80x the step time, ResNet-50 0.94x, EfficientNet-B0 0.94x, MobileNetV3-small 0.88x (1x1
  convs included; without them ResNet-50 ~1.0x); up to 16 or 64 pixels it lost (1.04x, 1.14x);
* the Slices' gradients (a Pad each, summed) took 38 ms of ResNet-18's step, onnxruntime's Pad
  copying rows of 2 values: as the tap-matrix MatMul, ResNet-18 0.82x again;
* then up to 16 output pixels 0.89x, 64 0.86x, 256 1.23x. With 64, against the Pad-and-Slices
  form on 4 pixels: ResNet-18 0.79x, ResNet-50 0.86x, RegNetY-400MF 0.90x, EfficientNet-B0 and
  MobileNetV3 within noise (0.99x, 1.01x); at batch 2, against the Conv: ResNet-18 0.93x,
  ResNet-50 0.89x, EfficientNet 0.96x, RegNet 0.98x, MobileNetV3 1.05x.
* but the columns, kept for dW, hold K times the input (x alone for the Conv): ResNet-50 at batch
  32 peaked at 1,245 MB with 64 pixels, 1,176 with 16, 1,149 with 4 (PyTorch: ~1,057), at the
  same speed (16 vs 64: 1.01x); ResNet-18 was 1.04x slower with 16 than with 64. 16 it is.
  (kxk convs only up to 4 pixels, 1x1 up to 16: 1,148 MB, but ResNet-50 1.08x and ResNet-18
  1.10x the step time.) Measured again once BatchNorm no longer held its inputs: 64 pixels
  made ResNet-18 at batch 32 0.95x at 64 and 128 px, but ResNet-50's peak 1,072 -> 1,155 MB at
  64 px and 1,964 -> 2,131 at 128 (PyTorch 1,068 and 1,893): still 16.
* measured again (ResNet-18 at batch 32, 64 px, 1 thread): its Gemms, forward 20.5 ms and
  backward 46.1 of a 217 ms step, are layer3's 3x3 convs on 4x4 maps and layer4's on 2x2, and
  run at MLAS's peak here (200-228 GFLOP/s, a 1024^3 Gemm 219); what they do past PyTorch's
  convolutions is the columns' zero taps, 1.44x the multiply-adds on 4x4 maps, 2.25x on 2x2.
  Only a product by the weight's taps per output pixel avoids them, a weight-sized copy each
  step and each way (the Weff above).
  ``MAX_TAPS`` keeps out a conv whose tap matrix would be large (a ViT's 8x8 stride-8 patch
  embedding: 4,096 x 4,096 entries at 64 px).

A kxk dense conv whose weight (and input) is smaller than its columns (``_reads_pixels``: a large
batch) reads its input pixel-major instead, [N, Q, Ci], the rows ``pixel_major`` keeps where they
exist: its columns come out of the tap MatMul as [N, P, K, Ci] and the weight is brought to [Co, K,
Ci] each step (its gradient back; ``_taps_outer``). ResNet-18's 256-channel 3x3 convs on 4x4 maps
at batch 32 transposed their columns and the columns' gradient (0.55 and 0.53 ms in the step's
profile, 2 threads) and their input from rows (0.35 and 0.13); now the weight and dW (0.36 and 0.50
in the same profile, 0.95 and 1.1-1.4 in later ones; alone, cache cold, 0.5 and 0.3). Trainer steps
interleaved, batch 32, 64 px: ResNet-18 0.990x / 0.988x the step time, ResNet-50 0.984x / 0.979x.
(dW made transposed, [K*Ci, Co], then one 3-D Transpose to [Co, Ci, K]: 3.14 ms against 1.74 for dW
and its Transpose back, 256 channels over 512 rows; the weight's Transposes as a 2-D one and a
Transpose of rows: the same times, onnxruntime merging the two back into one, hence the Gather.)

The batch may be symbolic: the rewrite reads it as -1, so one graph serves every batch size, and
a symbolic batch counts as a typical 16 where the batch decides. Exported with a symbolic batch,
ResNet-18 kept its small-map Convs and trained 1.58x slower than the same net exported at batch
32 (64 px), EfficientNet-B0 1.28x; now 0.99x and 1.00x.

A grouped Conv (more than one input channel a group) on such maps takes the same columns
into one batched MatMul over the groups: RegNetY-400MF at batch 32 0.97x the step time (both
orders of the interleaved pair; measured with 64 pixels), at batch 2 1.00x. Channel-major,
[G, Co/G, Ci/G*K] (the weight as it is) x [G, Ci/G*K, N*P], its Transposes move rows of P pixels
where the pixel-major [G, N*P, Ci/G*K] x [G, Ci/G*K, Co/G] moved single values: RegNetY-400MF at
batch 32 0.91x the step time (both orders; kernel time 405 -> 377 ms, its Transposes 70 -> 60),
at batch 2 1.00x. For dense convs channel-major lost (kernel time at batch 32: ResNet-18 510 ->
521 ms, its Transposes 20 -> 35; MobileNetV3-small 195 -> 206; EfficientNet-B0 665 -> 627):
they keep the pixel-major Gemm (and so against a MatMul of the weight broadcast over the images,
[Co, Ci] x [N, Ci, P], no Transposes but one small product per image: forward, dx and dW, 2
threads, ms, 1x1 440ch on 4x4 at N=32 1.76 vs 1.98, 1x1 512ch on 2x2 0.96 vs 2.24, 1x1 2048ch on
2x2 9.7 vs 39.3; only 1x1 256ch on 4x4 won, 0.73 vs 0.97). Grouped convs on maps of up to 64
output pixels (not 16) lost too: RegNetY-400MF's kernel time at batch 32 289 -> 310 ms at 64
px, 910 -> 995 at 128 px.
From a batch of ``MIN_BATCH`` and within ``MAX_WORK`` (below) a grouped Conv takes the
depthwise convs' products instead, one per group (``_group_products``): its columns were K
times the input, written, transposed and read back each way (RegNetY-400MF's 3x3 convs of 55
groups on 4x4 maps at 128 px, batch 32: their Transposes 7.8 ms of the step, their products and
tap MatMuls 10.8, against PyTorch's 5.4 for the convs whole); the group's dense matrix, [Ci/G*Q,
Co/G*P], is as large as the weight times Q*P/K. Trainer steps interleaved, RegNetY-400MF at
batch 32: 0.915x the step time at 64 px, 0.967x / 0.969x at 128 px.

A depthwise Conv becomes one per-channel product (each channel's [N, Q] pixels times its small
dense [Q, P] matrix: a MatMul batched over the channels, ``_group_products``; the CUDA graphs
keep the ``Einsum("ncq,cpq->ncp")`` they were timed with) where that does at most ``MAX_WORK``
times the multiply-adds of the convolution itself (zero taps included in neither), at a batch of
``MIN_BATCH`` or more:
EfficientNet-B0's 5x5 convs on 2x2 and 4x4 maps took 11-14 ms each way as Convs at batch 32.
``MAX_WORK`` was 2 until measured: onnxruntime's depthwise Conv runs one tiny product per image
and channel, so a product doing 2.6x or 3.5x the multiply-adds still wins (N=32, forward, dx and
dW, 2 threads, ms, Convs vs products: 3x3 on 4x4, 480ch 13.0 / 13.4 / 12.0 vs 4.0 / 4.4 / 4.3,
1152ch 19.9 / 35.5 vs 13.8 / 10.7; 5x5 on 8x8, 672ch 71.2 / 98.8 vs 46.1 / 47.2, 240ch 21.8 / 26.0
vs 15.3 / 17.8; 5x5 stride 2 from 8x8, 96ch 6.0 / 5.0 vs 4.0 / 3.6), where a 3x3 on 8x8 (8.5x)
loses (480ch, without dx: 16.6 vs 25.1). With 4, train steps at batch 32, 128 px, interleaved
both orders: MobileNetV3-small 0.855 / 0.873, EfficientNet-B0 0.924 / 0.989; at 64 px 1.048 /
0.973 and 0.986 / 0.895; peak RSS +34 and +74 MB (the products' [C, P, Q] matrices). Graphs
for CUDA keep 2 (``CUDA_MAX_WORK``), the bound their GPU timings were taken with. (PyTorch's
depthwise convs stay 2-4x faster than any of these: fwd + dx + dW at N=32, 144ch 3x3 on 32x32,
35 ms vs 79; onnxruntime's fast NCHWc Conv kernels serve constant weights only, an inference
graph's: forward, 2 threads, constant weight vs weight as an input, 480ch 3x3 on 8x8 0.93 vs
4.38 ms, 240ch 5x5 on 16x16 2.34 vs 12.28, a dense 64ch 3x3 on 32x32 9.7 vs 15.1. The ort-cpu
backend now gives fed weights those kernels too, ``backends/nchwc.py``; keeping these depthwise
convs as Convs to run there still lost, their gradients being what they were: train steps at
batch 32, 128 px, 1.10x for EfficientNet-B0 and 1.11x for MobileNetV3-small.)
The eval and inference graphs keep the Conv.

On maps of 17 to 64 output pixels, a dense stride-1 Conv of 128+ input channels stays a Conv
through autodiff and then (``gather_convs``, CPU graphs only) becomes its columns gathered from
the batch-innermost input times the weight, one Gemm (``conv_gather.gathered_conv``); the
stride-1 dxs on maps of up to 144 pixels become the same product on dy (``rules_nn.gathers_conv``
has the measurements). The columns live for the product alone. Kernel time at batch 32 of the
convs it changes (their forward, gradients and products; two profiles each, ms, before ->
after): ResNet-18 at 128 px (3 convs) 153 / 131 -> 131 / 140, at 64 px 47 / 54 -> 47 / 45;
ResNet-50 at 128 px (5) 304 / 250 -> 207 / 193, at 64 px 42 / 51 -> 41 / 45. Peak RSS of
ResNet-50 at 128 px 1,978 -> 1,999 MB (dy's columns).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import attr, static_shape
from graphc.passes.autodiff.conv_gather import gathered_conv
from graphc.passes.autodiff.rules_nn import gathers_conv, out_dims, typical_batch, window
from graphc.passes.emit import Emitter
from graphc.passes.training import pixel_major
from graphc.passes.values import replace_value

__all__ = ["CUDA_MAX_WORK", "MAX_PIXELS", "MAX_TAPS", "MAX_WORK", "MIN_BATCH", "PACKED_WEIGHT", "densify_convs",
           "gather_convs"]

MAX_PIXELS = 16
MAX_TAPS = 1 << 18
MAX_WORK = 4.0
CUDA_MAX_WORK = 2.0  # the 4 was measured on the CPU only
MIN_BATCH = 16
PACKED_WEIGHT = 1 << 18  # values, see ``_packs_columns``


def densify_convs(graph: ir.Graph, opset: int, device: str = "cpu") -> int:
    """Rewrite, in place, each qualifying 2-D Conv of ``graph``; returns how many. Graphs for
    CUDA keep the depthwise products and bound they were measured with on the GPU (Einsums,
    ``CUDA_MAX_WORK``; a grouped Conv keeps its columns there)."""
    if opset < 12:  # Einsum
        return 0
    e = Emitter(graph, opset, "dense_conv")
    dense: list[pixel_major.Dense] = []
    for node in list(graph):
        plan = _plan(node, device)
        if plan is not None:
            dense.append(_rewrite(e, graph, node, *plan, cpu=device == "cpu"))
    if device == "cpu":
        pixel_major.keep(Emitter(graph, opset, "pixel_major"), graph, [d for d in dense if d is not None])
    return len(dense)


def gather_convs(graph: ir.Graph, convs: list[ir.Node], opset: int, nchwc: int = 0) -> int:
    """After autodiff, on the CPU: rewrite in place each forward Conv of ``convs`` that runs
    faster as its gathered columns times the weight (``rules_nn.gathers_conv``: dense, stride 1,
    128+ input channels, maps of 17 to 64 pixels, not on ort-cpu's NCHWc kernels of channel block
    ``nchwc``); returns how many. Its gradient rule has already read x and the weight, which
    stay; the columns live only for the product (the dW gathers its own)."""
    e = Emitter(graph, opset, "gathered_conv")
    count = 0
    for node in convs:
        shapes = _static_shapes(node) if node.graph is graph else None
        if shapes is None:
            continue
        x, w = node.inputs[0], node.inputs[1]
        sx, sw = shapes
        kernel = list(sw[2:])
        spatial, strides, dilations, begin, end = window(None, node, x, kernel)
        out = out_dims(spatial, kernel, strides, dilations, begin, end)
        if not gathers_conv(kernel, sx[1], out, strides, attr(node, "group", 1), typical_batch(x), x.dtype,
                            nchwc=nchwc):
            continue
        e.source = node.metadata_props.get("graphc.source")
        y = gathered_conv(e, x, e.op("Reshape", w, e.ints([sw[0], -1])), sw[0], sx[1], spatial, kernel, out,
                          dilations, begin, end, node.inputs[2] if len(node.inputs) > 2 else None)
        _replace(e, graph, node, y)
        count += 1
    return count


def _static_shapes(node: ir.Node) -> tuple[list, list] | None:
    """The shapes of a 2-D Conv's input and weight when its channels, map and weight are static
    (the batch may be symbolic: the rewrites read it as -1); else None."""
    sx, sw = static_shape(node.inputs[0]), static_shape(node.inputs[1])
    if sx is None or sw is None or len(sx) != 4 or not all(isinstance(d, int) for d in [*sx[1:], *sw]):
        return None
    return sx, sw


def _replace(e: Emitter, graph: ir.Graph, node: ir.Node, y: ir.Value) -> None:
    """``y`` in place of the Conv ``node``'s output, the node removed (``e``'s source, set for
    its nodes, cleared)."""
    y.shape, y.dtype = node.outputs[0].shape, node.outputs[0].dtype
    e.source = None
    replace_value(node.outputs[0], y)
    graph.remove(node, safe=True)


def _plan(node: ir.Node, device: str):
    """(per-group products or not, the tap table T[P, Q, K] (None for a plain 1x1 conv), the
    output's spatial dims) of a Conv to rewrite; None for one to keep."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return None
    x = node.inputs[0]
    shapes = _static_shapes(node)
    if shapes is None or x.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        return None
    sw = shapes[1]
    group = attr(node, "group", 1)
    kernel = list(sw[2:])
    spatial, strides, dilations, begin, end = window(None, node, x, kernel)
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
    # grouped or depthwise (on CUDA depthwise of multiplier 1 only), batch 16+ (a symbolic batch
    # counts as typical, as the Conv rules take it), within the work bound: products per group
    if group > 1 and typical_batch(x) >= MIN_BATCH and (device == "cpu" or sw[1] == 1 and sw[0] == group):
        conv = _tap_count(spatial, out, kernel, strides, dilations, begin)
        if conv and math.prod(out) * math.prod(spatial) <= (MAX_WORK if device == "cpu" else CUDA_MAX_WORK) * conv:
            return True, _taps(spatial, out, kernel, strides, dilations, begin), out
    if group > 1 and sw[1] == 1:  # depthwise: the products or the Conv
        return None
    entries = math.prod(spatial) * math.prod(kernel) * math.prod(out)  # the tap matrix's
    if not (0 < math.prod(out) <= MAX_PIXELS and entries <= MAX_TAPS):
        return None
    plain = math.prod(kernel) == 1 and all(s == 1 for s in strides) and not any(begin + end)
    return False, (None if plain else _taps(spatial, out, kernel, strides, dilations, begin)), out


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


def _rewrite(e: Emitter, graph: ir.Graph, node: ir.Node, per_group: bool, taps: np.ndarray | None,
             out: list[int], cpu: bool) -> pixel_major.Dense | None:
    """The Conv ``node`` as its products: per group (``_group_products``; a depthwise one by
    Einsums in graphs not for the ``cpu``, the CUDA graphs, timed on the GPU that way) or im2col;
    a dense one's record for ``pixel_major``."""
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    e.source = node.metadata_props.get("graphc.source")
    dense = None
    if not per_group:
        y, dense = _im2col_gemm(e, x, w, b, taps, out, cpu=cpu)
    else:
        co = static_shape(w)[0]
        y = (_group_products if cpu else _depthwise_einsums)(e, x, w, taps)  # [N, Co, P]
        if b is not None:
            y = e.op("Add", y, e.unsqueeze(b, [1]))
        y = e.op("Reshape", y, e.ints([-1, co, *out]))
    _replace(e, graph, node, y)
    return dense


def _depthwise_einsums(e: Emitter, x: ir.Value, w: ir.Value, taps: np.ndarray) -> ir.Value:
    """[N, C, P]: a depthwise conv's ``_group_products`` as the CUDA graphs take them, two Einsums."""
    co, (_, q, k) = static_shape(w)[0], taps.shape
    weff = e.op("Einsum", e.op("Reshape", w, e.ints([co, k])), e.const(taps, x.dtype), equation="ck,pqk->cpq")
    return e.op("Einsum", e.op("Reshape", x, e.ints([-1, co, q])), weff, equation="ncq,cpq->ncp")


def _group_products(e: Emitter, x: ir.Value, w: ir.Value, taps: np.ndarray) -> ir.Value:
    """[N, Co, P]: each group's [N, Ci/G*Q] pixels times its dense [Ci/G*Q, Co/G*P] matrix (``w`` by
    the taps, one MatMul, each group's rows and columns brought together by a Transpose), the groups
    as the MatMul's batch, x's and the output's leading axes swapped by Transposes; a depthwise
    conv's channels each [N, Q] times [Q, P]. For those, onnxruntime (CPU, 2 threads) ran its Einsum
    ``ncq,cpq->ncp``, whose transposes are its own, and the gradients' Einsums 1.2-8x slower than
    these MatMuls and the ones autodiff makes of them (``bench_lowerings.py --only
    depthwise_product``, ms, Einsum vs MatMul, N=32: 576ch on 4x4 (Q = P = 16) forward 1.33 vs 0.64,
    dx 1.37 vs 0.87, the dense matrix's gradient 2.56 vs 0.38; 1152ch on 4x4 3.10 vs 1.53, 3.17 vs
    0.98, 5.95 vs 0.75; 240ch on 8x8 3.67 vs 1.16, 5.53 vs 2.09, 6.33 vs 1.22; N=2, 576ch 0.15 vs
    0.13, 0.19 vs 0.13, 0.21 vs 0.11). Trainer steps interleaved, both orders, batch 32:
    MobileNetV3-small at 128 px 0.79x / 0.82x the step time, EfficientNet-B0 0.87x / 0.94x; at 64 px
    0.96x / 0.89x and 0.85x / 0.85x; peak RSS 510 -> 498 MB and 1,512 -> 1,497 MB at 128 px."""
    (co, cg), (p, q, k) = static_shape(w)[:2], taps.shape
    group = static_shape(x)[1] // cg
    og = co // group  # output channels a group
    dense = e.const(np.ascontiguousarray(taps.transpose(2, 1, 0).reshape(k, q * p)), x.dtype)  # [K, Q*P]
    weff = e.op("MatMul", e.op("Reshape", w, e.ints([co * cg, k])), dense)  # [G, Co/G, Ci/G, Q, P]
    if cg > 1 or og > 1:
        weff = e.op("Transpose", e.op("Reshape", weff, e.ints([group, og, cg * q, p])), perm=[0, 2, 1, 3])
    weff = e.op("Reshape", weff, e.ints([group, cg * q, og * p]))
    xt = e.op("Transpose", e.op("Reshape", x, e.ints([-1, group, cg * q])), perm=[1, 0, 2])  # [G, N, Ci/G*Q]
    y = e.op("Transpose", e.op("MatMul", xt, weff), perm=[1, 0, 2])  # [N, G, Co/G*P]
    return y if og == 1 else e.op("Reshape", y, e.ints([0, co, p]))


def _im2col_gemm(e: Emitter, x: ir.Value, w: ir.Value, b: ir.Value | None, taps: np.ndarray | None,
                 out: list[int], *, cpu: bool) -> tuple[ir.Value, pixel_major.Dense | None]:
    """The Conv as the input's window values (the columns) times the weight, back to [N, Co,
    *out]: pixel-major for a dense conv, [N*P, Ci*K] x [Co, Ci*K]^T (on the ``cpu`` made
    transposed where ``_packs_columns``; with its record for ``pixel_major``), channel-major per
    group for a grouped one; ``taps`` is None for a plain 1x1 conv."""
    co, cg = static_shape(w)[:2]
    ci = static_shape(x)[1]
    group, p = ci // cg, math.prod(out)
    k = 1 if taps is None else taps.shape[2]
    if group == 1:  # [N*P, Ci*K] x [Co, Ci*K]^T, or [N*P, K*Ci] x [Co, K*Ci]^T reading x's pixels
        pixels, weight = None, w  # x pixel-major, [N, Q, Ci], where the conv reads it so
        if taps is None or _reads_pixels(x, co, p, taps.shape):
            pixels = e.op("Transpose", e.op("Reshape", x, e.ints([0, ci, -1])), perm=[0, 2, 1])
        if taps is None:  # a plain 1x1 conv's columns are x's pixels
            cols = pixels
        elif pixels is not None:  # [P*K, Q] x [N, Q, Ci]: the columns [N, P, K, Ci], the weight [Co, K, Ci]
            q = taps.shape[1]
            gather = e.const(np.ascontiguousarray(taps.transpose(0, 2, 1).reshape(p * k, q)), x.dtype)
            cols = e.op("MatMul", gather, e.op("Reshape", pixels, e.ints([-1, q, ci])))
            weight = _taps_outer(e, w, co, ci, k)
        else:
            cols = e.op("Transpose", e.op("Reshape", _columns(e, x, taps, pixels_first=True), e.ints([-1, ci, p, k])),
                        perm=[0, 2, 1, 3])  # [N, P, Ci, K]
        cols = e.op("Reshape", cols, e.ints([-1, ci * k]))
        weight = e.op("Reshape", weight, e.ints([co, -1]))
        if cpu and _packs_columns(x, co, p, co * ci * k):  # [Co, N*P] = weight x columns^T, then rows
            bias = [e.op("Reshape", b, e.ints([co, 1]))] if b is not None else []
            flipped = e.op("Reshape", e.op("Gemm", weight, cols, *bias, transB=1), e.ints([co, -1, p]))
            rows = e.op("Reshape", e.op("Transpose", flipped, perm=[1, 2, 0]), e.ints([-1, co]))
        else:
            rows = e.op("Gemm", cols, weight, *([b] if b is not None else []), transB=1)
        y = pixel_major.channel_major(e, rows, co, out)
        return y, pixel_major.Dense(y, rows, x if pixels is not None else None, pixels)
    # grouped: one batched MatMul over the groups, channel-major, [G, Co/G, Ci/G*K] (the weight
    # as it is) x [G, Ci/G*K, N*P]; the columns' and the output's Transposes swap leading axes,
    # moving whole rows of P pixels (see the module's docstring). (The pixel-major columns' two
    # Transposes as one 5-D Transpose, [N, G, Ci/G, K, P] -> [G, N, P, Ci/G, K]: 1.32x the step.)
    cols = x if taps is None else _columns(e, x, taps, pixels_first=False)
    cols = e.op("Transpose", e.op("Reshape", cols, e.ints([-1, ci * k, p])), perm=[1, 0, 2])  # [Ci*K, N, P]
    y = e.op("MatMul", e.op("Reshape", w, e.ints([group, co // group, cg * k])),
             e.op("Reshape", cols, e.ints([group, cg * k, -1])))  # [G, Co/G, N*P]
    if b is not None:
        y = e.op("Add", y, e.op("Reshape", b, e.ints([group, co // group, 1])))
    y = e.op("Transpose", e.op("Reshape", y, e.ints([co, -1, p])), perm=[1, 0, 2])  # [N, Co, P]
    return e.op("Reshape", y, e.ints([-1, co, *out])), None


def _taps_outer(e: Emitter, w: ir.Value, co: int, ci: int, k: int) -> ir.Value:
    """The weight [Co, Ci, K] as [Co, K, Ci]: one 2-D Transpose to [K, Co*Ci] and its rows of Ci
    gathered in [Co, K] order (its gradient the inverse Gather, then the 2-D Transpose back).
    onnxruntime runs the 3-D Transpose as one small 2-D transpose per output channel; a single 2-D
    one over the whole weight is one call, and a second Transpose in place of the Gather onnxruntime
    merges back into the 3-D one (the gradient's 2-D Transpose back, [K, Co*Ci] -> [Co*Ci, K], one
    of few rows, ort-cpu runs as an Einsum: ``backends/transposes``). 2 threads, ms a run, 3-D vs
    these two, warm / caches flushed: 256x256x3x3 0.15 vs 0.11 / 0.48 vs 0.29; 512x512x3x3 1.29 vs
    0.70 / 1.52 vs 1.16. ResNet-18's step at batch 32, 64 px (4 profiles each): Transposes 9.99 ->
    8.87 ms, Gathers 2.39 -> 2.82; Trainer steps interleaved 0.991x, 0.994x, 1.002x; ResNet-50
    0.998x. (Every batched Transpose of a session so rewritten, activations included:
    EfficientNet-B0 1.046x, RegNetY-400MF 1.096x the step, at batch 32, 64 px. And with this
    cheaper, every dense kxk conv reading pixels: ResNet-18 at batch 32, 128 px, 1.007x, its
    Transposes 29.5 -> 31.1 ms.) What these Transposes and Gathers cost at most, from graphs
    without them (the weight read as if stored [Co, K, Ci]; wrong values, timed only), Trainer
    steps interleaved at batch 32, 64 px, built second / first: ResNet-18 0.976x / 0.983x,
    ResNet-50 0.986x / 0.985x. train_step holds a trainable weight that only this chain reads in
    that order instead (``taps_params``); the chain stays in the gradients graph (data-parallel
    workers) and for weights also read otherwise."""
    taps = e.op("Transpose", e.op("Reshape", w, e.ints([co * ci, k])), perm=[1, 0])
    rows = e.const(np.arange(k)[None, :] * co + np.arange(co)[:, None], np.int64)
    return e.op("Gather", e.op("Reshape", taps, e.ints([k * co, ci])), rows, axis=0)


def _packs_columns(x: ir.Value, co: int, p: int, weight_values: int) -> bool:
    """Does a dense conv's Gemm make its rows transposed, [Co, N*P] = weight x columns^T, then a
    3-D Transpose to [N*P, Co] (a 2-D one onnxruntime folds back into the Gemm)? MLAS packs the
    Gemm's B operand on every call: so the columns, not the weight, where the weight has more rows
    than they do (a symbolic batch counts as typical) and ``PACKED_WEIGHT`` values or more. 2
    threads, ms, cols x W^T vs W x cols^T over [N*P, Ci*K] x [Co, Ci*K]: [8, 4608] x [512, ...]
    0.46 vs 0.23; [128, 4608] x [512, ...] 1.52 vs 1.27; [32, 2304] x [256, ...] 0.16 vs 0.12;
    [128, 512] x [2048, ...] 0.67 vs 0.60; [8, 112] x [672, ...] 0.030 vs 0.026 (the extra
    Transposes and Reshapes, forward and backward, cost more than that: MobileNetV3-small at
    batch 2 1.026x the step without the bound). Trainer steps interleaved, 64 px: batch 2
    ResNet-18 0.951x / 0.979x, ResNet-50 0.947x / 0.984x, RegNetY-400MF 0.988x, EfficientNet-B0
    0.983x; batch 32 ResNet-18 0.995x / 0.996x / 0.998x, ResNet-50 0.995x / 0.999x."""
    return co > typical_batch(x) * p and weight_values >= PACKED_WEIGHT


def _reads_pixels(x: ir.Value, co: int, p: int, taps_shape) -> bool:
    """Does a dense kxk conv read x pixel-major, its columns [N, P, K, Ci] made from x's pixels
    (a Transpose of x, or none where ``pixel_major`` finds x's rows) and its weight transposed
    to [Co, K, Ci] each step (and dW back), rather than transposing its columns from [N, Ci, P,
    K] to [N, P, Ci, K] (and their gradient back)? Where the weight and x are smaller than the
    columns (a symbolic batch counts as typical)."""
    _, q, k = taps_shape
    return co * k + typical_batch(x) * q < typical_batch(x) * p * k


def _columns(e: Emitter, x: ir.Value, taps: np.ndarray, pixels_first: bool) -> ir.Value:
    """x's window values, [N*Ci, P*K] (``pixels_first``) or [N*Ci, K*P]: x as [N*Ci, Q] times the
    0/1 tap matrix. A dense conv's columns go pixel-major next, [N, P, Ci, K]: from [N, Ci, P, K]
    that Transpose and its gradient's move runs of K values, from [N, Ci, K, P] single ones. 2
    threads, ms, forward / gradient Transpose, K=9, N=32, [N, Ci, P, K] vs [N, Ci, K, P]: 256ch on
    16 pixels 0.47 / 0.38 vs 0.26 / 1.12; 512ch on 4 0.21 / 0.19 vs 0.12 / 0.24; Trainer steps
    interleaved, ResNet-18 at batch 32, 64 px, 0.979x and 0.984x the step time, ResNet-50 0.998x,
    at batch 2 ResNet-18 1.007x, EfficientNet-B0 1.001x."""
    p, q, k = taps.shape
    order = (1, 0, 2) if pixels_first else (1, 2, 0)
    gather = e.const(np.ascontiguousarray(taps.transpose(*order).reshape(q, k * p)), x.dtype)
    return e.op("MatMul", e.op("Reshape", x, e.ints([-1, q])), gather)
