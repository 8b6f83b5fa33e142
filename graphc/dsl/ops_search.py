"""torch's searching, binning, distances, windows over a dim and index writes: ``searchsorted``,
``bucketize``, ``isin``, ``histogram``, ``cdist``, ``pdist``, ``trapezoid``/``trapz``, ``cumulative_trapezoid``,
``gradient``, ``put``, ``index_reduce`` and ``renorm``, plus ``Tensor.unfold`` and
``Tensor.fill_diagonal_`` (``windows`` and ``fill_diagonal`` here). Searches unroll torch's binary
search (a Gather per halving); the rest are Slice, Gather, ScatterND/ScatterElements, Where and
reductions, whose gradient rules apply."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import (cast, const_i64, constant, detach, emit, lift, minimum, reshape, reshape_like, scalar,
                            squeeze, unsqueeze, where)
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops import min as reduce_min
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_array import cumsum, dim_index, full, index_select, nan_as, pad, static_dim
from graphc.dsl.ops_divide import to_float
from graphc.dsl.ops_math import any as reduce_any
from graphc.dsl.ops_math import norm
from graphc.dsl.ops_scatter import scatter_reduce
from graphc.dsl.ops_views import diff, expand_as, movedim
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

_INT_MAX = np.iinfo(np.int64).max


def _comparable(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a`` and ``b`` in one dtype to compare, as torch promotes: an integer one takes the other's
    float dtype; two integer dtypes compare as int64."""
    if a.dtype == b.dtype:
        return a, b
    if (a.dtype in FLOAT_DTYPES) != (b.dtype in FLOAT_DTYPES):
        return (a, cast(b, a.dtype)) if a.dtype in FLOAT_DTYPES else (cast(a, b.dtype), b)
    if a.dtype in FLOAT_DTYPES:
        return cast(a, "float64"), cast(b, "float64")
    return cast(a, "int64"), cast(b, "int64")


def _operand(value: Any, other: Tensor) -> Tensor:
    """``value`` as a Tensor to compare with ``other``: a number takes ``other``'s dtype, unless it is
    a float next to an integer Tensor (then float64, as torch promotes)."""
    if isinstance(value, Tensor):
        return value
    if np.asarray(value).dtype.kind == "f" and other.dtype not in FLOAT_DTYPES:
        return constant(np.asarray(value, np.float64))
    return lift(value, other)


def _binary_search(seq: Tensor, values: Tensor, right: bool) -> Tensor:
    """torch's binary search, step by step, for each of ``values`` (``[..., K]`` in ``seq``'s
    ``[..., M]``, or any shape in a 1-D ``seq``; a static ``M``): the int64 position past every entry
    ``s`` it steps over, those with ``not s >= v`` (``right``: ``not s > v``). So a NaN value goes to
    the end, and NaN entries (sorted last) land where torch's search puts them."""
    seq, values = _comparable(seq, values)
    size = static_dim(seq, seq.ndim - 1, "searchsorted")
    lo = expand_as(constant(np.int64(0)), values)
    hi = lo + size
    for _ in range(size.bit_length()):  # torch's loop: while lo < hi, halving hi - lo
        mid = emit("Div", [lo + hi, constant(np.int64(2))])
        at = minimum(mid, size - 1)
        probe = emit("Gather", [seq, at]) if seq.ndim == 1 else emit("GatherElements", [seq, at], {"axis": -1})
        past = ~(probe > values) if right else ~(probe >= values)
        open_ = lo < hi
        lo, hi = where(open_ & past, mid + 1, lo), where(open_ & ~past, mid, hi)
    return lo


def searchsorted(sorted_sequence: Tensor, values: Any, *, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: Tensor | None = None) -> Tensor:
    """``torch.searchsorted``: where each of ``values`` would go in the last dim of ``sorted_sequence``
    (1-D, or batched with ``values``' leading dims) to keep it sorted, before equal entries (after
    them with ``right`` or ``side="right"``); ``sorter`` sorts an unsorted sequence. The sequence's last dim
    must be static. int64 (int32 with ``out_int32``). Signature: ai.onnx@13::Gather (GatherElements when batched)"""
    seq = lift(sorted_sequence)
    if side not in (None, "left", "right") or (side is not None and right and side == "left"):
        raise CaptureError(f"searchsorted side={side!r}, right={right!r}: expected side 'left' or 'right', not "
                           f"opposite to right (at {user_source()})")
    right = right or side == "right"
    values = _operand(values, seq)
    if seq.ndim == 0 or (seq.ndim > 1 and (values.ndim != seq.ndim or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(seq.shape[:-1], values.shape[:-1])))):
        raise CaptureError(f"searchsorted sorted_sequence: expected a 1-D Tensor or one whose leading dims are the "
                           f"values' ({values.type_str()}), got {seq.type_str()} (at {user_source()})")
    if sorter is not None:
        sorter = lift(sorter)
        if sorter.dtype != "int64" or sorter.shape != seq.shape:
            raise CaptureError(f"searchsorted sorter: expected an int64 Tensor of sorted_sequence's shape "
                               f"{list(seq.shape)}, got {sorter.type_str()} (at {user_source()})")
        seq = emit("GatherElements", [seq, sorter], {"axis": seq.ndim - 1})
    found = _binary_search(seq, values, right)
    return cast(found, "int32") if out_int32 else found


def bucketize(input: Any, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:  # noqa: A002
    """``torch.bucketize``: for each entry of ``input``, the index of its bucket among the sorted 1-D
    ``boundaries``: ``boundaries[i-1] < v <= boundaries[i]`` (``right``: ``boundaries[i-1] <= v <
    boundaries[i]``), as ``searchsorted``."""
    boundaries = lift(boundaries)
    if boundaries.ndim != 1:
        raise CaptureError(f"bucketize boundaries: expected a 1-D Tensor, got {boundaries.type_str()} "
                           f"(at {user_source()})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def isin(elements: Any, test_elements: Any, *, assume_unique: bool = False, invert: bool = False) -> Tensor:
    """``torch.isin``: whether each of ``elements`` equals one of ``test_elements`` (either may be a
    number; NaN equals nothing); ``invert`` negates. Each pair is compared: memory their product.
    Signature: ai.onnx@11::Equal"""
    if isinstance(elements, np.ndarray) and not isinstance(test_elements, Tensor):
        elements = lift(elements)  # two arrays: as an op on numpy arrays alone
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise CaptureError(f"isin: expected elements or test_elements to be a Tensor, got {elements!r} and "
                           f"{test_elements!r} (at {user_source()})")
    elements = _operand(elements, test_elements) if isinstance(test_elements, Tensor) else elements
    tests = _operand(test_elements, elements)
    if "bool" in (elements.dtype, tests.dtype):
        raise op_error("isin", [elements, tests], "expected numbers or Tensors of numbers, got bool; torch refuses "
                       "a bool input", user_source())
    a, b = _comparable(elements, reshape(tests, [-1]))
    found = reduce_any(unsqueeze(a, [-1]) == b, -1)
    return ~found if invert else found


# -- histogram ----------------------------------------------------------------------------------


class Histogram(NamedTuple):
    """``gc.histogram``'s result, as ``torch.return_types.histogram``: ``hist`` and ``bin_edges``."""

    hist: Tensor
    bin_edges: Tensor


def histogram(input: Tensor, bins: Any = 100, *, range: Any = None, weight: Tensor | None = None,  # noqa: A002
              density: bool = False) -> Histogram:
    """``torch.histogram``: the counts (or summed ``weight``) of a float ``input``'s entries in the bins
    of ``bin_edges``: ``bins`` equal bins over ``range`` (None: from the least to the greatest entry
    not NaN, where torch refuses NaN; widened by 0.5 each way when they are equal), or the edges of a
    1-D Tensor ``bins``. An entry goes to the last edge at or below it (the last bin holds the last
    edge), as torch's search; outside or NaN, nowhere. ``density`` divides by the total and the bin
    widths. No gradient, as torch. Signature: ai.onnx@18::ScatterElements"""
    x = detach(lift(input))
    if x.dtype not in FLOAT_DTYPES:
        raise CaptureError(f"histogram input: expected a floating-point Tensor, got {x.dtype} (at {user_source()})")
    flat = reshape(x, [-1])
    edges = bin_edges(flat, bins, range)
    count = edges.shape[0] - 1
    pos, inside = bin_positions(flat, edges)
    work = "float32" if x.dtype == "float16" else x.dtype  # onnxruntime has no float16 ScatterElements add
    if weight is None:
        added = cast(inside, work)
    else:
        w = detach(lift(weight, x))
        if w.dtype != x.dtype or w.shape != x.shape:
            raise CaptureError(f"histogram weight: expected a Tensor of the input's type {x.type_str()}, got "
                               f"{w.type_str()} (at {user_source()})")
        added = cast(where(inside, reshape(w, [-1]), scalar(0, x)), work)
    hist = cast(emit("ScatterElements", [full([count], 0, work), pos, added], {"reduction": "add"}), x.dtype)
    if density:
        hist = hist / (reduce_sum(hist) * diff(edges))
    return Histogram(hist, edges)


def bin_positions(flat: Tensor, edges: Tensor) -> tuple[Tensor, Tensor]:
    """The bin (int64) of each of the 1-D ``flat``'s entries among the 1-D ``edges``, as torch's
    histogram: the last edge at or below it (the last bin holds the last edge), 0 where it is outside
    or NaN; and whether it is inside."""
    below = reduce_sum(cast(unsqueeze(edges, [0]) <= unsqueeze(flat, [1]), "int64"), 1)
    inside = (flat >= edges[0]) & (flat <= edges[-1])
    return where(inside, minimum(below - 1, edges.shape[0] - 2), scalar(0, below)), inside


def bin_edges(flat: Tensor, bins: Any, range: Any) -> Tensor:  # noqa: A002 - torch's name
    """``histogram``'s edges of the 1-D ``flat``: a Tensor ``bins`` as given, else
    ``torch.linspace(lo, hi, bins + 1)`` over ``range`` or the entries not NaN."""
    if isinstance(bins, Tensor):
        if bins.ndim != 1 or bins.dtype != flat.dtype or not isinstance(bins.shape[0], int) or bins.shape[0] < 2 \
                or range is not None:
            raise CaptureError(f"histogram bins: expected an int, or a 1-D {flat.dtype} Tensor of at least 2 static "
                               f"edges without range, got {bins.type_str()} (at {user_source()})")
        return detach(bins)
    if not isinstance(bins, int) or bins <= 0:
        raise CaptureError(f"histogram bins={bins!r}: expected a positive int or a 1-D Tensor (at {user_source()})")
    if range is None:
        # one inf more each way, as onnxruntime refuses to reduce an empty set
        lo, hi = (reduce(pad(nan_as(flat, v), [0, 1], value=v)) for reduce, v in ((reduce_min, np.inf),
                                                                                  (reduce_max, -np.inf)))
        empty = lo > hi  # no entries (torch refuses NaN ones): torch's range is [0, 1]
        lo, hi = where(empty, scalar(0, lo), lo), where(empty, scalar(1, hi), hi)
    elif len(range) != 2 or not np.isfinite(range).all() or range[0] > range[1]:
        raise CaptureError(f"histogram range={range!r}: expected finite (min, max) with min <= max "
                           f"(at {user_source()})")
    else:
        lo, hi = scalar(range[0], flat), scalar(range[1], flat)
    same = lo == hi
    lo, hi = where(same, lo - 0.5, lo), where(same, hi + 0.5, hi)
    # torch.linspace: the first half counted up from lo, the second down from hi
    step = (hi - lo) / scalar(bins, lo)
    index = np.arange(bins + 1)
    up = index < (bins + 1) // 2
    ups = lo + step * constant(index.astype(np.dtype(flat.dtype.numpy)))
    downs = hi - step * constant((bins - index).astype(np.dtype(flat.dtype.numpy)))
    return where(constant(up), ups, downs)


# -- distances ----------------------------------------------------------------------------------

_COMPUTE_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


def minkowski(diff: Tensor, p: float) -> Tensor:
    """The ``p``-norm over the last dim of ``diff`` with torch's ``cdist``/``pdist`` gradients: 0 at a
    zero difference (and at each zero entry for ``p < 1``), and for ``p = inf`` ``sign(diff)`` at every
    entry of the largest size (ties each get all of it)."""
    size = emit("Abs", [diff])
    if math.isinf(p):
        top = detach(reduce_max(pad(size, [0, 1], value=0.0), -1, True))  # a 0 more: an empty diff gives 0
        ties = cast(detach(size) == top, diff.dtype)  # the value is top; the gradient sign(diff) at each tie
        return squeeze(top, [-1]) + reduce_sum(ties * (size - detach(size)), -1)
    if p in (0, 1, 2):
        return norm(diff, p, -1)
    return _power_or_zero(reduce_sum(_power_or_zero(size, p), -1), 1 / p)


def _power_or_zero(t: Tensor, exponent: float) -> Tensor:
    """``t ** exponent`` for ``t >= 0``, 0 with a gradient of 0 where ``t`` is 0 (not inf or nan)."""
    zero = t == scalar(0, t)
    return where(zero, scalar(0, t), where(zero, scalar(1, t), t) ** scalar(exponent, t))


@autocast_op()
def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: str = _COMPUTE_MODES[0]) -> Tensor:
    """``torch.cdist``: ``||x1[..., i, :] - x2[..., j, :]||_p`` for every row pair, ``[..., P, R]``
    (batch dims broadcast; ``p`` >= 0, inf included), gradients as torch's (``minkowski``). Always
    from the differences (``compute_mode`` is checked, not used: no matmul form), whose
    ``[..., P, R, M]`` Tensor is held. Signature: ai.onnx@13::ReduceSum"""
    x1, x2 = lift(x1), lift(x2)
    if x1.ndim < 2 or x2.ndim < 2 or x1.dtype not in FLOAT_DTYPES or x1.dtype != x2.dtype:
        raise CaptureError(f"cdist x1, x2: expected float Tensors of one dtype with at least 2 dims, got "
                           f"{x1.type_str()} and {x2.type_str()} (at {user_source()})")
    a, b = x1.shape[-1], x2.shape[-1]
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise CaptureError(f"cdist x1, x2: expected the same size of the last dim, got {a} and {b} "
                           f"(at {user_source()})")
    if not isinstance(p, (int, float)) or p < 0 or compute_mode not in _COMPUTE_MODES:
        raise CaptureError(f"cdist p={p!r}, compute_mode={compute_mode!r}: expected p >= 0 and one of "
                           f"{list(_COMPUTE_MODES)} (at {user_source()})")
    return minkowski(unsqueeze(x1, [-2]) - unsqueeze(x2, [-3]), p)


@autocast_op()
def pdist(input: Tensor, p: float = 2.0) -> Tensor:  # noqa: A002 - torch's names
    """``torch.pdist``: ``||input[i] - input[j]||_p`` for every row pair ``i < j`` of an ``[N, M]`` input
    (static ``N``), in torch's order ``(0, 1), (0, 2), ..., (N-2, N-1)``: ``[N (N - 1) / 2]``; gradients
    as ``cdist``'s (``minkowski``)."""
    x = lift(input)
    if x.shape is None or len(x.shape) != 2 or not isinstance(x.shape[0], int):
        got = "unknown rank" if x.shape is None else f"shape {list(x.shape)}"
        raise op_error("pdist", [x], f"expects a 2-D input [N, M] with a static N, got {got}", user_source())
    if not (isinstance(p, (int, float)) and p >= 0):
        raise op_error("pdist", [x], f"p must be a number >= 0, got {p!r}", user_source())
    rows, cols = np.triu_indices(x.shape[0], 1)
    return minkowski(index_select(x, 0, const_i64(rows)) - index_select(x, 0, const_i64(cols)), p)


# -- integrals and derivatives along a dim ------------------------------------------------------


def _part(x: Tensor, dim: int, start: int, stop: int) -> Tensor:
    """``x[start:stop]`` along ``dim`` (negative counts from the end; ``stop`` None-like as _INT_MAX)."""
    return emit("Slice", [x, const_i64([start]), const_i64([stop]), const_i64([dim])])


def _trapezoids(fn: str, y: Any, x: Any, dx: Any, dim: int) -> tuple[Tensor, int]:
    """The areas ``(y[i] + y[i+1]) / 2 * (x[i+1] - x[i])`` along ``dim`` (``dx``, or 1, without ``x``)."""
    y = to_float(lift(y))
    dim = dim_index(y, dim, fn)
    if x is not None and dx is not None:
        raise CaptureError(f"{fn} x, dx: expected one of them, got both (at {user_source()})")
    if x is None:
        step = scalar(1 if dx is None else dx, y)
    else:
        x = cast(lift(x, y), y.dtype)
        if x.ndim == 1:
            x = reshape(x, [-1 if d == dim else 1 for d in range(y.ndim)])
        elif x.ndim != y.ndim:
            raise CaptureError(f"{fn} x: expected a 1-D Tensor or one of y's rank {y.ndim}, got {x.type_str()} "
                               f"(at {user_source()})")
        step = diff(x, 1, dim)
    return step * (_part(y, dim, 1, _INT_MAX) + _part(y, dim, 0, -1)) / scalar(2, y), dim


def trapezoid(y: Tensor, x: Any = None, *, dx: float | None = None, dim: int = -1) -> Tensor:
    """``torch.trapezoid``: the trapezoid-rule integral of ``y`` along ``dim``, at the points ``x`` (1-D
    along ``dim``, or broadcast with ``y``) or spaced ``dx`` (default 1); integers become float32 (but for
    no points along ``dim``, zeros of ``y``'s dtype, as torch)."""
    areas, dim = _trapezoids("trapezoid", y, x, dx, dim)
    y = lift(y)
    return cast(reduce_sum(areas, dim), y.dtype) if y.shape[dim] == 0 else reduce_sum(areas, dim)  # torch's zeros


trapz = trapezoid


def cumulative_trapezoid(y: Tensor, x: Any = None, *, dx: float | None = None, dim: int = -1) -> Tensor:
    """``torch.cumulative_trapezoid``: the running trapezoid-rule integrals, one fewer along ``dim``."""
    areas, dim = _trapezoids("cumulative_trapezoid", y, x, dx, dim)
    return cumsum(areas, dim)


def gradient(input: Tensor, *, spacing: Any = 1, dim: Any = None,  # noqa: A002 - torch's names
             edge_order: int = 1) -> tuple[Tensor, ...]:
    """``torch.gradient``: the derivative of ``input`` along each of ``dim`` (None: all), by central
    differences inside and one-sided ones (``edge_order`` 1 or 2) at the ends; ``spacing`` a number, one
    per dim, or one 1-D Tensor of coordinates per dim. Integers become float32; wider float coordinates
    widen the result, as torch promotes."""
    x = to_float(lift(input))
    coordinates = [lift(h) for h in spacing if isinstance(h, Tensor) or np.ndim(h)] if isinstance(
        spacing, (list, tuple)) else []
    widest = max([x.dtype] + [h.dtype for h in coordinates if h.dtype in FLOAT_DTYPES],
                 key=lambda d: np.dtype(d.numpy).itemsize)
    x = cast(x, widest) if widest != x.dtype else x  # torch promotes: float64 coordinates give float64
    dims = list(range(x.ndim)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    dims = [dim_index(x, d, "gradient") for d in dims]
    spacings = list(spacing) if isinstance(spacing, (list, tuple)) else [spacing] * len(dims)
    if edge_order not in (1, 2) or len(spacings) != len(dims) or len(set(dims)) != len(dims):
        raise CaptureError(f"gradient edge_order={edge_order!r}, spacing={spacing!r}, dim={dim!r}: expected "
                           f"edge_order 1 or 2 and one spacing per dim, each dim once (at {user_source()})")
    for d in dims:
        size = x.shape[d]
        if isinstance(size, int) and size < edge_order + 1:
            raise CaptureError(f"gradient input: expected each dim's size to be at least edge_order + 1 = "
                               f"{edge_order + 1}, got {size} on dim {d} (at {user_source()})")
    return tuple(_derivative(x, d, _steps(x, d, h), edge_order) for d, h in zip(dims, spacings))


def _steps(x: Tensor, dim: int, spacing: Any) -> Tensor:
    """The spacing between neighbours along ``dim``: a scalar, or the differences of coordinates."""
    if not isinstance(spacing, Tensor) and np.ndim(spacing) == 0:
        return scalar(spacing, x)
    spacing = lift(spacing, x)
    if spacing.ndim != 1:
        raise CaptureError(f"gradient spacing: expected 1-D coordinate Tensors, got {spacing.type_str()} "
                           f"(at {user_source()})")
    steps = diff(cast(spacing, x.dtype))
    return reshape(steps, [-1 if d == dim else 1 for d in range(x.ndim)])


def _derivative(f: Tensor, dim: int, h: Tensor, edge_order: int) -> Tensor:
    """numpy's and torch's second-order differences for the (possibly uneven) steps ``h``."""
    def at(t: Tensor, start: int, stop: int) -> Tensor:
        return t if t.ndim == 0 else _part(t, dim, start, stop)

    left, right = at(h, 0, -1), at(h, 1, _INT_MAX)
    if h.ndim == 0:  # even steps: torch's (f[i+1] - f[i-1]) / 2h, which reads no f[i] (an inf there is no nan)
        inner = (_part(f, dim, 2, _INT_MAX) - _part(f, dim, 0, -2)) / (h + h)
    else:
        inner = (-right / (left * (left + right)) * _part(f, dim, 0, -2)
                 + (right - left) / (left * right) * _part(f, dim, 1, -1)
                 + left / (right * (left + right)) * _part(f, dim, 2, _INT_MAX))
    h0, h1, hn, hm = at(h, 0, 1), at(h, 1, 2), at(h, -1, _INT_MAX), at(h, -2, -1)
    fn, fm = _part(f, dim, -1, _INT_MAX), _part(f, dim, -2, -1)
    if edge_order == 1:
        first = (_part(f, dim, 1, 2) - _part(f, dim, 0, 1)) / h0
        last = (fn - fm) / hn
    else:
        f0, f1, f2 = (_part(f, dim, k, k + 1) for k in range(3))
        first = (-(h0 + h0 + h1) / (h0 * (h0 + h1)) * f0 + (h0 + h1) / (h0 * h1) * f1
                 - h0 / (h1 * (h0 + h1)) * f2)
        fl = _part(f, dim, -3, -2)
        last = (hn / (hm * (hn + hm)) * fl - (hn + hm) / (hn * hm) * fm + (hn + hn + hm) / (hn * (hn + hm)) * fn)
    return emit("Concat", [first, inner, last], {"axis": dim})


# -- windows and index writes -------------------------------------------------------------------


def windows(x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """``Tensor.unfold``: the windows of ``size`` entries every ``step`` along ``dimension`` (a static
    size), the windows in its place and their entries as a new last dim. Signature: ai.onnx@13::Gather"""
    x = lift(x)
    flat = x.ndim == 0
    if flat:
        x = reshape(x, [1])
    dim = dim_index(x, dimension, "unfold")
    length = static_dim(x, dim, "unfold")
    if not isinstance(size, int) or not isinstance(step, int) or not 0 <= size <= length or step <= 0:
        raise CaptureError(f"unfold size={size!r}, step={step!r}: expected a size from 0 to {length} (dim "
                           f"{dim}'s) and a positive step (at {user_source()})")
    starts = np.arange(0, length - size + 1, step)
    index = constant((starts[:, None] + np.arange(size)[None, :]).astype(np.int64))
    out = movedim(emit("Gather", [x, index], {"axis": dim}), dim + 1, -1)
    return reshape(_part(out, 0, 0, 1), [-1]) if flat else out  # a 0-d x: one window (size 0 gives two)


def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:  # noqa: A002
    """``torch.put``: ``input`` read as 1-D with ``source``'s entries written (added, with
    ``accumulate``) at the flat int64 ``index`` (negative counts from the end; repeated ones without
    ``accumulate`` write one of theirs). Signature: ai.onnx@16::ScatterND"""
    x, index = lift(input), lift(index)
    source = lift(source, x)
    if index.dtype != "int64":
        raise CaptureError(f"put index: expected an int64 Tensor, got {index.type_str()} (at {user_source()})")
    if source.dtype != x.dtype:
        raise CaptureError(f"put source: expected the input's dtype {x.dtype}, got {source.type_str()} "
                           f"(at {user_source()})")
    counts = [math.prod(t.shape) if all(isinstance(d, int) for d in t.shape) else None for t in (index, source)]
    if None not in counts and counts[0] != counts[1]:
        raise CaptureError(f"put source: expected as many entries as index ({counts[0]}), got {counts[1]} "
                           f"(at {user_source()})")
    flat = reshape(x, [-1])
    at = reshape(index, [-1, 1])
    at = where(at < scalar(0, at), at + emit("Size", [x]), at)
    out = emit("ScatterND", [flat, at, reshape(source, [-1])], {"reduction": "add"} if accumulate else {})
    return reshape_like(out, x)


def index_reduce(input: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,  # noqa: A002
                 include_self: bool = True) -> Tensor:
    """``torch.index_reduce``: ``source``'s slices along ``dim`` reduced ("prod", "mean", "amax",
    "amin") into ``input``'s slices the 1-D ``index`` names, ``input``'s own entries included unless
    ``include_self=False``; ``gc.scatter_reduce`` with ``index`` spread over ``source``'s shape."""
    x, index = lift(input), lift(index)
    source = lift(source, x)
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise CaptureError(f"index_reduce reduce={reduce!r}: expected 'prod', 'mean', 'amax' or 'amin' "
                           f"(at {user_source()})")
    if index.ndim != 1 or index.dtype not in ("int64", "int32"):
        raise CaptureError(f"index_reduce index: expected a 1-D int64 or int32 Tensor, got {index.type_str()} "
                           f"(at {user_source()})")
    dim = dim_index(x, dim, "index_reduce")
    if source.ndim != x.ndim:
        raise CaptureError(f"index_reduce source: expected the input's rank {x.ndim}, got {source.type_str()} "
                           f"(at {user_source()})")
    spread = expand_as(reshape(cast(index, "int64"), [-1 if d == dim else 1 for d in range(x.ndim)]), source)
    return scatter_reduce(x, dim, spread, source, reduce, include_self=include_self)


def fill_diagonal(x: Tensor, fill_value: Any, wrap: bool = False) -> Tensor:
    """``Tensor.fill_diagonal_``'s value: ``x`` (at least 2-D, static; beyond 2-D all dims equal) with
    the entries whose indices are all equal set to ``fill_value``; ``wrap`` restarts a tall matrix's
    diagonal after every ``cols + 1`` rows, as torch. Signature: ai.onnx@16::Where"""
    x = lift(x)
    shape = [static_dim(x, d, "fill_diagonal_") for d in range(x.ndim)] if x.ndim >= 2 else None
    if shape is None or (x.ndim > 2 and len(set(shape)) != 1):
        raise CaptureError(f"fill_diagonal_ input: expected a 2-D Tensor or one with all dims equal, got "
                           f"{x.type_str()} (at {user_source()})")
    total = math.prod(shape)
    stride = sum(int(np.prod(shape[d + 1:])) for d in range(x.ndim))
    length = total if wrap and x.ndim == 2 else min(shape) * stride
    mask = np.zeros(total, bool)
    mask[np.arange(0, min(length, total), stride)] = True
    return where(constant(mask.reshape(shape)), scalar(fill_value, x), x)


@autocast_op()
def renorm(input: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:  # noqa: A002
    """``torch.renorm``: each slice of ``input`` along ``dim`` whose ``p``-norm is above ``maxnorm``
    scaled by ``maxnorm / (norm + 1e-7)`` (a float ``input``; ``p > 0``, ``maxnorm >= 0``)."""
    x = lift(input)
    if x.dtype not in FLOAT_DTYPES:
        raise CaptureError(f"renorm input: expected a floating-point Tensor, got {x.dtype} (at {user_source()})")
    if not isinstance(p, (int, float)) or p <= 0 or not isinstance(maxnorm, (int, float)) or maxnorm < 0:
        raise CaptureError(f"renorm p={p!r}, maxnorm={maxnorm!r}: expected p > 0 and maxnorm >= 0 "
                           f"(at {user_source()})")
    if x.ndim < 2:
        raise op_error("renorm", [x], f"input: expected at least 2 dims, as torch, got {x.ndim}", user_source())
    dim = dim_index(x, dim, "renorm")
    norms = norm(x, p, [d for d in range(x.ndim) if d != dim], True)
    factor = where(norms > scalar(maxnorm, norms), scalar(maxnorm, norms) / (norms + scalar(1e-7, norms)),
                   scalar(1, norms))
    return x * factor


__all__ = [
    "Histogram", "bin_edges", "bin_positions", "bucketize", "cdist", "cumulative_trapezoid", "fill_diagonal",
    "gradient", "histogram", "index_reduce", "isin", "minkowski", "pdist", "put", "renorm", "searchsorted", "trapezoid",
    "trapz", "windows",
]
