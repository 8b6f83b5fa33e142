"""Image and detection kernels: GridSample, AffineGrid, RoiAlign, NonMaxSuppression, Col2Im,
CenterCropPad, MaxUnpool, ReverseSequence."""

from __future__ import annotations

import itertools
import math

import numpy as np

from graphc.backends.numpy.kernels import kernel, scalar


# -- affine grids and grid sampling -------------------------------------------------------------
def _base_coords(n, align_corners):
    if align_corners:
        return np.linspace(-1, 1, n) if n > 1 else np.zeros(1)
    return (np.arange(n) * 2 + 1) / n - 1


@kernel("AffineGrid", since=20)
def affine_grid(theta, size, *, align_corners=0):
    size = [int(v) for v in np.asarray(size).ravel()]
    n, spatial = size[0], size[2:]
    axes = [_base_coords(s, align_corners) for s in spatial]  # (D,) H, W order
    mesh = np.meshgrid(*axes, indexing="ij")
    coords = [m.ravel() for m in reversed(mesh)]  # x (width) first, as the spec orders them
    base = np.stack(coords + [np.ones_like(coords[0])], axis=0)  # (d+1, points)
    grid = theta.astype(np.float64) @ base  # (N, d, points)
    return (grid.transpose(0, 2, 1).reshape(n, *spatial, len(spatial)).astype(theta.dtype),)


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(x, lo, hi):
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    d = np.abs(x - lo) % (2 * span)
    return lo + np.where(d > span, 2 * span - d, d)


def _fetch(x, idx, padding_mode, sizes, align_corners=0):
    """x[n, c, *idx] for integer index arrays idx (N, *out); outside: zeros, the border pixel,
    or (reflection) the mirrored pixel."""
    n, c = x.shape[:2]
    inside = np.ones(idx[0].shape, bool)
    clipped = []
    if padding_mode == "reflection":
        idx = [_reflect(i.astype(np.float64), *((0, s - 1) if align_corners else (-0.5, s - 0.5))).astype(np.int64)
               for i, s in zip(idx, sizes)]
    for i, s in zip(idx, sizes):
        inside &= (i >= 0) & (i < s)
        clipped.append(np.clip(i, 0, s - 1))
    batch = np.arange(n).reshape(n, *([1] * (idx[0].ndim - 1)))
    vals = x[(batch[:, None], np.arange(c).reshape(1, c, *([1] * (idx[0].ndim - 1))),
              *(ci[:, None] for ci in clipped))]
    if padding_mode == "zeros":
        vals = np.where(inside[:, None], vals, 0)
    return vals


def _cubic_weights(t, a=-0.75):
    t = np.asarray(t)
    def k(d):
        d = np.abs(d)
        return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                        np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0))
    return [k(t + 1), k(t), k(1 - t), k(2 - t)]


@kernel("GridSample", since=16)
def grid_sample(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    sizes = x.shape[2:]
    d = len(sizes)
    coords = []
    for axis in range(d):  # grid's last dim lists x (width) first
        g = grid[..., d - 1 - axis].astype(np.float64)
        u = _unnormalize(g, sizes[axis], align_corners)
        if mode == "cubic":
            pass  # the padding maps each tap instead (onnxruntime and PyTorch; onnx's reference clamps the point)
        elif padding_mode == "border":
            u = np.clip(u, 0, sizes[axis] - 1)
        elif padding_mode == "reflection":
            lo, hi = (0, sizes[axis] - 1) if align_corners else (-0.5, sizes[axis] - 0.5)
            u = _reflect(u, lo, hi)
            if not align_corners:
                u = np.clip(u, 0, sizes[axis] - 1) if mode != "nearest" else u
        coords.append(u)
    pad = padding_mode if mode == "cubic" else "zeros" if padding_mode == "zeros" else "border"
    if mode == "nearest":
        idx = [np.rint(u).astype(np.int64) for u in coords]
        return (_fetch(x, idx, pad, sizes).astype(x.dtype),)
    base = [np.floor(u).astype(np.int64) for u in coords]
    frac = [u - b for u, b in zip(coords, base)]
    if mode == "linear":
        offsets, weights = [0, 1], [[1 - f, f] for f in frac]
    else:
        offsets, weights = [-1, 0, 1, 2], [_cubic_weights(f) for f in frac]
    out = 0
    for combo in itertools.product(range(len(offsets)), repeat=d):
        idx = [b + offsets[k] for b, k in zip(base, combo)]
        w = np.prod([weights[a][k] for a, k in enumerate(combo)], axis=0)
        out = out + _fetch(x, idx, pad, sizes, align_corners) * w[:, None]
    return (np.asarray(out).astype(x.dtype),)


# -- detection ------------------------------------------------------------------------------------
def _iou(box, boxes):
    y1, x1 = np.maximum(box[0], boxes[:, 0]), np.maximum(box[1], boxes[:, 1])
    y2, x2 = np.minimum(box[2], boxes[:, 2]), np.minimum(box[3], boxes[:, 3])
    inter = np.clip(y2 - y1, 0, None) * np.clip(x2 - x1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0)


@kernel("NonMaxSuppression", since=11)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    limit = int(scalar(max_output_boxes_per_class, 0))
    iou_t = float(scalar(iou_threshold, 0.0))
    score_t = scalar(score_threshold, None)
    selected = []
    for b in range(boxes.shape[0]):
        bx = boxes[b].astype(np.float64)
        if center_point_box:
            cx, cy, w, h = bx.T
            bx = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
        else:  # corners may come in either order
            bx = np.stack([np.minimum(bx[:, 0], bx[:, 2]), np.minimum(bx[:, 1], bx[:, 3]),
                           np.maximum(bx[:, 0], bx[:, 2]), np.maximum(bx[:, 1], bx[:, 3])], axis=1)
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = [i for i in np.argsort(-s, kind="stable") if score_t is None or s[i] > score_t]
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if not kept or np.all(_iou(bx[i], bx[kept]) <= iou_t):
                    kept.append(i)
            selected += [[b, c, i] for i in kept]
    return (np.array(selected, dtype=np.int64).reshape(-1, 3),)


@kernel("RoiAlign", since=16)
def roi_align(x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
              output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    n_rois = rois.shape[0]
    c, h, w = x.shape[1:]
    out = np.zeros((n_rois, c, output_height, output_width), x.dtype)
    offset = 0.5 if coordinate_transformation_mode == "half_pixel" else 0.0
    for r in range(n_rois):
        x1, y1, x2, y2 = rois[r] * spatial_scale - offset
        rw, rh = x2 - x1, y2 - y1
        if not offset:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / output_height, rw / output_width
        sh = sampling_ratio or int(math.ceil(rh / output_height))
        sw = sampling_ratio or int(math.ceil(rw / output_width))
        ys = y1 + (np.arange(output_height)[:, None] * bh + (np.arange(sh)[None, :] + 0.5) * bh / sh)  # (oh, sh)
        xs = x1 + (np.arange(output_width)[:, None] * bw + (np.arange(sw)[None, :] + 0.5) * bw / sw)
        terms = _bilinear_terms(x[int(batch_indices[r])], ys.ravel(), xs.ravel(), h, w)
        if mode == "avg":
            vals = sum(terms).reshape(c, output_height, sh, output_width, sw)
            out[r] = vals.mean(axis=(2, 4))
        else:  # onnxruntime's max mode: the largest weighted corner term over the samples
            vals = np.max(terms, axis=0).reshape(c, output_height, sh, output_width, sw)
            out[r] = vals.max(axis=(2, 4))
    return (out,)


def _bilinear_terms(img, ys, xs, h, w):
    """RoiAlign's sampling at the grid ys x xs: the four weighted corner terms (points
    outside [-1, size] give 0, others clamp to the image)."""
    def axis(v, size):
        valid = (v >= -1) & (v <= size)
        v = np.clip(v, 0, None)
        lo = np.minimum(np.floor(v).astype(np.int64), size - 1)
        hi = np.minimum(lo + 1, size - 1)
        v = np.where(lo >= size - 1, lo, v)
        frac = v - lo
        return valid, lo, hi, frac
    vy, y0, y1, fy = axis(ys, h)
    vx, x0, x1, fx = axis(xs, w)
    valid = vy[:, None] & vx[None, :]
    wy0, wy1 = (1 - fy)[:, None], fy[:, None]
    wx0, wx1 = (1 - fx)[None, :], fx[None, :]
    return [img[:, y0][:, :, x0] * (wy0 * wx0 * valid), img[:, y0][:, :, x1] * (wy0 * wx1 * valid),
            img[:, y1][:, :, x0] * (wy1 * wx0 * valid), img[:, y1][:, :, x1] * (wy1 * wx1 * valid)]


# -- folding, cropping, unpooling -----------------------------------------------------------------
@kernel("Col2Im", since=18)
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    image = [int(v) for v in np.asarray(image_shape).ravel()]
    block = [int(v) for v in np.asarray(block_shape).ravel()]
    d = len(image)
    dilations, strides = dilations or [1] * d, strides or [1] * d
    pads = pads or [0] * (2 * d)
    n, ck, _ = x.shape
    c = ck // math.prod(block)
    padded = [image[i] + pads[i] + pads[i + d] for i in range(d)]
    out_blocks = [(padded[i] - ((block[i] - 1) * dilations[i] + 1)) // strides[i] + 1 for i in range(d)]
    cols = x.reshape(n, c, *block, *out_blocks)
    out = np.zeros((n, c, *padded), x.dtype)
    for kpos in itertools.product(*(range(k) for k in block)):
        dst = (slice(None), slice(None)) + tuple(
            slice(k * dl, k * dl + (o - 1) * s + 1, s) for k, dl, o, s in zip(kpos, dilations, out_blocks, strides))
        out[dst] += cols[(slice(None), slice(None), *kpos)]
    crop = (slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + image[i]) for i in range(d))
    return (out[crop],)


@kernel("CenterCropPad", since=18)
def center_crop_pad(x, shape, *, axes=None):
    shape = [int(v) for v in np.asarray(shape).ravel()]
    axes = [a % x.ndim for a in (axes if axes is not None else range(x.ndim))]
    out = x
    for a, target in zip(axes, shape):
        size = out.shape[a]
        if target < size:  # crop the centre (extra element dropped at the start... end)
            start = (size - target) // 2
            out = np.take(out, range(start, start + target), axis=a)
        elif target > size:
            before = (target - size) // 2
            width = [(0, 0)] * out.ndim
            width[a] = (before, target - size - before)
            out = np.pad(out, width)
    return (out,)


@kernel("MaxUnpool", since=11)
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads=None, strides=None):
    d = len(kernel_shape)
    strides, pads = strides or [1] * d, pads or [0] * (2 * d)
    pooled_from = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[i + d]
                                       + kernel_shape[i] for i in range(d)]
    shape = [int(v) for v in np.asarray(output_shape).ravel()] if output_shape is not None else pooled_from
    out = np.zeros(shape, x.dtype)
    # indices are flat positions in the tensor the pool read (its inferred shape)
    out[np.unravel_index(indices.ravel(), pooled_from)] = x.ravel()
    return (out,)


@kernel("ReverseSequence", since=10)
def reverse_sequence(x, sequence_lens, *, batch_axis=1, time_axis=0):
    xt = np.moveaxis(x, (batch_axis, time_axis), (0, 1))
    t = np.arange(xt.shape[1])[None, :]
    lens = sequence_lens.astype(np.int64)[:, None]
    src = np.where(t < lens, lens - 1 - t, t)  # (batch, time)
    out = np.take_along_axis(xt, src.reshape(*src.shape, *([1] * (xt.ndim - 2))), axis=1)
    return (np.moveaxis(out, (0, 1), (batch_axis, time_axis)),)
