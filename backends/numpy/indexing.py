"""Indexing kernels: Gather*, Scatter*, NonZero, Compress, Unique.

ONNX indices may be negative (counted from the end); numpy fancy indexing agrees.
"""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@kernel("Gather", since=1)
def gather(data, indices, *, axis=0):
    return (np.take(data, indices.astype(np.int64, copy=False), axis=axis),)


@kernel("GatherElements", since=11)
def gather_elements(data, indices, *, axis=0):
    # indices may be smaller than data on the other axes too (take_along_axis wants them equal)
    return (data[_element_index(indices, axis, data.shape)],)


@kernel("GatherND", since=11)
def gather_nd(data, indices, *, batch_dims=0):
    batch = data.shape[:batch_dims]
    nb = int(np.prod(batch, dtype=np.int64))
    d = data.reshape(nb, *data.shape[batch_dims:])
    idx = indices.reshape(nb, *indices.shape[batch_dims:]).astype(np.int64)
    k = idx.shape[-1]
    b = np.arange(nb).reshape(nb, *([1] * (idx.ndim - 2)))
    # k = 0: each empty index tuple picks its whole batch slice
    out = d[(b, *np.moveaxis(idx, -1, 0))] if k else np.broadcast_to(d[b], (nb, *idx.shape[1:-1], *d.shape[1:]))
    return (out.reshape((*batch, *indices.shape[batch_dims:-1], *data.shape[batch_dims + k:])),)


def _element_index(indices, axis, data_shape):
    axis = axis % indices.ndim
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + data_shape[axis], idx)
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = idx
    return tuple(grid)


def _scatter(data, where, updates, reduction):
    out = data.copy()
    if reduction == "none":
        out[where] = updates
    else:
        _REDUCE[reduction].at(out, where, updates)
    return (out,)


@kernel("ScatterElements", since=11)
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    return _scatter(data, _element_index(indices, axis, data.shape), updates, reduction)


@kernel("Scatter", since=9)
def scatter(data, indices, updates, *, axis=0):
    return _scatter(data, _element_index(indices, axis, data.shape), updates, "none")


@kernel("ScatterND", since=11)
def scatter_nd(data, indices, updates, *, reduction="none"):
    where = tuple(np.moveaxis(indices.astype(np.int64), -1, 0))
    return _scatter(data, where, updates, reduction)


@kernel("NonZero", since=9)
def nonzero(x):
    """[rank, count]: a scalar has no coordinates, [0, 1] if it is nonzero (numpy refuses 0-d)."""
    if x.ndim == 0:
        return (np.zeros((0, int(bool(x))), np.int64),)
    return (np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1),)


@kernel("Compress", since=11)
def compress(x, condition, *, axis=None):
    return (np.compress(condition.astype(bool), x, axis=axis),)


@kernel("Unique", since=11)
def unique(x, *, axis=None, sorted=1):  # noqa: A002 - spec name
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    if not sorted:  # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        values = np.take(values, order, axis=axis or 0) if axis is not None else values[order]
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return (values, first.astype(np.int64), inverse.reshape(-1).astype(np.int64),
            counts.astype(np.int64))


@kernel("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """Writes ``update`` into a KV cache at each batch row's write index along ``axis``
    (``circular`` wraps around the cache length)."""
    axis = axis % past_cache.ndim
    batch, length, steps = past_cache.shape[0], past_cache.shape[axis], update.shape[axis]
    starts = np.zeros(batch, np.int64) if write_indices is None else write_indices.astype(np.int64)
    pos = starts[:, None] + np.arange(steps)[None, :]  # (batch, steps)
    if mode == "circular":
        pos %= length
    shape = [1] * past_cache.ndim
    shape[0], shape[axis] = batch, steps
    index = list(np.indices(update.shape, sparse=True))
    index[axis] = pos.reshape(shape)
    out = past_cache.copy()
    out[tuple(index)] = update
    return (out,)
