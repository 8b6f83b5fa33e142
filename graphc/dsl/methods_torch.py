"""PyTorch's ``Tensor`` methods on ``gc.Tensor`` (``x.view``, ``x.permute``, ``x.size()``,
``x.masked_fill``, ``x.split``, ``x.float()``, ...), bound to the class at import as ``methods``
binds the operators, so a ``forward`` written for torch runs unchanged. A name ``methods``
already defines keeps its definition there."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops, ops_array
from graphc.dsl.tensor import Tensor


def _dims(dims: tuple) -> list:
    return list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else list(dims)


def _size(self: Tensor, dim: int | None = None) -> Any:
    """``x.size()`` is the shape (ints and dim names); ``x.size(d)`` one dim."""
    return tuple(self.shape) if dim is None else self.shape[dim]


METHODS = {
    "view": lambda a, *shape: ops.reshape(a, _dims(shape)),
    "permute": lambda a, *dims: ops.transpose(a, _dims(dims)),
    "size": _size,
    "dim": lambda a: a.ndim,
    "unsqueeze": lambda a, dim: ops.unsqueeze(a, [dim]),
    "squeeze": lambda a, dim=None: ops.squeeze(a, None if dim is None else [dim]),
    "contiguous": lambda a: a,
    "float": lambda a: ops.cast(a, "float32"), "double": lambda a: ops.cast(a, "float64"),
    "half": lambda a: ops.cast(a, "float16"), "long": lambda a: ops.cast(a, "int64"),
    "int": lambda a: ops.cast(a, "int32"), "bool": lambda a: ops.cast(a, "bool"),
    "type_as": lambda a, other: ops.cast(a, other.dtype),
    "matmul": ops.matmul, "mm": ops.matmul, "bmm": ops.matmul,
    "sigmoid": ops.sigmoid, "tanh": ops.tanh, "abs": ops.abs, "erf": ops.erf,
    "masked_fill": ops_array.masked_fill, "split": ops_array.split, "chunk": ops_array.chunk,
    "expand": ops_array.expand, "repeat": ops_array.repeat, "pow": ops_array.pow, "clamp": ops_array.clamp,
    "cumsum": ops_array.cumsum, "argmax": ops_array.argmax, "argmin": ops_array.argmin, "topk": ops_array.topk,
    "gather": ops_array.gather, "index_select": ops_array.index_select, "scatter": ops_array.scatter,
    "tril": ops_array.tril, "triu": ops_array.triu, "sin": ops_array.sin, "cos": ops_array.cos,
    "rsqrt": ops_array.rsqrt,
}

for _name, _method in METHODS.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _method)
