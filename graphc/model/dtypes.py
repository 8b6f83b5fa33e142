"""Dtypes and tensor specs: one table maps graphc names to numpy and ONNX types."""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import onnx
from pydantic import BaseModel, ConfigDict, field_validator

from graphc.errors import did_you_mean

# name -> (numpy dtype, onnx TensorProto elem type). bfloat16 has no numpy dtype; ml_dtypes
# (an onnx dependency) provides one.
try:
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - onnx pulls ml_dtypes in
    _BF16 = None

_TABLE: dict[str, tuple[Any, int]] = {
    "float32": (np.dtype(np.float32), onnx.TensorProto.FLOAT),
    "float16": (np.dtype(np.float16), onnx.TensorProto.FLOAT16),
    "bfloat16": (_BF16, onnx.TensorProto.BFLOAT16),
    "float64": (np.dtype(np.float64), onnx.TensorProto.DOUBLE),
    "int64": (np.dtype(np.int64), onnx.TensorProto.INT64),
    "int32": (np.dtype(np.int32), onnx.TensorProto.INT32),
    "int16": (np.dtype(np.int16), onnx.TensorProto.INT16),
    "int8": (np.dtype(np.int8), onnx.TensorProto.INT8),
    "uint8": (np.dtype(np.uint8), onnx.TensorProto.UINT8),
    "uint16": (np.dtype(np.uint16), onnx.TensorProto.UINT16),
    "uint32": (np.dtype(np.uint32), onnx.TensorProto.UINT32),
    "uint64": (np.dtype(np.uint64), onnx.TensorProto.UINT64),
    "bool": (np.dtype(np.bool_), onnx.TensorProto.BOOL),
}
# Every other ONNX element type an imported model may use, named as ONNX names it in lower case
# ("string", "complex64", "float8e4m3fn", "int4", ...), with the numpy dtype onnx maps
# it to (ml_dtypes for the small floats and ints; object for strings).
for _name, _code in onnx.TensorProto.DataType.items():
    if _code != onnx.TensorProto.UNDEFINED and _code not in {code for _, code in _TABLE.values()}:
        try:
            _TABLE[_name.lower()] = (np.dtype(onnx.helper.tensor_dtype_to_np_dtype(_code)), _code)
        except (KeyError, TypeError, ValueError):  # pragma: no cover - an onnx without ml_dtypes
            pass
_ALIASES = {"bool_": "bool", "float": "float32", "double": "float64", "half": "float16", "cfloat": "complex64",
            "cdouble": "complex128"}
_BY_ONNX = {code: name for name, (_, code) in _TABLE.items()}

FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
# a complex dtype -> the real dtype of its parts (a complex DSL Tensor is a real one with a trailing (real, imag) dim)
COMPLEX_PARTS = {"complex64": "float32", "complex128": "float64"}


class DType(str):
    """A dtype name (a ``str`` subclass, so ``gc.float32 == "float32"``)."""

    @property
    def numpy(self) -> np.dtype:
        return to_numpy(self)

    @property
    def onnx(self) -> int:
        return to_onnx(self)

    def __repr__(self) -> str:
        return f"gc.{self}"


float32, float16, bfloat16, float64 = (DType(n) for n in ("float32", "float16", "bfloat16", "float64"))
int64, int32, int16, int8 = (DType(n) for n in ("int64", "int32", "int16", "int8"))
uint8, uint16, uint32, uint64 = (DType(n) for n in ("uint8", "uint16", "uint32", "uint64"))
bool_ = DType("bool")
complex64, complex128 = DType("complex64"), DType("complex128")
# torch's other names for these dtypes (``torch.bool``, ``torch.long``, ...): ``gc.bool`` etc., attributes of the
# graphc module only (not in its ``__all__``: a star import would hide the builtins bool, float and int)
TORCH_NAMES = {"bool": bool_, "float": float32, "double": float64, "half": float16, "long": int64, "int": int32,
               "short": int16, "int16": int16, "cfloat": complex64, "cdouble": complex128}

DTypeLike = Union[str, np.dtype, type, int]


_ACCEPTED = "a dtype name (float32, float64, int64, ...), a numpy dtype or type, an ONNX element type or a torch dtype"


def as_dtype(dtype: DTypeLike) -> DType:
    """Normalise a dtype name, numpy dtype/type, ONNX elem-type code or torch dtype (``torch.float64``,
    recognised by its type's module: graphc never imports torch) to a ``DType``."""
    given, dtype = dtype, torch_dtype_name(dtype)
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) in _BY_ONNX:
            return DType(_BY_ONNX[int(dtype)])
        raise TypeError(f"unsupported ONNX element type {dtype}")
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
        if name in _TABLE:
            return DType(name)
        raise TypeError(f"unknown dtype {given!r}{did_you_mean(given, [*_TABLE, *_ALIASES])}; expected {_ACCEPTED}: "
                        f"one of {sorted(_TABLE)}")
    try:
        npd = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"unknown dtype {dtype!r} (a {type(dtype).__name__}); expected {_ACCEPTED}") from exc
    for name, (candidate, _) in _TABLE.items():
        if candidate is not None and candidate == npd:
            return DType(name)
    raise TypeError(f"unsupported numpy dtype {npd}")


def torch_dtype_name(dtype: Any) -> Any:
    """A torch dtype (``torch.bfloat16``, ``torch.double``) as its name (``"bfloat16"``, ``"float64"``; the
    float8 ones as ONNX spells them, ``float8e4m3fn``); anything else as given."""
    if type(dtype).__module__ != "torch":
        return dtype
    return str(dtype).removeprefix("torch.").replace("float8_", "float8")


def to_numpy(dtype: DTypeLike) -> np.dtype:
    npd = _TABLE[as_dtype(dtype)][0]
    if npd is None:  # pragma: no cover
        raise TypeError("bfloat16 needs the ml_dtypes package")
    return npd


def to_onnx(dtype: DTypeLike) -> int:
    return _TABLE[as_dtype(dtype)][1]


def finfo(dtype: DTypeLike) -> np.finfo:
    """numpy's ``finfo`` of a float dtype, bfloat16's too (``ml_dtypes.finfo``; numpy's refuses it)."""
    npd = to_numpy(dtype)
    return ml_dtypes.finfo(npd) if npd == _BF16 else np.finfo(npd)


Dim = Union[int, str, None]


def type_text(dtype: Any, shape: Any) -> str:
    """``float32[N,4]``: a dtype and shape as messages show them; ``?`` stands for an unknown
    dtype, rank or dim. The one format of ``TensorSpec``, ``Tensor.type_str`` and feed checks."""
    dims = "?" if shape is None else ",".join("?" if d is None else str(d) for d in shape)
    return f"{'?' if dtype is None else dtype}[{dims}]"


class TensorSpec(BaseModel):
    """Name, dtype and shape of a graph input or output. Dims are ints, names or None."""

    model_config = ConfigDict(frozen=True)

    name: str = ""
    dtype: str
    shape: tuple[Dim, ...] | None = ()

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, value: Any) -> str:
        return str(as_dtype(value))

    @field_validator("shape", mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        if value is None:
            return None
        dims = tuple(value)
        for d in dims:
            if not (d is None or isinstance(d, (str, int, np.integer))) or isinstance(d, bool):
                raise ValueError(f"dim {d!r} must be an int, a name or None")
            if isinstance(d, (int, np.integer)) and d < 0:
                raise ValueError(f"dim {d} must be >= 0")
        return tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in dims)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def __str__(self) -> str:
        return f"{self.name + ': ' if self.name else ''}{type_text(self.dtype, self.shape)}"


def spec(dtype: DTypeLike, shape: Any = (), name: str = "") -> TensorSpec:
    """``gc.spec("float32", ("N", 784))`` — a TensorSpec for capture or validation."""
    return TensorSpec(name=name, dtype=as_dtype(dtype), shape=shape)


def parse_spec(text: str) -> TensorSpec:
    """Parse the CLI form ``NAME:DTYPE[DIM,...]``, e.g. ``x:float32[N,784]``."""
    import re

    m = re.fullmatch(r"\s*([^:\s]+)\s*:\s*(\w+)\s*(?:\[([^\]]*)\])?\s*", text)
    if not m:
        raise ValueError(f"bad input spec {text!r}; expected NAME:DTYPE[DIM,...], e.g. x:float32[N,784]")
    name, dtype, dims = m.groups()
    shape: list[Dim] = []
    items = [d.strip() for d in dims.split(",")] if dims and dims.strip() else []  # "[]": a scalar
    for d in items:
        if not (d == "?" or d.lstrip("-").isdigit() or re.fullmatch(r"[A-Za-z_]\w*", d)):
            raise ValueError(f"bad input spec {text!r}: dim {d!r} is neither a size, a name (letters, digits, _) "
                             "nor ?")
        shape.append(int(d) if d.lstrip("-").isdigit() else (None if d == "?" else d))
    return spec(dtype, shape, name=name)
