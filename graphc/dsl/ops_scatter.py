"""Writing into a Tensor under torch's names (``gc.scatter_add``, ``gc.scatter_reduce``,
``gc.index_fill``, ``gc.index_put``, ``gc.select_scatter``, ``gc.slice_scatter``,
``gc.diagonal_scatter``, ``gc.masked_scatter``) and reading by a mask (``gc.masked_select``,
``gc.nonzero``, ``gc.argwhere``: their length is known only at run time, ``NonZero``'s). Each
returns a new Tensor (graph values are never written in place) built from ScatterElements,
ScatterND, Where and Gather, whose gradient rules reach both the input and the values written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.indexing import getitem
from graphc.dsl.ops import (cast, concat, const_i64, constant, emit, known_in_range, lift, reduction, reshape,
                            reshape_like, same_dtype, scalar, transpose, unsqueeze, where)
from graphc.dsl.ops_array import (cumsum, dim_index, dim_length, dim_positions, full_like, ones_like, static_dim,
                                  zeros_like)
from graphc.dsl.ops_divide import floor_divide
from graphc.dsl.ops_linalg import diagonal_cells
from graphc.dsl.ops_reshape import broadcast_tensors
from graphc.dsl.ops_views import index_copy, movedim
from graphc.dsl.tensor import Tensor
from graphc.dsl.dims import one_element
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

# torch's scatter_reduce names -> ScatterElements' reduction
_REDUCTIONS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "add"}


def _scatter_operands(fn: str, x: Any, index: Any, src: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``x``, an int ``index`` and ``src`` cut to ``index``'s shape: torch reads only the first
    ``index.size(d)`` entries of each dim of ``src``, ScatterElements wants the two of one shape."""
    x, index = lift(x), lift(index)
    src = lift(src, x)
    if index.dtype not in ("int64", "int32"):
        raise op_error("ScatterElements", [x, index, src], f"{fn}: index must be int64 or int32, got {index.dtype}",
                       user_source())
    same_dtype("ScatterElements", x, src)
    if not x.ndim == index.ndim == src.ndim:
        raise op_error("ScatterElements", [x, index, src], f"{fn}: input, index and src need one rank, got "
                       f"{x.ndim}, {index.ndim} and {src.ndim}", user_source())
    if index.shape != src.shape:
        if not all(isinstance(d, int) for d in index.shape):
            raise op_error("ScatterElements", [x, index, src], f"{fn}: an index smaller than src needs static dims",
                           user_source())
        src = emit("Slice", [src, const_i64([0] * src.ndim), const_i64(index.shape), const_i64(range(src.ndim))])
    return x, index, src


@autocast_op()
@one_element()
def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """``torch.scatter_add``: ``x`` with each ``src[i][j]`` added at ``index[i][j]`` along ``dim``.
    Signature: ai.onnx@18::ScatterElements (reduction="add")"""
    return scatter_reduce(x, dim, index, src, "sum")


def scatter_reduce(x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """``torch.scatter_reduce``: ``src`` reduced into ``x`` at ``index`` along ``dim`` by ``reduce``
    ("sum", "prod", "mean", "amax", "amin"); ``include_self=False`` leaves ``x``'s value out where
    something is written (those places are first set to the reduction's identity). "mean" of
    integers rounds down, as torch's. Signature: ai.onnx@18::ScatterElements"""
    if reduce not in _REDUCTIONS:
        raise CaptureError(f"scatter_reduce reduce={reduce!r}; expected one of {sorted(_REDUCTIONS)} "
                           f"(at {user_source()})")
    x, index, src = _scatter_operands("scatter_reduce", x, index, src)
    axis = {"axis": dim_index(x, dim, "ScatterElements")}
    base = x
    if not include_self:
        identity = {"sum": 0, "mean": 0, "prod": 1, "amax": _extreme(x, -1), "amin": _extreme(x, 1)}[reduce]
        base = emit("ScatterElements", [x, index, full_like(src, identity)], axis)
    out = emit("ScatterElements", [base, index, src], {**axis, "reduction": _REDUCTIONS[reduce]})
    if reduce != "mean":
        return out
    start = ones_like(x) if include_self else zeros_like(x)
    count = emit("ScatterElements", [start, index, ones_like(src)], {**axis, "reduction": "add"})
    written = count > scalar(0, count)
    divisor = where(written, count, scalar(1, count))
    mean = out / divisor if x.dtype in FLOAT_DTYPES else floor_divide(out, divisor)
    return where(written, mean, x)


def _extreme(x: Tensor, sign: int) -> Any:
    """The largest (``sign`` 1) or smallest value of ``x``'s dtype: inf for floats."""
    if x.dtype in FLOAT_DTYPES:
        return sign * np.inf
    info = np.iinfo(x.dtype.numpy) if x.dtype != "bool" else None
    return bool(sign > 0) if info is None else (info.max if sign > 0 else info.min)


def _dim_mask(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """A bool Tensor, true along ``dim`` at the entries of the 1-D ``index`` (negative counts from
    the end), of size 1 on ``x``'s other dims."""
    size = dim_length(x, dim)
    positions = dim_positions(x, dim)
    index = cast(index, "int64")
    index = where(index < scalar(0, index), index + size, index)
    hit = emit("Equal", [unsqueeze(positions, [1]), unsqueeze(index, [0])])
    shape = [1] * x.ndim
    shape[dim] = -1
    return reshape(reduction("ReduceMax", cast(hit, "int32"), [1], False) > 0, shape)


def index_fill(x: Tensor, dim: int, index: Tensor, value: Any) -> Tensor:
    """``torch.index_fill``: ``x`` with the entries of ``dim`` at the 1-D (or 0-D) ``index`` set to
    ``value`` (a number, or a 0-D Tensor that receives their gradient). Signature: ai.onnx@16::Where"""
    x, index = lift(x), lift(index)
    if index.dtype not in ("int64", "int32") or index.ndim > 1:
        raise op_error("Where", [x, index], f"index_fill takes a 1-D int64 or int32 index, got {index.type_str()}",
                       user_source())
    value = lift(value, x)
    if value.ndim:
        raise op_error("Where", [x, value], f"index_fill takes a number or a 0-D Tensor as value, got "
                       f"{value.type_str()}", user_source())
    same_dtype("Where", x, value)
    dim = dim_index(x, dim, "Where")
    return emit("Where", [_dim_mask(x, dim, reshape(index, [-1])), value, x], out_types=[(x.dtype, x.shape)])


@autocast_op()
def index_put(x: Tensor, indices: Sequence[Tensor], values: Any, accumulate: bool = False) -> Tensor:
    """``torch.index_put``: ``x[indices] = values`` (``indices`` a tuple of int index Tensors, or
    bool masks, for ``x``'s leading dims, broadcast together; ``values`` broadcast to what they
    pick); ``accumulate`` adds, repeated positions adding up. Signature: ai.onnx@18::ScatterND"""
    x = lift(x)
    if not isinstance(indices, (tuple, list)) or not indices:
        raise CaptureError(f"index_put takes a tuple of index Tensors, got {indices!r} (at {user_source()})")
    rows, axis = [], 0
    for k, item in enumerate(indices):
        if item is None:  # torch's index_put: "expected Tensor as element 0 ..., but got NoneType"
            raise op_error("ScatterND", [x], f"index_put indices[{k}] is None: torch's index_put takes index Tensors "
                           f"only; for every position along a dim write x[:, idx] = values", user_source())
        item = lift(item)
        if item.dtype == "bool":
            mask_rows = emit("NonZero", [item])
            rows += [emit("Gather", [mask_rows, constant(np.asarray(k, np.int64))], {"axis": 0})
                     for k in range(item.ndim)]
        elif item.dtype in ("int64", "int32"):
            rows.append(cast(item, "int64"))
        else:
            raise op_error("ScatterND", [x, item], f"index_put indices must be int64, int32 or bool, got "
                           f"{item.dtype}", user_source())
    if len(rows) > x.ndim:
        raise op_error("ScatterND", [x, *rows], f"index_put: {len(rows)} indices for rank {x.ndim}", user_source())
    for axis, row in enumerate(rows):  # ScatterND's indices must lie in [0, size): negative ones count from the end
        rows[axis] = where(row < scalar(0, row), row + reshape(dim_length(x, axis), []), row)
    rows = broadcast_tensors(*rows)
    tuples = concat([unsqueeze(r, [-1]) for r in rows], -1)
    picked = emit("GatherND", [x, tuples])
    values = lift(values, x)
    if values.dtype != x.dtype and not accumulate and len(indices) == 1 and lift(indices[0]).dtype == "bool" and \
            values.shape is not None and all(d == 1 for d in values.shape):
        known_in_range(x.dtype, values)  # torch's index_put of one mask and one value is its masked_fill, which
        values = cast(values, x.dtype)  # casts a value in the dtype's range
    same_dtype("ScatterND", x, values)
    if values.shape != picked.shape:
        values = emit("Expand", [values, emit("Shape", [picked])], out_types=[(x.dtype, picked.shape)])
    return emit("ScatterND", [x, tuples, values], {"reduction": "add"} if accumulate else {})


def select_scatter(x: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    """``torch.select_scatter``: ``x`` with ``x.select(dim, index)`` replaced by ``src``.
    Signature: ai.onnx@18::ScatterElements"""
    x = lift(x)
    dim = dim_index(x, dim, "ScatterElements")
    size = x.shape[dim]
    if isinstance(size, int) and not -size <= index < size:
        raise op_error("ScatterElements", [x], f"select_scatter index {index} out of range for dim {dim} of size "
                       f"{size}", user_source())
    return index_copy(x, dim, const_i64([index]), unsqueeze(lift(src, x), [dim]))


def slice_scatter(x: Tensor, src: Tensor, dim: int = 0, start: int | None = None, end: int | None = None,
                  step: int = 1) -> Tensor:
    """``torch.slice_scatter``: ``x`` with ``x[start:end:step]`` along ``dim`` (a static size)
    replaced by ``src``. Signature: ai.onnx@18::ScatterElements"""
    x = lift(x)
    dim = dim_index(x, dim, "ScatterElements")
    if step < 1:
        raise op_error("ScatterElements", [x], f"slice_scatter step must be >= 1, got {step}", user_source())
    positions = range(static_dim(x, dim, "ScatterElements"))[slice(start, end, step)]
    return index_copy(x, dim, const_i64(positions), lift(src, x))


def diagonal_scatter(x: Tensor, src: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """``torch.diagonal_scatter``: ``x`` with its ``offset`` diagonal over ``dim1`` and ``dim2``
    (static sizes) replaced by ``src`` (the diagonal last, as ``torch.diagonal`` gives it): the
    two dims moved first and one ScatterND of the diagonal's (row, column) pairs. Signature: ai.onnx@18::ScatterND"""
    x, src = lift(x), lift(src, x)
    a, b = dim_index(x, dim1, "ScatterND"), dim_index(x, dim2, "ScatterND")
    if a == b:
        raise op_error("ScatterND", [x], f"diagonal_scatter dim1 and dim2 must differ, got {dim1} and {dim2}",
                       user_source())
    rows, cols = static_dim(x, a, "ScatterND"), static_dim(x, b, "ScatterND")
    pairs = constant(np.asarray(diagonal_cells(rows, cols, offset), np.int64).reshape(-1, 2))
    moved = movedim(x, (a, b), (0, 1))
    updates = movedim(src, -1, 0)
    out = emit("ScatterND", [moved, pairs, updates])
    return movedim(out, (0, 1), (a, b))


def masked_scatter(x: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """``torch.masked_scatter``: where the bool ``mask`` (broadcast with ``x``) is true, the next
    entry of ``source`` in row-major order; elsewhere ``x``. The k-th true place reads
    ``source.flatten()[k]`` (a Gather at the running count of trues). Signature: ai.onnx@13::Gather"""
    x, mask = lift(x), lift(mask)
    if mask.dtype != "bool":
        raise op_error("Where", [x, mask], f"masked_scatter's mask must be bool, got {mask.dtype}", user_source())
    source = lift(source, x)
    same_dtype("Where", x, source)
    x, mask = broadcast_tensors(x, mask)
    flat = reshape(mask, [-1])
    taken = cumsum(flat, 0)
    taken = taken - scalar(1, taken)
    picked = emit("Gather", [reshape(source, [-1]), emit("Max", [taken, const_i64([0])])], {"axis": 0})
    return reshape_like(where(flat, picked, reshape(x, [-1])), x)


def masked_select(x: Tensor, mask: Tensor) -> Tensor:
    """``torch.masked_select``: the 1-D Tensor of ``x``'s entries where the bool ``mask`` (the two
    broadcast together) is true, in row-major order; its length is known at run time. Signature: ai.onnx@9::NonZero"""
    x, mask = lift(x), lift(mask)
    if mask.dtype != "bool":
        raise op_error("NonZero", [x, mask], f"masked_select's mask must be bool, got {mask.dtype}", user_source())
    x, mask = broadcast_tensors(x, mask)
    return getitem(reshape(x, [-1]), reshape(mask, [-1]))


def nonzero(x: Tensor, *, as_tuple: bool = False) -> Any:
    """``torch.nonzero``: the int64 ``[count, rank]`` indices of ``x``'s nonzero (true) entries in
    row-major order, or with ``as_tuple`` one 1-D Tensor per dim (of ``x`` cast to bool: onnxruntime's
    NonZero takes few dtypes, not float64). Signature: ai.onnx@9::NonZero"""
    x = lift(x)
    if x.ndim == 0:
        raise op_error("NonZero", [x], "nonzero of a 0-D Tensor is not supported; reshape it to [1]", user_source())
    rows = emit("NonZero", [cast(x, "bool")])
    if as_tuple:
        return tuple(emit("Gather", [rows, constant(np.asarray(k, np.int64))], {"axis": 0}) for k in range(x.ndim))
    return transpose(rows, [1, 0])


def argwhere(x: Tensor) -> Tensor:
    """``torch.argwhere``: ``nonzero(x)``."""
    return nonzero(x)


__all__ = [
    "argwhere", "diagonal_scatter", "index_fill", "index_put", "masked_scatter", "masked_select", "nonzero",
    "scatter_add", "scatter_reduce", "select_scatter", "slice_scatter",
]
