"""The columns of a ``gc.data.RayDataLoader``'s stored blocks: each block's layout (read where the
block is stored), the blocks' layouts checked into one dtype and row shape a column, and the
arrays read from a block made so.

A column may widen across blocks within its kind (int32 and int64: int64; float32 and float64:
float64; uint8 and int16: int16), the dtype ``numpy.concatenate`` and torch's collate give, and
no value changes. Anything else is an ``InputError`` naming the column: a column missing from a
block, null values (None: numpy would read them as NaN, an int column as float), dtypes of two
kinds (int64 and float64: which is meant?), rows of different shapes (a batch stacks its rows).
An object column of arrays (Ray's form of a list or variable-shaped tensor column) whose rows
share one shape is served stacked, as ``numpy.asarray`` stacks equal lists; other object columns
(strings) are served as object arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

from graphc.errors import InputError

Columns = Optional[tuple[str, ...]]


@dataclass(frozen=True)
class Column:
    """A column's dtype and row shape (one block's, or the dataset's once checked)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    stacked: bool = False  # an object column of equal-shaped arrays, served stacked
    null: Optional[int] = None  # a block's first row holding a null value, if any
    nulls: int = 0
    ragged: tuple = ()  # a block's (row, shape, row, shape): two rows of differing shapes


def _numpy(table: Any, columns: Columns) -> dict[str, np.ndarray]:
    """A stored block's ``columns`` (None: all) as numpy arrays, as Ray Data's ``iter_batches`` converts them."""
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(table if columns is None else table.select(list(columns))).to_batch_format("numpy")


def arrays(table: Any, columns: Columns, layout: dict[str, Column]) -> dict[str, np.ndarray]:
    """A stored block's ``columns`` as numpy arrays of the dataset's ``layout``: stacked, widened."""
    got = _numpy(table, columns)
    for name, a in got.items():
        column = layout[name]
        if column.stacked and a.dtype == object:
            a = np.stack(a) if len(a) else np.zeros((0, *column.shape), column.dtype)
        got[name] = a.astype(column.dtype, copy=False)
    return got


def _described(a: np.ndarray) -> Column:
    """One block's column ``a``: an object column of arrays by its rows' shapes."""
    if a.dtype != object or not len(a) or not all(isinstance(v, np.ndarray) for v in a):
        return Column(a.dtype, a.shape[1:])
    shapes = [v.shape for v in a]
    other = next((row for row, shape in enumerate(shapes) if shape != shapes[0]), None)
    if other is not None:
        return Column(a.dtype, a.shape[1:], ragged=(0, shapes[0], other, shapes[other]))
    return Column(np.result_type(*{v.dtype for v in a}), shapes[0], stacked=True)


def block_layout(table: Any) -> tuple[int, dict[str, Column]]:
    """A stored block's row count and columns (run where it is stored, once)."""
    import pyarrow.compute as pc

    described = {name: _described(a) for name, a in _numpy(table, None).items()}
    for name, column in described.items():
        nulls = table.column(name).null_count
        if nulls:
            first = int(np.flatnonzero(pc.is_null(table.column(name)).to_numpy(zero_copy_only=False))[0])
            described[name] = replace(column, null=first, nulls=nulls)
    return table.num_rows, described


def _widened(dtypes: list[np.dtype]) -> Optional[np.dtype]:
    """The dtype ``dtypes`` widen to within their kind (unsigned into signed too), else None."""
    try:
        wide = np.result_type(*dtypes)
    except TypeError:
        return None
    ok = all(d.kind == wide.kind or (d.kind, wide.kind) == ("u", "i") for d in dtypes)
    return wide if ok else None


def checked(layouts: list[tuple[int, dict[str, Column]]], firsts: np.ndarray) -> dict[str, Column]:
    """The dataset's columns from its blocks' ``layouts`` (blocks of no rows left out), each
    block's first row at ``firsts``; ``InputError`` naming the column, the blocks and the rows
    where they cannot be one array."""
    def rows(j: int) -> str:
        return f"block {j} (rows {firsts[j]}-{firsts[j + 1] - 1})"

    filled = [(j, columns) for j, (count, columns) in enumerate(layouts) if count]
    if not filled:
        return {}
    first, names = filled[0][0], filled[0][1].keys()
    for j, columns in filled:
        for name in sorted(names ^ columns.keys()):
            has, lacks = (first, j) if name in names else (j, first)
            raise InputError(f"column {name!r} is in {rows(has)} but not in {rows(lacks)}: every block of the "
                             "dataset needs the same columns (fill it, or drop it with Dataset.drop_columns)")
        for name, c in columns.items():
            if c.nulls:
                raise InputError(
                    f"column {name!r} has {c.nulls} null value(s) (None) in {rows(j)}, the first at row "
                    f"{firsts[j] + c.null}: numpy would read them as NaN (an int column as float); fill or "
                    "drop them in the dataset")
            if c.ragged:
                raise InputError(_ragged(name, firsts[j] + c.ragged[0], c.ragged[1], firsts[j] + c.ragged[2],
                                         c.ragged[3]))
    result = {}
    for name in names:
        per = [(j, columns[name]) for j, columns in filled]
        for j, c in per:
            if c.shape != per[0][1].shape:
                raise InputError(_ragged(name, firsts[first], per[0][1].shape, firsts[j], c.shape))
        wide = _widened([c.dtype for _, c in per])
        if wide is None:
            kinds = sorted({c.dtype: j for j, c in reversed(per)}.items(), key=lambda kind: kind[1])  # first blocks
            (a, i), (b, j) = next(((x, y) for x in kinds for y in kinds if _widened([x[0], y[0]]) is None),
                                  kinds[:2])
            raise InputError(f"column {name!r} is {a} in {rows(i)} and {b} in {rows(j)}: no dtype holds "
                             "both without changing values; cast it to one in the dataset")
        result[name] = Column(wide, per[0][1].shape, any(c.stacked for _, c in per))
    return result


def _ragged(name: str, row: int, shape: tuple, other: int, other_shape: tuple) -> str:
    return (f"column {name!r} holds rows of different shapes: {shape} (row {row}) and {other_shape} (row {other}); "
            "a batch stacks its rows into one array, so pad or resize them to one shape in the dataset")
