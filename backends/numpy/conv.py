"""Convolution and pooling kernels, N-d, vectorized.

Conv is im2col: the padded input is laid out channel-major ([C, N, *S]), ``as_strided``
exposes every window as a view, one reshape copies the windows into a (groups, C/g*k, N*out)
matrix and one batched matmul with the weights produces the output (done on cache-sized slices
of the batch). ConvTranspose is the adjoint: one matmul, then a col2im
scatter-add with one strided slice per kernel position. Pools reduce one strided slice per
kernel position (a 3x3 pool is 9 vectorized maximum/add calls). No loop ever visits pixels.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from graphc.backends.numpy.kernels import kernel, require_shape
from graphc.backends.numpy.reduction import reduce_axes


def geometry(spatial, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode=0):
    """(pads_begin, pads_end, out_shape) for a conv or pool over ``spatial``."""
    d = len(spatial)
    strides = list(strides or [1] * d)
    dilations = list(dilations or [1] * d)
    pads = list(pads or [0] * (2 * d))
    begin, end, out = [], [], []
    for i in range(d):
        eff = (kernel_shape[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-spatial[i] // strides[i])
            total = max((o - 1) * strides[i] + eff - spatial[i], 0)
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            b, e = 0, 0
            o = (spatial[i] - eff) // strides[i] + 1
        else:
            b, e = pads[i], pads[i + d]
            span = spatial[i] + b + e - eff
            o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
            if ceil_mode and (o - 1) * strides[i] >= spatial[i] + b:
                o -= 1  # the last window would start in the end padding
        if o < 0:  # 0 is an empty output (onnx.reference's, onnxruntime's pools'); less has no meaning
            raise ValueError(
                f"the kernel does not fit the padded input on spatial axis {i}: it spans (kernel {kernel_shape[i]} - 1) "
                f"* dilation {dilations[i]} + 1 = {eff}, the input {spatial[i]} + pads {b} + {e} = "
                f"{spatial[i] + b + e}, so the output would be {o} long (stride {strides[i]})")
        begin.append(b)
        end.append(e)
        out.append(o)
    return begin, end, out, strides, dilations


def _pad_spatial(x, begin, end, value=0.0):
    """Pad the spatial axes of [N, C, *S] with ``value``."""
    if not any(begin) and not any(end):
        return x
    width = [(0, 0), (0, 0)] + list(zip(begin, end))
    return np.pad(x, width, constant_values=value)


def _window_slices(kpos, strides, dilations, out_shape):
    """Spatial slices that pick, for every output position, the input at kernel offset ``kpos``."""
    return (slice(None), slice(None)) + tuple(
        slice(k * dl, k * dl + (o - 1) * s + 1, s) if o > 0 else slice(0, 0)  # no window: empty
        for k, s, dl, o in zip(kpos, strides, dilations, out_shape))


# -- convolution --------------------------------------------------------------------------------
def check_weight(x, w, group, transpose=False):
    """Refuse a W that does not fit X: rank, channels divisible by ``group``, and W's input
    channels (dim 1 of a Conv's [M, C/group, *k], dim 0 of a ConvTranspose's [C, M/group, *k])."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"X has shape {list(x.shape)} and W {list(w.shape)}: expected [N, C, *spatial] and a W "
                         f"of the same rank")
    c = x.shape[1]
    if group < 1 or c % group or (not transpose and w.shape[0] % group):
        what = f"X's channels C = {c}" + ("" if transpose else f" and W's output channels M = {w.shape[0]}")
        raise ValueError(f"group is {group}, which does not divide {what}")
    axis, want = (0, c) if transpose else (1, c // group)
    if w.shape[axis] != want:
        rule = "X's channels C" if transpose else f"X's channels C / group = {c} / {group}"
        raise ValueError(f"W has shape {list(w.shape)}: its input channels (dim {axis}) are {w.shape[axis]}, "
                         f"expected {rule} = {want}")


def _channels_first(x, begin, end):
    """``x`` [N, C, *S] as a [C, N, *S_padded] array: im2col then reads whole rows of output
    positions (contiguous memory), which is several times faster than gathering per window."""
    xc = x.swapaxes(0, 1)
    if not any(begin) and not any(end):
        return xc
    shape = xc.shape[:2] + tuple(n + b + e for n, b, e in zip(xc.shape[2:], begin, end))
    padded = np.zeros(shape, dtype=x.dtype)
    padded[(slice(None), slice(None)) + tuple(slice(b, b + n) for b, n in zip(begin, xc.shape[2:]))] = xc
    return padded


def _im2col(xc, group, kshape, strides, dilations, out_shape):
    """Windows of ``xc`` [C, N, *S] as a (group, C/group*prod(k), N*prod(out)) matrix."""
    c, n = xc.shape[:2]
    d = len(kshape)
    s = xc.strides
    shape = (group, c // group, *kshape, n, *out_shape)
    st = (s[0] * (c // group), s[0], *(s[2 + i] * dilations[i] for i in range(d)), s[1],
          *(s[2 + i] * strides[i] for i in range(d)))
    view = as_strided(xc, shape, st, writeable=False)
    return view.reshape(group, (c // group) * math.prod(kshape), n * math.prod(out_shape))


# im2col works on slices of the batch whose window matrix stays about this size, so the copy
# and the matmul that reads it back share the CPU cache (30% faster on ResNet-sized layers).
_IM2COL_BYTES = 1 << 20


@kernel("Conv", since=1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    check_weight(x, w, group)
    kshape = list(kernel_shape or w.shape[2:])
    begin, end, out_shape, strides, dilations = geometry(
        x.shape[2:], kshape, strides, dilations, pads, auto_pad)
    xc = _channels_first(x, begin, end)
    m, n = w.shape[0], x.shape[0]
    require_shape(b, (m,), "bias B", f"one value per output channel, M = {m}")
    wg = w.reshape(group, m // group, -1)
    per_image = wg.shape[2] * group * math.prod(out_shape) * x.dtype.itemsize
    step = max(1, _IM2COL_BYTES // max(per_image, 1))
    positions = math.prod(out_shape)
    y = np.empty((group, m // group, n * positions), dtype=np.result_type(x, w))
    for first in range(0, n, step):
        cols = _im2col(xc[:, first:first + step], group, kshape, strides, dilations, out_shape)
        np.matmul(wg, cols, out=y[:, :, first * positions:(first + step) * positions])
    y = y.reshape(m, n, *out_shape)
    if b is not None:
        y += b.reshape(m, 1, *([1] * len(out_shape)))
    return (y.swapaxes(0, 1),)  # [N, M, *out], channel-major in memory like the next im2col wants


@kernel("ConvTranspose", since=1)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    check_weight(x, w, group, transpose=True)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    d = len(spatial)
    kshape = list(kernel_shape or w.shape[2:])
    strides = list(strides or [1] * d)
    dilations = list(dilations or [1] * d)
    output_padding = list(output_padding or [0] * d)
    full = [(spatial[i] - 1) * strides[i] + (kshape[i] - 1) * dilations[i] + 1 + output_padding[i]
            for i in range(d)]
    begin, target = _transpose_crop(full, spatial, strides, pads, auto_pad, output_shape)
    mg = w.shape[1]
    require_shape(b, (group * mg,), "bias B", f"one value per output channel, M = group {group} * W's dim 1 {mg}")
    # float16 is summed in float32 and rounded once, as torch's and onnxruntime's kernels do (summed in
    # float16, the overlapping windows' adds put a stride-2 3x3 transpose 78 float16 spacings off)
    wide = np.float32 if x.dtype == np.float16 else x.dtype
    xg = x.reshape(n, group, c // group, -1).transpose(1, 0, 3, 2).astype(wide, copy=False)  # (g, N, I, C/g)
    wg = w.reshape(group, 1, c // group, mg * math.prod(kshape)).astype(wide, copy=False)
    cols = np.matmul(xg, wg).reshape(group, n, *spatial, mg, *kshape)
    cols = np.moveaxis(cols, 2 + d, 2)  # (g, N, M/g, *I, *k)
    out = np.zeros((n, group, mg, *full), dtype=wide)
    for kpos in itertools.product(*(range(k) for k in kshape)):
        dst = (slice(None),) + _window_slices(kpos, strides, dilations, spatial)
        out[dst] += cols[(Ellipsis, *kpos)].transpose(1, 0, 2, *range(3, 3 + d))
    out = _crop_or_extend(out.reshape(n, group * mg, *full), begin, target)
    if b is not None:
        out = out + b.reshape(-1, *([1] * d)).astype(wide, copy=False)
    return (np.ascontiguousarray(out.astype(x.dtype, copy=False)),)


def _crop_or_extend(out, begin, target):
    """The spatial window ``[begin, begin + target)`` of ``out`` [N, C, *S], zeros where it
    reaches past ``out`` (a negative ``begin``, or an end past S)."""
    inside = tuple(slice(max(b, 0), min(b + t, n)) for b, t, n in zip(begin, target, out.shape[2:]))
    out = out[(slice(None), slice(None), *inside)]
    before = [max(-b, 0) for b in begin]
    after = [t - w - bf for t, w, bf in zip(target, out.shape[2:], before)]
    return _pad_spatial(out, before, after)


def _transpose_crop(full, spatial, strides, pads, auto_pad, output_shape):
    """(begin, target): the output is the window ``[begin, begin + target)`` of the ``full``
    scatter-add result, per spatial axis; ``begin`` is negative where auto_pad SAME extends it."""
    d = len(spatial)
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = list(output_shape)[-d:] if output_shape is not None else [
            spatial[i] * strides[i] for i in range(d)]
        total = [f - t for f, t in zip(full, target)]
        if output_shape is not None and any(-t >= s for t, s in zip(total, strides)):  # as onnxruntime
            raise ValueError(f"output_shape {target} is past what this input reaches, {full} plus strides - 1 "
                             f"(input spatial dims {list(spatial)}, strides {strides}, output_padding included)")
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):  # an output_shape past the end: zeros at the end
            begin = [max(0, b) for b in begin]
        # SAME_*'s total is negative for a kernel narrower than the stride (its output is still
        # input * strides): negative pads, zeros on both sides. The halves round down, as
        # onnx.reference's: the spec's "extra padding at the end for SAME_UPPER" then holds for
        # -1 too (pads -1, 0). onnxruntime and onnx's shape inference clamp the total to 0 instead
        # (5 wide, not 6, for 3 wide, kernel 1, stride 2), against the spec's input * strides.
        return begin, target
    pads = list(pads or [0] * (2 * d))
    target = [full[i] - pads[i] - pads[i + d] for i in range(d)]
    if any(t < 0 for t in target):
        raise ValueError(f"pads {pads} crop more than the full output {full} (input spatial dims {list(spatial)}, "
                         f"strides {strides}): the output would be {target}")
    return pads[:d], target


# -- pooling ------------------------------------------------------------------------------------
def _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, fill):
    begin, end, out_shape, strides, dilations = geometry(
        x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    # ceil_mode may need room past the explicit end padding for the last window.
    extra = [max((o - 1) * s + (k - 1) * dl + 1 - (n + b + e), 0)
             for o, s, k, dl, n, b, e in zip(out_shape, strides, kernel_shape, dilations,
                                             x.shape[2:], begin, end)]
    xp = _pad_spatial(x, begin, [e + ex for e, ex in zip(end, extra)], fill)
    return xp, begin, end, extra, out_shape, strides, dilations


def _kernel_positions(kernel_shape):
    return itertools.product(*(range(k) for k in kernel_shape))


@kernel("MaxPool", since=1)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None,
             storage_order=0, strides=None, _outputs=1):
    fill = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf  # bfloat16: kind "V"
    xp, begin, _, _, out_shape, strides, dilations = _pool_setup(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, fill)
    if _outputs > 1:
        best, arg = _max_and_index(xp, x.shape, kernel_shape, begin, strides, dilations,
                                   out_shape, storage_order)
        return best, arg
    return (_window_fold(np.maximum, xp, kernel_shape, strides, dilations, out_shape),)


def _max_and_index(xp, shape, kernel_shape, begin, strides, dilations, out_shape, storage_order):
    """MaxPool with its second output: the flat input index of each window's maximum."""
    best = None
    arg = None
    for kpos in _kernel_positions(kernel_shape):
        window = xp[_window_slices(kpos, strides, dilations, out_shape)]
        pos = _flat_index(kpos, window, shape, begin, strides, dilations, storage_order)
        if best is None:
            best, arg = window.copy(), np.broadcast_to(pos, window.shape).copy()
        else:
            better = window > best
            best = np.where(better, window, best)
            arg = np.where(better, pos, arg)
    return best, arg


def _flat_index(kpos, like, shape, begin, strides, dilations, storage_order):
    n, c, *spatial = shape
    d = len(spatial)
    out_shape = like.shape[2:]
    coords = [np.arange(o) * s - b + k * dl
              for o, s, b, k, dl in zip(out_shape, strides, begin, kpos, dilations)]
    grids = np.meshgrid(*coords, indexing="ij")
    nc = np.arange(n * c).reshape(n, c, *([1] * d))
    flat = np.zeros_like(grids[0])
    for i in reversed(range(d)) if storage_order else range(d):  # storage_order 1: column-major
        flat = flat * spatial[i] + grids[i]
    return nc * math.prod(spatial) + flat


def _window_fold(ufunc, xp, kernel_shape, strides, dilations, out_shape):
    """``ufunc`` (np.add, np.maximum) folded over each window of ``xp``: one strided view a kernel position."""
    total = None
    for kpos in _kernel_positions(kernel_shape):
        window = xp[_window_slices(kpos, strides, dilations, out_shape)]
        total = window.copy() if total is None else ufunc(total, window, out=total)
    return total


@kernel("AveragePool", since=1)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape, pads=None, strides=None):
    xp, begin, end, extra, out_shape, strides, dilations = _pool_setup(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0)
    total = _window_fold(np.add, xp, kernel_shape, strides, dilations, out_shape)
    if not any(begin) and not any(end) and not any(extra):
        return ((total / math.prod(kernel_shape)).astype(x.dtype, copy=False),)
    # how many elements of each window count: the input, plus the pads (explicit or auto_pad's,
    # as onnxruntime, onnx.reference and PyTorch count them) if asked; never ceil_mode's extra
    mask = np.ones((1, 1, *x.shape[2:]), x.dtype)
    if count_include_pad:
        mask = _pad_spatial(mask, begin, end, 1)
        mask = _pad_spatial(mask, [0] * len(begin), extra, 0)
    else:
        mask = _pad_spatial(mask, begin, [e + ex for e, ex in zip(end, extra)], 0)
    counts = _window_fold(np.add, mask, kernel_shape, strides, dilations, out_shape)
    return ((total / counts).astype(x.dtype, copy=False),)


@kernel("LpPool", since=11)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2,
            pads=None, strides=None):
    xp, _, _, _, out_shape, strides, dilations = _pool_setup(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0)
    total = _window_fold(np.add, np.abs(xp) ** p, kernel_shape, strides, dilations, out_shape)
    return ((total ** (1.0 / p)).astype(x.dtype, copy=False),)


def _spatial_axes(x):
    return tuple(range(2, x.ndim))


# The global pools are ReduceMean/ReduceMax over the spatial axes, empty ones included: the mean
# of nothing is 0/0 = NaN (no numpy warning), the maximum of nothing -inf, as ReduceMax's spec
# has it. onnxruntime refuses empty spatial dims; onnx.reference gives NaN and raises.
@kernel("GlobalAveragePool", since=1)
def global_average_pool(x):
    return (reduce_axes("ReduceMean", x, _spatial_axes(x)),)


@kernel("GlobalMaxPool", since=1)
def global_max_pool(x):
    return (reduce_axes("ReduceMax", x, _spatial_axes(x)),)


@kernel("GlobalLpPool", since=2)
def global_lp_pool(x, *, p=2):
    total = np.sum(np.abs(x) ** p, axis=_spatial_axes(x), keepdims=True)
    return ((total ** (1.0 / p)).astype(x.dtype, copy=False),)


@kernel("CausalConvWithState", since=27)
def causal_conv_with_state(x, w, b=None, past_state=None, *, activation="none"):
    """Depthwise causal 1-D conv over [B, C, T] continuing from ``past_state`` (the previous
    k-1 inputs); also returns the last k-1 inputs as the next state."""
    batch, channels, _ = x.shape
    k = w.shape[2]
    past = past_state if past_state is not None else np.zeros((batch, channels, k - 1), x.dtype)
    padded = np.concatenate([past, x], axis=2)
    (y,) = conv(padded, w, b, group=channels)
    y = y.astype(x.dtype, copy=False)
    if activation in ("silu", "swish"):
        y32 = y.astype(np.float32)
        y = (y32 / (1 + np.exp(-y32))).astype(x.dtype)
    return y, padded[:, :, padded.shape[2] - (k - 1):]


def _bilinear_zero_padded(x, py, px):
    """x [N, G, Cg, H, W] sampled at float positions py, px [N, G, *pts]: bilinear, every
    corner outside the image counting as 0. Returns [N, G, *pts, Cg]."""
    n, g, _, h, w = x.shape
    y0, x0 = np.floor(py).astype(np.int64), np.floor(px).astype(np.int64)
    fy, fx = py - y0, px - x0
    lead = (np.arange(n).reshape(n, 1, *([1] * (py.ndim - 2))),
            np.arange(g).reshape(1, g, *([1] * (py.ndim - 2))))
    out = 0
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            yi, xi = y0 + dy, x0 + dx
            inside = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
            vals = x[lead[0], lead[1], :, np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]
            out = out + vals * (wy * wx * inside)[..., None]
    return out


@kernel("DeformConv", since=19)
def deform_conv(x, w, offset, b=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
                offset_group=1, pads=None, strides=None):
    """2-D deformable convolution: each kernel tap samples the input at its position plus a
    learned offset (bilinear, zero outside), scaled by ``mask``; then a grouped matmul."""
    if x.ndim != 4:
        raise ValueError(f"X has shape {list(x.shape)}, expected [N, C, H, W]: the numpy backend's DeformConv is "
                         "2-D (as onnxruntime's)")
    check_weight(x, w, group)
    n, c, h, wd = x.shape
    m = w.shape[0]
    if kernel_shape is not None and list(kernel_shape) != list(w.shape[2:]):
        raise ValueError(f"kernel_shape is {list(kernel_shape)}, but W has shape {list(w.shape)}: expected its "
                         f"spatial dims {list(w.shape[2:])}")
    kh, kw = w.shape[2:]
    if offset_group < 1 or c % offset_group:
        raise ValueError(f"offset_group is {offset_group}, which does not divide X's channels C = {c}")
    (pt, pl), _, (oh, ow), (sh, sw), (dh, dw) = geometry((h, wd), (kh, kw), strides, dilations, pads, "NOTSET")
    taps = f"offset_group * kH * kW = {offset_group} * {kh} * {kw}"
    require_shape(offset, (n, offset_group * kh * kw * 2, oh, ow), "offset",
                  f"[N, {taps} * 2, oH, oW], the output {oh} x {ow}")
    require_shape(mask, (n, offset_group * kh * kw, oh, ow), "mask", f"[N, {taps}, oH, oW], the output {oh} x {ow}")
    require_shape(b, (m,), "bias B", f"one value per output channel, M = {m}")
    k = kh * kw
    off = offset.reshape(n, offset_group, k, 2, oh, ow).astype(np.float64)
    ky, kx = (a.ravel() for a in np.meshgrid(np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij"))
    py = (np.arange(oh) * sh - pt)[None, None, None, :, None] + ky[None, None, :, None, None] + off[:, :, :, 0]
    px = (np.arange(ow) * sw - pl)[None, None, None, None, :] + kx[None, None, :, None, None] + off[:, :, :, 1]
    xg = x.reshape(n, offset_group, c // offset_group, h, wd)
    sampled = _bilinear_zero_padded(xg, py, px)  # (N, og, K, oh, ow, C/og)
    if mask is not None:
        sampled = sampled * mask.reshape(n, offset_group, k, oh, ow)[..., None]
    cols = sampled.transpose(0, 1, 5, 2, 3, 4).reshape(n, group, (c // group) * k, oh * ow)
    y = np.einsum("gmk,ngkl->ngml", w.reshape(group, m // group, -1).astype(np.float64), cols)
    y = y.reshape(n, m, oh, ow)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return (y.astype(x.dtype),)
