"""Resize (opsets 10, 11, 13, 18, 19) and the deprecated Upsample.

Resizing is separable: for every axis whose size changes, each output coordinate is mapped
back to an input coordinate (``coordinate_transformation_mode``) and the axis is resampled at
once: nearest with one ``np.take``, linear and cubic with one (out, in) weight matrix applied
by ``tensordot``. Antialiasing (opset 18) widens the filter by 1/scale when downsampling.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.backends.numpy.kernels import kernel


def _source_coords(out_len, in_len, scale, mode, roi_start=0.0, roi_end=1.0):
    o = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        offset = in_len / 2 * (1 - adjustment)
        return offset + (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
    if mode == "align_corners":  # the output's own length, as the spec, onnxruntime and PyTorch have
        return o * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros(out_len)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":  # opsets 11-17
        return (o + 0.5) / scale
    if mode == "tf_crop_and_resize":
        if out_len > 1:
            return roi_start * (in_len - 1) + o * (roi_end - roi_start) * (in_len - 1) / (out_len - 1)
        return np.full(out_len, 0.5 * (roi_start + roi_end) * (in_len - 1))
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest(coords, in_len, mode):
    if mode == "round_prefer_floor":
        idx = np.ceil(coords - 0.5)
    elif mode == "round_prefer_ceil":
        idx = np.floor(coords + 0.5)
    elif mode == "floor":
        idx = np.floor(coords)
    else:
        idx = np.ceil(coords)
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def _cubic(t, a):
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _weights(coords, in_len, scale, mode, cubic_a, exclude_outside, antialias):
    """(out, in) matrix of linear or cubic weights, edge indices clamped like onnxruntime."""
    s = min(scale, 1.0) if antialias else 1.0
    base = np.floor(coords)
    ratio = coords - base
    if mode == "linear":
        start = int(math.floor(-1 / s) + 1)
        offsets = np.arange(start, 2 - start)
        w = np.clip(1 - np.abs((offsets[None, :] - ratio[:, None]) * s), 0, 1)
    else:
        start = int(math.floor(-2 / s) + 1)
        offsets = np.arange(start, 2 - start)
        w = _cubic((offsets[None, :] - ratio[:, None]) * s, cubic_a)
    idx = base[:, None].astype(np.int64) + offsets[None, :]
    inside = (idx >= 0) & (idx < in_len)
    if exclude_outside:
        w = np.where(inside, w, 0)
    if antialias or exclude_outside:
        w = w / w.sum(axis=1, keepdims=True)
    matrix = np.zeros((len(coords), in_len))
    rows = np.broadcast_to(np.arange(len(coords))[:, None], idx.shape)
    np.add.at(matrix, (rows, np.clip(idx, 0, in_len - 1)), w)
    return matrix


def axis_resamplings(in_shape, out_shape, scales, *, mode, coord_mode, nearest_mode, cubic_a=-0.75,
                     exclude_outside=0, antialias=0, roi=None):
    """One ``(axis, taken, outside)`` for each axis a Resize changes, in order: ``taken`` the source index of each
    output position (nearest) or the (out, in) weight matrix (linear, cubic); ``outside`` the output positions
    outside the input (``tf_crop_and_resize``, shaped to broadcast over the output) or None."""
    plans = []
    for axis, (in_len, out_len, scale) in enumerate(zip(in_shape, out_shape, scales)):
        if in_len == out_len and scale == 1.0 and coord_mode != "tf_crop_and_resize":
            continue
        start, end = (roi[axis], roi[axis + len(in_shape)]) if roi is not None and len(roi) else (0.0, 1.0)
        coords = _source_coords(out_len, in_len, scale, coord_mode, start, end)
        outside = None
        if coord_mode == "tf_crop_and_resize":
            shape = [1] * len(in_shape)
            shape[axis] = out_len
            outside = ((coords < 0) | (coords > in_len - 1)).reshape(shape)
        taken = (_nearest(coords, in_len, nearest_mode) if mode == "nearest" else
                 _weights(coords, in_len, scale, mode, cubic_a, exclude_outside, antialias))
        plans.append((axis, taken, outside))
    return plans


def _resize(x, out_shape, scales, *, extrapolation_value=0.0, **how):
    y = x
    outside = None
    for axis, taken, out in axis_resamplings(x.shape, out_shape, scales, **how):
        if taken.ndim == 1:
            y = np.take(y, taken, axis=axis)
        else:
            y = np.moveaxis(np.tensordot(y, taken, axes=([axis], [1])), -1, axis)
        if out is not None:
            outside = out if outside is None else outside | out
    if outside is not None:
        y = np.where(outside, extrapolation_value, y)
    return (y.astype(x.dtype, copy=False),)


def plan(in_shape, roi=None, scales=None, sizes=None, *, legacy=False, antialias=0, axes=None,
         coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
         extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
         nearest_mode="round_prefer_floor"):
    """``axis_resamplings`` of a Resize of an input of ``in_shape`` given its inputs and attributes (``legacy``:
    opset 10's Resize or an Upsample, by ``scales`` and ``mode`` only)."""
    if legacy:
        out, full = _plan_sizes(in_shape, scales, None, None, "stretch")
        return axis_resamplings(in_shape, out, full, mode=mode, coord_mode="asymmetric", nearest_mode="floor")
    out, full = _plan_sizes(in_shape, scales, sizes, axes, keep_aspect_ratio_policy)
    return axis_resamplings(in_shape, out, full, mode=mode, coord_mode=coordinate_transformation_mode,
                            nearest_mode=nearest_mode, cubic_a=cubic_coeff_a, exclude_outside=exclude_outside,
                            antialias=antialias, roi=_full_roi(roi, axes, len(in_shape)))


def _plan_sizes(shape, scales, sizes, axes, policy):
    """(output shape, per-axis scales) from the scales or sizes input."""
    axes = list(range(len(shape))) if axes is None else [a % len(shape) for a in axes]
    full_scales = [1.0] * len(shape)
    out = list(shape)
    if sizes is not None and np.asarray(sizes).size:
        sizes = [int(v) for v in np.asarray(sizes).ravel()]
        ratios = [sizes[i] / shape[a] for i, a in enumerate(axes)]
        if policy in ("not_larger", "not_smaller"):
            r = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [r] * len(axes)
            sizes = [int(math.floor(r * shape[a] + 0.5)) for a in axes]
        for i, a in enumerate(axes):
            out[a], full_scales[a] = sizes[i], ratios[i]
    else:
        scales = [float(v) for v in np.asarray(scales).ravel()]
        for i, a in enumerate(axes):  # the float32 scale times the dim in double, as onnx's shape inference
            out[a] = int(math.floor(shape[a] * scales[i]))  # and reference have it (onnxruntime: in float32)
            full_scales[a] = scales[i]
    return out, full_scales


def _full_roi(roi, axes, ndim):
    if roi is None or not np.asarray(roi).size:
        return None
    roi = [float(v) for v in np.asarray(roi).ravel()]
    if axes is None:
        return roi
    full = [0.0] * ndim + [1.0] * ndim
    n = len(axes)
    for i, a in enumerate(axes):
        full[a % ndim], full[a % ndim + ndim] = roi[i], roi[i + n]
    return full


@kernel("Resize", since=10)
def resize_v10(x, scales, *, mode="nearest"):
    out, full = _plan_sizes(x.shape, scales, None, None, "stretch")
    return _resize(x, out, full, mode=mode, coord_mode="asymmetric", nearest_mode="floor")


@kernel("Resize", since=11)
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    out, full = _plan_sizes(x.shape, scales, sizes, axes, keep_aspect_ratio_policy)
    return _resize(x, out, full, mode=mode, coord_mode=coordinate_transformation_mode,
                   nearest_mode=nearest_mode, cubic_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value, antialias=antialias,
                   roi=_full_roi(roi, axes, x.ndim))


@kernel("Upsample", since=7)
def upsample_v7(x, *, mode="nearest", scales):
    return resize_v10(x, np.asarray(scales, np.float32), mode=mode)


@kernel("Upsample", since=9)
def upsample(x, scales, *, mode="nearest"):
    return resize_v10(x, scales, mode=mode)
