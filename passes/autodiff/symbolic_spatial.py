"""Gradients of Conv, ConvTranspose and AveragePool whose spatial dims are known only at run time.

The static rules (``rules_nn``) size their lowerings from the input's dims; here they come from
``Shape`` at run time, so one training graph serves every image size (a fully convolutional net
captured with ``("N", 3, "H", "W")``). Kernel, strides, dilations and channel counts stay static:
dx is a ConvTranspose without pads, cropped by the forward's begin pads and zero-filled at the end
to x's dims (a Slice and a Pad); dW a Conv of x by dy with batch and channels swapped, cut to the
kernel; an AveragePool's divisors a Conv of ones of x's run-time size. auto_pad SAME pads are
computed from the run-time dims (x padded explicitly for dW).
"""

from __future__ import annotations

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


def _weight_grad(g: GradBuilder, image: ir.Value, kernel_of: ir.Value, kernel: list[int], strides, dilations,
                 begin, end, group: int, per_group: int) -> ir.Value:
    """dW [Co, Ci/g, *k] of a Conv of ``image`` [N, Ci, *S] whose output gradient is
    ``kernel_of`` [N, Co, *O]: the Conv of ``image`` (groups over the batch) by ``kernel_of``
    (batch and channels swapped), strides and dilations exchanged, cut to the kernel."""
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


def conv_grads(g: GradBuilder, node: ir.Node, dy: ir.Value, w_shape: list[int], window, dx_too: bool = True):
    """(dx, dW) of a Conv (None where not wanted, or dx without ``dx_too``) of ``window``
    (``run_time_window``'s). dx: ConvTranspose(dy, w) without pads (its
    size s*(O-1) + d*(k-1) + 1 from dy's) then ``_fitted``; dW: ``_weight_grad``. The whole
    gradient graph (forward, dx, dW), onnxruntime CPU, 2 threads, ms, two runs each on a shared
    machine, static rules vs these at the same sizes, N=8: 64->64 3x3 pads 1 on 32x32 33.3 / 43.8
    vs 64.2 / 79.3 (the static rules' gathered and flipped-weight forms); 64->128 stride 2 34.0 /
    17.9 vs 31.4 / 22.7; depthwise 32ch 3x3 on 64x64 42.6 / 62.2 vs 51.8 / 58.2; ConvTranspose
    64->32 2x2 stride 2 on 16x16 (``conv_transpose_weight_grad``) 14.1 / 6.7 vs 11.8 / 10.8;
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
        dw = _weight_grad(g, x, dy, kernel, strides, dilations, begin, end, group, w_shape[1])
    return dx, dw


def conv_transpose_weight_grad(g: GradBuilder, node: ir.Node, x: ir.Value, dy: ir.Value, w_shape: list[int],
                               pads: list[int]) -> ir.Value:
    """dW [Ci, Co/g, *k] of a ConvTranspose y = ConvTranspose(x, w) (static pads), the adjoint of
    the Conv of y by w: that Conv's dW with dy as its image and x as its output gradient."""
    n_sp = len(w_shape) - 2
    strides = list(attr(node, "strides", None) or [1] * n_sp)
    dilations = list(attr(node, "dilations", None) or [1] * n_sp)
    return _weight_grad(g, dy, x, list(w_shape[2:]), strides, dilations, pads[:n_sp], pads[n_sp:],
                        attr(node, "group", 1), w_shape[1])


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

