"""Adaptive pooling where an input size is not a multiple of the output size. torch's windows along a dim
of size ``n`` pooled to ``o`` are ``[floor(i n / o), ceil((i + 1) n / o))``: they overlap and differ in
length, so no AveragePool or MaxPool kernel holds them. The (static) spatial dims are flattened and each
window's flat positions gathered, a window shorter than the longest repeating its first position; the
average divides the sum of its own positions by their count, the maximum is the first largest (a NaN where
the window holds one, as torch's) and its flat position is torch's ``indices``. Gather, Where, ReduceSum,
ArgMax and GatherElements, all with gradient rules. Also torch's empty result for an output size 0."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.ops import cast, const_i64, constant, emit, reduction, reshape, scalar, squeeze, unary, where
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import to_numpy


def _windows(n: int, o: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's ``o`` windows over ``n`` positions: ``[o, longest]`` positions (short ones repeat their first)
    and which of them belong to the window."""
    starts = [i * n // o for i in range(o)]
    ends = [-(-(i + 1) * n // o) for i in range(o)]
    longest = max(e - s for s, e in zip(starts, ends))
    steps = np.arange(longest)
    valid = steps[None, :] < np.asarray(ends)[:, None] - np.asarray(starts)[:, None]
    return np.where(valid, np.asarray(starts)[:, None] + steps, np.asarray(starts)[:, None]), valid


def window_table(dims: list[int], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For each output position (row-major over ``sizes``), the flat positions in the ``dims`` plane of its
    window (``[prod(sizes), window]`` int64) and which of them count (bool, the same shape)."""
    nd, strides = len(dims), np.cumprod([1, *dims[:0:-1]])[::-1]
    flat, valid = np.zeros((1,) * 2 * nd, np.int64), np.ones((1,) * 2 * nd, bool)
    for d, (n, o) in enumerate(zip(dims, sizes)):
        positions, ok = _windows(n, o)
        shape = [1] * 2 * nd
        shape[d], shape[nd + d] = positions.shape
        flat, valid = flat + positions.reshape(shape) * strides[d], valid & ok.reshape(shape)
    count = int(np.prod(sizes))
    return flat.reshape(count, -1), valid.reshape(count, -1)


def windows_pool(op: str, x: Tensor, sizes: list[int], return_indices: bool = False) -> Any:
    """Adaptive ``op`` (AveragePool or MaxPool) of ``x`` (static spatial dims) to ``sizes`` over torch's
    windows; MaxPool with ``return_indices``: ``(output, indices)``."""
    dims = [int(d) for d in x.shape[2:]]
    table, valid = window_table(dims, sizes)
    lead = list(x.shape[:2])
    windows = emit("Gather", [reshape(x, [*lead, -1]), constant(table)], {"axis": 2})  # [N, C, P, window]
    if op == "AveragePool":
        total = reduction("ReduceSum", where(constant(valid), windows, scalar(0, windows)), [3], False)
        return reshape(total / constant(valid.sum(1).astype(to_numpy(windows.dtype))), [*lead, *sizes])
    first = emit("ArgMax", [windows], {"axis": 3, "keepdims": 1})
    nans = cast(unary("IsNaN", windows), "int32")
    first_nan = emit("ArgMax", [nans], {"axis": 3, "keepdims": 1})
    found = emit("GatherElements", [nans, first_nan], {"axis": 3}) > scalar(0, nans)
    first = where(found, first_nan, first)
    y = reshape(squeeze(emit("GatherElements", [windows, first], {"axis": 3}), [3]), [*lead, *sizes])
    if not return_indices:
        return y
    at = emit("GatherElements", [emit("Expand", [constant(table), emit("Shape", [windows])]), first], {"axis": 3})
    return y, reshape(squeeze(at, [3]), [*lead, *sizes])


def empty_pool(x: Tensor, sizes: list, return_indices: bool) -> Any:
    """torch's empty result for a 0 size: each sized dim cut to 1 step (0 where 0), expanded to its size."""
    axes = [2 + i for i, o in enumerate(sizes) if o is not None]
    cut = emit("Slice", [x, const_i64([0] * len(axes)), const_i64([int(o != 0) for o in sizes if o is not None]),
                         const_i64(axes)])
    y = emit("Expand", [cut, const_i64([1, 1, *(1 if o is None else o for o in sizes)])])
    return (y, cast(y, "int64")) if return_indices else y
