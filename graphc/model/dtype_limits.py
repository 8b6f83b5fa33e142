"""torch's ``finfo`` and ``iinfo``: the limits of a float or integer dtype, given as a graphc dtype, a torch dtype or
its name (``gc.finfo(gc.float16).min``, ``gc.finfo(torch.bfloat16).eps``), as Python numbers, as torch's."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from graphc.model.dtypes import FLOAT_DTYPES, DType, as_dtype

_INTEGER_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8"})


class _Limits:
    """The limits as read-only attributes, shown as torch shows them."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"gc.{type(self).__name__}'s {name} is read-only")

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)}' for n in self.__slots__)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.dtype))


class finfo(_Limits):  # noqa: N801 - torch's name
    """``torch.finfo(dtype=float32)``: ``bits``, ``eps``, ``max``, ``min``, ``tiny`` (= ``smallest_normal``) and
    ``resolution`` (``10**-digits``) of a float dtype, as Python numbers; ``dtype`` its name."""

    __slots__ = ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype")

    def __init__(self, dtype: Any = "float32") -> None:
        name = _kind(dtype, FLOAT_DTYPES, "finfo", "a floating point", "iinfo")
        limits = ml_dtypes.finfo(name.numpy)
        self._set(bits=int(limits.bits), eps=float(limits.eps), max=float(limits.max), min=float(limits.min),
                  tiny=float(limits.tiny), smallest_normal=float(limits.smallest_normal),
                  resolution=10.0 ** -int(limits.precision), dtype=name)


class iinfo(_Limits):  # noqa: N801 - torch's name
    """``torch.iinfo(dtype)``: ``bits``, ``max`` and ``min`` of an integer dtype, as Python ints; ``dtype`` its
    name."""

    __slots__ = ("bits", "max", "min", "dtype")

    def __init__(self, dtype: Any) -> None:
        name = _kind(dtype, _INTEGER_DTYPES, "iinfo", "an integer", "finfo")
        limits = np.iinfo(name.numpy)
        self._set(bits=int(limits.bits), max=int(limits.max), min=int(limits.min), dtype=name)


def _kind(dtype: Any, kinds: frozenset, fn: str, kind: str, other: str) -> DType:
    name = as_dtype(dtype)
    if name not in kinds:
        hint = f" (gc.{other} takes {name})" if name in FLOAT_DTYPES | _INTEGER_DTYPES else ""
        raise TypeError(f"gc.{fn}: dtype must be {kind} dtype ({', '.join(sorted(kinds))}), got {name}{hint}")
    return name


__all__ = ["finfo", "iinfo"]
