"""Shape kernels: reshape, transpose, concat/split, slice, squeeze/unsqueeze, expand, pad,
tile, constants and ranges.

Versioning: Reshape/Slice/Pad/Split/Squeeze/Unsqueeze took attributes before moving them to
inputs (Reshape 5, Slice 10, Pad 11, Split 13, Squeeze/Unsqueeze 13).
"""

from __future__ import annotations

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from graphc.backends.numpy.kernels import kernel, scalar


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).ravel()]


# -- reshape family -----------------------------------------------------------------------------
def _reshape(x, shape, allowzero=0):
    asked = _ints(shape)
    if not allowzero and any(s == 0 for s in asked[x.ndim:]):
        raise ValueError(f"shape {asked} has a 0 at position {asked.index(0, x.ndim)}, which copies a dim of the "
                         f"input, but the input {list(x.shape)} has rank {x.ndim} (allowzero 0)")
    shape = asked if allowzero else [x.shape[i] if s == 0 else s for i, s in enumerate(asked)]
    try:
        return (x.reshape(shape),)
    except ValueError:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        why = ("it has more than one -1" if shape.count(-1) > 1 else
               f"its other dims hold {known} values, so a -1 has no one size" if -1 in shape else
               f"it holds {known} values")
        raise ValueError(f"cannot reshape the input {list(x.shape)} ({x.size} values) to shape {asked} "
                         f"({shape} with 0s copied): {why}") from None


@kernel("Reshape", since=1)
def reshape_v1(x, *, shape, consumed_inputs=None):
    return _reshape(x, shape)


@kernel("Reshape", since=5)
def reshape(x, shape, *, allowzero=0):
    return _reshape(x, shape, allowzero)


@kernel("Transpose", since=1)
def transpose(x, *, perm=None):
    return (np.transpose(x, perm),)


@kernel("Flatten", since=1)
def flatten(x, *, axis=1):
    axis = axis + x.ndim if axis < 0 else axis  # the spec allows axis in [-r, r]; r gives [N, 1]
    rows, cols = (int(np.prod(x.shape[:axis], dtype=np.int64)), int(np.prod(x.shape[axis:], dtype=np.int64)))
    return (x.reshape(rows, cols),)  # no -1: ambiguous where x is empty


@kernel("Squeeze", since=1)
def squeeze_v1(x, *, axes=None):
    return (np.squeeze(x, axis=tuple(axes) if axes else None),)


@kernel("Squeeze", since=13)
def squeeze(x, axes=None):
    return (np.squeeze(x, axis=tuple(_ints(axes)) if axes is not None else None),)


def _unsqueeze(x, axes):
    out_rank = x.ndim + len(axes)
    axes = sorted(a % out_rank for a in axes)
    return (np.expand_dims(x, tuple(axes)),)


@kernel("Unsqueeze", since=1)
def unsqueeze_v1(x, *, axes):
    return _unsqueeze(x, list(axes))


@kernel("Unsqueeze", since=13)
def unsqueeze(x, axes):
    return _unsqueeze(x, _ints(axes))


@kernel("Expand", since=8)
def expand(x, shape):
    target = _ints(shape)
    try:
        out = np.broadcast_shapes(x.shape, tuple(target))
    except ValueError:
        raise ValueError(f"the input {list(x.shape)} does not broadcast with shape {target} (trailing dims must "
                         "be equal or one of them 1)") from None
    return (np.broadcast_to(x, out),)


@kernel("Shape", since=1)
def shape_(x, *, start=0, end=None):
    return (np.array(x.shape[start:end], dtype=np.int64),)


@kernel("Size", since=1)
def size(x):
    return (np.array(x.size, dtype=np.int64),)


# -- concat / split -----------------------------------------------------------------------------
@kernel("Concat", since=1)
def concat(*xs, axis=1):
    check_concat(xs, axis, "input")
    return (np.concatenate(xs, axis=axis),)


def check_concat(xs, axis: int, what: str) -> None:
    """Refuse tensors ``xs`` Concat cannot join on ``axis`` (``what`` k names the k-th): an axis
    outside their rank, or another rank or dims off the axis than the first's."""
    first = xs[0].shape
    if not -len(first) <= axis < len(first):
        raise ValueError(f"axis {axis} is outside [{-len(first)}, {len(first) - 1}] for {what}s of rank {len(first)}")
    keep = [d for i, d in enumerate(first) if i != axis % len(first)]
    for k, x in enumerate(xs):
        if x.ndim != len(first) or [d for i, d in enumerate(x.shape) if i != axis % x.ndim] != keep:
            raise ValueError(f"{what} {k} has shape {list(x.shape)} and {what} 0 {list(first)}: {what}s must have one "
                             f"rank and the same dims off axis {axis}")


def _split(x, axis, sizes, n):
    if sizes is None:
        dim = x.shape[axis]
        chunk = -(-dim // n)
        sizes = [min(chunk, dim - i * chunk) for i in range(n)]
    cuts = np.cumsum(sizes)[:-1]
    return tuple(np.split(x, cuts, axis=axis))


@kernel("Split", since=1)
def split_v1(x, split_in=None, *, axis=0, split=None, _outputs=1):
    sizes = split if split else (_ints(split_in) if split_in is not None else None)
    return _split(x, axis, sizes, _outputs)


@kernel("Split", since=13)
def split_v13(x, split=None, *, axis=0, _outputs=1):
    return _split(x, axis, _ints(split) if split is not None else None, _outputs)


@kernel("Split", since=18)
def split(x, split=None, *, axis=0, num_outputs=None, _outputs=1):
    return _split(x, axis, _ints(split) if split is not None else None, num_outputs or _outputs)


# -- slice --------------------------------------------------------------------------------------
def _slice(x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a] = _onnx_slice(s, e, st, x.shape[a])
    return (x[tuple(index)],)


def _onnx_slice(start, end, step, dim):
    """ONNX clamps like Python, except that an end of -1 after clamping means "before index 0"
    for negative steps (a Python slice would read -1 as the last element)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    return slice(start, end if end >= 0 else None, step)


@kernel("Slice", since=1)
def slice_v1(x, *, starts, ends, axes=None):
    return _slice(x, starts, ends, axes)


@kernel("Slice", since=10)
def slice_(x, starts, ends, axes=None, steps=None):
    return _slice(x, starts, ends, axes, steps)


# -- pad / tile ---------------------------------------------------------------------------------
def _pad(x, pads, mode, value, axes=None):
    pads = _ints(pads)
    axes = _ints(axes) if axes is not None else list(range(x.ndim))
    n = len(axes)
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a % x.ndim] = (pads[i], pads[i + n])
    # negative pads crop
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(width))
    x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        return (np.pad(x, width, mode="constant", constant_values=value),)
    numpy_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    return (np.pad(x, width, mode=numpy_mode),)


@kernel("Pad", since=2)
def pad_v2(x, *, pads, mode="constant", value=0.0):
    return _pad(x, pads, mode, value)


@kernel("Pad", since=11)
def pad(x, pads, constant_value=None, axes=None, *, mode="constant"):
    value = constant_value.item() if constant_value is not None and constant_value.size else 0
    return _pad(x, pads, mode, value, axes)


@kernel("Tile", since=6)
def tile(x, repeats):
    return (np.tile(x, _ints(repeats)),)


# -- constants and ranges -----------------------------------------------------------------------
@kernel("Constant", since=1)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
             value_string=None, value_strings=None, sparse_value=None):
    if value is not None:
        return (value,)
    if sparse_value is not None:
        return (sparse_value,)
    if value_float is not None:
        return (np.array(value_float, np.float32),)
    if value_floats is not None:
        return (np.array(value_floats, np.float32),)
    if value_int is not None:
        return (np.array(value_int, np.int64),)
    if value_ints is not None:
        return (np.array(value_ints, np.int64),)
    if value_string is not None:
        return (np.array(value_string, dtype=object),)
    return (np.array(value_strings, dtype=object),)


@kernel("ConstantOfShape", since=9)
def constant_of_shape(shape, *, value=None):
    fill = value if value is not None else np.zeros(1, np.float32)
    return (np.full(_ints(shape), fill.ravel()[0], dtype=fill.dtype),)


@kernel("Range", since=11)
def range_(start, limit, delta):
    first, last, step = (scalar(v) for v in (start, limit, delta))
    return (np.arange(first, last, step).astype(start.dtype, copy=False),)


@kernel("EyeLike", since=9)
def eye_like(x, *, dtype=None, k=0):
    out_dtype = tensor_dtype_to_np_dtype(dtype) if dtype is not None else x.dtype
    return (np.eye(x.shape[0], x.shape[1], k=k, dtype=out_dtype),)


@kernel("Trilu", since=14)
def trilu(x, k=None, *, upper=1):
    k = int(scalar(k, 0))
    return ((np.triu if upper else np.tril)(x, k),)


@kernel("OneHot", since=9)
def one_hot(indices, depth, values, *, axis=-1):
    depth = int(scalar(depth))
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hot = idx[..., None] == np.arange(depth)
    out = np.where(hot, values[1], values[0]).astype(values.dtype)
    axis = axis % (idx.ndim + 1)
    return (np.moveaxis(out, -1, axis),)


@kernel("DepthToSpace", since=1)
def depth_to_space(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return (y.reshape(n, c // (b * b), h * b, w * b),)


@kernel("SpaceToDepth", since=1)
def space_to_depth(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return (y.reshape(n, c * b * b, h // b, w // b),)
