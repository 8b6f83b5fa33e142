"""torch's counting and uniqueness functions: ``bincount``, ``unique``, ``unique_consecutive`` and
``histogramdd``. Their result sizes are known at run time only (dims without a size). ``unique``
over all entries and ``unique_consecutive`` mark where sorted (or given) neighbours differ, so NaNs
stay apart and -0.0 equals 0.0 as in torch; ``unique`` over a ``dim`` is ONNX's ``Unique``. None has
a gradient, as torch's have none."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.builder import user_source
from graphc.dsl.ops import cast, concat, const_i64, detach, emit, lift, maximum, reshape, reshape_like, scalar, where
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_array import cumsum, dim_index, dim_length, dim_positions, full, ir_tensor, pad, static_dim
from graphc.dsl.ops_math import any as reduce_any
from graphc.dsl.ops_search import bin_edges, bin_positions
from graphc.dsl.ops_views import argsort, diff, movedim
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

_INTEGERS = ("int8", "int16", "int32", "int64", "uint8")


def bincount(input: Any, weights: Any = None, minlength: int = 0) -> Tensor:  # noqa: A002 - torch's names
    """``torch.bincount``: how often each value ``0 .. max(input)`` (at least ``minlength`` of them)
    occurs in the 1-D non-negative integer ``input`` (int64), or the sum of the ``weights`` at its
    entries (float32 for float32 weights, else float64, as torch). A negative entry known at capture
    (eager values) is refused, as torch; at run time one counts nowhere. Signature: ai.onnx@18::ScatterElements"""
    x = detach(lift(input))
    if x.ndim != 1 or x.dtype not in _INTEGERS:
        raise CaptureError(f"bincount input: expected a 1-D Tensor of integers, got {x.type_str()} (at "
                           f"{user_source()})")
    if x.eager_value is not None and x.eager_value.size and x.eager_value.min() < 0:
        raise CaptureError(f"bincount input: expected non-negative entries, got {x.eager_value.min()} (at "
                           f"{user_source()})")
    if not isinstance(minlength, int) or isinstance(minlength, bool) or minlength < 0:
        raise CaptureError(f"bincount minlength={minlength!r}: expected an int >= 0 (at {user_source()})")
    index = cast(x, "int64")
    valid = index >= scalar(0, index)
    if weights is None:
        added = cast(valid, "int64")
    else:
        w = detach(lift(weights))
        if w.ndim != 1 or w.shape[0] != x.shape[0]:
            raise CaptureError(f"bincount weights: expected a 1-D Tensor of the input's length {x.shape[0]}, got "
                               f"{w.type_str()} (at {user_source()})")
        w = w if w.dtype in ("float32", "float64") else cast(w, "float64")
        added = where(valid, w, scalar(0, w))
    index = where(valid, index, scalar(0, index))
    top = reduce_max(pad(where(valid, index, scalar(-1, index)), [0, 1], value=-1)) + 1  # a -1 more: x may be empty
    length = reshape(maximum(top, scalar(minlength, top)), [1])
    zeros = emit("ConstantOfShape", [length], {"value": ir_tensor(np.zeros(1, np.dtype(added.dtype.numpy)))})
    return emit("ScatterElements", [zeros, index, added], {"reduction": "add"})


def _sortable(x: Tensor) -> Tensor:
    """``x`` in a dtype onnxruntime's TopK sorts (bool as uint8), the order unchanged."""
    return cast(x, "uint8") if x.dtype == "bool" else x


def _runs(first: Tensor, size: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For the bool ``first`` (1-D, where a run of equal entries starts): the int64 starts, each entry's
    run (0-based) and each run's length (``size`` entries in all, a 1-element Tensor)."""
    starts = reshape(emit("NonZero", [first]), [-1])
    run = cumsum(cast(first, "int64"), 0) - scalar(1, starts)
    return starts, run, diff(concat([starts, size], 0))


def _differs(x: Tensor) -> Tensor:
    """Whether each slice of ``x`` along dim 0 starts a run: the first, and each not equal to the one
    before it in some entry (a NaN equals nothing)."""
    before = concat([emit("Slice", [x, const_i64([0]), const_i64([1]), const_i64([0])]),
                     emit("Slice", [x, const_i64([0]), const_i64([-1]), const_i64([0])])], 0)
    unequal = x != before
    if x.ndim > 1:
        unequal = reduce_any(unequal, list(range(1, x.ndim)))
    return unequal | (dim_positions(x, 0) == scalar(0, dim_positions(x, 0)))


def _returned(values: Tensor, inverse: Tensor, counts: Tensor, return_inverse: bool,
              return_counts: bool) -> Any:
    """torch's result: ``values``, then ``inverse`` and ``counts`` where asked for."""
    extra = [t for t, asked in ((inverse, return_inverse), (counts, return_counts)) if asked]
    return (values, *extra) if extra else values


def unique(input: Any, sorted: bool = True, return_inverse: bool = False,  # noqa: A002 - torch's names
           return_counts: bool = False, dim: int | None = None) -> Any:
    """``torch.unique``: the distinct entries of ``input`` (flattened), sorted; or with ``dim`` its
    distinct slices along ``dim`` in lexicographic order. ``return_inverse`` adds where each entry
    (slice) went (``input``'s shape; 1-D with ``dim``), ``return_counts`` how often each occurs. Sorted
    either way, as torch's CPU result; each NaN is distinct, and -0.0 equals 0.0 (the first of them
    kept). With ``dim``: ONNX's ``Unique``, which has no torch semantics for slices holding NaN.
    Signature: ai.onnx@11::TopK"""
    x = detach(lift(input))
    if not isinstance(sorted, bool):
        raise CaptureError(f"unique sorted={sorted!r}: expected a bool (at {user_source()})")
    if dim is not None:
        return _unique_slices(x, dim, return_inverse, return_counts)
    flat = reshape(x, [-1])
    order = argsort(_sortable(flat))
    ordered = emit("Gather", [flat, order])
    starts, run, counts = _runs(_differs(ordered), dim_length(flat, 0))
    inverse = emit("ScatterElements", [order, order, run])  # run of the i-th smallest, written at its position
    inverse = reshape_like(inverse, x)
    return _returned(emit("Gather", [ordered, starts]), inverse, counts, return_inverse, return_counts)


_UNIQUE_TYPES = {"bool": "int8", "int16": "int64", "int32": "int64", "uint8": "int64", "bfloat16": "float32"}


def _unique_slices(x: Tensor, dim: int, return_inverse: bool, return_counts: bool) -> Any:
    """``unique`` along ``dim``: ONNX's ``Unique`` (sorted) in a dtype onnxruntime's takes."""
    axis = dim_index(x, dim, "unique")
    work = _UNIQUE_TYPES.get(str(x.dtype), x.dtype)
    values, _, inverse, counts = emit("Unique", [cast(x, work) if work != x.dtype else x],
                                      {"axis": axis, "sorted": 1}, num_outputs=4)
    return _returned(cast(values, x.dtype) if work != x.dtype else values, inverse, counts, return_inverse,
                     return_counts)


def unique_consecutive(input: Any, return_inverse: bool = False, return_counts: bool = False,  # noqa: A002
                       dim: int | None = None) -> Any:
    """``torch.unique_consecutive``: ``input`` (flattened, or its slices along ``dim``) with each run of
    equal neighbours kept once (the first), in order; ``return_inverse`` adds each entry's run
    (``input``'s shape; 1-D with ``dim``), ``return_counts`` each run's length. A NaN equals nothing,
    -0.0 equals 0.0. Signature: ai.onnx@9::NonZero"""
    x = detach(lift(input))
    if dim is None:
        flat = reshape(x, [-1])
        starts, run, counts = _runs(_differs(flat), dim_length(flat, 0))
        return _returned(emit("Gather", [flat, starts]), reshape_like(run, x), counts, return_inverse, return_counts)
    axis = dim_index(x, dim, "unique_consecutive")
    front = movedim(x, axis, 0)
    starts, run, counts = _runs(_differs(front), dim_length(front, 0))
    return _returned(emit("Gather", [x, starts], {"axis": axis}), run, counts, return_inverse, return_counts)


# -- histogramdd --------------------------------------------------------------------------------


class Histogramdd(NamedTuple):
    """``gc.histogramdd``'s result, as ``torch.return_types.histogramdd``: ``hist`` and one 1-D
    Tensor of ``bin_edges`` per dim."""

    hist: Tensor
    bin_edges: tuple[Tensor, ...]


def histogramdd(input: Any, bins: Any = 10, *, range: Any = None, weight: Any = None,  # noqa: A002
                density: bool = False) -> Histogramdd:
    """``torch.histogramdd``: the counts (or summed ``weight``, of ``input``'s shape less its last dim)
    of the points ``input[..., :]`` (a float Tensor of at least 2 dims, ``D`` points' coordinates in
    its static last dim) in a ``D``-dim grid of bins: ``bins`` an int for every dim, one int per dim,
    or one 1-D Tensor of edges per dim; ``range`` ``D`` (min, max) pairs flattened (None: each dim's
    least to greatest entry not NaN). In each dim a point goes to the bin of the last edge at or below
    it, as ``gc.histogram``; a point outside in any dim, or NaN, nowhere. ``density`` divides by the
    total and each bin's volume. No gradient, as torch. Signature: ai.onnx@18::ScatterElements"""
    x = detach(lift(input))
    if x.dtype not in FLOAT_DTYPES or x.ndim < 2:
        raise CaptureError(f"histogramdd input: expected a floating-point Tensor of at least 2 dims, got "
                           f"{x.type_str()} (at {user_source()})")
    d = static_dim(x, x.ndim - 1, "histogramdd")
    per_dim = [bins] * d if isinstance(bins, int) else list(bins) if isinstance(bins, (list, tuple)) else None
    if per_dim is None or len(per_dim) != d:
        raise CaptureError(f"histogramdd bins: expected an int, or one int or 1-D Tensor per dim ({d}), got "
                           f"{bins!r} (at {user_source()})")
    if range is not None and (len(range) != 2 * d or any(isinstance(b, Tensor) for b in per_dim)):
        raise CaptureError(f"histogramdd range={range!r}: expected {2 * d} numbers, (min, max) for each dim, "
                           f"with int bins (at {user_source()})")
    points = reshape(x, [-1, d])
    edges, index, inside = [], None, None
    for k, b in enumerate(per_dim):
        column = reshape(emit("Gather", [points, const_i64([k])], {"axis": 1}), [-1])
        e = bin_edges(column, b, None if range is None else tuple(range[2 * k:2 * k + 2]))
        pos, ok = bin_positions(column, e)
        edges.append(e)
        index = pos if index is None else index * scalar(e.shape[0] - 1, pos) + pos
        inside = ok if inside is None else inside & ok
    counts = [e.shape[0] - 1 for e in edges]
    work = "float32" if x.dtype == "float16" else x.dtype  # onnxruntime has no float16 ScatterElements add
    if weight is None:
        added = cast(inside, work)
    else:
        w = detach(lift(weight, x))
        if w.dtype != x.dtype or tuple(w.shape) != tuple(x.shape[:-1]):
            raise CaptureError(f"histogramdd weight: expected a {x.dtype} Tensor of the input's shape less its last "
                               f"dim {list(x.shape[:-1])}, got {w.type_str()} (at {user_source()})")
        added = cast(where(inside, reshape(w, [-1]), scalar(0, w)), work)
    hist = emit("ScatterElements", [full([math.prod(counts)], 0, work), index, added], {"reduction": "add"})
    hist = reshape(cast(hist, x.dtype), counts)
    if density:
        hist = hist / reduce_sum(hist)
        for k, e in enumerate(edges):
            along = [1] * d
            along[k] = -1
            hist = hist / reshape(diff(e), along)
    return Histogramdd(hist, tuple(edges))


__all__ = ["Histogramdd", "bincount", "histogramdd", "unique", "unique_consecutive"]
