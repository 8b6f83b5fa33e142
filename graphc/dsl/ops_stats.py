"""torch's NaN-aware reductions, quantiles and statistics: ``nansum``, ``nanmean``,
``count_nonzero``, ``aminmax``, ``var_mean``/``std_mean``, ``quantile``/``nanquantile``,
``kthvalue``, ``mode``, ``cov``/``corrcoef``, ``dist`` and ``histc``, each written in standard ONNX
ops. Order statistics sort with TopK (NaNs after everything, as torch's sort) and read their
values with GatherElements, so gradients go to the picked entries, as torch's."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import user_source
from graphc.dsl.ops import cast, constant, detach, emit, lift, reshape, scalar, squeeze, unsqueeze
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops import mean as reduce_mean
from graphc.dsl.ops import min as reduce_min
from graphc.dsl.ops import sqrt, where
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_binary import sub
from graphc.dsl.ops_array import dim_index, dim_length, dim_positions, full, gather, nan_as, sort_order, var
from graphc.dsl.ops_divide import to_float
from graphc.dsl.ops_math import amax, amin, isnan, norm
from graphc.dsl.ops_order import ValuesIndices, picked
from graphc.dsl.ops_views import movedim
from graphc.dsl.tensor import Tensor
from graphc.dsl.dims import one_element
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, to_numpy


class Aminmax(NamedTuple):
    """``gc.aminmax``'s result, as ``torch.return_types.aminmax``: ``min`` and ``max``."""

    min: Tensor
    max: Tensor


def _nan_zeroed(x: Tensor) -> Tensor:
    """``x`` with its NaNs read as 0, so no gradient reaches them."""
    return where(isnan(x), scalar(0, x), x) if x.dtype in FLOAT_DTYPES else x


def nansum(x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """``torch.nansum``: the sum over ``dim`` (None: all) with NaNs as 0; ``dtype`` casts first, else
    bool and integer Tensors sum in int64. Signature: ai.onnx@13::ReduceSum"""
    x = lift(x) if dtype is None else cast(lift(x), dtype)
    return reduce_sum(_nan_zeroed(x), dim, keepdim)


def nanmean(x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """``torch.nanmean``: the mean over ``dim`` (None: all) of the entries that are not NaN (NaN
    where none is); a float Tensor only, as torch (``dtype`` casts first)."""
    x = lift(x) if dtype is None else cast(lift(x), dtype)
    if x.dtype not in FLOAT_DTYPES:
        raise CaptureError(f"nanmean input: expected a floating-point Tensor, got {x.dtype} (at {user_source()})")
    return nansum(x, dim, keepdim) / reduce_sum(cast(~isnan(x), x.dtype), dim, keepdim)


def count_nonzero(x: Tensor, dim: Any = None) -> Tensor:
    """``torch.count_nonzero``: the int64 count of nonzero entries (NaN counts) over ``dim`` (None: all)."""
    return reduce_sum(cast(lift(x), "bool"), dim)


def aminmax(x: Tensor, *, dim: int | None = None, keepdim: bool = False) -> Aminmax:
    """``torch.aminmax``: ``(min, max)`` over ``dim`` (None: all), NaN where a NaN is (``amin``'s and
    ``amax``'s); ties share the gradient, as torch's."""
    x = lift(x)
    dims = list(range(x.ndim)) if dim is None else dim
    return Aminmax(amin(x, dims, keepdim), amax(x, dims, keepdim))


def var_mean(x: Tensor, dim: Any = None, correction: float = 1, keepdim: bool = False, *,
             unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
    """``torch.var_mean``: ``(gc.var(...), the mean)`` over the same dims."""
    mean = reduce_mean(x, None if isinstance(dim, bool) else dim, keepdim)  # a bool dim: var_mean(x, unbiased)
    return var(x, dim, correction, keepdim, unbiased=unbiased), mean


def std_mean(x: Tensor, dim: Any = None, correction: float = 1, keepdim: bool = False, *,
             unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
    """``torch.std_mean``: ``(gc.std(...), the mean)`` over the same dims."""
    variance, mean = var_mean(x, dim, correction, keepdim, unbiased=unbiased)
    return sqrt(variance), mean


# -- sorting --------------------------------------------------------------------------------


@one_element()
def kthvalue(x: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
    """``torch.kthvalue``: the ``k``-th smallest value along ``dim`` (1-based; NaN the largest) and
    its index. On ties the index is the ``k``-th in a stable sort, which may differ from torch's
    (its quickselect's); the value is the same and the gradient goes to the index."""
    x = lift(x)
    dim = dim_index(x, dim, "TopK")
    size = x.shape[dim]
    if not isinstance(k, int) or (isinstance(size, int) and not 1 <= k <= size):
        raise CaptureError(f"kthvalue k={k!r}: expected an int from 1 to the size of dim {dim} ({size}) "
                           f"(at {user_source()})")
    index = emit("Slice", [sort_order(x, dim, False), _i64(k - 1), _i64(k), _i64(dim)])
    return picked(x, index, dim, keepdim)


def _i64(value: int) -> Tensor:
    return constant(np.asarray([value], np.int64))


@one_element()
def mode(x: Tensor, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
    """``torch.mode``: the most frequent value along ``dim`` (the smallest on ties) and the last
    index holding it (torch's for up to 16 entries; beyond, torch's depends on its unstable sort).
    It compares every pair along ``dim``: memory ``n`` times ``x``'s. NaNs each count once."""
    x = lift(x)
    dim = dim_index(x, dim, "Mode")
    key = movedim(cast(x, "int32") if x.dtype == "bool" else x, dim, -1)  # onnxruntime has no bool Where
    counts = reduce_sum(unsqueeze(key, [-1]) == unsqueeze(key, [-2]), -1)  # [..., i]: entries equal to i
    top = counts == reduce_max(counts, -1, True)
    sortable = nan_as(key, np.inf)
    fill = np.inf if key.dtype in FLOAT_DTYPES else np.iinfo(to_numpy(key.dtype)).max
    value = reduce_min(where(top, sortable, scalar(fill, key)), -1, True)
    steps = dim_positions(x, dim)
    index = reduce_max(where(top & (sortable == value), steps, scalar(-1, steps)), -1, True)
    return picked(x, movedim(index, -1, dim), dim, keepdim)


# -- quantiles ------------------------------------------------------------------------------

_INTERPOLATIONS = {"linear": None, "lower": "Floor", "higher": "Ceil", "nearest": "Round", "midpoint": None}


def _quantiles(q: Any, x: Tensor, fn: str) -> tuple[Tensor, bool]:
    """``q`` as a 1-D Tensor of ``x``'s dtype, and whether it was a scalar; static values must lie in [0, 1]."""
    if isinstance(q, Tensor):
        if q.ndim > 1 or q.dtype != x.dtype:
            raise CaptureError(f"{fn} q: expected a scalar or 1-D Tensor of the input's dtype {x.dtype}, got "
                               f"{q.type_str()} (at {user_source()})")
        return (reshape(q, [1]), True) if q.ndim == 0 else (q, False)
    values = np.asarray(q, to_numpy(x.dtype))
    if values.ndim > 1 or not np.all((values >= 0) & (values <= 1)):
        raise CaptureError(f"{fn} q={q!r}: expected a number or a 1-D list of numbers in [0, 1] (at {user_source()})")
    return constant(values.reshape(-1)), values.ndim == 0


def _quantile(x: Tensor, q: Any, dim: int | None, keepdim: bool, interpolation: str, fn: str) -> Tensor:
    x = lift(x)
    if x.dtype not in ("float32", "float64"):
        raise CaptureError(f"{fn} input: expected float32 or float64, got {x.dtype} (at {user_source()})")
    if interpolation not in _INTERPOLATIONS:
        raise CaptureError(f"{fn} interpolation={interpolation!r}: expected one of {list(_INTERPOLATIONS)} "
                           f"(at {user_source()})")
    q, scalar_q = _quantiles(q, x, fn)
    rows = reshape(x, [-1]) if dim is None else movedim(x, dim_index(x, dim, "TopK"), -1)
    last = rows.ndim - 1
    if rows.shape[last] == 0:
        raise CaptureError(f"{fn} input: expected a non-empty Tensor (at {user_source()})")
    data = gather(rows, last, sort_order(rows, last, False))
    ranks = _ranks(rows, q, fn == "nanquantile")
    if _INTERPOLATIONS[interpolation]:
        ranks = emit(_INTERPOLATIONS[interpolation], [ranks])
    below = cast(emit("Floor", [ranks]), "int64")
    out = gather(data, last, below)
    if interpolation in ("linear", "midpoint"):
        weight = scalar(0.5, ranks) if interpolation == "midpoint" else ranks - emit("Floor", [ranks])
        out = _lerp(out, gather(data, last, cast(emit("Ceil", [ranks]), "int64")), weight)
    if keepdim:
        out = reshape(out, [1] * x.ndim + [-1]) if dim is None else unsqueeze(out, [dim_index(x, dim, "TopK")])
    return squeeze(out, [out.ndim - 1]) if scalar_q else movedim(out, -1, 0)


def _ranks(rows: Tensor, q: Tensor, skip_nan: bool) -> Tensor:
    """The fractional sorted positions of the quantiles ``q`` in each row (last dim) of ``rows``, as
    torch: over the entries not NaN (0 when all are) or, where a row has a NaN, its last (a NaN)."""
    nan = cast(isnan(rows), rows.dtype)
    if skip_nan:
        ranks = q * (reduce_sum(scalar(1, nan) - nan, -1, True) - scalar(1, q))
        return where(ranks < scalar(0, ranks), scalar(0, ranks), ranks)
    last = cast(dim_length(rows, rows.ndim - 1), rows.dtype) - scalar(1, q)
    return where(reduce_max(nan, -1, True) > scalar(0, nan), last, q * last)


def _lerp(lo: Tensor, hi: Tensor, weight: Tensor) -> Tensor:
    """torch's lerp: from ``lo`` below a weight of 0.5, from ``hi`` above (the same gradients)."""
    one = scalar(1, weight)
    return where(weight < scalar(0.5, weight), lo + weight * (hi - lo), hi - (hi - lo) * (one - weight))


@autocast_op()
def quantile(x: Tensor, q: Any, dim: int | None = None, keepdim: bool = False, *,
             interpolation: str = "linear") -> Tensor:
    """``torch.quantile``: the ``q``-th quantiles (a number, a list or a 1-D Tensor; the quantiles
    first in the result) of ``x`` along ``dim`` (None: all), NaN where a row has one; interpolation
    linear, lower, higher, nearest or midpoint. A Tensor ``q`` is not range-checked at run time.
    Signature: ai.onnx@11::TopK"""
    return _quantile(x, q, dim, keepdim, interpolation, "quantile")


@autocast_op()
def nanquantile(x: Tensor, q: Any, dim: int | None = None, keepdim: bool = False, *,
                interpolation: str = "linear") -> Tensor:
    """``torch.nanquantile``: ``quantile`` of the entries that are not NaN (NaN where all are)."""
    return _quantile(x, q, dim, keepdim, interpolation, "nanquantile")


# -- covariance, distance, histogram ---------------------------------------------------------


def cov(x: Tensor, *, correction: int = 1, fweights: Tensor | None = None, aweights: Tensor | None = None) -> Tensor:
    """``torch.cov``: the covariance of the rows (variables) of ``x`` over its columns (observations),
    weighted by integer ``fweights`` and float ``aweights``, divided by the weighted count less
    ``correction`` (0 where that is not positive, as torch); one (static) variable gives a scalar. An integer
    ``x`` is read as float32. Signature: ai.onnx@12::Einsum"""
    x = to_float(lift(x))
    if x.ndim > 2:
        raise CaptureError(f"cov input: expected a 1-D or 2-D Tensor, got {x.type_str()} (at {user_source()})")
    rows = reshape(x, [1, -1]) if x.ndim < 2 else x
    weights = [_weights(w, name, rows) for w, name in ((fweights, "fweights"), (aweights, "aweights"))
               if w is not None]
    w = weights[0] * weights[1] if len(weights) == 2 else weights[0] if weights else None
    total = cast(reshape(dim_length(rows, 1), []), x.dtype) if w is None else reduce_sum(w)
    weighted = rows if w is None else rows * w
    centered = rows - unsqueeze(reduce_sum(weighted, 1) / total, [1])
    lost = scalar(correction, total)
    if aweights is not None and correction != 0:
        lost = lost * reduce_sum(w * weights[-1]) / total
    count = total - lost
    count = where(count <= scalar(0, count), scalar(0, count), count)
    # Einsum, not MatMul: onnxruntime folds a constant divisor of a MatMul into a float32 alpha
    out = emit("Einsum", [centered, centered if w is None else centered * w], {"equation": "ij,kj->ik"}) / count
    return squeeze(out) if rows.shape[0] == 1 else out


def _weights(w: Any, name: str, rows: Tensor) -> Tensor:
    """``cov``'s ``fweights`` (integers) or ``aweights`` (floats): 1-D, one per observation, as ``rows``' dtype."""
    w = lift(w)
    integral = name == "fweights"
    if w.ndim != 1 or (w.dtype not in FLOAT_DTYPES and w.dtype != "bool") != integral:
        raise CaptureError(f"cov {name}: expected a 1-D {'integer' if integral else 'floating-point'} Tensor, got "
                           f"{w.type_str()} (at {user_source()})")
    if isinstance(w.shape[0], int) and isinstance(rows.shape[1], int) and w.shape[0] != rows.shape[1]:
        raise CaptureError(f"cov {name}: expected {rows.shape[1]} entries (one per observation), got {w.shape[0]} "
                           f"(at {user_source()})")
    return cast(w, rows.dtype)


def corrcoef(x: Tensor) -> Tensor:
    """``torch.corrcoef``: ``cov(x)`` divided by the product of the standard deviations, clipped
    to [-1, 1]; one variable gives ``c / c`` (1, or NaN where it does not vary)."""
    c = cov(x)
    if c.ndim == 0:
        return c / c
    steps = dim_positions(c, 0)
    std = sqrt(squeeze(gather(c, 1, unsqueeze(steps, [1])), [1]))
    return emit("Clip", [c / unsqueeze(std, [1]) / unsqueeze(std, [0]), scalar(-1, c), scalar(1, c)])


@autocast_op()
def dist(a: Tensor, b: Tensor, p: float = 2) -> Tensor:
    """``torch.dist``: the ``p``-norm of ``a - b`` (broadcast; ``p`` 0, inf, -inf or any number, as
    ``gc.norm``); the two promote as torch's, to a float dtype (torch's norm refuses integers, its ``-`` bools)."""
    diff = sub(a, b)
    if diff.dtype not in FLOAT_DTYPES:
        raise CaptureError(f"dist: expected float Tensors (torch's norm refuses integers), got {lift(a).dtype} and "
                           f"{lift(b).dtype} (at {user_source()})")
    return norm(diff, p)


def histc(x: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002 - torch's names
    """``torch.histc``: counts (in ``x``'s float dtype) of the entries in ``bins`` equal bins from
    ``min`` to ``max`` (both equal: the least and greatest entries not NaN, where torch refuses NaN,
    widened by 1 each way when they are equal too); entries outside or NaN are not counted, ``max``
    is in the last bin. Bin
    ``floor((v - min) * bins / (max - min))`` as torch's first guess: a value within rounding of an
    inner edge may land one bin from torch's. No gradient, as torch. Signature: ai.onnx@18::ScatterElements"""
    x = detach(lift(x))
    if x.dtype not in FLOAT_DTYPES:
        raise CaptureError(f"histc input: expected a floating-point Tensor, got {x.dtype} (at {user_source()})")
    if not isinstance(bins, int) or bins <= 0 or not np.isfinite([min, max]).all() or min > max:
        raise CaptureError(f"histc bins={bins!r}, min={min!r}, max={max!r}: expected a positive int of bins and "
                           f"finite min <= max (at {user_source()})")
    flat = reshape(x, [-1])
    lo, hi = scalar(min, x), scalar(max, x)
    if min == max:  # the range of the entries not NaN
        lo, hi = reduce_min(nan_as(flat, np.inf)), reduce_max(nan_as(flat, -np.inf))
        same = lo == hi
        lo, hi = where(same, lo - 1, lo), where(same, hi + 1, hi)
    pos = emit("Floor", [(flat - lo) * scalar(bins, x) / (hi - lo)])
    counted = (flat >= lo) & (flat <= hi) & ~isnan(pos)  # NaN: a NaN entry, or an infinite one at an infinite edge
    pos = cast(where(counted, emit("Clip", [pos, scalar(0, x), scalar(bins - 1, x)]), scalar(0, x)), "int64")
    return emit("ScatterElements", [full([bins], 0, x.dtype), pos, cast(counted, x.dtype)], {"reduction": "add"})


__all__ = [
    "Aminmax", "aminmax", "corrcoef", "count_nonzero", "cov", "dist", "histc", "kthvalue", "mode", "nanmean",
    "nanquantile", "nansum", "quantile", "std_mean", "var_mean",
]
