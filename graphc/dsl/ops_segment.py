"""``torch.segment_reduce``: consecutive segments along ``axis`` reduced by sum, mean, max, min or prod,
through a ``(segments, positions)`` membership mask built from the lengths (or offsets), which may be
run-time Tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import known_value, op_error, user_source
from graphc.dsl.ops import cast, lift, scalar, unsqueeze, where
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_array import arange, cumsum
from graphc.dsl.ops_math import amax, amin, prod
from graphc.dsl.ops_views import narrow
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES

_IDENTITY = {"sum": 0.0, "mean": 0.0, "max": -np.inf, "min": np.inf, "prod": 1.0}
_NAMES = {"sum": "sum", "mean": "mean", "max": "max", "amax": "max", "min": "min", "amin": "min", "prod": "prod"}


def _lengths(data: Tensor, lengths: Any, offsets: Any, axis: int) -> tuple[Tensor, np.ndarray | None]:
    """The int64 lengths, and their values where known at capture (constants, or the example in an
    eager capture)."""
    fn = "segment_reduce"
    if (lengths is None) == (offsets is None):
        raise op_error(fn, [data], "give one of lengths or offsets", user_source())
    name, given = ("lengths", lengths) if lengths is not None else ("offsets", offsets)
    t = lift(given)
    if t.dtype not in ("int32", "int64") or t.ndim != axis + 1:
        raise op_error(fn, [data, t], f"{name} must be int32/int64 of rank axis + 1 = {axis + 1}, got {t.type_str()}",
                       user_source())
    known = known_value(t, eager=True)
    t = cast(t, "int64")
    if lengths is not None:
        return t, known
    count = t.shape[-1]
    if not isinstance(count, int) or count < 1:
        raise op_error(fn, [data, t], f"offsets needs a static last dim >= 1, got {t.type_str()}", user_source())
    return narrow(t, -1, 1, count - 1) - narrow(t, -1, 0, count - 1), None if known is None else np.diff(known)


def _checked(data: Tensor, lengths: Tensor, known: np.ndarray | None, axis: int) -> None:
    """torch's checks, where the lengths are known: none negative, each row adds up to the axis."""
    if known is None:
        return
    if (known < 0).any():
        raise op_error("segment_reduce", [data, lengths], "lengths contains a negative value", user_source())
    if isinstance(data.shape[axis], int) and (known.sum(-1) != data.shape[axis]).any():
        raise op_error("segment_reduce", [data, lengths], f"each row of lengths must add up to data.shape[{axis}] = "
                       f"{data.shape[axis]} (unless unsafe=True), got sums {known.sum(-1).tolist()}", user_source())


def segment_reduce(data: Any, reduce: str, *, lengths: Any = None, indices: Any = None, offsets: Any = None,
                   axis: int = 0, unsafe: bool = False, initial: Any = None) -> Tensor:
    """``torch.segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
    initial=None)``: ``lengths`` (or ``offsets``, one more) of shape ``data.shape[:axis] + (S,)`` cut
    ``data`` along ``axis`` into ``S`` consecutive segments, each reduced by ``reduce`` ("sum", "mean",
    "max"/"amax", "min"/"amin", "prod"); ``initial`` joins every segment, so an empty one gives it (else
    0, nan, -inf, inf, 1). ``unsafe`` skips the check (made when the lengths are known at capture) that
    each row of lengths adds up to ``data.shape[axis]``."""
    fn = "segment_reduce"
    x = lift(data)
    if reduce not in _NAMES:
        raise op_error(fn, [x], f"reduce must be one of sum, prod, mean, max (amax), min (amin), got {reduce!r}",
                       user_source())
    if x.dtype not in FLOAT_DTYPES:
        raise op_error(fn, [x], f"data must be floating point, got {x.dtype}", user_source())
    if indices is not None:
        raise op_error(fn, [x], "indices based reduction is not supported (nor by torch); give lengths or offsets",
                       user_source())
    if not 0 <= axis < x.ndim:
        raise op_error(fn, [x], f"axis must be in [0, {x.ndim}), got {axis}", user_source())
    kind = _NAMES[reduce]
    lens, known = _lengths(x, lengths, offsets, axis)
    if not unsafe:
        _checked(x, lens, known, axis)
    ends = cumsum(lens, axis)  # (*pre, S)
    starts = ends - lens
    pos = arange(0, x.shape[axis], dtype="int64") if isinstance(x.shape[axis], int) else None
    if pos is None:
        raise op_error(fn, [x], f"needs a static data.shape[{axis}], got {x.type_str()}", user_source())
    inside = (unsqueeze(starts, [-1]) <= pos) & (pos < unsqueeze(ends, [-1]))  # (*pre, S, L)
    trailing = x.ndim - axis - 1
    member = unsqueeze(inside, list(range(axis + 2, axis + 2 + trailing))) if trailing else inside
    values = unsqueeze(x, [axis])  # (*pre, 1, L, *post)
    fill = scalar(_IDENTITY[kind], x)
    held = where(member, values, fill)
    out = {"sum": reduce_sum, "mean": reduce_sum, "max": amax, "min": amin, "prod": prod}[kind](held, axis + 1)
    count = cast(unsqueeze(lens, list(range(axis + 1, axis + 1 + trailing))) if trailing else lens, x.dtype)
    if initial is not None:
        start = scalar(float(initial), x)
        out = {"sum": lambda o: o + start, "mean": lambda o: o + start, "max": lambda o: where(o < start, start, o),
               "min": lambda o: where(o > start, start, o), "prod": lambda o: o * start}[kind](out)
    if kind == "mean":
        empty = count == scalar(0, count)
        if initial is None:
            return out / count
        return where(empty, out, out / where(empty, scalar(1, count), count))
    return out


__all__ = ["segment_reduce"]
