# Over 500 lines: the gradient rules of the neural-network ops (Conv, pools, Resize, ...), one
# rule per op in the registry's table, sharing the separable-op helpers; one family, one file.
"""VJP rules of neural-network ops: Dropout, Conv, ConvTranspose and pooling.

Convolutions and pools need static channel counts (the batch may be symbolic); Conv,
ConvTranspose, AveragePool and MaxPool take spatial dims known only at run time
(``symbolic_spatial``), the other pools need them static.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, const_array, node_attrs, static_shape
from graphc.passes.autodiff.channel_scale import channel_scaled
from graphc.passes.autodiff.conv_gather import batch_innermost, gather, gathered_conv
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.separable import axis_matrix, contract
from graphc.passes.autodiff.symbolic_spatial import (average_pool_grad, conv_grads, conv_transpose_weight_grad,
                                                     run_time_window, spatial_of, symbolic_spatial)


# -- Dropout ----------------------------------------------------------------------------------
def _fixed_input(node: ir.Node, i: int, default) -> np.ndarray | None:
    """Input ``i`` as numpy: ``default`` when absent, None when it can change at run time."""
    v = node.inputs[i] if len(node.inputs) > i else None
    if v is None:
        return np.asarray(default)
    return None if v.is_graph_input() else const_array(v)


@grad_rule("Dropout")
def grad_dropout(g, node, dy):
    # training: dx = dy * mask / (1 - ratio) through the node's mask output (added to the node
    # when it lacks one, so forward and backward share one random draw); inference: dx = dy.
    # Before opset 12 Dropout has no training mode and is the identity. The ratio gets no gradient.
    rest = (None,) * (len(node.inputs) - 1)
    training = _fixed_input(node, 2, False)
    if g.opset < 12 or (training is not None and not bool(training)):
        return (dy,) + rest
    ratio = _fixed_input(node, 1, 0.5)
    node = g.with_outputs(node, 2)
    if ratio is None:
        scale = g.div(g.scalar(1.0, dy), g.sub(g.scalar(1.0, dy), g.cast_like(node.inputs[1], dy)))
    else:
        scale = g.scalar(1.0 / (1.0 - float(ratio)) if float(ratio) < 1 else 0.0, dy)
    if training is None:  # a run-time flag: the mask is all ones in inference, only the scale differs
        scale = g.op("Where", node.inputs[2], scale, g.scalar(1.0, dy))
    return (g.mul(dy, g.mul(g.cast_like(node.outputs[1], dy), scale)),) + rest


# -- shared window geometry -------------------------------------------------------------------
def window(g: GradBuilder | None, node: ir.Node, x: ir.Value, kernel: list[int]):
    """(spatial input dims, strides, dilations, pads begin, pads end) with auto_pad resolved."""
    sx = static_shape(x)
    if sx is None or not all(isinstance(d, int) for d in sx[2:]):
        raise GraphError(f"gradient of {node.op_type} {node.name!r} needs static spatial dims, "
                         f"got input shape {sx}")
    spatial = list(sx[2:])
    n = len(spatial)
    strides = list(attr(node, "strides", None) or [1] * n)
    dilations = list(attr(node, "dilations", None) or [1] * n)
    pads = list(attr(node, "pads", None) or [0] * (2 * n))
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * n)
        for i in range(n):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i])
            small = total // 2
            pads[i], pads[i + n] = (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    return spatial, strides, dilations, pads[:n], pads[n:]


def out_dims(spatial, kernel, strides, dilations, begin, end, ceil=False):
    out = []
    for i, d in enumerate(spatial):
        span = d + begin[i] + end[i] - ((kernel[i] - 1) * dilations[i] + 1)
        out.append((-(-span // strides[i]) if ceil else span // strides[i]) + 1)
    return out


def _transposed(g: GradBuilder, dy: ir.Value, w: ir.Value, spatial, kernel, strides, dilations,
                begin, end, group: int) -> ir.Value:
    """ConvTranspose(dy, w) sized back to the input's spatial dims (the input gradient). For a
    dense 3x3 stride-2 Conv, the four sub-pixel phases of dx as Convs of dy by their taps of the
    weight (1x1, 1x2, 2x1, 2x2; the three larger on ort-cpu's NCHWc kernels) interleaved by a
    Concat and DepthToSpace did not beat it (2 threads, ms, N=32, ConvTranspose vs phases:
    128->64 channels, 16x16 -> 32x32, 5.6 vs 7.3; 256->128, 8x8 -> 16x16, 4.9 vs 4.8; 128->64,
    8x8 -> 16x16, 1.9 vs 1.7; N=2, 128->64 on 16x16, 0.32 vs 0.71)."""
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
    extra = [spatial[i] - (strides[i] * (out[i] - 1) + (kernel[i] - 1) * dilations[i] + 1 - begin[i] - end[i])
             for i in range(len(spatial))]
    return g.op("ConvTranspose", dy, w, strides=strides, dilations=dilations, pads=begin + end,
                output_padding=extra if any(extra) else None, group=group if group != 1 else None)


# -- Conv -------------------------------------------------------------------------------------
def _swap01(g: GradBuilder, t: ir.Value, n_sp: int) -> ir.Value:
    """``t`` [A, B, *S] (``n_sp`` spatial axes) as [B, A, *S]: batch and channels, or a weight's
    output and input channels, exchanged."""
    return g.transpose(t, [1, 0] + list(range(2, 2 + n_sp)))


def _groups_over_batch(g: GradBuilder, t: ir.Value, group: int, per_group: int, spatial: list[int]) -> ir.Value:
    """[N, group*per_group, *S] -> [per_group, group*N, *S]: channel groups become Conv groups
    over the batch (for group 1 just the batch/channel swap)."""
    n_sp = len(spatial)
    if group == 1:
        return _swap01(g, t, n_sp)
    r = g.op("Reshape", t, g.ints([0, group, per_group] + spatial))
    return g.op("Reshape", g.transpose(r, [2, 1, 0] + list(range(3, 3 + n_sp))), g.ints([per_group, -1] + spatial))


# The im2col dW's column matrix holds prod(K) copies of the input; it is built and multiplied at
# most this many values at a time (``_conv_weight_grad_im2col``).
IM2COL_CHUNK = 1 << 22


def _image_chunks(g: GradBuilder, x, dy, per_image: int, bound: int) -> list[tuple[ir.Value, ir.Value]]:
    """(x, dy) of a few images at a time, so that a chunk's columns (``per_image`` values an
    image) stay within ``bound``: Slices along a static batch; the whole batch when it is
    symbolic or fits."""
    batch = _known_batch(x)
    chunks = 1 if batch is None else min(batch, -(-batch * per_image // bound))
    if chunks == 1:
        return [(x, dy)]
    size = -(-batch // chunks)
    pieces = []
    for first in range(0, batch, size):  # images [first, first + size)
        bounds = (g.ints([first]), g.ints([min(first + size, batch)]), g.ints([0]))
        pieces.append((g.op("Slice", x, *bounds), g.op("Slice", dy, *bounds)))
    return pieces


def _conv_weight_grad_im2col(g: GradBuilder, x, dy, w_shape, spatial, strides, dilations, begin, end,
                             per_image: int):
    """dW as an explicit im2col and GEMMs over batch and pixels: the window slices of the padded,
    channel-major input stacked channel-major ([Ci, prod(K), N, O]), so the GEMM against dy as
    [Co, N*O] (``transB``: the column matrix is never transposed) gives dW in its own layout,
    with no weight-size Transpose after it. The prod(K) slices are taken at once: stacking one
    spatial axis at a time (sum(K) Slices, two Concats) wrote the columns twice
    (``bench_lowerings.py --only dense_dw``, 2 / 1 threads, ms, at once vs staged: N=32, 64ch
    16x16 3x3 14.3 vs 16.6 / 20.5 vs 24.1; 128ch 8x8 10.1 vs 10.7 / 13.6 vs 14.7; 64->128
    stride 2 7.5 vs 7.7 / 7.9 vs 9.4; 3->64 7x7 stride 2 on 64x64 25.6 vs 28.3 / 28.0 vs 29.3).
    Windows taken as shifts of the flattened padded input (dy zero-padded onto the same grid, so
    each tap is one contiguous Slice per channel) were slower, for the padding's extra columns:
    2 threads, N=32, 16x16 21.6 vs 19.8 ms, 8x8 12.0 vs 8.1, 4x4 11.6 vs 6.7; so were taps as
    runs of whole padded rows (only dy's rows padded, ``--only dense_dw`` "row-runs", 2 / 1
    threads: 16x16 14.0 vs 13.0 / 19.7 vs 17.3, 8x8 11.0 vs 8.7 / 13.2 vs 10.8, 4x4 11.8 vs 9.2 /
    13.4 vs 8.9).

    A static batch whose columns pass ``IM2COL_CHUNK`` values is taken a few images at a time,
    each chunk's Gemm adding into the last one's result (its C input): the columns stay in cache
    and their memory bounded (``--only large_dw``, 2 threads, ms, N=32, chunks of 4 and 8 images
    vs all 32: 64ch 16x16 11.7 (8) vs 12.3; 128ch 16x16 36.9 / 35.6 vs 35.4). One Gemm per tap
    on its window, without the column matrix, was slower (N=32, 64ch on 32x32 44.3 vs 39.6 in
    chunks of 4; 3->32 on 128x128 101 vs 42). CUDA graphs keep the chunks: there the whole
    batch's columns at once ran faster but held more memory (H100, batch 32, 128 px, graphed
    steps, GPU memory in use: ResNet-50 25.7 -> 22.6 ms, 2,554 -> 2,732 MB, 1.23x PyTorch's;
    ResNet-18 11.8 -> 10.4 ms, 1,576 -> 1,606 MB), and chunks of 2**24 values gained too little
    to tell (25.2 ms and 2,590 MB; 11.3 and 1,534). ``per_image``: one image's column values."""
    n_sp = len(spatial)
    ci, kernel = w_shape[1], list(w_shape[2:])
    padded_dims, unpadded = [d + b + e for d, b, e in zip(spatial, begin, end)], [0] * n_sp
    dw = None
    for xs, dys in _image_chunks(g, x, dy, per_image, IM2COL_CHUNK):
        # [Ci, 1, n, *S]: the taps' windows stack on axis 1 as they are, one Unsqueeze per chunk
        # where there was one per tap (ResNet-50's train_step 311 nodes fewer, 5,175; steps as
        # fast: ResNet-18 interleaved both orders, ratio new/old at batch 2 0.90 / 1.01, at 32
        # 1.00 / 0.93). [Ci, n, *S] is padded before that Unsqueeze: onnxruntime's CUDA Pad has a
        # fast kernel for tensors of up to 4 axes padded along the last two only; its generic one
        # took 3.3 of ResNet-50's 22.7 ms of GPU kernel time (44 Pads of [Ci, 1, n, H, W], 75 us
        # each; H100, batch 32, 128 px). Graphed steps, same lease, 5-D -> 4-D: ResNet-50 29.3 ->
        # 25.7 ms, ResNet-18 14.7 -> 11.8 (PyTorch eager 29.2 / 31.2 and 14.7 / 12.3 in those runs)
        padded = _padded(g, _swap01(g, xs, n_sp), begin, end, lead=2)
        channel_major = g.unsqueeze(padded, [1])
        taps = _windows(g, channel_major, kernel, padded_dims, strides, dilations, unpadded, unpadded, lead=3)
        cols = g.op("Concat", *taps, axis=1) if len(taps) > 1 else taps[0]
        cols = g.op("Reshape", cols, g.ints([ci * math.prod(kernel), -1]))
        dy2 = g.op("Reshape", _swap01(g, dys, n_sp), g.ints([w_shape[0], -1]))
        dw = g.op("Gemm", dy2, cols, *([dw] if dw is not None else []), transB=1)
    return g.op("Reshape", dw, g.ints(list(w_shape)))


# The gathered dW's column matrix (``_conv_weight_grad_gathered``) is built whole up to this many
# values (for a symbolic batch, at a typical batch of 16); past it, a run of channels at a time,
# ``GATHER_CHUNK`` values a run. Raised, at 128 px and batch 32 (steps interleaved both orders;
# peak RSS of 5 steps), when past it meant chunks of images: 2**24, ResNet-18 0.99x / 0.98x the
# step, 886 -> 889 MB, ResNet-50 1.01x / 0.96x, 1,979 -> 2,016 MB; 2**25, ResNet-18 0.92x /
# 0.93x and 806 MB, but ResNet-50 2,088 MB, 1.12x PyTorch's 1,864 (its columns at the step's
# peak). The runs of channels take what the whole batch's columns gained without that memory.
GATHER_COLS = 1 << 23
GATHER_CHUNK = IM2COL_CHUNK  # past GATHER_COLS, a run's values (whole channels; whole groups)


def _conv_weight_grad_gathered(g: GradBuilder, x, dy, w_shape, spatial, strides, dilations, begin, end,
                               group: int, runs: list[int]):
    """dW as one GEMM against the column matrix, built by one Gather: x batch-innermost and padded,
    [Ci, P, N] (P its padded pixels), each (tap, output pixel) reading a row of N values at a
    constant flat position (strides and dilations in the index), so the columns come out
    [Ci * K, O * N] as the GEMM reads them, against dy as [Co, O * N]. ``_conv_weight_grad_im2col``
    took a strided Slice per tap and a Concat, writing the columns twice. ``bench_lowerings.py
    --only dense_dw``, 2 threads, ms, Slices all at once / gathered, N=32: 64ch 16x16 13.6 / 8.2;
    128ch 8x8 7.9 / 4.9; 256ch 4x4 7.0 / 4.0; 64->128 stride 2 8.0 / 3.6; N=2 64ch 16x16 1.25 /
    1.33. On large maps it beats the Slices' chunks of images too (``--only large_dw``: 64ch
    32x32 36.5 vs 40.4; 64->128 stride 2 on 64x64 67.5 vs 112), but holds the whole batch's
    columns (75 MB there): it builds them whole up to ``GATHER_COLS`` values, and past that for a
    run of whole input channels at a time (``GATHER_CHUNK`` values, the Slices' chunks' bound, so
    the step's peak stays), each run a Split of the one batch-innermost input and each run's
    Gemm making its own columns of dW (concatenated). Against the Slices' chunks at 128 px, batch
    32, per-kernel profiles of two runs each: ResNet-18's Conv gradients 648 / 708 -> 558 / 578
    ms (Slice and Concat 126 -> Gather 47), with chunks of images. Runs of channels beat chunks
    of images, which Slice, Transpose and Pad x and dy per chunk and gather rows of a few images
    (2 threads, ms, whole / chunks of images / runs of channels: N=32, 64ch 32x32 22.7 / 26.2 /
    21.7; 128ch 16x16 15.2 / 16.5 / 15.4; 256ch 32x32 180 / 317 (one image a chunk) / 200); in
    the step at 128 px, batch 32 (two profiles each, ms): Gather and Transpose, ResNet-18 98 / 99
    -> 70 / 72, ResNet-50 141 / 142 -> 113 / 114, RegNetY-400MF 70 / 72 -> 68 / 69 (Trainer steps
    interleaved: 0.99x, 1.01x, 1.00x, within this VM's noise); peak RSS ResNet-18 876 -> 837 MB,
    ResNet-50 2,000 -> 1,998. (A 7x7 stem's: 15.6 vs the Conv's 15.2: the Conv stays.)
    Measured again at ResNet-18's shapes at 64 px against the Conv over swapped axes, on the
    generic kernel / on ort-cpu's NCHWc kernels (dy, its kernel, reordered in the graph), 1
    thread, ms: N=32, 64ch 16x16 5.6 vs 11.1 / 10.1; 128ch 8x8 4.2 vs 8.1 / 6.9; 64->128 stride 2
    2.6 vs 4.7 / 5.0; N=2, 64ch 16x16 0.58 vs 0.61 / 0.41, 128ch 8x8 0.38 vs 0.55 / 0.38. The
    Transpose, Pad and Gather it spends besides the GEMM (ResNet-18 at batch 32, 1 thread: 9 ms
    of the 3x3 convs' 46 ms of gradient kernels, the GEMMs 19 at ~220 GFLOP/s, MLAS's peak here)
    move x, and its columns, once each; the Pad is one zero row (``conv_gather.batch_innermost``).
    The dense GEMM makes dW transposed, [Ci * K, Co], the columns as its A and dy as its B, then
    one 4-D Transpose to dW (a 2-D one onnxruntime folds back into the GEMM): MLAS packs the B
    operand on every call, and dy is K times smaller than the columns. 2 threads, ms, dy x
    cols^T vs cols x dy^T and the Transpose, over O * N rows: [64, 576] 32,768 rows 7.7 vs 5.5;
    [128, 1152] 8,192 6.1 vs 5.4; [256, 2304] 2,048 5.5 vs 5.7. Trainer steps interleaved:
    ResNet-18 at batch 32 0.970x / 0.982x the step time at 128 px, 0.989x at 64 px, at batch 2
    0.974x; ResNet-50 at batch 32, 64 px 0.985x; RegNetY-400MF (grouped) at 128 px 0.999x.
    A grouped Conv (``group`` > 1, several input channels a group) takes the columns of all its
    groups, as [G, Ci/G * K, O * N], into one MatMul batched over the groups, each group's rows
    of dy against its own columns, from a batch of 4 (``_conv_weight_grad``). ``--only
    grouped_dw``, 2 threads, ms, against the Conv with each group's channels as its batch and dy
    as its kernel, RegNetY-400MF's group width 8: N=32, 48ch 64x64 stride 2 22.0 vs 36.2; 104ch
    16x16 9.0 vs 20.1; 208ch 8x8 4.5 vs 10.2; 104ch 32x32 stride 2 11.4 vs 14.0; N=8, 104ch
    16x16 3.1 vs 5.0; N=4 2.3 vs 2.4; but N=2 1.07 vs 0.67. RegNetY-400MF's train_step, Trainer
    steps interleaved both orders: batch 32 at 128 px 0.92x / 0.87x the step time (kernel time
    811 -> 728 ms, its grouped convs' backward 208 -> 143), at 64 px 0.97x / 0.96x. (Measured
    on the graphs of an earlier session this form had left the step at 1.00x.) Its runs are of
    whole groups, each run's product making its own groups' rows of dW. (Their dW^T, the
    columns as A and dy as the packed B, as the dense GEMM's above, won alone on many rows, 2
    threads, groups of 8 -> 8, ms: 6 groups over 32,768 rows 2.61 vs 1.62, 13 over 8,192 1.32 vs
    0.78, lost on few, 13 over 2,048 0.18 vs 0.33; taken from 8,192 rows, RegNetY-400MF's step
    at batch 32 was 1.008x at 128 px, 1.000x at 64 px.) ``runs``: the number of channels
    (groups) in each run (``_channel_runs``)."""
    n_sp = len(spatial)
    co, cg, kernel = w_shape[0], w_shape[1], list(w_shape[2:])
    ci = cg * group
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
    rows = batch_innermost(g, x, ci, spatial, begin, end)  # [Ci, P, N]
    sizes = [units * (cg if group > 1 else 1) for units in runs]
    parts = g.split(rows, sizes, axis=0, count=len(sizes)) if len(sizes) > 1 else (rows,)
    dy2 = g.op("Reshape", g.transpose(dy, [*range(1, 2 + n_sp), 0]), g.ints([co, -1]))  # [Co, O * N]
    if group > 1:  # rows (g, m) of dy, a run of whole groups each
        dy3 = g.op("Reshape", dy2, g.ints([group, co // group, -1]))
        dys = g.split(dy3, runs, axis=0, count=len(runs)) if len(runs) > 1 else (dy3,)
    dws = []
    for i, (part, channels) in enumerate(zip(parts, sizes)):
        cols = gather(g, part, channels, spatial, kernel, out, strides, dilations, begin)  # [c * K, O * N]
        if group == 1:
            dws.append(g.op("Gemm", cols, dy2, transB=1))  # [c * K, Co]: dW^T (see the docstring)
            continue
        # rows (g, c, k) of the columns and (g, m) of dy: each group's product, batched
        per_group = g.op("Reshape", cols, g.ints([channels // cg, cg * math.prod(kernel), -1]))
        dws.append(g.op("MatMul", dys[i], g.transpose(per_group, [0, 2, 1])))  # [groups, Co/G, Cg * K]
    dw = dws[0] if len(dws) == 1 else g.op("Concat", *dws, axis=0)
    if group == 1:  # [Ci, *k, Co] -> [Co, Ci, *k]
        return g.transpose(g.op("Reshape", dw, g.ints([ci, *kernel, co])), [n_sp + 1, *range(n_sp + 1)])
    return g.op("Reshape", dw, g.ints(list(w_shape)))


def _channel_runs(x: ir.Value, ci: int, cg: int, group: int, kernel, out) -> list[int] | None:
    """The gathered dW's runs: its input channels (a grouped conv's groups) in runs of equal
    size (the last one shorter), one run when all their columns fit ``GATHER_COLS``, else runs
    within ``GATHER_CHUNK``; None where one channel's (group's) columns pass that. The columns
    are counted at x's batch (a symbolic one's typical 16)."""
    unit = cg if group > 1 else 1  # channels a run takes whole: a group's, or one
    units, per_unit = ci // unit, unit * math.prod(kernel) * math.prod(out) * typical_batch(x)
    if units * per_unit <= GATHER_COLS:
        return [units]
    if per_unit > GATHER_CHUNK:
        return None
    size = GATHER_CHUNK // per_unit
    return [min(size, units - first) for first in range(0, units, size)]


def _depthwise_weight_grad_taps(g: GradBuilder, x, dy, w_shape, spatial, strides, dilations, begin, end):
    """dW of a depthwise Conv (one input channel per output channel) one kernel tap at a time:
    the sum over batch and pixels of dy times the window of the padded input that the tap
    reads (a Slice). onnxruntime (CPU, 1 thread, idle machine, ms; ``scripts/bench_lowerings.py
    --only depthwise_dw``), this vs the Conv over x with batch and channels swapped: 3x3, stride
    1, N=2, 96ch on 32x32: 2.7 vs 5.4 and 2.65 vs 5.53; N=32, 144ch on 16x16: 28.5 vs 31.1 and
    25.1 vs 26.5; 240ch on 8x8: 7.7 vs 8.4. A tie at N=32, 96ch on 32x32 (70.8 vs 82.2, then 73.6
    vs 70.0), so it serves inputs of at most 2**21 values. It loses once x outgrows the cache
    (N=32, 144ch on 32x32: 93.5 vs 77.8; 96ch on 64x64: 253 vs 232), with strides (its strided Slices:
    N=32, 96ch, 64x64 stride 2: 147 vs 101), for 5x5 kernels (96ch on 32x32: 165 vs 87) and on
    small maps (480ch on 4x4: 12.5 vs 8.6). Stacking the taps channel-major for one batched
    MatMul was in between (58.9 / 24.6 ms where the two above took 64.8-93.8 / 22.8-36.0, on a
    loaded machine). Taken a few images at a time (2**20 values), so that each chunk stays in
    cache, the taps beat the Conv on large maps for 3x3 kernels, by too little to keep (2 threads,
    ms, N=32: 96ch 32x32 37.8 vs 45.6; 144ch 32x32 59.9 vs 69.1; 32ch 64x64 49.7 vs 58.1) and
    still lost for 5x5 ones (96ch 32x32 96.7 vs 72.4; 240ch 16x16 92.2 vs 57.9)."""
    axes = list(range(2, 2 + len(spatial)))
    sums = [g.reduce("ReduceSum", g.mul(tap, dy), [0] + axes)  # [1, C, 1, ...]: taps stack on axis 2
            for tap in _windows(g, x, list(w_shape[2:]), spatial, strides, dilations, begin, end)]
    return g.op("Reshape", g.op("Concat", *sums, axis=2) if len(sums) > 1 else sums[0], g.ints(list(w_shape)))


def _depthwise_weight_grad_per_image(g: GradBuilder, x, dy, w_shape, spatial, strides, dilations, begin, end):
    """dW of a depthwise Conv (multiplier 1) with a static batch N, on the CPU: one Conv whose
    N*C groups are each image's channels, x as [1, N*C, *spatial] and dy as its kernels
    [N*C, 1, *out] (both Reshapes, no copy), strides and dilations exchanged; then the images'
    sums. The Conv with batch and channels swapped (below) computes the same after two full-size
    Transposes. onnxruntime (CPU, 2 threads, ms; ``bench_lowerings.py --only depthwise_dw``), this
    vs that: N=32, 3x3, 96ch on 32x32 24.4 vs 27.7; 144ch on 32x32 36.7 vs 47.7; 240ch on 8x8 4.1
    vs 4.4; 5x5, 96ch on 32x32 65.4 vs 67.2; stride 2, 96ch on 64x64 49.6 vs 54.1; 144ch 5x5 on
    32x32 40.1 vs 43.1; 240ch on 16x16 9.6 vs 10.1; N=2, 96ch on 32x32 3.0 vs 4.4; and against
    the taps (3x3, stride 1, N=32, 144ch on 16x16) 16.1 vs 17.5. On outputs under 64 pixels the
    groups' own overhead loses (N=32, 672ch 5x5 stride 2 on 8x8: 15.2 vs 14.0; 1152ch on 4x4
    15.9 vs 14.6), and the symbolic batch cannot name N*C groups."""
    n, c = _known_batch(x), w_shape[0]
    kernel = list(w_shape[2:])
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
    images = g.op("Reshape", x, g.ints([1, n * c, *spatial]))
    kernels = g.op("Reshape", dy, g.ints([n * c, 1, *out]))
    end = _reaching_end(kernel, spatial, out, strides, dilations, begin, end)
    dw = g.op("Conv", images, kernels, strides=dilations, dilations=strides, pads=begin + end, group=n * c)
    dw = _within_kernel(g, dw, kernel, spatial, out, strides, dilations, begin, end)
    summed = g.reduce("ReduceSum", g.op("Reshape", dw, g.ints([n, c * math.prod(kernel)])), [0], keepdims=False)
    return g.op("Reshape", summed, g.ints(list(w_shape)))


# The row products and spread dy of a few images at a time, at most this many values: whole at
# batch 32, 128 px, EfficientNet-B0's peak RSS was 1,623 MB against 1,511 with the per-image
# Conv; in chunks of 2**21, 2**22, 2**23 values 1,513, 1,511, 1,512 MB, and 2**23 ran at the
# whole batch's speed (Trainer steps interleaved, both orders, 1.01x / 1.01x). A symbolic batch
# within it takes the products whole.
ROWS_CHUNK = 1 << 23


def _rows_per_image(c: int, kw: int, ho: int, spatial) -> int:
    """Values of one image's spread dy [C, Ho, kw*W] and row products [C, Ho*kw, H], alive together."""
    return c * ho * kw * sum(spatial)


def _depthwise_weight_grad_rows(g: GradBuilder, x, dy, w_shape, spatial, strides, dilations, begin, end):
    """dW of a depthwise 2-D Conv (multiplier 1) as two matrix products, on the CPU. dy's columns
    are spread onto x's, once per kernel column j, by one MatMul with a constant 0/1 matrix
    [Wo, kw*W] (the tap's column shift, its padding as missing ones); each image and channel's
    [Ho*kw, W] rows of that times its x transposed (onnxruntime reads it so: a FusedMatMul) give
    P[(o, j), r] = sum over columns of dy row o, shifted for j, against x row r; summed over the
    images, tap (i, j) is the sum over o of P's entries at r = o*stride + i*dilation - pad
    (one Gather of the taps' diagonals, the rows padded so that none runs off). The products
    compute every pair of rows, 2*kw*W multiply-adds a value of dy, but as GEMMs, where the
    per-image Conv spends more on its im2col of each image and channel, one column a tap.
    ``bench_lowerings.py --only depthwise_dw``, 2 threads, ms, this vs the per-image Conv, stride
    1, N=32: 3x3, 96ch on 32x32 16.4 vs 33.6; 144ch on 32x32 25.5 vs 50.7; 32ch on 64x64 30.0 vs
    48.0; 96ch on 56x56 120.9 vs 164.1; 240ch on 8x8 3.7 vs 6.0; 5x5, 96ch on 32x32 29.4 vs 62.6;
    240ch on 16x16 21.5 vs 42.3; N=4, 144ch 3x3 on 16x16 2.00 vs 3.42 (the taps 2.42); N=2, 96ch
    on 32x32 2.07 vs 2.54; under 64 output pixels, against the Conv over swapped axes that took
    them, 1152ch on 4x4 11.8 vs 21.8, 672ch 5x5 on 4x4 9.8 vs 15.1. It loses where the
    rows get long, the products growing with W^3 a map (16ch on 112x112: 119.6 vs 111.1, the
    taps a few images at a time 87.9; N=2, 32ch on 224x224 118.0 vs 63.3), on the small maps of a
    batch of 2 (1152ch on 4x4 1.68 vs 1.13), and with a stride of 2, whose products pair 2x the
    rows and columns dy has (``--only reaching_pads``: 96ch on 64x64 75.4 vs 65.9; N=2 7.16 vs
    4.30; 16ch on 128x128 49.6 vs 29.6; on smaller maps won in one run, lost in another):
    ``_conv_weight_grad`` keeps the others there. Trainer steps interleaved, both orders, batch
    32, 128 px: EfficientNet-B0 0.93x / 0.95x the step time (in chunks of ``ROWS_CHUNK``: 0.92x /
    0.96x), MobileNetV3-small 0.94x / 0.96x; 64 px 0.95x / 0.95x and 0.93x / 0.99x. (The same
    two products for the depthwise forward and dx, w's taps banded per channel, lost to Conv and
    ConvTranspose, ``--only row_conv``: N=32, 96ch 3x3 on 32x32 27.2 vs 14.4 and 40.0 vs 16.4;
    stride 2 on 64x64 36.8 vs 16.2 and 37.7 vs 31.0; 5x5 ones about even.)"""
    c, (kh, kw) = w_shape[0], w_shape[2:]
    (h, w), (ho, wo) = spatial, out_dims(spatial, [kh, kw], strides, dilations, begin, end)
    shift = np.zeros((wo, kw, w))
    for j in range(kw):
        cols = np.arange(wo) * strides[1] + j * dilations[1] - begin[1]
        inside = (cols >= 0) & (cols < w)
        shift[np.arange(wo)[inside], j, cols[inside]] = 1.0
    pairs = None
    for xs, dys in _image_chunks(g, x, dy, _rows_per_image(c, kw, ho, spatial), ROWS_CHUNK):
        spread = g.op("MatMul", dys, g.const(shift.reshape(wo, kw * w), x.dtype, hint="tap_shift"))  # [N,C,Ho,kw*W]
        rows = g.op("Reshape", spread, g.ints([0, c, ho * kw, w]))
        part = g.reduce("ReduceSum", g.op("MatMul", rows, g.transpose(xs, [0, 1, 3, 2])), [0], keepdims=False)
        pairs = part if pairs is None else g.op("Add", pairs, part)
    tail = max(0, strides[0] * (ho - 1) + dilations[0] * (kh - 1) + 1 - begin[0] - h)
    if begin[0] or tail:  # [C, Ho*kw, H] -> rows r + pad, so every tap's index is in range
        pairs = g.op("Pad", pairs, g.ints([0, 0, begin[0], 0, 0, tail]))
    length = h + begin[0] + tail
    i, j, o = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(ho), indexing="ij")
    diagonals = (o * kw + j) * length + o * strides[0] + i * dilations[0]  # [kh, kw, Ho]
    taps = g.op("Gather", g.op("Reshape", pairs, g.ints([c, ho * kw * length])), g.const(diagonals, np.int64), axis=1)
    return g.op("Reshape", g.reduce("ReduceSum", taps, [3], keepdims=False), g.ints(list(w_shape)))


def _windows(g: GradBuilder, t: ir.Value, kernel, spatial, strides, dilations, begin, end,
             lead: int = 2) -> list[ir.Value]:
    """What each kernel tap of a Conv reads of ``t`` (``lead`` axes, then the spatial ones;
    padded here): one strided Slice of the output's size per tap, taps in row-major order."""
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
    padded = _padded(g, t, begin, end, lead)
    axes, steps = g.ints(list(range(lead, lead + len(spatial)))), g.ints(strides)
    slices = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offsets, dilations)]
        ends = [first + (n - 1) * s + 1 for first, n, s in zip(starts, out, strides)]
        slices.append(g.op("Slice", padded, g.ints(starts), g.ints(ends), axes, steps))
    return slices


def _padded(g: GradBuilder, t: ir.Value, begin, end, lead: int) -> ir.Value:
    """``t`` zero-padded by ``begin``/``end`` along its spatial axes, after ``lead`` others."""
    if not any(begin + end):
        return t
    return g.op("Pad", t, g.ints([0] * lead + list(begin) + [0] * lead + list(end)))


def _pointwise_weight_grad(g: GradBuilder, x, dy, w_shape, spatial, strides):
    """dW of a 1x1 Conv (no padding, one group): ``dW[m, c] = sum_{n, p} dy[n, m, p] x[n, c, p]``,
    x subsampled by the strides first. Where the maps outweigh the weight (``Co*Ci <= P*(Ci+Co)``,
    P pixels), one MatMul per image (onnxruntime reads x transposed: it fuses the Transpose into
    a FusedMatMul) summed over the batch; else dy and x channel-major and one Gemm.
    ``bench_lowerings.py --only pointwise_dw``, 2 threads, ms, that vs the Einsum
    ``nmhw,nchw->mc`` this was (ORT's Einsum permutes both operands itself): N=32, 16->96 on
    64x64 4.8 vs 25.8; 144->24 on 32x32 4.5 vs 18.2; 256->64 on 16x16 3.3 vs 7.8; 512->128 on
    8x8 (Gemm) 3.2 vs 5.5; 1024->2048 on 2x2 (Gemm) 6.0 vs 7.1; N=2, 1024->2048 on 2x2 (Gemm) 1.3
    vs 2.5; 256->64 on 16x16 (Gemm) 0.35 vs 0.44. The per-image MatMuls lose where the weight is
    the larger (N=32, 1024->2048 on 2x2: 67 ms, its [N, Co, Ci] products summed). In CPU graphs x is
    subsampled by a 1-tap AveragePool (onnxruntime's pooling runs on both threads, a strided
    Slice on one; 2 threads, ms, warm / caches flushed, Slice vs AveragePool: [32,64,32,32] 0.42
    / 0.46 vs 0.18 / 0.35, [32,256,16,16] 0.44 / 0.49 vs 0.15 / 0.40; in ResNet-18's step at
    batch 32, 64 px the Slice took 0.66): Trainer steps interleaved, 64 px, the new graphs'
    Trainer built second / first, batch 32 ResNet-18 0.994x / 1.003x, ResNet-50 0.990x / 1.008x,
    RegNetY-400MF 0.987x / 0.994x, at 128 px ResNet-18 1.000x; batch 2 ResNet-18 0.994x,
    ResNet-50 0.983x / 1.004x: within these pairs' noise. (A 1-tap window adds its value to 0:
    exact, but for -0.0 read as +0.0.)"""
    n_sp = len(spatial)
    co, ci = w_shape[0], w_shape[1]
    if any(s != 1 for s in strides):  # x[..., ::s]
        if g.device == "cpu":
            x = g.op("AveragePool", x, kernel_shape=[1] * n_sp, strides=list(strides))
        else:  # the CUDA graphs keep the Slice they were timed with
            x = g.op("Slice", x, g.ints([0] * n_sp), g.ints(spatial), g.ints(list(range(2, 2 + n_sp))), g.ints(strides))
    pixels = math.prod(-(-d // s) for d, s in zip(spatial, strides))
    if co * ci <= pixels * (ci + co):
        rows = g.op("Reshape", dy, g.ints([0, co, -1]))
        cols = g.transpose(g.op("Reshape", x, g.ints([0, ci, -1])), [0, 2, 1])
        dw = g.reduce("ReduceSum", g.op("MatMul", rows, cols), [0], keepdims=False)
    else:
        rows = g.op("Reshape", _swap01(g, dy, n_sp), g.ints([co, -1]))
        dw = g.op("Gemm", rows, g.op("Reshape", _swap01(g, x, n_sp), g.ints([ci, -1])), transB=1)
    return g.op("Reshape", dw, g.ints(list(w_shape)))


def _conv_weight_grad(g: GradBuilder, x, dy, w_shape, spatial, strides, dilations, begin, end, group):
    # A 1x1 Conv's dW (most of ResNet-50's convs, every expand/project conv of MobileNet and
    # EfficientNet) is a matrix product (``_pointwise_weight_grad``): onnxruntime (CPU, 2 threads)
    # ran the Einsum form of it 4 to 14 times faster than the Conv below with its three
    # Transposes and, for strides, its Slice (N=2, 256->64, 16x16: 0.32 vs 1.29 ms; N=32,
    # 1024->2048 stride 2 on 4x4: 10.8 vs 155 ms), and the products beat the Einsum.
    if (group == 1 and all(k == 1 for k in w_shape[2:]) and not any(begin + end)
            and x.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE)):
        return _pointwise_weight_grad(g, x, dy, w_shape, spatial, strides)
    # dW[m, c, k] = sum_{n, o} dy[n, m, o] * xpad[n, c, o*stride + k*dilation]. On the CPU, for
    # up to 9 taps (grouped convs too, from a batch of 4, each group's product batched; not
    # depthwise ones), the columns by one Gather of the batch-innermost input, up to
    # ``GATHER_COLS`` values, past that a run of channels at a time, as long as one channel's
    # (one group's) columns fit ``GATHER_CHUNK`` (against the Conv below, dW alone, 2 threads,
    # ms: 64ch 3x3 on 96x96, N=8, runs of 6 channels 69 vs 133; 32ch on 64x64, N=32, runs of 3
    # channels 45 vs 97) (``_conv_weight_grad_gathered``): bench_zoo's
    # ResNet-18 at batch 32 (64 px), Trainer steps interleaved, both orders, 0.975x / 0.898x the
    # step time (its dW kernels' Slices, Concat and Pad 43 -> 12 ms); ResNet-50 0.95x / 1.02x, at
    # batch 2 1.01x / 0.99x. Elsewhere (a channel's columns past a run, CUDA), two lowerings,
    # chosen by measurement on onnxruntime (CPU), 3x3 convs:
    # * an im2col (Slices of the channel-major input, stacked channel-major) and one GEMM, whose
    #   output is dW in its own layout. 2 threads, against the Conv below: N=32, 64ch on 16x16:
    #   11.6 ms vs 21.2; 128ch on 8x8: 10.8 vs 22.4; 256ch on 4x4: 12.2 vs 16.5; stride 2,
    #   64->128: 8.3 vs 10.8; N=2, 64ch on 16x16: 0.9 vs 2.2 (those with the columns stacked
    #   kernel-major and a weight-size Transpose after the GEMM; stacking channel-major saves it:
    #   1 thread, dW and the forward Conv, ms, N=32, 128ch on 8x8 21.9 -> 19.4, 256ch on 4x4
    #   28.7 -> 23.8, 8x128ch on 8x8 5.5 -> 4.6). On short batch x pixels it now wins too, where
    #   the Conv below did before (N=2, 512ch on 2x2: 5.7 vs 12.6; 256ch on 4x4: 2.6 vs 4.8; N=32,
    #   512ch on 2x2: 44.5 vs 53.0). Its column matrix holds prod(K) copies of x: with a static
    #   batch it is taken a few images at a time past ``IM2COL_CHUNK`` values, where it wins by
    #   more (``bench_lowerings.py --only large_dw``, 2 threads, ms, chunks of 4 images vs the
    #   Conv: N=32, 64ch on 32x32 43.9 vs 125.5; 64->128 stride 2 on 64x64 111 vs 237; 3->32 on
    #   128x128 44.4 vs 76.7), as long as one image's columns fit in a chunk; a symbolic batch,
    #   taken whole, is capped at 2**24 values (for a typical batch of 16).
    #   Kernels of more than 9 taps lose to the Conv (3->64 7x7 stride 2, N=32 on 64x64: 23.5 vs
    #   10.5; on 128x128 106 vs 55; N=2 on 64x64 2.1 vs 1.0; stride 1, 64x64: 64.6 vs 64.9); the
    #   gathered columns with dW^T gained nothing on the 7x7 stems either (Trainer steps at 64 px,
    #   interleaved: ResNet-18 at batch 32 0.985x / 1.004x, at batch 2 0.985x; ResNet-50 0.998x).
    #   Nor did the stride-2 stem as a stride-1 conv over x's SpaceToDepth (12 channels, the kernel
    #   4x4 after padding it to 8x8), whose Conv over swapped axes has no dilation, dW read back by
    #   a Reshape, Transpose and Slice: 2 threads, a loaded 2-core VM, ms, median / fastest of
    #   16-60 interleaved runs, this Conv vs that: 3->64 7x7 stride 2, N=32 on 64x64 45.8 / 25.4 vs
    #   81.4 / 59.7; on 128x128 167 / 136 vs 384 / 276; N=2 on 64x64 0.93 / 0.58 vs 3.66 / 0.97
    #   (its products by dy are 16 pixels wide where this Conv's are 64).
    # * a Conv over x with batch and channels swapped, dy as the kernel, strides and dilations
    #   exchanged, then the result transposed: for grouped convs at batches under 4 and on
    #   CUDA, larger kernels and past the cap; and for a 3x3 conv of up to 64 channels at a
    #   static batch of 1 or 2 where ort-cpu runs it on its NCHWc kernels (``swaps_on_nchwc``,
    #   its table there): ResNet-18's and ResNet-50's 64-channel convs on 16x16 at 64 px, batch 2,
    #   Trainer steps interleaved on a loaded 2-core VM, 1 thread: ResNet-18 0.940x the step time
    #   (rounds 0.79x-1.09x, their median 0.91x; kernel time, fastest of 4 profiles, 84.7 -> 79.6 ms,
    #   its conv gradients 9.0 -> 7.3), ResNet-50 0.980x (median 0.99x). Batches 8 and 32 keep
    #   the gathered columns (their graphs unchanged). On the CPU a stride-1 depthwise 2-D conv on maps
    #   up to 64x64 takes two matrix products over x's and dy's rows (``_depthwise_weight_grad_rows``;
    #   at a batch under 4 from 1024 output pixels). Another depthwise conv with a static batch
    #   takes the same Conv over the images' channels as groups, without the Transposes,
    #   where its output has 64+ pixels (``_depthwise_weight_grad_per_image``); with a symbolic
    #   batch, 3x3 ones, stride 1, on mid-sized maps take the taps (``_depthwise_weight_grad_taps``).
    # (An im2col with a batched MatMul or an Einsum over [N, K*Ci, O] was no faster than the
    # Conv at N=32: 24 vs 21 ms; for depthwise 3x3/5x5 convs 1.3-2.7x slower than it.)
    # On onnxruntime's CUDA provider the Conv below is the slowest of the three wherever dy, its
    # kernel, is large (cuDNN's grouped direct kernel; H100, batch 32 at 128 px, CUPTI kernel
    # times: ResNet-18's 7x7 stem dW 12.1 ms of a 23.1 ms GPU step, EfficientNet-B0's 11 large
    # depthwise dWs 28.6 of 51.5), so there (``device="cuda"``) every depthwise conv takes the
    # taps and every dense one the im2col, whatever its kernel, stride or map size. GPU kernel
    # time per step, the CPU's choices -> these: ResNet-18 23.1 -> 11.8 ms, ResNet-50 42.4 ->
    # 31.5, MobileNetV3-small 23.1 -> 15.9; step time (interleaved, one session) 28.0 -> 22.9,
    # 69.2 -> 66.0, EfficientNet-B0 70.5 -> 62.4, but MobileNetV3-small 45.1 -> 53.5: its 721
    # more nodes on a step bound by kernel launches (and identical RegNet graphs took 64 and 81
    # ms in two sessions: cuDNN's algorithm search differs per session).
    cuda = g.device == "cuda"
    n_sp = len(spatial)
    cg, kernel = w_shape[1], list(w_shape[2:])
    out = out_dims(spatial, kernel, strides, dilations, begin, end)
    depthwise = group == w_shape[0] and cg == 1
    floats = g.opset >= 11 and x.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE)  # (Pad's pads an input)
    # Where ort-cpu has onnxruntime's NCHWc kernels (``g.nchwc``, their channel block) they run
    # the per-image Conv (its groups the images' channels, whole blocks of them) 3-6x faster than
    # the generic kernel (``backends/nchwc.py``), and it then beats the row products: train steps
    # at batch 32, 128 px, interleaved, two runs, EfficientNet-B0 0.94x / 0.98x, MobileNetV3-small
    # 0.94x / 0.96x; at batch 2, 64 px, EfficientNet-B0 0.97x (MobileNetV3-small's graphs the same).
    blocked = (depthwise and bool(g.nchwc) and n_sp == 2 and _known_batch(x) is not None and math.prod(out) >= 64
               and _known_batch(x) * w_shape[0] % g.nchwc == 0)
    if (depthwise and floats and not cuda and not blocked and n_sp == 2 and all(v == 1 for v in strides)
            and max(spatial) <= 64 and (typical_batch(x) >= 4 or math.prod(out) >= 1024)
            and (_known_batch(x)  # or else whole: a symbolic batch cannot be chunked
                 or typical_batch(x) * _rows_per_image(w_shape[0], kernel[1], out[0], spatial) <= ROWS_CHUNK)):
        return _depthwise_weight_grad_rows(g, x, dy, w_shape, spatial, strides, dilations, begin, end)
    if depthwise and not cuda and _known_batch(x) and math.prod(out) >= 64:
        return _depthwise_weight_grad_per_image(g, x, dy, w_shape, spatial, strides, dilations, begin, end)
    if depthwise and (cuda or (
            math.prod(kernel) <= 9 and all(v == 1 for v in strides) and math.prod(out) >= 256
            and typical_batch(x) * w_shape[0] * math.prod(spatial) <= 1 << 21)):
        return _depthwise_weight_grad_taps(g, x, dy, w_shape, spatial, strides, dilations, begin, end)
    per_image = cg * group * math.prod(kernel) * math.prod(out)  # columns
    dense = group == 1 and floats
    runs = _channel_runs(x, cg * group, cg, group, kernel, out)
    swapped = swaps_on_nchwc(g.nchwc, x.dtype, _known_batch(x), cg, group, kernel, out, strides, dilations)
    if (floats and not cuda and not swapped and math.prod(kernel) <= 9 and runs is not None
            and (group == 1 or (cg > 1 and typical_batch(x) >= 4))):
        return _conv_weight_grad_gathered(g, x, dy, w_shape, spatial, strides, dilations, begin, end, group, runs)
    if (dense and not swapped and (math.prod(kernel) <= 9 or cuda)
            and (per_image <= IM2COL_CHUNK if _known_batch(x) is not None
                 else per_image * typical_batch(x) <= 1 << 24)):
        return _conv_weight_grad_im2col(g, x, dy, w_shape, spatial, strides, dilations, begin, end, per_image)
    xt = _groups_over_batch(g, x, group, cg, spatial)
    dyt = _swap01(g, dy, n_sp)
    dw = g.op("Conv", xt, dyt, strides=dilations, dilations=strides, pads=begin + end,
              group=group if group != 1 else None)
    return _within_kernel(g, _swap01(g, dw, n_sp), kernel, spatial, out, strides, dilations, begin, end)


def _reaching_end(kernel, spatial, out, strides, dilations, begin, end) -> list[int]:
    """The end pads of a Conv over x by dy with strides and dilations exchanged (a dW) that
    reach the kernel's last tap and no further: where the strides do not divide evenly, the
    forward's end pads make that Conv compute taps past the kernel, cut off after it. Taken by
    the depthwise dW grouped by image and channel (``_depthwise_weight_grad_per_image``), where
    onnxruntime's im2col of each group, a column a tap, is most of the work. The Conv over
    swapped axes keeps the forward's pads: there the taps are the columns of one large GEMM,
    which ran no faster on fewer (ResNet-18's 7x7 stride-2 stem at batch 32, 128 px, 8x8 ->
    7x7 taps: its dW's kernel time 52.5 / 51.1 -> 57.9 / 63.6 ms in two profiles). A
    depthwise dW with a stride of 2, these end pads vs the forward's (``bench_lowerings.py
    --only reaching_pads``, 2 threads, ms, N=32): 96ch 3x3 on 64x64 47.3 vs 62.3; 144ch 5x5 on
    32x32 31.9 vs 40.1; 240ch 3x3 on 16x16 6.3 vs 8.5; 672ch 5x5 on 8x8 8.4 vs 11.6; N=2, 96ch
    on 64x64 1.50 vs 1.73. Trainer steps interleaved, both orders, at batch 32, 128 px:
    MobileNetV3-small 0.94x / 0.96x the step time, EfficientNet-B0 0.99x / 0.97x; at 64 px
    1.00x / 0.93x and 1.02x / 1.01x; at batch 2 (64 px) its gradient Convs' kernel time moved
    within noise (two profiles, EfficientNet-B0 20.7 / 19.7 -> 18.0 / 21.1 ms, MobileNetV3-small
    5.5 / 5.1 -> 5.0 / 4.9)."""
    return [max(0, min(e, d * (k - 1) + 1 + s * (o - 1) - n - b))
            for k, n, o, s, d, b, e in zip(kernel, spatial, out, strides, dilations, begin, end)]


def _within_kernel(g: GradBuilder, dw: ir.Value, kernel, spatial, out, strides, dilations, begin, end) -> ir.Value:
    """The kernel's taps of ``dw``, a Conv over x by dy with strides and dilations exchanged:
    when the strides do not divide evenly, that Conv also reaches windows the forward never did."""
    full = [(spatial[i] + begin[i] + end[i] - (out[i] - 1) * strides[i] - 1) // dilations[i] + 1
            for i in range(len(spatial))]
    if full == kernel:
        return dw
    return g.op("Slice", dw, g.ints([0] * len(kernel)), g.ints(kernel), g.ints(list(range(2, 2 + len(kernel)))))


@grad_rule("Conv")
def grad_conv(g, node, dy):
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    w_shape = static_shape(w)
    if w_shape is None or not all(isinstance(d, int) for d in w_shape):
        raise GraphError(f"gradient of Conv {node.name!r} needs a static weight shape, got {w_shape}")
    kernel = list(w_shape[2:])
    group = attr(node, "group", 1)
    if symbolic_spatial(x):  # its spatial dims known only at run time
        db = g.reduce("ReduceSum", dy, [0] + list(range(2, 2 + len(kernel))), keepdims=False) if g.wants(b) else None
        found = run_time_window(g, node, x, kernel)
        strides, dilations, begin, end = found
        # a stride-1 Conv with static pads: dx as a Conv by the flipped weight (``_flipped_input_grad``),
        # already of x's size, in place of the padless ConvTranspose, its Slice and Pad. Forward and
        # dx, 64->64 3x3 pads 1, N=8 32x32, 2 threads, ms, two runs each: 20.5 / 21.5 vs 26.0 / 30.4
        # (the static rule's 20.4 / 20.3); with dW too 65.7 / 68.6 vs 78.8 / 87.4 (static 28.7 /
        # 34.4), with dW then the swapped Conv: now the static rule's gathered columns, their
        # positions from the run-time dims (``symbolic_spatial._gathered_weight_grad``, 0.6-1.3x
        # the static form's time where the Conv took 1.2-1.8x). Depthwise 32ch 3x3 on 64x64 with
        # dW: 42.8 / 41.9 vs 48.3 / 48.8 (static 44.2 / 33.5).
        flip = (g.wants(x) and all(s == 1 for s in strides) and isinstance(begin, list) and isinstance(end, list)
                and _flipped_pads(w_shape, dilations, begin, end) is not None
                and (group == 1 or w_shape[0] == group * w_shape[1]))
        dx, dw = conv_grads(g, node, dy, w_shape, found, dx_too=not flip)
        if flip:
            dx = _flipped_input_grad(g, dy, w, w_shape, dilations, begin, end, group)
        return dx, dw, db
    spatial, strides, dilations, begin, end = window(g, node, x, kernel)
    scaled = channel_scaled(g, dy, (1,))
    if scaled is not None:  # a BatchNorm's dx, z * factor per output channel: dx by the weight * factor, dW * factor
        dy, factor, _ = scaled
        factor = g.op("Reshape", factor, g.ints([-1] + [1] * (len(w_shape) - 1)))
        if g.wants(x):
            w = g.mul(w, factor)
            w.dtype, w.shape = node.inputs[1].dtype, node.inputs[1].shape
    dx = dw = db = None
    if g.wants(x) and group == 1 and all(k == 1 for k in kernel + strides) and not any(begin + end):
        # A 1x1 Conv's dx is a 1x1 Conv by the transposed weight: onnxruntime (CPU, 2 threads)
        # runs it 1.2-2x faster than the ConvTranspose (N=32, 672->112 on 4x4: 0.91 vs 1.97 ms;
        # 1152->192 on 2x2: 2.7 vs 5.3; N=2, 144->24 on 16x16: 0.08 vs 0.11). For dense kxk
        # convs see ``_by_flipped_conv``.
        # Where the weight outweighs the activations (maps of 4 pixels, or 32 in the whole batch),
        # one Gemm by the weight as it is, dy's batch and channels swapped, beats transposing the
        # weight each step (1 thread, ms, that vs the Conv vs the ConvTranspose): N=32, 512<-2048
        # on 2x2: 6.3 / 18.1 / 35.3; 96<-576 on 2x2: 0.73 / 0.90 / 1.71; N=2, 512<-2048 on 2x2:
        # 1.15 / 2.98 / 1.97; 256<-1024 on 4x4: 0.27 / 0.37 / 0.42; but N=32 on 4x4, 256<-1024:
        # 5.2 / 4.5 / 8.2; N=2 on 8x8, 128<-512: 0.28 / 0.24 / 0.28.
        pixels, batch = math.prod(spatial), typical_batch(x)
        if pixels <= 4 or batch * pixels <= 32:
            dx = _pointwise_input_grad_gemm(g, dy, w, w_shape, spatial)
        else:
            dx = _pointwise_input_grad_conv(g, dy, w, len(spatial))
    elif g.wants(x) and _strided_pointwise_by_conv(w_shape, spatial, kernel, begin + end, group):
        dx = _zero_interleaved(g, _pointwise_input_grad_conv(g, dy, w, len(spatial)), w_shape[1], spatial, strides)
    elif (g.wants(x) and g.device == "cpu" and _flipped_pads(w_shape, dilations, begin, end) is not None
          and gathers_conv(w_shape[2:], w_shape[0], spatial, strides, group, typical_batch(x), x.dtype, dx=True,
                           nchwc=g.nchwc)):
        dx = _gathered_input_grad(g, dy, w, w_shape, spatial, dilations, begin, end)
    elif g.wants(x) and _by_flipped_conv(w_shape, spatial, strides, dilations, begin, end, group, typical_batch(x),
                                         x.dtype, g.nchwc):
        dx = _flipped_input_grad(g, dy, w, w_shape, dilations, begin, end, group)
    elif g.wants(x):
        dx = _transposed(g, dy, w, spatial, kernel, strides, dilations, begin, end, group)
    if g.wants(node.inputs[1]):
        dw = _conv_weight_grad(g, x, dy, w_shape, spatial, strides, dilations, begin, end, group)
        dw = dw if scaled is None else g.mul(dw, factor)
    if g.wants(b):
        db = g.reduce("ReduceSum", dy, [0] + list(range(2, 2 + len(spatial))), keepdims=False)
        db = db if scaled is None else g.mul(db, g.op("Reshape", factor, g.ints([-1])))
    return dx, dw, db


def _known_batch(x: ir.Value) -> int | None:
    """x's batch dim, None when it is symbolic."""
    sx = static_shape(x)
    return sx[0] if sx is not None and isinstance(sx[0], int) else None


def typical_batch(x: ir.Value) -> int:
    """x's batch dim; a typical 16 when it is symbolic (what the lowerings, and dense_conv, are
    chosen for when the batch is only known at run time)."""
    batch = _known_batch(x)
    return 16 if batch is None else batch


def _pointwise_input_grad_conv(g: GradBuilder, dy: ir.Value, w: ir.Value, n_sp: int) -> ir.Value:
    """dx of a 1x1 Conv on dy's own grid: dy convolved by the weight with its channel axes swapped."""
    return g.op("Conv", dy, _swap01(g, w, n_sp))


def _pointwise_input_grad_gemm(g: GradBuilder, dy: ir.Value, w: ir.Value, w_shape, spatial) -> ir.Value:
    """dx of a 1x1 Conv as ``W^T @ dy`` over all pixels of the batch: dy [N, Co, *S] -> [Co, N*S],
    one Gemm with the weight [Co, Ci] read transposed (``transA``), back to [N, Ci, *S]."""
    co, ci = w_shape[0], w_shape[1]
    n_sp = len(spatial)
    cols = g.op("Reshape", g.transpose(g.op("Reshape", dy, g.ints([0, co, -1])), [1, 0, 2]), g.ints([co, -1]))
    out = g.op("Gemm", g.op("Reshape", w, g.ints([co, ci])), cols, transA=1)  # [Ci, N*S]
    return _swap01(g, g.op("Reshape", out, g.ints([ci, -1] + list(spatial))), n_sp)


def _strided_pointwise_by_conv(w_shape, spatial, kernel, pads, group) -> bool:
    """Whether a strided 1x1 Conv's dx is taken as a 1x1 Conv by the transposed weight spread
    over the input grid with zeros (``_zero_interleaved``) rather than a ConvTranspose: on small
    maps or wide convs, where onnxruntime's ConvTranspose is slowest. 1 thread, interleaved, ms,
    that vs the ConvTranspose, stride 2, dx [N, Ci, H, H] from dy [N, Co, H/2, H/2]:
    H=4: N=32, 1024<-2048 34.9 vs 57.8; 2048<-1024 38.6 vs 53.0; 512<-1024 10.6 vs 13.6; 256<-512
    2.8 vs 3.2; N=8, 1024<-2048 14.5 vs 17.4. H=8: N=32, 1024<-2048 49.4 vs 62.6, but 512<-1024
    20.5 vs 17.9 and 256<-512 6.5 vs 4.5; H=16, 256<-512: 23.8 vs 9.6 (N=32), 0.95 vs 0.50 (N=2)."""
    return (group == 1 and all(k == 1 for k in kernel) and not any(pads)
            and (math.prod(spatial) <= 16 or w_shape[0] * w_shape[1] >= 2 ** 21))


NCHWC_MIN_PIXELS = 1024  # ``graphc.backends.nchwc.DENSE_MIN_PIXELS`` (passes never import a backend)
NCHWC_SWAPPED_TAPS = 256  # ``graphc.backends.nchwc.SWAPPED_MAX_TAPS``


def swaps_on_nchwc(nchwc: int, dtype, batch: int | None, in_channels: int, group: int, kernel, out, strides,
                   dilations) -> bool:
    """Does a dense 3x3 stride-1 Conv's dW take the Conv over swapped axes (dy its kernel), which
    ort-cpu runs on onnxruntime's NCHWc kernels of channel block ``nchwc`` (``graphc.backends.nchwc``:
    a batch under a block, dy of at most ``NCHWC_SWAPPED_TAPS`` pixels), in place of the gathered
    columns? At a static batch of 1 or 2, up to 64 input channels, on maps of 65 to 256 pixels.
    ``bench_lowerings.py --only batch_dw``, 1 thread, ms, two runs, gathered vs that: N=2, 64ch
    16x16 0.67 / 0.65 vs 0.46 / 0.49; 32ch 16x16 0.27 / 0.28 vs 0.18 / 0.17; 64ch 12x12 0.36 /
    0.34 vs 0.24 / 0.24; N=1, 64ch 16x16 0.51 / 0.48 vs 0.21 / 0.21. Not at 128 channels (N=2,
    8x8 0.50 / 0.49 vs 0.49 / 0.48; 12x12 1.01 / 0.96 vs 1.01 / 1.00; 16x16 3.3 / 4.4 vs 4.5 /
    3.3), 256 (16x16 12.5 / 12.0 vs 13.5 / 13.7), with a stride (64->128 on 16x16 0.25 / 0.26 vs
    0.36 / 0.37), nor from N=4 (64ch 16x16 0.92 / 0.85 vs 0.87 / 0.91; 128ch 8x8 0.79 / 0.65 vs
    0.87 / 0.80), N=8 (1.22 vs 1.44) or N=32 (9.1 vs 19.8); the 3-channel stems (N=2, 3->32 on
    64x64 stride 2 0.13 vs 0.12) are a tie. ResNet-18 and ResNet-50 at 64 px take it for their
    64-channel 3x3 convs on 16x16 maps at batch 2."""
    return (bool(nchwc) and dtype == ir.DataType.FLOAT and batch is not None and batch <= 2 and group == 1
            and in_channels <= 64 and list(kernel) == [3, 3] and all(s == 1 for s in strides)
            and all(d == 1 for d in dilations) and 64 < math.prod(out) <= NCHWC_SWAPPED_TAPS)


def blocked_dense(nchwc: int, dtype, in_channels: int, batch: int, out) -> bool:
    """Does ort-cpu run a dense Conv (its weight fed) on onnxruntime's NCHWc kernels, of channel
    block ``nchwc`` (0: none)? A float32 one, its input channels whole blocks, its batch times
    output pixels ``NCHWC_MIN_PIXELS`` or more: ``graphc.backends.nchwc``'s rule, which it must
    equal."""
    return (bool(nchwc) and dtype == ir.DataType.FLOAT and in_channels % nchwc == 0
            and batch * math.prod(out) >= NCHWC_MIN_PIXELS)


def gathers_conv(kernel, in_channels: int, out, strides, group: int, batch: int, dtype, dx: bool = False,
                 nchwc: int = 0) -> bool:
    """Whether, in the CPU training graphs, a dense stride-1 Conv of up to 9 taps whose output has
    ``out`` dims runs as its gathered columns times the weight (``conv_gather.gathered_conv``):
    where onnxruntime's Conv and ConvTranspose run one small GEMM per image. ``dx``: the Conv that
    is a dx (``_gathered_input_grad``, in place of a ConvTranspose), on maps of 17 to 144 pixels;
    else a forward Conv of 128+ input channels on maps of 17 to 64. Both at a batch of 8 or more,
    and not where ort-cpu runs the Conv on its NCHWc kernels (``blocked_dense``; the dx then a
    Conv by the flipped weight, ``_by_flipped_conv``), faster now that their weight's reorder is
    (2 threads, ms, NCHWc vs gathered, x's or dy's Transpose to batch-innermost included, N=32:
    128ch 8x8 forward 1.38 / 1.44 vs 1.96 / 2.29, dx 1.64 / 2.15 vs 2.07 / 2.53; 256ch 8x8 5.67 /
    5.48 vs 7.10 / 6.82, dx 6.66 / 6.68 vs 7.18 / 7.45).
    ``bench_lowerings.py --only gathered_conv``, 2 threads, ms, two runs each, 3x3, this vs the
    Conv / vs the ConvTranspose: N=32, 256ch 8x8 15.3, 14.2 vs 17.0, 15.7 / 16.7, 17.9 vs 18.5,
    21.3; 128ch 8x8 6.8, 5.6 vs 8.3, 7.6 / 6.9, 5.3 vs 8.9, 6.7; 256ch 7x7 13.0, 14.1 vs 17.3,
    20.9 / 14.7, 14.0 vs 22.6, 21.1; 64ch 8x8 (dx) 2.2, 1.9 vs 2.8, 2.6; 128ch 12x12 (dx) 13.3,
    13.3 vs 15.2, 14.4; N=8, 256ch 8x8 4.9, 5.1 vs 5.5, 5.5 / 5.7, 6.3 vs 5.8, 6.6. Not for the
    forward on 64 channels (8x8: 1.7, 1.2 vs 1.3, 1.1) or 144 pixels (128ch 12x12: 13.1, 13.1 vs
    10.1, 10.1), nor either on 16x16 maps (128ch: 19.3 vs 12.5 / 22.4 vs 19.0), nor at N=2 (256ch
    8x8: 1.8 vs 1.1 / 2.8 vs 1.7). Maps of up to 16 pixels are ``dense_conv``'s. The columns are
    bounded as the gathered dW's. Grouped convs (groups of 8) lose as products batched over the
    groups, forward and stride-1 dx alike (``--only grouped_conv``, N=32, ms, against the Conv:
    forward, 48ch 64x64 stride 2 21.2 vs 9.1, 104ch 16x16 7.4 vs 4.0; dx 7.9 vs the flipped
    Conv's 4.6; at 8x8 a tie, 1.73 vs 1.80), though their dW gains (``_conv_weight_grad_gathered``)."""
    return (group == 1 and len(kernel) == 2 and 1 < math.prod(kernel) <= 9 and all(s == 1 for s in strides)
            and 16 < math.prod(out) <= (144 if dx else 64) and (dx or in_channels >= 128) and batch >= 8
            and not blocked_dense(nchwc, dtype, in_channels, batch, out)
            and dtype == ir.DataType.FLOAT and in_channels * math.prod(kernel) * math.prod(out) * batch <= GATHER_COLS)


def _flipped_pads(w_shape, dilations, begin, end) -> list[int] | None:
    """The pads of the Conv that is a stride-1 Conv's dx: d*(k-1) - pad each side; None where a
    pad passes the kernel's reach (they would be negative)."""
    kernel = list(w_shape[2:])
    pads = [d * (k - 1) - b for d, k, b in zip(dilations, kernel, begin)] + \
           [d * (k - 1) - e for d, k, e in zip(dilations, kernel, end)]
    return pads if min(pads) >= 0 else None


def _gathered_input_grad(g: GradBuilder, dy: ir.Value, w: ir.Value, w_shape, spatial, dilations, begin,
                         end) -> ir.Value:
    """dx of a dense stride-1 Conv (``gathers_conv``): a Conv of dy by the weight flipped in space
    with its channel axes swapped, as dy's gathered columns, their taps reversed, times the weight
    swapped, [Ci, Co * K] (a Slice flipping the weight each step took about 1 ms for each of
    ResNet-18's 256x256x3x3 weights)."""
    co, ci, kernel = w_shape[0], w_shape[1], list(w_shape[2:])
    n_sp = len(kernel)
    pads = _flipped_pads(w_shape, dilations, begin, end)
    weight = g.op("Reshape", _swap01(g, w, n_sp), g.ints([ci, -1]))
    return gathered_conv(g, dy, weight, ci, co, out_dims(spatial, kernel, [1] * n_sp, dilations, begin, end),
                         kernel, spatial, dilations, pads[:n_sp], pads[n_sp:], flip=True)


def _by_flipped_conv(w_shape, spatial, strides, dilations, begin, end, group: int, batch: int, dtype,
                     nchwc: int = 0) -> bool:
    """Whether a stride-1 Conv's dx is taken as a Conv of dy by the weight flipped in space, each
    group's channel axes swapped (``_flipped_input_grad``), not a ConvTranspose: onnxruntime's
    grouped ConvTranspose is its slowest and least parallel kernel, and its dense one loses on
    large maps. Interleaved, ms, that vs the ConvTranspose, dx [N, C, H, H]
    (``scripts/bench_lowerings.py --only conv_dx``), 2 threads / 1 thread. Depthwise, N=32:
    3x3 96ch 32x32 8.5 vs 20.5 / 16.0 vs 20.7; 96ch 64x64 28.2 vs 55.4 / 52.9 vs 67.5; 480ch 8x8
    4.6 vs 10.3 / 11.2 vs 10.5; 5x5 240ch 16x16 18.8 vs 37.8 / 36.2 vs 38.6; 1152ch 4x4 18.3 vs 24.3
    / 20.5 vs 19.3; N=2, 96ch 32x32 0.74 vs 1.21 / 0.64 vs 0.78. Groups of 8 channels (RegNet),
    N=32: 48ch 16x16 2.4 vs 5.3 / 2.6 vs 2.0; 104ch 8x8 1.9 vs 3.2 / 2.0 vs 1.7; 440ch 2x2 4.3 vs
    4.0 / 2.7 vs 2.1; N=2, 104ch 8x8 0.25 vs 0.22 / 0.21 vs 0.14: taken from N=8 and 16 pixels,
    depthwise always. Dense 3x3, 2 threads: N=32, 64ch 32x32 21.6 vs 28.2; 128ch 16x16 19.6 vs
    27.3; 64ch 16x16 7.0 vs 9.7; but 128ch 8x8 11.6 vs 10.8 and 256ch 8x8 24.7 vs 25.2, and N=2
    (64ch 16x16 1.10 vs 0.72; 256ch 4x4 5.4 vs 1.5: the weight's flip is paid per step): taken
    from N=8 on maps of 256 pixels. Left as they were: a depthwise channel multiplier of 2
    (96->192, 32x32: 15.2 vs 16.0 / 30.1 vs 21.6) and stride 2 (dy spread over the input grid
    with zeros first: 98.6 vs 40.9 ms, 96ch 64x64; as sub-pixel phases, each output phase a
    stride-1 depthwise Conv of dy by its taps, interleaved by DepthToSpace: 86.3 ms as one Conv
    of channel multiplier 4, 109.6 as four Convs, vs 49.6 / 42.4, and slower at 16x16 to 128x128;
    so are groups of 8 at stride 2 as phases, one Conv of dy by the 2x2 phase kernels, N=32,
    ``--only grouped_conv``: 48ch 64x64 35.8 vs 27.2, 104ch 32x32 14.5 vs 10.3, 208ch 16x16 6.7
    vs 4.2). A dense one ort-cpu runs on its NCHWc kernels (``blocked_dense``) is taken at any
    size (see ``gathers_conv``)."""
    if any(s != 1 for s in strides) or (group > 1 and w_shape[0] != group * w_shape[1]):
        return False
    if _flipped_pads(w_shape, dilations, begin, end) is None:
        return False
    if group == 1:
        return batch >= 8 and math.prod(spatial) >= 256 or blocked_dense(nchwc, dtype, w_shape[0], batch, spatial)
    return w_shape[1] == 1 or (batch >= 8 and math.prod(spatial) >= 16)


def _flipped_input_grad(g: GradBuilder, dy: ir.Value, w: ir.Value, w_shape, dilations, begin, end, group: int) -> ir.Value:
    """dx of a stride-1 grouped Conv: Conv(dy, w') with w' [Ci, Co/g, *k] the weight reversed
    along every spatial axis, each group's channel axes swapped; pads d*(k-1) - pad.
    Reversing every spatial axis reverses the taps' row-major order: in floating point the
    weight as [Co * Ci/g, K] times the K x K anti-identity, exact (each value times 1, plus
    zeros). A Slice of step -1 along the spatial axes took 3x as long (2 threads, ms, flip and
    swap, Slice vs product: 256x256x3x3 1.31 vs 0.39, 512x512x3x3 5.1 vs 1.8, 128x128x3x3 0.30
    vs 0.10; ResNet-18's dxs at 128 px spent 6.4 ms of a step in those Slices). Trainer steps
    interleaved, batch 32: ResNet-18 0.993x the step time at 128 px, 0.991x at 64 px; ResNet-50
    at 128 px and EfficientNet-B0 at 64 px 1.00x."""
    co, ci_g, kernel = w_shape[0], w_shape[1], list(w_shape[2:])
    n_sp, taps = len(kernel), math.prod(kernel)
    if w.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        reverse = g.const(np.eye(taps)[::-1], w.dtype)
        flipped = g.op("MatMul", g.op("Reshape", w, g.ints([co * ci_g, taps])), reverse)  # [Co * Ci/g, K]
    else:
        axes = list(range(2, 2 + n_sp))
        flipped = g.op("Slice", w, g.ints([-1] * n_sp), g.ints([-(2 ** 62)] * n_sp), g.ints(axes), g.ints([-1] * n_sp))
    swap = ci_g > 1 or co != group  # not depthwise: swap each group's channel axes, whole runs of taps
    if swap:
        flipped = g.transpose(g.op("Reshape", flipped, g.ints([group, co // group, ci_g, taps])), [0, 2, 1, 3])
    flipped = g.op("Reshape", flipped, g.ints(([group * ci_g, co // group] if swap else [co, ci_g]) + kernel))
    return g.op("Conv", dy, flipped, pads=_flipped_pads(w_shape, dilations, begin, end),
                dilations=dilations if any(d != 1 for d in dilations) else None, group=group)


def _zero_interleaved(g: GradBuilder, t: ir.Value, channels: int, spatial: list[int], strides: list[int]) -> ir.Value:
    """[N, C, *O] placed at every stride-th position of a zero [N, C, *spatial] grid: each axis
    gets a new one of size stride after it (a Pad of zeros), the pairs are merged, the end cut to
    the input's size."""
    n_sp = len(spatial)
    out = [(d - 1) // s + 1 for d, s in zip(spatial, strides)]
    split = g.op("Reshape", t, g.ints([0, channels] + [v for o in out for v in (o, 1)]))
    pads = [0] * (2 + 2 * n_sp) + [0, 0] + [v for s in strides for v in (0, s - 1)]
    grid = g.op("Pad", split, g.ints(pads))
    merged = g.op("Reshape", grid, g.ints([0, channels] + [o * s for o, s in zip(out, strides)]))
    if all(o * s == d for o, s, d in zip(out, strides, spatial)):
        return merged
    axes = list(range(2, 2 + n_sp))
    return g.op("Slice", merged, g.ints([0] * n_sp), g.ints(spatial), g.ints(axes))


@grad_rule("ConvTranspose")
def grad_conv_transpose(g, node, dy):
    # ConvTranspose is the adjoint of Conv: dx = Conv(dy, w) with the same geometry; dw is a Conv
    # over dy with batch and channels swapped (groups over the batch) and x as the kernel.
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    w_shape, sx = static_shape(w), static_shape(x)
    if w_shape is None or not all(isinstance(d, int) for d in w_shape) or sx is None:
        raise GraphError(f"gradient of ConvTranspose {node.name!r} needs a static weight shape and a known rank")
    n_sp = len(w_shape) - 2
    kernel = list(w_shape[2:])
    strides = list(attr(node, "strides", None) or [1] * n_sp)
    dilations = list(attr(node, "dilations", None) or [1] * n_sp)
    out_pad = list(attr(node, "output_padding", None) or [0] * n_sp)
    unpadded = None if not all(isinstance(d, int) for d in sx[2:]) else [
        strides[i] * (sx[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    pads = _transposed_pads(node, unpadded, [d * st if isinstance(d, int) else None for d, st in zip(sx[2:], strides)])
    group = attr(node, "group", 1)
    dx = dw = db = None
    if g.wants(x):
        dx = g.op("Conv", dy, w, strides=strides, dilations=dilations, pads=pads, group=group if group != 1 else None)
    if g.wants(w) and unpadded is None:  # spatial dims known only at run time
        dw = conv_transpose_weight_grad(g, node, x, dy, w_shape, pads)
    elif g.wants(w):
        spatial_y = [unpadded[i] - pads[i] - pads[n_sp + i] for i in range(n_sp)]
        dyt = _groups_over_batch(g, dy, group, w_shape[1], spatial_y)
        full = g.op("Conv", dyt, _swap01(g, x, n_sp), strides=dilations, dilations=strides, pads=pads,
                    group=group if group != 1 else None)
        dw = g.op("Slice", _swap01(g, full, n_sp), g.ints([0] * n_sp), g.ints(kernel),
                  g.ints(list(range(2, 2 + n_sp))))
    if g.wants(b):
        db = g.reduce("ReduceSum", dy, [0] + list(range(2, 2 + n_sp)), keepdims=False)
    return dx, dw, db


def _transposed_pads(node: ir.Node, unpadded: list[int] | None, same: list) -> list[int]:
    """A ConvTranspose's pads (begins, then ends): its ``pads``, none for auto_pad VALID, or those
    its ``output_shape`` (the spatial dims; ``same``, input dims times strides, for auto_pad
    SAME_*) sets, as ONNX computes them: the ``unpadded`` size less the output_shape, the odd one
    at the end for SAME_UPPER, else at the start."""
    n_sp = len(same)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    output_shape = attr(node, "output_shape")
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = same
    if output_shape is None:
        return [0] * (2 * n_sp) if auto_pad == "VALID" else list(attr(node, "pads", None) or [0] * (2 * n_sp))
    output_shape = list(output_shape)[-n_sp:]
    total = None if unpadded is None else [u - t for u, t in zip(unpadded, output_shape)]
    if total is None or any(t < 0 for t in total):
        setting = f"output_shape {output_shape}" if attr(node, "output_shape") is not None else \
            f"auto_pad={auto_pad!r} (output dims {output_shape})"
        raise GraphError(f"gradient of ConvTranspose {node.name!r}: {setting} needs static spatial dims of at "
                         f"least it, the size without pads; got {unpadded}")
    if auto_pad == "SAME_UPPER":
        return [t // 2 for t in total] + [t - t // 2 for t in total]
    return [t - t // 2 for t in total] + [t // 2 for t in total]


# -- pooling ----------------------------------------------------------------------------------
def _max_pool_tiles(g: GradBuilder, node: ir.Node, x: ir.Value, dy: ir.Value) -> ir.Value | None:
    """dx for 2-D windows that tile the input (strides == kernel, no pads or dilation, dims
    divisible), else None. Needs no Indices output: asking for one moves onnxruntime's forward
    MaxPool off its fast kernel (~20x slower). The window's first maximum in row-major order
    gets the gradient, as with Indices (PyTorch's choice): each element equal to its window's
    max scores by position (first = highest), and a MaxPool of the scores picks exactly one.
    Where the forward's window max is NaN nothing equals it (the best score is 0, which names
    no position), so that window passes no gradient (onnxruntime's MaxPool skips NaN instead:
    there the largest other value gets it)."""
    kernel = list(attr(node, "kernel_shape"))
    if len(kernel) != 2 or g.opset < 11 or x.dtype is None:
        return None
    if symbolic_spatial(x):
        return _max_pool_tiles_at_run_time(g, node, x, dy, kernel)
    spatial, strides, dilations, begin, end = window(g, node, x, kernel)
    if strides != kernel or any(d != 1 for d in dilations) or any(begin + end) or \
            any(d % k for d, k in zip(spatial, kernel)):
        return None
    rows, cols = np.indices(spatial)
    return _tiled_grad(g, node, x, dy, kernel, lambda: g.const(
        (math.prod(kernel) - (rows % kernel[0]) * kernel[1] - cols % kernel[1]).astype(np.float32)[None, None]))


def _tiled_grad(g: GradBuilder, node: ir.Node, x: ir.Value, dy: ir.Value, kernel, scores) -> ir.Value:
    """``_max_pool_tiles``'s dx over x [N, C, *out * kernel], ``scores()`` building each
    position's score in its window."""
    scales = g.const(np.array([1.0, 1.0, *kernel], dtype=np.float32))
    first_is_best = scores()

    def tile(v: ir.Value) -> ir.Value:  # each window's value repeated over the window
        return g.op("Resize", v, None, scales, mode="nearest", coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor")

    # masks as Cast + Mul, not Where: onnxruntime's Where is the slower kernel (LeNet pool1,
    # x [64,6,28,28]: 385 us with Where, 305 us like this, forward MaxPool included)
    is_max = g.op("Cast", g.op("Equal", x, tile(node.outputs[0])), to=int(ir.DataType.FLOAT))
    best = g.op("MaxPool", g.mul(is_max, first_is_best), kernel_shape=kernel, strides=kernel)
    # best names the window's first maximum (0 where nothing matched: no position scores 0)
    return g.mul(g.cast_like(g.op("Equal", first_is_best, tile(best)), dy), tile(dy))


def _max_pool_tiles_at_run_time(g: GradBuilder, node: ir.Node, x: ir.Value, dy: ir.Value, kernel) -> ir.Value | None:
    """``_max_pool_tiles`` on spatial dims known only at run time: x cut to the windows' extent
    (out * kernel, from Shape), the scores one window's tiled over it, dx zero-filled at the end
    back to x's dims; windows that tile by their attributes (no pads, auto_pad, dilation or
    ceil_mode). 2x2 stride 2 over [8, 64, 32, 32], forward and dx, 2 threads, ms, two runs
    each: this 1.15 / 1.50, the Indices' ScatterElements 8.0 / 2.6, static tiles 0.88 / 1.11."""
    if (list(attr(node, "strides", None) or [1, 1]) != kernel or any(d != 1 for d in attr(node, "dilations", None) or [])
            or any(attr(node, "pads", None) or []) or attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID")
            or attr(node, "ceil_mode", 0)):
        return None
    axes, out = g.ints([2, 3]), spatial_of(g, node.outputs[0])
    cut = g.op("Slice", x, g.ints([0, 0]), g.op("Mul", out, g.ints(kernel)), axes)
    rows, cols = np.indices(kernel)
    pattern = (math.prod(kernel) - rows * kernel[1] - cols).astype(np.float32)[None, None]
    dx = _tiled_grad(g, node, cut, dy, kernel,
                     lambda: g.op("Tile", g.const(pattern), g.op("Concat", g.ints([1, 1]), out, axis=0)))
    short = g.op("Sub", spatial_of(g, x), spatial_of(g, dx))
    return g.op("Pad", dx, g.op("Concat", g.ints([0] * 6), short, axis=0))


@grad_rule("MaxPool")
def grad_max_pool(g, node, dy):
    # Each output's gradient goes to the input element its Indices output names (the first
    # maximum of the window, like PyTorch), accumulated where windows overlap: ScatterElements
    # with reduction="add" over the flattened input. Tiling windows take a faster path.
    # Asking for Indices costs the forward onnxruntime's fast MaxPool (ResNet's 3x3 stride-2 pool
    # on [32,64,64,64], 2 threads: 46 ms with Indices, 6 without), but finding each window's
    # first maximum without them lost: per tap, the strided window values equal to the max take
    # what is left of dy, the nine parts shifted, summed and interleaved back (forward and
    # backward, ``bench_lowerings.py --only max_pool``, ms, this vs that: [32,64,32,32] 18.4 vs
    # 52.6, [32,64,64,64] 69.2 vs 198, [2,64,32,32] 1.2 vs 2.4, measured again on onnxruntime 1.31
    # 7.6 vs 13.2, 29.2 vs 79.6, 0.43 vs 0.74; its strided Slices, Wheres and Pads). Nor with x
    # as its four row/column parity planes (SpaceToDepth), each tap one plane shifted by at most a
    # row and a column, the masks as Equal, Cast, Mul and Sub, the planes' gradients interleaved
    # by DepthToSpace: [32,64,32,32] 10.7-14.0 vs 7.4, [32,64,64,64] 53.6 vs 30.6, [2,64,32,32]
    # 0.52 vs 0.42 (its DepthToSpace 2.8 ms and ten Pads 2.9, the masks 2.1). Nor the Indices
    # themselves as an ArgMax over each window's nine values beside the fast MaxPool:
    # [32,64,32,32], 2 threads, ms, MaxPool with Indices 6.4 (without 0.33); the windows gathered
    # from the padded input (Pad, Gather, ArgMax) 8.3, sliced (nine strided Slices, Concat,
    # ArgMax) 7.7. MaxUnpool (8 ms where ScatterElements takes 20) writes one gradient where two
    # overlapping windows share their maximum; it needs their sum. Nor is there much to win: with
    # MaxUnpool in its place (wrong values, timed only), ResNet-18's step at batch 32, 64 px took
    # 1.000x / 1.003x (Trainers interleaved, built second / first), though the ScatterElements
    # shows 3.0 ms in its profile (1.3-1.6 alone, caches flushed). ScatterElements over the
    # images' planes, [N*C, H*W] along axis 1 (each index taken modulo H*W), in place of the
    # flat input: 2 threads, ms, 3x3 stride 2 over [32, 64, 32, 32] 5.13 vs 1.95, [32, 64, 64,
    # 64] 14.2 vs 8.6. Measured again on one thread, where ResNet-18's pool (batch 32, 64 px) and
    # its ScatterElements take 22.9 and 11.2 of 349 ms of kernel time (fastest of five profiled
    # steps), forward and dx of [32,64,32,32], ms, this vs that: the windows' ArgMax (nine strided
    # Slices of the input padded with -inf, Concat, ArgMax, the tap's offset gathered) beside the
    # fast MaxPool, scattered into the padded input and sliced back, 13.2 vs 14.9 (CPU time, fastest
    # of 30 runs). On 2 threads, a busy machine (fastest of 30 runs each), the Indices as two 1-D
    # pools' (columns, then rows: the same first maximum in row-major order, the second's Indices
    # gathered from the first's) 68 vs 113 for the forward alone, and the pads as a Pad of -inf in
    # front of a pool without pads, forward and dx, 58 vs 73. Last, the fast pool beside each
    # window's first maximum found tap by tap (x padded with NaN, its stride phases by one
    # SpaceToDepth, each tap's view Equal to the pooled output, a Where chain over the taps in
    # reverse keeping int32 positions, scattered as here): one thread, CPU time, forward and dx of
    # [32,64,32,32] 13.6 vs 9.1 ms ([2,...] 0.76 vs 0.36), ResNet-18's whole step 0.97-0.99x,
    # ResNet-50's 0.98-0.99x; but on 2 threads even (fastest 8.0 vs 8.0, in the step 8.5 vs 8.6):
    # its SpaceToDepth, Wheres, Pad and scatter run on one thread where the pool uses all, so it
    # would lose with more cores. Not kept. Nor ScatterND (the Indices as [M, 1], reduction add)
    # for the ScatterElements: forward and dx, 2 threads, a loaded 2-core VM, ms, median / fastest
    # of 10-60 interleaved runs, this vs that: [32,64,32,32] 53.6 / 36.5 vs 64.9 / 45.0;
    # [32,64,64,64] 262 / 206 vs 254 / 209; [2,64,32,32] 1.34 / 1.14 vs 1.87 / 1.22.
    x = node.inputs[0]
    tiled = _max_pool_tiles(g, node, x, dy)
    if tiled is not None:
        return (tiled,)
    node = g.with_outputs(node, 2)
    indices = node.outputs[1]
    if attr(node, "storage_order", 0):
        indices = _row_major_indices(g, node, indices)
    flat = g.scatter_elements(g.flat_zeros_like(x, dy), g.op("Reshape", indices, g.ints([-1])),
                              g.op("Reshape", dy, g.ints([-1])), 0)
    return (g.reshape_like(flat, x),)


def _row_major_indices(g: GradBuilder, node: ir.Node, indices: ir.Value) -> ir.Value:
    """MaxPool's storage_order=1 Indices (spatial position in column-major order, after the
    row-major batch and channel offset) in row-major order, as ScatterElements needs them."""
    spatial = (static_shape(node.inputs[0]) or [None])[2:]
    if not spatial or not all(isinstance(d, int) for d in spatial):
        raise GraphError(f"gradient of MaxPool {node.name!r} with storage_order=1 needs static spatial dims")
    size = g.ints([math.prod(spatial)])
    rest = g.op("Mod", indices, size)  # the column-major spatial position
    row_major = g.op("Sub", indices, rest)
    for axis, dim in enumerate(spatial):  # the first axis varies fastest
        coordinate = g.op("Mod", rest, g.ints([dim]))
        rest = g.op("Div", rest, g.ints([dim]))
        row_major = g.op("Add", row_major, g.op("Mul", coordinate, g.ints([math.prod(spatial[axis + 1:])])))
    return row_major


def _pool_matrices(g: GradBuilder, node: ir.Node, spatial, kernel, strides, dilations, begin, end,
                   windows_only: bool = False):
    """{axis: [out, in] matrix} of an AveragePool, one spatial axis at a time (``axis_matrix``,
    the basis vectors on the batch axis), with the node's own ceil_mode and count_include_pad;
    ``windows_only``: 1 for each element of a window, 0 elsewhere (the window sums)."""
    n, rank = len(spatial), 2 + len(spatial)
    matrices = {}
    for i in range(n):
        one = [1] * n
        attrs = node_attrs(node, drop=("auto_pad", "kernel_shape", "strides", "dilations", "pads", "p"))
        if windows_only:
            attrs["count_include_pad"] = 1  # no empty window: every entry of a window is > 0
        attrs.update(kernel_shape=[kernel[i] if j == i else 1 for j in range(n)],
                     strides=[strides[i] if j == i else 1 for j in range(n)],
                     pads=[begin[i] if j == i else 0 for j in range(n)] + [end[i] if j == i else 0 for j in range(n)])
        if dilations != one:
            attrs["dilations"] = [dilations[i] if j == i else 1 for j in range(n)]
        matrix = axis_matrix("AveragePool", attrs, rank, 2 + i, 0, spatial[i], [], g.opset)
        matrices[2 + i] = (matrix > 0).astype(np.float64) if windows_only else matrix
    return matrices


@grad_rule("AveragePool")
def grad_average_pool(g, node, dy):
    # dx = ConvTranspose(dy / divisor, ones) per channel. The divisor is the window size, or with
    # count_include_pad=0 the number of non-pad elements in each window (a Conv of ones).
    x = node.inputs[0]
    kernel = list(attr(node, "kernel_shape"))
    channels = (static_shape(x) or [None, None])[1]
    if not isinstance(channels, int):
        raise GraphError(f"gradient of AveragePool {node.name!r} needs a static channel count")
    if symbolic_spatial(x):  # its spatial dims known only at run time
        return (average_pool_grad(g, node, dy, channels),)
    spatial, strides, dilations, begin, end = window(g, node, x, kernel)
    if attr(node, "ceil_mode", 0) and out_dims(spatial, kernel, strides, dilations, begin, end, ceil=True) != \
            out_dims(spatial, kernel, strides, dilations, begin, end):
        # the last windows hang over the end and average fewer elements: average pooling is
        # separable (window and divisor per axis), so dx contracts dy with each axis' matrix
        return (contract(g, dy, _pool_matrices(g, node, spatial, kernel, strides, dilations, begin, end),
                         2 + len(spatial)),)
    dtype = (dy.dtype or ir.DataType.FLOAT).numpy()
    if attr(node, "count_include_pad", 0) or not any(begin + end):
        scaled = g.div(dy, g.scalar(float(math.prod(kernel)), dy))
    else:
        ones_x = g.const(np.ones([1, 1] + spatial, dtype=dtype))
        ones_k = g.const(np.ones([1, 1] + kernel, dtype=dtype))
        counts = g.op("Conv", ones_x, ones_k, strides=strides, dilations=dilations, pads=begin + end)
        scaled = g.div(dy, counts)
    ones = g.const(np.ones([channels, 1] + kernel, dtype=dtype))
    return (_transposed(g, scaled, ones, spatial, kernel, strides, dilations, begin, end, channels),)


@grad_rule("GridSample")
def grad_grid_sample(g, node, dy):
    # Each output reads the taps around its source point (nearest: 1; linear: 2 per axis; cubic:
    # 4 per axis, 2-D only) with weights from the grid: dx scatters dy * weight back to those
    # pixels (ScatterElements, add); the grid gets dy times the weights' slope along each axis
    # (nearest: none). Border/reflection padding first moves a source point that lies outside
    # the image (clamp; mirror; not in cubic mode), then maps taps outside it (clamp; mirror),
    # as onnxruntime and PyTorch do.
    x, grid = node.inputs
    sx = static_shape(x)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(attr(node, "mode", "linear"), attr(node, "mode", "linear"))
    padding, align = attr(node, "padding_mode", "zeros"), attr(node, "align_corners", 0)
    if (sx is None or len(sx) not in (4, 5) or not all(isinstance(d, int) for d in sx[1:])
            or (mode == "cubic" and len(sx) != 4)):
        raise GraphError(f"gradient of GridSample {node.name!r} needs a 4-D (any mode) or 5-D (linear, nearest) input "
                         f"with static channels and spatial dims (got {sx}, mode {mode!r})")
    channels, spatial = sx[1], sx[2:]
    sizes = spatial[::-1]  # the grid's last axis lists x (width) first
    strides = [math.prod(sizes[:k]) for k in range(len(sizes))]  # flat pixel index = sum tap_k * stride_k
    flat_x = g.op("Reshape", x, g.ints([0, channels, math.prod(spatial)]))
    flat_dy = g.op("Reshape", dy, g.ints([0, channels, -1]))
    axes = []  # per grid axis: (tap weights, their slopes d weight / d grid, (pixel index, valid) per tap)
    for k, size in enumerate(sizes):
        # cubic: the padding maps each tap, not the point (onnxruntime and PyTorch)
        at, scale, moved = _grid_source(g, g.op("Gather", grid, g.const(k, np.int64), axis=-1), size,
                                        "zeros" if mode == "cubic" else padding, align)
        if mode == "nearest":
            taps, weights, slopes = [g.op("Round", at)], [None], [None]
        else:
            low = g.op("Floor", at)
            frac = g.sub(at, low)
            offsets = (0, 1) if mode == "linear" else (-1, 0, 1, 2)
            taps = [g.add(low, g.scalar(float(o), low)) if o else low for o in offsets]
            weights, slopes = _tap_weights(g, frac, mode, scale, moved)
        axes.append(([_row(g, w) for w in weights], [_row(g, s) for s in slopes],
                     [_tap_pixel(g, t, size, padding, align) for t in taps]))
    zeros = g.full(g.op("Shape", flat_x), 0.0, x)  # [N, C, prod(spatial)] in x's dtype
    combos = list(itertools.product(*[range(len(a[2])) for a in axes]))  # every tap of every axis

    def tap(combo):  # (flat pixel index [N, C, P], weight-and-mask [N, 1, P] or None)
        index, factors = None, []
        for (weights, _, pixels), t, stride in zip(axes, combo, strides):
            pixel, valid = pixels[t]
            term = g.mul(pixel, g.const(stride, np.int64)) if stride != 1 else pixel
            index = term if index is None else g.add(index, term)
            factors += [f for f in (weights[t], valid) if f is not None]
        index = g.op("Expand", _row(g, index), g.op("Shape", flat_dy))
        return index, (g.cast_like(functools.reduce(g.mul, factors), x) if factors else None)

    taps = {combo: tap(combo) for combo in combos}
    dx = dgrid = None
    if g.wants(x):
        indices = g.op("Concat", *[taps[c][0] for c in combos], axis=2)
        updates = g.op("Concat", *[g.mul(flat_dy, taps[c][1]) if taps[c][1] is not None else flat_dy
                                   for c in combos], axis=2)
        dx = g.reshape_like(g.scatter_elements(zeros, indices, updates, 2), x)
    if g.wants(grid) and mode != "nearest":
        values = {c: g.op("GatherElements", flat_x, taps[c][0], axis=2) for c in combos}
        parts = []
        for k in range(len(axes)):
            terms = []
            for c in combos:  # value * slope along k * weights along the others * valid
                factors = [values[c]]
                for j, ((weights, slopes, pixels), t) in enumerate(zip(axes, c)):
                    factors += [slopes[t] if j == k else weights[t]] + ([pixels[t][1]] if pixels[t][1] is not None else [])
                terms.append(functools.reduce(g.mul, [g.cast_like(f, x) for f in factors]))
            d = g.reduce("ReduceSum", g.mul(flat_dy, g.sum_values(terms)), [1], keepdims=False)  # [N, P]
            shape = g.op("Shape", g.op("Gather", grid, g.const(0, np.int64), axis=-1))
            parts.append(g.unsqueeze(g.op("Reshape", g.cast_like(d, grid), shape), [-1]))
        dgrid = g.op("Concat", *parts, axis=-1)
    return dx, dgrid


def _row(g: GradBuilder, value: ir.Value | None) -> ir.Value | None:
    """[N, *out] -> [N, 1, P]: broadcast over channels (a scalar broadcasts as it is)."""
    if value is None or static_shape(value) == ():
        return value
    return g.op("Reshape", value, g.ints([0, 1, -1]))


_CUBIC_A = -0.75  # ONNX's (and PyTorch's) bicubic convolution constant


def _tap_weights(g: GradBuilder, frac: ir.Value, mode: str, scale: float, moved: ir.Value | None):
    """The taps' weights at fraction ``frac`` past the lower tap, and their derivatives with
    respect to the grid: d weight / d frac times ``scale`` times ``moved`` (``_grid_source``)."""
    one = g.scalar(1.0, frac)
    if mode == "linear":
        if moved is None:  # constants: -scale for the lower tap, +scale for the upper
            return [g.sub(one, frac), frac], [g.scalar(-scale, frac), g.scalar(scale, frac)]
        up = g.mul(moved, g.scalar(scale, frac))
        return [g.sub(one, frac), frac], [g.neg(up), up]

    def poly(v, coeffs):  # Horner: coeffs from the highest power
        out = g.scalar(coeffs[0], frac)
        for c in coeffs[1:]:
            out = g.add(g.mul(out, v), g.scalar(c, frac))
        return out

    a = _CUBIC_A
    outer, inner = [a, -5 * a, 8 * a, -4 * a], [a + 2, -(a + 3), 0.0, 1.0]  # |t| in [1, 2] and [0, 1]
    d_outer, d_inner = [3 * a, -10 * a, 8 * a], [3 * (a + 2), -2 * (a + 3), 0.0]
    dist = [g.add(frac, one), frac, g.sub(one, frac), g.sub(g.scalar(2.0, frac), frac)]  # tap distances
    weights = [poly(dist[0], outer), poly(dist[1], inner), poly(dist[2], inner), poly(dist[3], outer)]
    scaled = g.scalar(scale, frac) if moved is None else g.mul(moved, g.scalar(scale, frac))
    slopes = [poly(dist[0], d_outer), poly(dist[1], d_inner), g.neg(poly(dist[2], d_inner)),
              g.neg(poly(dist[3], d_outer))]  # d distance / d frac is +1, +1, -1, -1
    return weights, [g.mul(s, scaled) for s in slopes]


def _reflect(g: GradBuilder, at: ir.Value, low: float, span: float):
    """``at`` mirrored into [low, low + span], and the sign of its slope (+1 or -1)."""
    offset = g.sub(at, g.scalar(low, at))
    wrapped = g.op("Mod", g.op("Abs", offset), g.scalar(2 * span, at), fmod=1)
    mirrored = g.op("Greater", wrapped, g.scalar(span, at))
    inside = g.op("Where", mirrored, g.sub(g.scalar(2 * span, at), wrapped), wrapped)
    sign = g.mul(g.op("Sign", offset), g.op("Where", mirrored, g.scalar(-1.0, at), g.scalar(1.0, at)))
    return g.add(inside, g.scalar(low, at)), sign


def _grid_bounds(size: int, align: int) -> tuple[float, float]:
    return (0.0, size - 1.0) if align else (-0.5, size - 0.5)


def _grid_source(g: GradBuilder, along: ir.Value, size: int, padding: str, align: int):
    """The source coordinate (in pixels) a normalized grid coordinate reads along an axis of
    ``size`` pixels, moved by the padding when outside the image bounds; its derivative with
    respect to the grid coordinate is ``scale`` times ``moved`` (None: 1; else 0 where clamped,
    -1 where mirrored)."""
    scale = (size - 1) / 2 if align else size / 2
    at = g.add(g.mul(along, g.scalar(scale, along)), g.scalar((size - 1) / 2, along))
    low, high = _grid_bounds(size, align)
    if padding == "border":
        outside = g.op("Or", g.op("Less", at, g.scalar(low, along)), g.op("Greater", at, g.scalar(high, along)))
        at = g.op("Where", outside, g.op("Clip", at, g.scalar(0.0, along), g.scalar(size - 1.0, along)), at)
        return at, scale, g.cast_like(g.op("Not", outside), at)
    if padding == "reflection":
        if high == low:  # one pixel, align_corners: every point reads it
            return g.mul(at, g.scalar(0.0, along)), 0.0, None
        mirrored, sign = _reflect(g, at, low, high - low)
        return mirrored, scale, sign
    return at, scale, None


def _tap_pixel(g: GradBuilder, tap: ir.Value, size: int, padding: str, align: int):
    """(int64 pixel index, validity mask or None) of a tap coordinate after the padding."""
    if padding == "reflection":
        low, high = _grid_bounds(size, align)
        tap = g.op("Floor", _reflect(g, tap, low, high - low)[0]) if high > low else tap
    index = g.op("Cast", g.op("Clip", tap, g.scalar(0.0, tap), g.scalar(size - 1.0, tap)), to=int(ir.DataType.INT64))
    if padding != "zeros":
        return index, None
    valid = g.op("And", g.op("GreaterOrEqual", tap, g.scalar(0.0, tap)), g.op("LessOrEqual", tap, g.scalar(size - 1.0, tap)))
    return index, _row(g, g.cast_like(valid, tap))


def _lp_factors(g: GradBuilder, node: ir.Node, dy: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(dy y^(1-p), sign(x) |x|^(p-1)) of an Lp pool y = (sum over a window of |x|^p)^(1/p),
    whose gradient is the first spread over each window times the second."""
    x, y, p = node.inputs[0], node.outputs[0], attr(node, "p", 2)
    slope = g.mul(g.op("Sign", x), g.op("Pow", g.op("Abs", x), g.scalar(p - 1.0, x)))
    return g.mul(dy, g.op("Pow", y, g.scalar(1.0 - p, y))), slope


@grad_rule("LpPool")
def grad_lp_pool(g, node, dy):
    # dx = sign(x) |x|^(p-1) * W^T(dy * y^(1-p)), W^T spreading each window's value back over its
    # elements (the AveragePool windows, summed)
    x = node.inputs[0]
    kernel = list(attr(node, "kernel_shape"))
    spatial, strides, dilations, begin, end = window(g, node, x, kernel)
    sums = _pool_matrices(g, node, spatial, kernel, strides, dilations, begin, end, windows_only=True)
    scaled, slope = _lp_factors(g, node, dy)
    return (g.mul(contract(g, scaled, sums, 2 + len(spatial), x.dtype), slope),)


@grad_rule("GlobalLpPool")
def grad_global_lp_pool(g, node, dy):
    # one window over all spatial dims: dy y^(1-p), [N, C, 1, ...], broadcast over it
    scaled, slope = _lp_factors(g, node, dy)
    return (g.mul(scaled, slope),)
