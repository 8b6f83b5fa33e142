"""Order statistics with torch's ``(values, indices)`` results: ``max``/``min`` over one dim,
``median``/``nanmedian`` (torch's lower median) and ``cummax``/``cummin``. Each picks its int64
indices first and reads its values there with GatherElements, so the gradient goes to the picked
entry (on ties too) and a NaN is picked, as torch's. A median over all entries spreads its gradient
evenly over the entries equal to it, as torch's does."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import user_source
from graphc.dsl.ops import cast, const_i64, detach, emit, lift, reshape, scalar, squeeze, unsqueeze, where
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops import min as reduce_min
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_array import arg_index, dim_index, dim_length, dim_positions, gather, nan_as
from graphc.dsl.ops_math import isnan
from graphc.dsl.ops_views import movedim, sort
from graphc.dsl.tensor import Tensor
from graphc.dsl.dims import one_element
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, to_numpy


class ValuesIndices(Tensor):
    """torch's ``(values, indices)`` result (``torch.return_types.max``) that is also its values
    Tensor, so code that took ``x.max(dim)`` for its values keeps working: ``v, i = x.max(1)``,
    ``.values`` and ``.indices`` as torch; arithmetic and functions see the values. A bare int
    index is refused: ``x.max(1)[0]`` is torch's values but numpy's first row."""

    __slots__ = ("indices",)

    def __init__(self, values: Tensor, indices: Tensor):
        super().__init__(values.value, values.eager_value)
        self.indices = indices

    @property
    def values(self) -> Tensor:
        return Tensor(self.value, self.eager_value)

    def __iter__(self):
        return iter((self.values, self.indices))

    def __getitem__(self, key: Any) -> Tensor:
        if isinstance(key, int):
            raise CaptureError(f"[{key}] of a (values, indices) result is ambiguous: write .values or .indices "
                               f"(torch's [0] and [1]), or .values[{key}] for a row of the values (at {user_source()})")
        return self.values[key]


def picked(x: Tensor, index: Tensor, dim: int, keepdim: bool) -> ValuesIndices:
    """``x`` at ``index`` (``x``'s rank, size 1 along ``dim`` unless a cumulative op's) and the index."""
    values = gather(x, dim, index)
    if not keepdim:
        values, index = squeeze(values, [dim]), squeeze(index, [dim])
    return ValuesIndices(values, index)


def _arg(op: str, x: Tensor, dim: int, keepdim: bool) -> ValuesIndices:
    """``op`` ArgMax/ArgMin's first index along ``dim`` (a NaN's first, as torch) and the value there."""
    x = lift(x)
    dim = dim_index(x, dim, op)
    return picked(x, arg_index(op, x, dim, keepdim=True), dim, keepdim)


@one_element()
def max_dim(x: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    """``torch.max(x, dim)``: the largest value along ``dim`` and its first index. Signature: ai.onnx@13::ArgMax"""
    return _arg("ArgMax", x, dim, keepdim)


@one_element()
def min_dim(x: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    """``torch.min(x, dim)``: the smallest value along ``dim`` and its first index. Signature: ai.onnx@13::ArgMin"""
    return _arg("ArgMin", x, dim, keepdim)


def _median(x: Tensor, dim: Any, keepdim: bool, skip_nan: bool) -> Tensor:
    x = lift(x)
    if dim is None:
        return _evenly(x, _median(reshape(x, [-1]), 0, False, skip_nan).values)
    dim = dim_index(x, dim, "TopK")
    order = sort(nan_as(x, np.inf), dim).indices  # NaNs last
    nan = isnan(x) if x.dtype in FLOAT_DTYPES else None
    two = const_i64([2])
    if skip_nan and nan is not None:  # each row's own count; truncated, 0 for a row of NaNs
        index = gather(order, dim, emit("Div", [reduce_sum(cast(~nan, "int64"), dim, keepdims=True) - 1, two]))
    else:
        pos = emit("Div", [dim_length(x, dim) - 1, two])
        index = emit("Slice", [order, pos, pos + 1, const_i64([dim])])
    if nan is not None and not skip_nan:
        nans = cast(nan, "int32")
        index = where(reduce_max(nans, dim, True) > 0,
                      emit("ArgMax", [nans], {"axis": dim, "keepdims": 1}), index)
    return picked(x, index, dim, keepdim)


def _evenly(x: Tensor, value: Tensor) -> Tensor:
    """``value`` (a reduction's result) with its gradient spread evenly over the entries of ``x``
    equal to it (NaNs, when it is NaN), as torch's ``evenly_distribute_backward``."""
    value = detach(value)
    if x.dtype not in FLOAT_DTYPES:
        return value
    hit = (x == value) | (isnan(x) & isnan(value))
    return value + reduce_sum(where(hit, x - detach(x), scalar(0, x))) / reduce_sum(cast(hit, x.dtype))


@one_element()
def median(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """``torch.median``: the lower median (the ``(n - 1) // 2``-th smallest), NaN where there is
    one; over all entries the value, along ``dim`` the value and its index (``ValuesIndices``)."""
    return _median(x, dim, keepdim, skip_nan=False)


@one_element()
def nanmedian(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """``torch.nanmedian``: ``median`` of the entries that are not NaN (NaN where all are)."""
    return _median(x, dim, keepdim, skip_nan=True)


def _cumulative(x: Tensor, dim: int, largest: bool) -> ValuesIndices:
    """The running max (or min) along ``dim`` and, as torch, the last index where it is reached
    (a NaN's from the first NaN on). It compares every pair of positions along ``dim``: memory
    ``n`` times ``x``'s."""
    x = lift(x)
    op = "CumMax" if largest else "CumMin"
    dim = dim_index(x, dim, op)
    key = movedim(nan_as(x, np.inf if largest else -np.inf), dim, -1)
    steps = dim_positions(x, dim)
    source, upto = unsqueeze(steps, [1]), unsqueeze(steps, [0])
    seen = source <= upto  # [i, j]: i at or before j
    if key.dtype in FLOAT_DTYPES:
        fill = -np.inf if largest else np.inf
    else:
        fill = np.iinfo(to_numpy(key.dtype)).min if largest else np.iinfo(to_numpy(key.dtype)).max
    ahead = unsqueeze(key, [-1])  # [..., i, 1]
    best = (reduce_max if largest else reduce_min)(where(seen, ahead, scalar(fill, key)), -2, True)
    index = reduce_max(where(seen & (ahead == best), source, scalar(-1, source)), -2)  # the last i reaching it
    if x.dtype in FLOAT_DTYPES:  # the last NaN from the first on, past the infs NaNs were read as
        nan = reduce_max(where(seen & unsqueeze(isnan(movedim(x, dim, -1)), [-1]), source, scalar(-1, source)), -2)
        index = where(nan >= scalar(0, nan), nan, index)
    return picked(x, movedim(index, -1, dim), dim, keepdim=True)


@one_element()
def cummax(x: Tensor, dim: int) -> ValuesIndices:
    """``torch.cummax``: the running maximum along ``dim`` and the last index it was reached at."""
    return _cumulative(x, dim, largest=True)


@one_element()
def cummin(x: Tensor, dim: int) -> ValuesIndices:
    """``torch.cummin``: the running minimum along ``dim`` and the last index it was reached at."""
    return _cumulative(x, dim, largest=False)


__all__ = ["ValuesIndices", "cummax", "cummin", "max_dim", "median", "min_dim", "nanmedian"]
