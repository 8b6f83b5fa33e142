"""Gradients of Conv, ConvTranspose and AveragePool whose spatial dims are known only at run time.

The static rules (``rules_nn``) size their lowerings from the input's dims; here they come from
``Shape`` at run time, so one training graph serves every image size (a fully convolutional net
captured with ``("N", 3, "H", "W")``). Kernel, strides, dilations and channel counts stay static:
dx is a ConvTranspose without pads, cropped by the forward's begin pads and zero-filled at the end
to x's dims (a Slice and a Pad); dW on the CPU the static rules' gathered columns times dy, their
Gather's positions computed from the run-time dims (``_gathered_weight_grad``), elsewhere (and for
depthwise convs and kernels past 9 taps) a Conv of x by dy with batch and channels swapped, cut
to the kernel; an AveragePool's divisors a Conv of ones of x's run-time size. auto_pad SAME pads are
computed from the run-time dims (x padded explicitly for dW). The gathered columns grow with the
run-time image (a run of 64 channels of 3x3 holds 576 x N x prod(O) values): past
``_COLUMNS_BUDGET`` an If takes runs of 8 channels instead, over runs of the batch (a Loop) that
keep those within the budget too.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, attr
from graphc.passes.values import static_shape

__all__ = ["conv_grads", "conv_transpose_weight_grad", "average_pool_grad", "symbolic_spatial", "run_time_window",
           "spatial_of"]


def symbolic_spatial(x: ir.Value) -> bool:
    """Whether x's rank is known and some spatial dim (after batch and channels) is not."""
    sx = static_shape(x)
    return sx is not None and not all(isinstance(d, int) for d in sx[2:])


def spatial_of(g: GradBuilder, t: ir.Value) -> ir.Value:
    """t's spatial dims [n] (int64), from Shape at run time."""
    return g.op("Shape", t, start=2) if g.opset >= 15 else \
        g.op("Slice", g.op("Shape", t), g.ints([2]), g.ints([2 ** 62]))


def run_time_window(g: GradBuilder, node: ir.Node, x: ir.Value, kernel: list[int]):
    """(strides, dilations, begin, end): the pads as int lists, or int64 [n] Values computed from
    x's run-time dims for auto_pad SAME_*."""
    n = len(kernel)
    strides = list(attr(node, "strides", None) or [1] * n)
    dilations = list(attr(node, "dilations", None) or [1] * n)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if auto_pad == "VALID":
        return strides, dilations, [0] * n, [0] * n
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        pads = list(attr(node, "pads", None) or [0] * (2 * n))
        return strides, dilations, pads[:n], pads[n:]
    # out = ceil(H / s); total = max(0, (out - 1) * s + d * (k - 1) + 1 - H), the odd one at the end (UPPER)
    size, s = spatial_of(g, x), g.ints(strides)
    out = g.op("Div", g.op("Add", size, g.ints([v - 1 for v in strides])), s)
    reach = g.ints([d * (k - 1) + 1 for d, k in zip(dilations, kernel)])
    total = g.op("Max", g.op("Sub", g.op("Add", g.op("Mul", g.op("Sub", out, g.ints([1] * n)), s), reach), size),
                 g.ints([0] * n))
    small = g.op("Div", total, g.ints([2] * n))
    begin = small if auto_pad == "SAME_UPPER" else g.op("Sub", total, small)
    return strides, dilations, begin, g.op("Sub", total, begin)


# A run of the gathered dW's columns holds at most this many columns' worth of input channels
# (whole channels, whole groups; at least one): 64 channels of a 3x3 kernel, so a run's columns are
# at most 576 x O x N values (N=16, 64x64: 151 MB in float32). ``_gathered_weight_grad``.
_RUN_COLUMNS = 576
# A run's columns hold at most this many values (256 MB in float32): past it (a run's rows times
# N times the output's pixels, at run time) dW takes runs of ``_BOUNDED_RUN_COLUMNS`` rows, 8
# channels of a 3x3 kernel, columns 8x smaller (``_weight_grad``). Runs of 64 channels beat runs
# of 8 at every size measured, so the bound is one of memory: forward + dx + dW, N=8 64->64 3x3,
# 2 threads, medians of 5, ms, two runs on a shared 2-core machine, 64 vs 8: 64x64 197 / 187 vs
# 237 / 207; 128x128 623 / 651 vs 762 / 816; 192x192 1,597 vs 1,767; 256x256 3,526 vs 4,299
# (N=16 64x64, 37.7M values, the largest of ``bench_runtime_dw.py``'s cases, 480 / 327 vs 551 /
# 471: within the budget). Peak RSS of one run at 256x256 (1.2 GB of columns a run): 2,274 MB
# (twice) -> 1,090 (twice); the swapped Conv there held 926 but took 8.1 / 8.8 s against the
# runs of 8's 6.7 / 6.0 (and at 128x128 2.2 s vs 1.1), and has no float64 kernel in onnxruntime.
# Runs of 8 channels of the whole batch still grow with N (N=16 8ch 512x512: 1.2 GB of columns), so
# past the budget they are taken over runs of the batch (``_batch_chunks``: as many images as keep
# a run's columns within it, at least one). Peak RSS of one step, graphc's ort-cpu with the
# Trainer's options (exact arena, no memory pattern) / its defaults, before -> after: N=16 8->8
# 512x512 (runs of 3 images) 2,237 -> 1,007 / 2,273 -> 1,107 MB; N=32 64->64 256x256 (runs of
# 14) 3,951 -> 3,481 (forward + dx alone 2,753: dW's share 1,198 -> 728) / 4,369 -> 4,451 (the
# session's own arena, doubling as it grows, keeps the high water); N=8 64ch 256x256 (one run:
# the If's whole-batch branch) 1,217 / 1,092 both. Smaller runs cost time, the Gather copying
# fewer images at a time (``bench_runtime_dw.py`` cases 12 and 13, runs vs whole_batch, median
# ms, two runs on a loaded 2-core machine): N=32 64ch 256x256 12,943 / 9,892 vs 9,881 / 8,450
# (1.17-1.31x); N=16 8ch 512x512 2,321 / 1,326 vs 1,416 / 776 (1.64-1.71x); that case with runs
# of 16 (one) / 8 / 3 images 1,876 / 2,034 / 2,705 vs 1,866. One image's runs of 8 channels past
# the budget (3x3, over 2^26 / 72 output pixels, about 965x965) still take it whole.
# The If cost nothing measurable in the common case (``bench_runtime_dw.py`` variants runs vs
# gathered, interleaved, 60-100 rounds, median ms: N=8 64ch 32x32 46.0 / 52.4 / 43.6 / 49.8 vs
# 41.7 / 47.5 / 46.4 / 54.9; N=32 32ch 58.3 / 69.7 vs 59.1 / 69.0; the machine at load 9-13).
_COLUMNS_BUDGET = 1 << 26
_BOUNDED_RUN_COLUMNS = 72


def _static(*pads) -> bool:
    return all(isinstance(p, list) for p in pads)


def _as_value(g: GradBuilder, pads) -> ir.Value:
    return g.ints(pads) if isinstance(pads, list) else pads


def _fitted(g: GradBuilder, full: ir.Value, begin, x: ir.Value) -> ir.Value:
    """``full`` [N, C, *F] (a ConvTranspose over the unpadded input's frame) cropped by ``begin``
    and zero-filled at the end to x's spatial dims: where the forward's last windows stopped short
    of x's end, or (ceil mode) ran past it."""
    n_sp = len(begin) if isinstance(begin, list) else static_shape(begin)[0]
    size = spatial_of(g, x)
    axes = g.ints(list(range(2, 2 + n_sp)))
    if _static(begin) and not any(begin):
        cut = g.op("Slice", full, g.ints([0] * n_sp), size, axes)
    else:
        first = _as_value(g, begin)
        cut = g.op("Slice", full, first, g.op("Add", first, size), axes)
    short = g.op("Sub", size, spatial_of(g, cut))  # >= 0
    return g.op("Pad", cut, g.op("Concat", g.ints([0] * (n_sp + 4)), short, axis=0))


def _over_batch(g: GradBuilder, t: ir.Value, group: int, per_group: int, n_sp: int) -> ir.Value:
    """[N, group*per_group, *S] -> [per_group, group*N, *S] with S known at run time (the channel
    groups become Conv groups over the batch; for group 1 the batch/channel swap)."""
    swap = [1, 0] + list(range(2, 2 + n_sp))
    if group == 1:
        return g.transpose(t, swap)
    flat = g.op("Reshape", t, g.ints([0, group, per_group, -1]))
    shape = g.op("Concat", g.ints([per_group, -1]), spatial_of(g, t), axis=0)
    return g.op("Reshape", g.transpose(flat, [2, 1, 0, 3]), shape)


def _positions(g: GradBuilder, padded: ir.Value, out: ir.Value, kernel: list[int], strides, dilations) -> ir.Value:
    """[*k, *O] int64: the flat position in the padded input ([*P], ``padded`` its run-time dims)
    that tap k of output pixel o reads, ``out`` the run-time output dims (``conv_gather._index``
    sized at run time): per axis a Range of the output's strided starts plus the tap's offset,
    times that axis' pitch, summed by broadcasting."""
    n = len(kernel)
    index = None
    for i in range(n):
        step = g.const(np.int64(strides[i]))
        count = g.op("Squeeze", g.op("Slice", out, g.ints([i]), g.ints([i + 1])), g.ints([0]))
        starts = g.op("Range", g.const(np.int64(0)), g.op("Mul", count, step), step)  # [O_i]
        taps = g.const((np.arange(kernel[i]) * dilations[i]).reshape(-1, 1).astype(np.int64))  # [k_i, 1]
        pos = g.op("Add", taps, starts)  # [k_i, O_i]
        if i < n - 1:
            pos = g.op("Mul", pos, g.reduce("ReduceProd", g.op("Slice", padded, g.ints([i + 1]), g.ints([n])), [0]))
        pos = g.unsqueeze(pos, [a for a in range(2 * n) if a not in (i, n + i)]) if n > 1 else pos
        index = pos if index is None else g.op("Add", index, pos)
    return index


def _run_channels(kernel: list[int], group: int, per_group: int, rows: int) -> int:
    """The input channels of a run of ``_gathered_weight_grad``'s columns: whole groups (or
    channels), ``rows`` rows' worth, at least one."""
    unit = per_group if group > 1 else 1
    return unit * max(1, rows // (unit * math.prod(kernel)))


def _gathers(g: GradBuilder, image: ir.Value, kernel: list[int], group: int, per_group: int) -> bool:
    """Whether the dW of this Conv takes ``_gathered_weight_grad``: on the CPU, float tensors,
    up to 9 taps, dense or grouped with several channels a group (depthwise: the Conv)."""
    return (g.device == "cpu" and g.opset >= 11 and image.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE)
            and math.prod(kernel) <= 9 and (group == 1 or per_group > 1))


def _gathered_weight_grad(g: GradBuilder, image: ir.Value, kernel_of: ir.Value, kernel: list[int], strides,
                          dilations, begin, end, group: int, per_group: int, out_channels: int,
                          run_rows: int) -> ir.Value:
    """dW [Co, Ci/g, *k] as ``rules_nn._conv_weight_grad_gathered`` lowers it, its geometry from
    ``image``'s run-time dims: ``image`` batch-innermost and padded, [Ci, P, N]; the columns of a
    run of channels (whole groups; ``run_rows`` rows of columns, ``_run_channels``) by one Gather at ``_positions``; each run's
    GEMM against ``kernel_of`` [N, Co, *O] as [Co, O * N] (dense: dW^T, one 4-D Transpose after
    the Concat; grouped: one MatMul batched over the run's groups).

    Against the Conv of x by dy with batch and channels swapped (which onnxruntime runs as one
    small GEMM per input channel, a 9-column im2col of the whole batch each) and two other
    run-time forms: one GEMM per kernel tap on its strided window of the channel-major input
    (Slice ends from dy's dims; no column matrix), and the columns of all channels at once.
    ``scripts/bench_runtime_dw.py``, forward + dx + dW, 2 threads, the time over the static
    form's (its gathered columns) in the same run, two runs on a shared 2-core machine (noisy:
    the same graph twice differed by up to 1.3x), Conv / all at once / runs of 8 channels /
    per tap: N=8 64->64 3x3 on 32x32 1.39, 1.75 / 0.90, 1.27 / 0.79, 1.42 / 0.77, 1.44 (ms:
    static 32.1, Conv 44.7, all at once 28.7); N=32 32ch on 32x32 1.28, 1.58 / 0.63, 0.91 /
    0.94, 0.97 / 0.96, 1.05; N=16 64ch on 64x64 1.59, 1.66 / 0.88, 0.89 / 1.10, 1.17 / 1.18,
    1.25; stride 2, N=32 32->64 on 32x32 1.50, 1.33 / 0.92, 0.72 / 1.37, 1.02 / 1.63, 1.03;
    dilation 2, N=16 32ch on 64x64 1.31, 1.30 / 0.96, 1.00 / 1.08, 1.18 / 1.14, 1.11; grouped
    (8 groups of 8), N=16 64ch on 32x32 1.22 / 1.34 / 0.99 / -. Every gathered form beat the
    Conv; all at once won most: runs are of 64 channels (``_RUN_COLUMNS``), all at once up to
    there, bounding the columns past it (N=16 128ch on 32x32: Conv 1.10, all at once 0.92, runs
    of 64 0.96, of 8 0.96, per tap 1.04)."""
    n_sp, ci, taps = len(kernel), per_group * group, math.prod(kernel)
    rows = g.transpose(image, [*range(1, 2 + n_sp), 0])  # [Ci, *S, N]
    if not _static(begin, end) or any(begin + end):
        zeros = g.ints([0])
        rows = g.op("Pad", rows, g.op("Concat", zeros, _as_value(g, begin), zeros, zeros, _as_value(g, end), zeros,
                                      axis=0))
    padded = g.op("Add", g.op("Add", spatial_of(g, image), _as_value(g, begin)), _as_value(g, end))
    reach = g.ints([d * (k - 1) + 1 for d, k in zip(dilations, kernel)])
    out = g.op("Add", g.op("Div", g.op("Sub", padded, reach), g.ints(strides)), g.ints([1] * n_sp))
    batch = g.op("Slice", g.op("Shape", image), g.ints([0]), g.ints([1]))
    rows = g.op("Reshape", rows, g.op("Concat", g.ints([ci, -1]), batch, axis=0))  # [Ci, P, N]
    index = _positions(g, padded, out, kernel, strides, dilations)
    dy = g.op("Reshape", g.transpose(kernel_of, [*range(1, 2 + n_sp), 0]), g.ints([out_channels, -1]))  # [Co, O*N]
    size = _run_channels(kernel, group, per_group, run_rows)
    sizes = [min(size, ci - first) for first in range(0, ci, size)]
    parts = g.split(rows, sizes, axis=0, count=len(sizes)) if len(sizes) > 1 else (rows,)
    if group > 1:  # rows (g, m) of dy, a run of whole groups each
        dy3 = g.op("Reshape", dy, g.ints([group, out_channels // group, -1]))
        runs = [channels // per_group for channels in sizes]
        dys = g.split(dy3, runs, axis=0, count=len(runs)) if len(runs) > 1 else (dy3,)
    dws = []
    for i, (part, channels) in enumerate(zip(parts, sizes)):
        cols = g.op("Reshape", g.op("Gather", part, index, axis=1), g.ints([channels * taps, -1]))  # [c*K, O*N]
        if group == 1:
            dws.append(g.op("Gemm", cols, dy, transB=1))  # [c * K, Co]
        else:
            per = g.op("Reshape", cols, g.ints([channels // per_group, per_group * taps, -1]))
            dws.append(g.op("MatMul", dys[i], g.transpose(per, [0, 2, 1])))  # [groups, Co/G, Cg * K]
    dw = dws[0] if len(dws) == 1 else g.op("Concat", *dws, axis=0)
    if group == 1:  # [Ci, *k, Co] -> [Co, Ci, *k]
        return g.transpose(g.op("Reshape", dw, g.ints([ci, *kernel, out_channels])), [n_sp + 1, *range(n_sp + 1)])
    return g.op("Reshape", dw, g.ints([out_channels, per_group, *kernel]))


def _swapped_conv_weight_grad(g: GradBuilder, image: ir.Value, kernel_of: ir.Value, kernel: list[int], strides,
                              dilations, begin, end, group: int, per_group: int) -> ir.Value:
    """dW as the Conv of ``image`` (groups over the batch) by ``kernel_of`` (batch and channels
    swapped), strides and dilations exchanged, cut to the kernel."""
    n_sp = len(kernel)
    if _static(begin, end):
        pads = begin + end if any(begin + end) else None
    else:  # run-time pads: the image padded first
        zeros = g.ints([0, 0])
        image = g.op("Pad", image, g.op("Concat", zeros, begin, zeros, end, axis=0))
        pads = None
    swap = [1, 0] + list(range(2, 2 + n_sp))
    dw = g.op("Conv", _over_batch(g, image, group, per_group, n_sp), g.transpose(kernel_of, swap),
              strides=dilations, dilations=strides, pads=pads, group=group if group != 1 else None)
    return g.op("Slice", g.transpose(dw, swap), g.ints([0] * n_sp), g.ints(kernel), g.ints(list(range(2, 2 + n_sp))))


def _branch(g: GradBuilder, build, like: ir.Value, shape: list[int]) -> ir.Graph:
    """An If branch whose one output, of ``like``'s dtype and ``shape``, ``build(sub)`` makes."""
    graph = ir.Graph([], [], nodes=[], name=g.fresh("branch"))
    out = build(g.subgraph_builder(graph))
    out.type, out.shape = ir.TensorType(like.dtype), ir.Shape(shape)
    graph.outputs.append(out)
    return graph


def _batch_chunks(g: GradBuilder, build, image: ir.Value, kernel_of: ir.Value, rows: int, shape: list[int]):
    """``build(sub, image_chunk, kernel_of_chunk)`` summed over runs of images (a Loop adding each
    run's dW [*shape] into zeros), each run as many images as keep ``rows`` rows of columns by
    their output pixels within ``_COLUMNS_BUDGET`` (at least one image): ``kernel_of``'s pixels
    an image at run time (1 for an empty output); the last run the rest of the batch. Where the
    whole batch fits in one run, an If takes ``build`` of the whole batch instead: no copies of
    the slices, no Loop."""
    per_image = g.op("Max", g.reduce("ReduceProd", spatial_of(g, kernel_of), [0], keepdims=False),
                     g.const(np.int64(1)))
    images = g.op("Max", g.op("Div", g.const(np.int64(_COLUMNS_BUDGET // rows)), per_image), g.const(np.int64(1)))
    batch = g.op("Squeeze", g.op("Slice", g.op("Shape", image), g.ints([0]), g.ints([1])), g.ints([0]))
    trips = g.op("Div", g.op("Sub", g.op("Add", batch, images), g.const(np.int64(1))), images)  # ceil
    body = ir.Graph([], [], nodes=[], name=g.fresh("batch_chunk"))
    sub = g.subgraph_builder(body)
    step = ir.Value(name=g.fresh("i"), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    go = ir.Value(name=g.fresh("cond"), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    total = ir.Value(name=g.fresh("dw"), type=ir.TensorType(image.dtype), shape=ir.Shape(shape))
    body.inputs.extend([step, go, total])
    first = sub.unsqueeze(sub.op("Mul", step, images), [0])
    last = sub.op("Add", first, sub.unsqueeze(images, [0]))  # past the batch in the last run: Slice clamps
    chunk = [sub.op("Slice", t, first, last, sub.ints([0])) for t in (image, kernel_of)]
    out = sub.op("Add", total, build(sub, *chunk))
    kept = sub.op("Identity", go)
    for value, like in ((kept, go), (out, total)):
        value.type, value.shape = like.type, like.shape
    body.outputs.extend([kept, out])

    def chunked(sub: GradBuilder) -> ir.Value:
        return sub.op("Loop", trips, None, sub.const(np.zeros(shape, image.dtype.numpy())), body=body)

    return g.op("If", g.op("Less", images, batch), then_branch=_branch(g, chunked, image, shape),
                else_branch=_branch(g, lambda sub: build(sub, image, kernel_of), image, shape))


def _weight_grad(g: GradBuilder, image: ir.Value, kernel_of: ir.Value, kernel: list[int], strides, dilations,
                 begin, end, group: int, per_group: int, out_channels: int) -> ir.Value:
    """dW [Co, Ci/g, *k] of a Conv of ``image`` [N, Ci, *S] whose output gradient is
    ``kernel_of`` [N, Co, *O]: where ``_gathers``, an If on a run's columns (its rows times
    N * prod(O), read off ``kernel_of``'s Shape): within ``_COLUMNS_BUDGET`` values
    ``_gathered_weight_grad`` in runs of ``_RUN_COLUMNS`` rows, past it in runs of
    ``_BOUNDED_RUN_COLUMNS`` rows over ``_batch_chunks`` of the batch, or, where the two runs
    are of the same channels (8 or fewer of a 3x3 kernel), ``_batch_chunks`` alone: its If takes
    the whole batch where that fits; elsewhere ``_swapped_conv_weight_grad``."""
    if not _gathers(g, image, kernel, group, per_group):
        return _swapped_conv_weight_grad(g, image, kernel_of, kernel, strides, dilations, begin, end, group,
                                         per_group)

    def gathered(rows: int):
        return lambda sub, img, dy: _gathered_weight_grad(sub, img, dy, kernel, strides, dilations, begin, end,
                                                          group, per_group, out_channels, rows)

    ci, taps = group * per_group, math.prod(kernel)
    run = min(ci, _run_channels(kernel, group, per_group, _RUN_COLUMNS))
    bounded = min(ci, _run_channels(kernel, group, per_group, _BOUNDED_RUN_COLUMNS))
    shape = [out_channels, per_group, *kernel]

    def chunks(sub: GradBuilder) -> ir.Value:
        return _batch_chunks(sub, gathered(_BOUNDED_RUN_COLUMNS), image, kernel_of, bounded * taps, shape)

    # the same runs: N * prod(O) within the budget of run * taps rows is the whole batch in one chunk
    if run == bounded:
        return chunks(g)
    pixels = g.op("Div", g.reduce("ReduceProd", g.op("Shape", kernel_of), [0], keepdims=False),
                  g.const(np.int64(out_channels)))  # N * prod(O)
    fits = g.op("Less", pixels, g.const(np.int64(_COLUMNS_BUDGET // (run * taps) + 1)))
    return g.op("If", fits, then_branch=_branch(g, lambda sub: gathered(_RUN_COLUMNS)(sub, image, kernel_of), image,
                                                shape),
                else_branch=_branch(g, chunks, image, shape))


def conv_grads(g: GradBuilder, node: ir.Node, dy: ir.Value, w_shape: list[int], window, dx_too: bool = True):
    """(dx, dW) of a Conv (None where not wanted, or dx without ``dx_too``) of ``window``
    (``run_time_window``'s). dx: ConvTranspose(dy, w) without pads (its
    size s*(O-1) + d*(k-1) + 1 from dy's) then ``_fitted``; dW: ``_weight_grad``. The whole
    gradient graph (forward, dx, dW), onnxruntime CPU, 2 threads, ms, two runs each on a shared
    machine, static rules vs these at the same sizes, N=8, dW the swapped Conv (before
    ``_gathered_weight_grad``, whose figures are its own): 64->64 3x3 pads 1 on 32x32 33.3 / 43.8
    vs 64.2 / 79.3 (the static rules' gathered and flipped-weight forms); 64->128 stride 2 34.0 /
    17.9 vs 31.4 / 22.7; depthwise 32ch 3x3 on 64x64 42.6 / 62.2 vs 51.8 / 58.2; ConvTranspose
    64->32 2x2 stride 2 on 16x16 (``conv_transpose_weight_grad``) 14.1 / 6.7 vs 11.8 / 10.8, its
    dW now the gathered columns too (``bench_runtime_dw.py`` case 10, the static form / the
    swapped Conv / gathered / graphc's If: 5.67 / 7.48 / 5.70 / 4.87 and 2.04 / 2.10 / 1.13 /
    1.10, so it keeps them);
    AveragePool 3x3 stride 2 pads 1 over 64ch 32x32 (``average_pool_grad``) 0.81 / 0.76 vs
    1.09 / 0.98."""
    x, w = node.inputs[0], node.inputs[1]
    kernel, group = list(w_shape[2:]), attr(node, "group", 1)
    strides, dilations, begin, end = window
    dx = dw = None
    if g.wants(x) and dx_too:
        full = g.op("ConvTranspose", dy, w, strides=strides, dilations=dilations, group=group if group != 1 else None)
        dx = _fitted(g, full, begin, x)
    if g.wants(w):
        dw = _weight_grad(g, x, dy, kernel, strides, dilations, begin, end, group, w_shape[1], w_shape[0])
    return dx, dw


def conv_transpose_weight_grad(g: GradBuilder, node: ir.Node, x: ir.Value, dy: ir.Value, w_shape: list[int],
                               pads: list[int]) -> ir.Value:
    """dW [Ci, Co/g, *k] of a ConvTranspose y = ConvTranspose(x, w) (static pads), the adjoint of
    the Conv of y by w: that Conv's dW with dy as its image and x as its output gradient."""
    n_sp = len(w_shape) - 2
    strides = list(attr(node, "strides", None) or [1] * n_sp)
    dilations = list(attr(node, "dilations", None) or [1] * n_sp)
    return _weight_grad(g, dy, x, list(w_shape[2:]), strides, dilations, pads[:n_sp], pads[n_sp:],
                        attr(node, "group", 1), w_shape[1], w_shape[0])


def average_pool_grad(g: GradBuilder, node: ir.Node, dy: ir.Value, channels: int) -> ir.Value:
    """dx of an AveragePool: dy over each window's divisor, spread back over the window (a
    ConvTranspose by ones, one group a channel) and ``_fitted`` to x. The divisor is the window
    size, or (count_include_pad=0 with pads, or ceil mode, whose last windows can run past the
    end) the number of elements each window covers: of x, or of x and its pads
    (count_include_pad=1), a Conv of ones with ``strides - 1`` more zeros at the end for ceil
    mode, cut to dy's dims."""
    x = node.inputs[0]
    kernel = list(attr(node, "kernel_shape"))
    n_sp = len(kernel)
    strides, dilations, begin, end = run_time_window(g, node, x, kernel)
    dtype = (dy.dtype or ir.DataType.FLOAT).numpy()
    include, ceil = attr(node, "count_include_pad", 0), attr(node, "ceil_mode", 0)
    padded = not _static(begin, end) or any(begin + end)
    if not ceil and (include or not padded):
        scaled = g.div(dy, g.scalar(float(np.prod(kernel)), dy))
    else:
        size = spatial_of(g, x)
        if include and padded:
            size = g.op("Add", g.op("Add", size, _as_value(g, begin)), _as_value(g, end))
            zeros, tail = [0] * n_sp, _as_value(g, [s - 1 for s in strides])
        else:
            zeros, tail = _as_value(g, begin), g.op("Add", _as_value(g, end), g.ints([s - 1 for s in strides]))
        ones = g.full(g.op("Concat", g.ints([1, 1]), size, axis=0), 1.0, dy)
        ones = g.op("Pad", ones, g.op("Concat", g.ints([0, 0]), _as_value(g, zeros), g.ints([0, 0]), tail, axis=0))
        counts = g.op("Conv", ones, g.const(np.ones([1, 1] + kernel, dtype=dtype)), strides=strides, dilations=dilations)
        counts = g.op("Slice", counts, g.ints([0] * n_sp), spatial_of(g, dy), g.ints(list(range(2, 2 + n_sp))))
        scaled = g.div(dy, counts)
    ones_k = g.const(np.ones([channels, 1] + kernel, dtype=dtype))
    full = g.op("ConvTranspose", scaled, ones_k, strides=strides, dilations=dilations, group=channels)
    return _fitted(g, full, begin, x)

