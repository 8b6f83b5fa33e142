"""torch's dtype promotion, pure Python over graphc's dtypes (no graph): ``promote_types``, ``can_cast``,
``result_type`` and ``common_dtype``, which ``ops.promote`` applies to every elementwise op of several inputs."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, DType, as_dtype

_INTS = ("uint8", "int8", "int16", "int32", "int64")
_FLOATS = ("float16", "bfloat16", "float32", "float64")


def kind(dtype: Any) -> int:
    """bool 0 < integer 1 < float 2: torch's categories."""
    return 2 if dtype in FLOAT_DTYPES else 0 if dtype == "bool" else 1


def promote_types(type1: Any, type2: Any) -> DType:
    """``torch.promote_types``: the smallest dtype both cast to without leaving their category (uint8 with int8
    is int16, float16 with bfloat16 float32)."""
    a, b = as_dtype(type1), as_dtype(type2)
    for d in (a, b):
        if d not in _INTS + _FLOATS + ("bool",):
            raise CaptureError(f"promote_types: {d} is not a dtype torch promotes (at {user_source()})")
    if a == b or kind(a) != kind(b):
        return a if kind(a) >= kind(b) else b
    if {a, b} == {"float16", "bfloat16"}:
        return DType("float32")
    if {a, b} == {"uint8", "int8"}:
        return DType("int16")
    order = _INTS if a in _INTS else _FLOATS
    return a if order.index(a) > order.index(b) else b


def can_cast(from_: Any, to: Any) -> bool:
    """``torch.can_cast``: False from float to integer or bool and from integer to bool, as torch's in-place
    ops refuse; True otherwise (narrowing within a category too)."""
    return kind(as_dtype(from_)) <= kind(as_dtype(to))


def number_dtype(x: Any) -> DType | None:
    """The dtype torch gives a Python (or numpy) number among Tensors: bool, int64, or float32 (the default
    dtype); None for anything else (a numpy array takes the Tensors' dtype instead)."""
    if isinstance(x, (bool, np.bool_)):
        return DType("bool")
    if isinstance(x, (int, np.integer)):
        return DType("int64")
    if isinstance(x, (float, np.floating)):
        return DType("float32")
    return None


def result_type(tensor1: Any, tensor2: Any) -> DType:
    """``torch.result_type`` of Tensors and Python numbers (``common_dtype`` of the two)."""
    return common_dtype(tensor1, tensor2)


def common_dtype(*operands: Any) -> DType:
    """The dtype torch computes an elementwise op of ``operands`` (Tensors and Python numbers) in: Tensors with
    dims rank above 0-D Tensors above numbers; a lower rank counts only where its category (bool, integer,
    float) is higher. A Python float is float32, an int int64."""
    ranks: dict[int, DType | None] = {2: None, 1: None, 0: None}
    for operand in operands:
        if isinstance(operand, Tensor):
            rank, dtype = (2 if operand.ndim else 1), operand.dtype
        elif (dtype := number_dtype(operand)) is not None:
            rank = 0
        else:
            raise CaptureError(f"result_type takes Tensors and Python numbers, got {type(operand).__name__} "
                               f"(at {user_source()})")
        ranks[rank] = dtype if ranks[rank] is None else promote_types(ranks[rank], dtype)
    return _combine(ranks[2], _combine(ranks[1], ranks[0]))


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    """torch's ``combine_categories``: ``lower`` counts only where its category is above ``higher``'s."""
    if higher is None or lower is None:
        return higher or lower
    return promote_types(higher, lower) if kind(lower) > kind(higher) else higher


__all__ = ["can_cast", "common_dtype", "kind", "number_dtype", "promote_types", "result_type"]
