"""`gc.Tensor`: a symbolic value during capture (with its example value in eager capture)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dtypes import DType, as_dtype
from graphc.errors import GraphError


class Tensor:
    """A value in the graph being captured. Operators record ONNX nodes.

    ``.shape`` holds ints and symbolic dim names (``"N"``), ``None`` for unknown dims.
    In eager capture (``gc.capture`` given example arrays) ``.numpy()`` returns the value.
    """

    __slots__ = ("value", "_value", "_const")
    __array_priority__ = 1000  # numpy scalars/arrays on the left defer to our reflected ops

    def __init__(self, value: ir.Value, eager_value: np.ndarray | None = None):
        self.value = value
        self._value = eager_value
        self._const = None

    # -- type -----------------------------------------------------------------------------------
    @property
    def dtype(self) -> DType:
        return as_dtype(int(self.value.dtype)) if self.value.dtype is not None else DType("float32")

    @property
    def shape(self) -> tuple | None:
        if self.value.shape is None:
            return None
        return tuple(d if isinstance(d, int) else d.value for d in self.value.shape)

    @property
    def ndim(self) -> int:
        shape = self.shape
        if shape is None:
            raise GraphError(f"rank of {self.value.name} is unknown")
        return len(shape)

    @property
    def name(self) -> str:
        return self.value.name

    def type_str(self) -> str:
        shape = self.shape
        dims = "?" if shape is None else ",".join("?" if d is None else str(d) for d in shape)
        return f"{self.dtype}[{dims}]"

    def numpy(self) -> np.ndarray:
        """The example value (eager capture only)."""
        if self._value is None:
            from graphc.dsl.builder import user_source

            raise GraphError(f"{self.value.name}: {self.type_str()} has no value; pass example np.ndarrays "
                             f"to gc.capture for eager values (at {user_source()})")
        return self._value

    def __repr__(self) -> str:
        if self._value is not None:
            return f"Tensor({self.value.name}: {self.type_str()}, value=\n{self._value})"
        return f"Tensor({self.value.name}: {self.type_str()})"

    __hash__ = object.__hash__

    # -- Python protocol misuse ---------------------------------------------------------------
    def __bool__(self) -> bool:
        from graphc.dsl.builder import user_source

        raise GraphError(f"Python `if`/`and`/`or`/`bool()` on traced value {self.value.name}: {self.type_str()} "
                         f"at {user_source()}; the graph cannot branch on it. Use gc.where(cond, a, b) "
                         f"or gc.cond(pred, true_fn, false_fn, ...)")

    def __len__(self) -> int:
        shape = self.shape
        if shape and isinstance(shape[0], int):
            return shape[0]
        from graphc.dsl.builder import user_source

        raise GraphError(f"len() of {self.value.name}: {self.type_str()} is not static (at {user_source()})")

    def __iter__(self):
        n = len(self)
        return (self[i] for i in range(n))

    def __index__(self) -> int:
        from graphc.dsl.builder import user_source

        raise GraphError(f"traced value {self.value.name} used as a Python int at {user_source()}")

    # -- numpy protocols: numpy's operators on a Tensor build graph ops; other numpy functions
    # cannot see inside a traced value, so they are refused with the gc.* function to use.
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
        dunders = _UFUNC_OPERATORS.get(ufunc.__name__)
        if dunders is not None and method == "__call__" and not kwargs:
            if len(inputs) == 1:
                return getattr(self, dunders[0])()
            a, b = inputs
            return getattr(a, dunders[0])(b) if isinstance(a, Tensor) else getattr(b, dunders[1])(a)
        raise _numpy_refused(f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"),
                             ufunc.__name__, self)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any):
        raise _numpy_refused(f"np.{func.__name__}", func.__name__, self)

    def __array__(self, dtype: Any = None, copy: Any = None):
        from graphc.dsl.builder import user_source

        hint = "; .numpy() gives its example value in eager capture" if self._value is not None else ""
        raise GraphError(f"traced value {self.value.name}: {self.type_str()} cannot become a numpy array at "
                         f"{user_source()}: inside forward use gc.* functions on it{hint}")

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, other): return _ops().binary("Add", self, other)
    def __radd__(self, other): return _ops().binary("Add", other, self)
    def __sub__(self, other): return _ops().binary("Sub", self, other)
    def __rsub__(self, other): return _ops().binary("Sub", other, self)
    def __mul__(self, other): return _ops().binary("Mul", self, other)
    def __rmul__(self, other): return _ops().binary("Mul", other, self)
    def __truediv__(self, other): return _ops().binary("Div", self, other)
    def __rtruediv__(self, other): return _ops().binary("Div", other, self)
    def __pow__(self, other): return _ops().binary("Pow", self, other)
    def __rpow__(self, other): return _ops().binary("Pow", other, self)
    def __matmul__(self, other): return _ops().matmul(self, other)
    def __rmatmul__(self, other): return _ops().matmul(other, self)
    def __neg__(self): return _ops().unary("Neg", self)
    def __pos__(self): return self
    def __abs__(self): return _ops().abs(self)
    def __lt__(self, other): return _ops().binary("Less", self, other)
    def __le__(self, other): return _ops().binary("LessOrEqual", self, other)
    def __gt__(self, other): return _ops().binary("Greater", self, other)
    def __ge__(self, other): return _ops().binary("GreaterOrEqual", self, other)
    def __eq__(self, other): return _ops().binary("Equal", self, other)  # type: ignore[override]
    def __ne__(self, other): return _ops().unary("Not", _ops().binary("Equal", self, other))  # type: ignore[override]
    def __invert__(self): return _ops().unary("Not", self)
    def __and__(self, other): return _ops().binary("And", self, other)
    def __or__(self, other): return _ops().binary("Or", self, other)
    def __xor__(self, other): return _ops().binary("Xor", self, other)

    def __getitem__(self, index: Any) -> "Tensor":
        from graphc.dsl.indexing import getitem

        return getitem(self, index)

    # -- methods --------------------------------------------------------------------------------
    @property
    def T(self) -> "Tensor":
        return _ops().transpose(self)

    def reshape(self, *shape: Any) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _ops().reshape(self, shape)

    def transpose(self, *dims: Any) -> "Tensor":
        """No args: reverse the axes. Two ints: swap them (as ``torch.transpose``). A sequence
        (or three or more ints): a full permutation (as ``numpy.transpose``)."""
        if not dims:
            return _ops().transpose(self)
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            return _ops().transpose(self, list(dims[0]))
        if len(dims) == 2:
            perm = list(range(self.ndim))
            a, b = (d % self.ndim for d in dims)
            perm[a], perm[b] = perm[b], perm[a]
            return _ops().transpose(self, perm)
        return _ops().transpose(self, list(dims))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        return _ops().flatten(self, start_dim, end_dim)

    def sum(self, axis=None, keepdims: bool = False) -> "Tensor":
        return _ops().sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims: bool = False) -> "Tensor":
        return _ops().mean(self, axis, keepdims)

    def max(self, axis=None, keepdims: bool = False) -> "Tensor":
        return _ops().max(self, axis, keepdims)

    def min(self, axis=None, keepdims: bool = False) -> "Tensor":
        return _ops().min(self, axis, keepdims)

    def astype(self, dtype: Any) -> "Tensor":
        return _ops().cast(self, dtype)

    def relu(self) -> "Tensor":
        return _ops().relu(self)

    def exp(self) -> "Tensor":
        return _ops().exp(self)

    def log(self) -> "Tensor":
        return _ops().log(self)

    def sqrt(self) -> "Tensor":
        return _ops().sqrt(self)

    def softmax(self, axis: int = -1) -> "Tensor":
        return _ops().softmax(self, axis)


def _ops():
    from graphc.dsl import ops

    return ops


# numpy ufuncs that are Python operators on a Tensor: (method, reflected method), so
# ``np_array + t`` and ``np.add(np_array, t)`` build the same node as ``t.__radd__(np_array)``.
_UFUNC_OPERATORS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"), "multiply": ("__mul__", "__rmul__"),
    "divide": ("__truediv__", "__rtruediv__"), "power": ("__pow__", "__rpow__"),
    "matmul": ("__matmul__", "__rmatmul__"), "less": ("__lt__", "__gt__"), "less_equal": ("__le__", "__ge__"),
    "greater": ("__gt__", "__lt__"), "greater_equal": ("__ge__", "__le__"), "equal": ("__eq__", "__eq__"),
    "not_equal": ("__ne__", "__ne__"), "bitwise_and": ("__and__", "__and__"), "bitwise_or": ("__or__", "__or__"),
    "bitwise_xor": ("__xor__", "__xor__"), "negative": ("__neg__",), "positive": ("__pos__",),
    "absolute": ("__abs__",), "invert": ("__invert__",),
}
# numpy names whose graphc function is spelled differently
_GC_NAMES = {"absolute": "abs", "concatenate": "concat", "power": "pow", "arccos": "acos", "arcsin": "asin",
             "arctan": "atan", "amax": "max", "amin": "min", "square": "pow"}


def _numpy_refused(what: str, name: str, tensor: Tensor) -> GraphError:
    """GraphError for a numpy function given a traced value, suggesting the gc.* function."""
    import graphc as gc
    from graphc.dsl.builder import user_source

    gc_name = _GC_NAMES.get(name, name)
    hint = f"use gc.{gc_name}(...) instead" if hasattr(gc, gc_name) else \
        "graphc has no function of that name: build it from gc.* ops"
    return GraphError(f"{what} cannot run on traced value {tensor.value.name}: {tensor.type_str()} at "
                      f"{user_source()}: numpy cannot see inside the graph being captured; {hint}")
