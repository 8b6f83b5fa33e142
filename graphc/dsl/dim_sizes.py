"""Sizes a torch user writes with a symbolic dim, read at run time: ``T = x.shape[1]`` then ``T - 1``,
``B * T``, ``T // 2`` (``Tensor.shape``'s ``DimName`` operators, each a 0-d int64 Tensor, as torch's SymInt
is an int), sizes of the factories (``gc.zeros(T, D)``: ``sized``) and ``dim_length``, a dim as an int64 ``[1]``.
Slice bounds and reshape dims are read by ``ops.run_time_int``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphc.dsl.builder import current
from graphc.dsl.ops import checked_int, const_i64, dim_read, int64_vector, lift
from graphc.dsl.sources import called_from_graphc, user_source
from graphc.dsl.tensor import DimName, Tensor
from graphc.errors import CaptureError

__all__ = ["DIM_NAME_OPERATORS", "dim_length", "sized"]


def dim_length(x: Tensor, dim: int) -> Tensor:
    """Dim ``dim`` (non-negative) of ``x`` as an int64 ``[1]``, read at run time when symbolic."""
    size = x.shape[dim]
    return const_i64([size]) if isinstance(size, int) else dim_read(x, dim)


def sized(size: Sequence[Any], fn: str) -> tuple[list, Tensor | None]:
    """torch's ``*size`` (ints >= 0, dim names, 0-d integer Tensors such as ``B * T``): the output's shape
    (a name kept, a Tensor's dim unknown) and, where a size is not an int, the shape as an int64 Tensor read at
    run time (else None)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    sizes = [checked_int(d, f"size {tuple(size)}", fn, counts=True) for d in size]
    shape = [None if isinstance(d, Tensor) else d for d in sizes]
    if all(isinstance(d, int) for d in shape):
        return shape, None
    sources = current().dim_sources
    return shape, int64_vector(dim_length(Tensor(sources[d][0]), sources[d][1]) if isinstance(d, str) else d
                               for d in sizes)


def _refused_comparison(symbol: str) -> Callable:
    """``DimName``'s ``symbol``: str's comparison with a str, a CaptureError with a number (the size is not known
    at capture). ``==`` and ``!=`` with a number stay str's (unequal) in graphc's own code, whose checks such as
    ``d == 1`` read a name as a size other than that number."""
    method = _COMPARISONS[symbol]

    def compare(self: DimName, other: Any) -> Any:
        if isinstance(other, str) or not isinstance(other, (int, float, np.number)) or \
                (symbol in ("==", "!=") and called_from_graphc()):
            return getattr(str, method)(self, other)
        test = f"{self} {symbol} {other}"
        raise _unknown_size(test, self, f"({self} - {other} {symbol} 0 for {test})")
    return compare


def _refused_truth(self: DimName) -> bool:
    """``bool(T)``: str's (True) in graphc's own code, else a CaptureError as a comparison with 0."""
    if called_from_graphc():
        return True
    raise _unknown_size(f"bool({self})", self, f"({self} + 0 != 0)")


def _unknown_size(what: str, name: DimName, example: str) -> CaptureError:
    """The CaptureError of a Python test on a symbolic dim: its size is known only when the graph runs."""
    return CaptureError(f"{what}: the dim {str(name)!r} is symbolic, its size is known only when the graph runs, so "
                        f"Python cannot test it at capture; drop the check (an assert on the length), give that "
                        f"input a static size, or test the size in the graph: arithmetic on the name is a Tensor "
                        f"read at run time {example}, a bool Tensor for gc.where or gc.cond (at {user_source()})")


_COMPARISONS = {"<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__", "==": "__eq__", "!=": "__ne__"}


def _arithmetic(method: str, concatenates: bool = False) -> Callable:
    """``DimName``'s ``method``: with an int or another dim name, the Tensor operator on its size read at run
    time; with a Tensor, that Tensor's reflected operator (which takes the size in its dtype); ``+`` with
    another str concatenates, as str's."""
    def apply(self: DimName, other: Any = None) -> Any:
        if method in ("__neg__", "__pos__"):
            return getattr(lift(self), method)()
        if isinstance(other, str) and not isinstance(other, DimName) and concatenates:
            return str.__add__(*((self, other) if method == "__add__" else (other, self)))
        if isinstance(other, bool) or not isinstance(other, (int, np.integer, DimName)):
            return NotImplemented
        return getattr(lift(self), method)(lift(other) if isinstance(other, str) else other)
    return apply


DIM_NAME_OPERATORS = {
    **{m: _arithmetic(m, concatenates=m in ("__add__", "__radd__"))
       for m in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
                 "__rfloordiv__", "__truediv__", "__rtruediv__", "__mod__", "__rmod__", "__neg__", "__pos__")},
    **{name: _refused_comparison(symbol) for symbol, name in _COMPARISONS.items()},
    "__bool__": _refused_truth, "__hash__": str.__hash__,
}
