"""``Tensor.__getitem__``: ints, slices, ``None``, ``...`` and integer index Tensors (Gather)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import GraphError

_INT_MAX = np.iinfo(np.int64).max


def getitem(x: Tensor, index: Any) -> Tensor:
    """``x[index]``: Slice for ints and slices, Gather for index Tensors, Unsqueeze for ``None``."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(i is Ellipsis for i in items) > 1:
        raise GraphError(f"an index can have only one `...` (at {user_source()})")
    rank = x.ndim
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    if consumed > rank:
        raise op_error("Slice", [x], f"too many indices ({consumed}) for rank {rank}", user_source())
    if any(i is Ellipsis for i in items):  # not `in`: Tensor.__eq__ builds a node
        pos = next(k for k, i in enumerate(items) if i is Ellipsis)
        items[pos:pos + 1] = [slice(None)] * (rank - consumed)
    else:
        items += [slice(None)] * (rank - consumed)

    starts, ends, axes, steps = [], [], [], []
    squeeze_axes, gathers, new_axes = [], [], []
    axis = 0   # axis in x
    out_axis = 0  # axis in the result
    for item in items:
        if item is None:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(item, Tensor):
            gathers.append((axis, item))
        elif isinstance(item, (int, np.integer)):
            i = int(item)
            dim = x.shape[axis]
            if isinstance(dim, int) and not -dim <= i < dim:
                raise op_error("Slice", [x], f"index {i} out of range for axis {axis} of size {dim}", user_source())
            starts.append(i)
            ends.append(i + 1 if i != -1 else _INT_MAX)
            axes.append(axis)
            steps.append(1)
            squeeze_axes.append(axis)
            axis += 1
            continue
        elif isinstance(item, slice):
            if item != slice(None):
                step = 1 if item.step is None else int(item.step)
                if step == 0:
                    raise GraphError(f"slice step cannot be zero (at {user_source()})")
                lo = (0 if step > 0 else -1) if item.start is None else int(item.start)
                hi = (_INT_MAX if step > 0 else -_INT_MAX) if item.stop is None else int(item.stop)
                starts.append(lo)
                ends.append(hi)
                axes.append(axis)
                steps.append(step)
        else:
            raise GraphError(f"unsupported index {item!r} of type {type(item).__name__} (at {user_source()})")
        axis += 1
        out_axis += 1
    y = x
    if axes:
        y = ops.emit("Slice", [y, ops.const_i64(starts), ops.const_i64(ends), ops.const_i64(axes),
                               ops.const_i64(steps)])
    # gathers on distinct axes, applied from the last axis so earlier axis numbers stay valid
    for ax, idx in sorted(gathers, key=lambda g: -g[0]):
        if idx.dtype not in ("int64", "int32"):
            raise op_error("Gather", [x, idx], "index tensors must be int64 or int32", user_source())
        y = ops.emit("Gather", [y, idx], {"axis": ax})
    if squeeze_axes:
        if gathers:
            raise GraphError(f"mixing integer and tensor indices is not supported (at {user_source()})")
        y = ops.squeeze(y, squeeze_axes)
    if new_axes:
        y = ops.unsqueeze(y, new_axes)
    if y is x:
        y = ops.emit("Identity", [x])
    return y
