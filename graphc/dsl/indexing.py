"""``Tensor.__getitem__``: ints, slices, ``None``, ``...``, integer index Tensors (or lists) and bool
masks, as torch indexes.

torch first applies the ints (select), slices and ``None`` (a new axis), then indexes the result
with the index Tensors: one is a Gather on its axis; several are broadcast together and pick
pointwise (GatherND), their result dims in their place if they index adjacent axes, else first.
A bool mask over k axes is the k index Tensors of its ``NonZero`` (the result's length is known
only at run time), or of a constant mask's positions (a numpy array: the length is static).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import known_value, op_error, user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.passes.infer import InferenceError, broadcast

_INT_MAX = np.iinfo(np.int64).max


def getitem(x: Tensor, index: Any) -> Tensor:
    """``x[index]``: Slice (and Squeeze) for ints and slices, Unsqueeze for ``None``, then Gather for
    one index Tensor, GatherND for several."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(i is Ellipsis for i in items) > 1:
        raise CaptureError(f"an index can have only one `...` (at {user_source()})")
    rank = x.ndim
    items = [_as_index(i) for i in items]
    consumed = sum(_width(i) for i in items)
    if consumed > rank:
        raise op_error("Slice", [x], f"too many indices ({consumed}) for rank {rank}", user_source())
    if any(i is Ellipsis for i in items):  # not `in`: Tensor.__eq__ builds a node
        pos = next(k for k, i in enumerate(items) if i is Ellipsis)
        items[pos:pos + 1] = [slice(None)] * (rank - consumed)
    else:
        items += [slice(None)] * (rank - consumed)

    starts, ends, axes, steps = [], [], [], []
    squeeze_axes, picks, new_axes = [], [], []
    named = {}  # axis -> the dim name a slice ``[:T]`` leaves it
    axis = 0   # axis in x
    out_axis = 0  # axis after the ints, slices and Nones
    for item in items:
        if item is None:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(item, Tensor) and item.dtype == "bool":
            for idx in _mask_indices(x, item, axis):
                picks.append((out_axis, idx))
                out_axis += 1
            axis += item.ndim
            continue
        if isinstance(item, Tensor):
            if item.dtype not in ("int64", "int32"):
                raise op_error("Gather", [x, item], f"index tensors must be int64, int32 or bool, got {item.dtype}",
                               user_source())
            picks.append((out_axis, item))
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
            if not (item.start is None and item.stop is None and item.step is None):
                lo, hi, step = _bounds(item, axis)
                if item.start is not None:
                    lo, hi = _python_start(x, axis, lo, hi, step)
                starts.append(lo)
                ends.append(hi)
                axes.append(axis)
                steps.append(step)
                if _counts_to_name(item):
                    named[axis] = str(item.stop)
        else:
            raise CaptureError(f"unsupported index {item!r} of type {type(item).__name__} (at {user_source()})")
        axis += 1
        out_axis += 1
    y = x
    if axes:
        bounds = list(zip(axes, starts, ends, steps))
        y = ops.emit("Slice", [y, ops.int64_vector(starts), ops.int64_vector(ends), ops.const_i64(axes),
                               ops.int64_vector(steps)],
                     out_types=None if not any(isinstance(v, Tensor) for v in starts + ends + steps) else
                     [(x.dtype, _run_time_sliced(x.shape, bounds, named))])
    if squeeze_axes:
        y = ops.squeeze(y, squeeze_axes)
    if new_axes:
        y = ops.unsqueeze(y, new_axes)
    if len(picks) == 1:
        (ax, idx), = picks
        y = ops.emit("Gather", [y, idx], {"axis": ax})
    elif picks:
        y = _pointwise(x, y, picks)
    if y is x:
        y = ops.emit("Identity", [x])
    return y


def _bounds(item: slice, axis: int) -> tuple[Any, Any, Any]:
    """(start, stop, step) of a slice on ``axis`` for ONNX's Slice: ints, or 0-d int64 Tensors read at run time
    where a bound is a dim name (``pos[:, :T]``) or a Tensor derived from one (``T - 1``); a missing bound is
    the end the step walks from or to (by the step's sign, at run time where the step is a Tensor)."""
    lo, hi, step = (None if b is None else ops.run_time_int(b, f"the slice {part} on axis {axis}", "Slice")
                    for part, b in (("start", item.start), ("stop", item.stop), ("step", item.step)))
    step = 1 if step is None else step
    if isinstance(step, int) and step == 0:
        raise CaptureError(f"slice step cannot be zero (at {user_source()})")
    forward = step > 0  # a bool Tensor where the step is one
    pick = (lambda a, b: a if forward else b) if isinstance(step, int) else (lambda a, b: ops.where(forward, a, b))
    return pick(0, -1) if lo is None else lo, pick(_INT_MAX, -_INT_MAX) if hi is None else hi, step


def _python_start(x: Tensor, axis: int, lo: Any, hi: Any, step: Any) -> tuple[Any, Any]:
    """(start, stop) of a slice given a start, as Python reads them where Slice does not: a negative step's
    start before the axis (``x[-17::-1]`` on 12 rows) leaves Python's slice empty, where Slice clamps it to
    row 0 and reads that row. Such bounds become (0, 0), empty for Slice too: at capture where the start,
    step and size are known, else chosen at run time. Other bounds read as Python's and stay."""
    if (isinstance(step, int) and step > 0) or (isinstance(lo, int) and lo >= -1):
        return lo, hi  # a start of -1 or more is before an axis only of size 0, where Slice reads nothing
    size = x.shape[axis]
    if isinstance(lo, int) and isinstance(size, int):
        if lo >= -size:
            return lo, hi
        if isinstance(step, int):
            return 0, 0
        empty = ops.binary("Less", step, 0)
    else:
        if not isinstance(size, int):
            size = ops.dim_of(x, axis)
        empty = ops.binary("Less", lo, -size)
        if isinstance(step, Tensor):
            empty = ops.emit("And", [empty, ops.binary("Less", step, 0)])
    return ops.where(empty, 0, lo), ops.where(empty, 0, hi)


def _counts_to_name(item: slice) -> bool:
    """Whether a slice keeps a dim name's count, ``[:T]`` or ``[0:T:1]``: its length is ``T``, if ``T`` is at
    most the axis' size (else the axis' size; a later op joining it with ``T`` fails at run time, as torch's)."""
    return isinstance(item.stop, str) and all(b is None or (type(b) is int and b == default)
                                              for b, default in ((item.start, 0), (item.step, 1)))


def _run_time_sliced(shape: tuple, bounds: list[tuple], named: dict[int, str]) -> list:
    """The shape a Slice with run-time bounds leaves: axes not sliced as they were, ``[:T]`` axes ``T``
    (``named``), axes of static size and bounds their length, the others unknown."""
    out = list(shape)
    for axis, lo, hi, step in bounds:
        static = isinstance(out[axis], int) and not any(isinstance(v, Tensor) for v in (lo, hi, step))
        out[axis] = named[axis] if axis in named else len(range(out[axis])[lo:hi:step]) if static else None
    return out


def _as_index(item: Any) -> Any:
    """A list or numpy array of ints or bools as a constant index Tensor, a dim name as its size (a 0-d index);
    other items as given."""
    if isinstance(item, str):
        return ops.run_time_int(item, "an index", "Gather")
    if isinstance(item, (list, np.ndarray)):
        array = np.asarray(item)
        if array.dtype.kind not in "biu":
            raise CaptureError(f"an index list or array must hold ints or bools, got {array.dtype} {item!r} "
                               f"(at {user_source()})")
        return ops.constant(array if array.dtype == bool else array.astype(np.int64))
    return item


def _width(item: Any) -> int:
    """How many axes of ``x`` an index item consumes: a bool mask its rank, ``None``/``...`` none."""
    if item is None or item is Ellipsis:
        return 0
    return item.ndim if isinstance(item, Tensor) and item.dtype == "bool" else 1


def _mask_indices(x: Tensor, mask: Tensor, axis: int) -> list[Tensor]:
    """A bool ``mask`` over ``x``'s axes from ``axis`` on as one int64 index Tensor per axis
    (``NonZero``'s rows): torch's ``x[mask]`` is ``x`` indexed by ``mask.nonzero()``'s columns."""
    if mask.ndim == 0:
        raise op_error("NonZero", [x, mask], "a 0-d bool index is not supported; use gc.where", user_source())
    for k, (dm, dx) in enumerate(zip(mask.shape, x.shape[axis:])):
        if isinstance(dm, int) and isinstance(dx, int) and dm != dx:
            raise op_error("NonZero", [x, mask], f"the mask's dim {k} ({dm}) does not match axis {axis + k} of the "
                           f"indexed tensor ({dx})", user_source())
    known = known_value(mask)
    if known is not None:  # a constant mask (a numpy array): its positions, so the result's length is static
        return [ops.constant(rows.astype(np.int64)) for rows in np.nonzero(known)]
    rows = ops.emit("NonZero", [mask])
    return [ops.emit("Gather", [rows, ops.constant(np.asarray(k, np.int64))], {"axis": 0}) for k in range(mask.ndim)]


def _pointwise(x: Tensor, y: Tensor, picks: list[tuple[int, Tensor]]) -> Tensor:
    """``y`` indexed by several index Tensors at once (``picks``: (axis, index) in axis order): the
    axes moved first, one GatherND on the broadcast indices stacked as tuples, and the result dims
    moved to the first indexed axis when the axes are adjacent (numpy's and torch's rule)."""
    axes = [ax for ax, _ in picks]
    idxs = [ops.cast(idx, "int64") if idx.dtype != "int64" else idx for _, idx in picks]
    try:
        shape = broadcast(*(idx.shape for idx in idxs))
    except InferenceError as exc:
        shapes = " and ".join(idx.type_str() for idx in idxs)
        raise op_error("GatherND", [x, *idxs], f"index tensors {shapes} cannot broadcast together: {exc}",
                       user_source()) from None
    if shape is None:
        raise op_error("GatherND", [x, *idxs], "index tensors need a known rank", user_source())
    # broadcast by adding zeros of the common shape (also where a length is unknown, as a mask's)
    if any(idx.shape != shape or None in idx.shape for idx in idxs):
        zeros = sum((idx * 0 for idx in idxs[1:]), idxs[0] * 0)
        idxs = [idx + zeros for idx in idxs]
    tuples = ops.concat([ops.unsqueeze(idx, [-1]) for idx in idxs], axis=-1)
    rest = [d for d in range(y.ndim) if d not in axes]
    if axes + rest != list(range(y.ndim)):
        y = ops.transpose(y, axes + rest)
    y = ops.emit("GatherND", [y, tuples])
    nb, first = len(shape), axes[0]
    if axes == list(range(first, first + len(axes))) and first:
        y = ops.transpose(y, [*range(nb, nb + first), *range(nb), *range(nb + first, y.ndim)])
    return y
