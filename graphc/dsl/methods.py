"""``gc.Tensor``'s operators and methods, bound to the class at import (functions layer).

They are DSL functions, so they live above the tensor layer: ``t + 1`` is ``ops.binary("Add",
t, 1)``, ``t[i]`` is ``indexing.getitem``. ``graphc.dsl.capture`` imports this module, so every
Tensor a capture makes has them. numpy's protocols are here too: numpy's operators on a Tensor
build the same nodes; any other numpy function is refused, naming the ``gc.*`` function to use.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from graphc.dsl import dim_sizes, ops, ops_binary, ops_divide, ops_order
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import user_source
from graphc.dsl.indexing import getitem
from graphc.dsl.tensor import ComplexTensor, DimName, Tensor
from graphc.errors import CaptureError


def _reshape(self: Tensor, *shape: Any) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return ops.reshape(self, shape)


def _transpose(self: Tensor, *dims: Any) -> Tensor:
    """No args: reverse the axes. Two ints: swap them (as ``torch.transpose``). A sequence
    (or three or more ints): a full permutation (as ``numpy.transpose``)."""
    if not dims:
        return ops.transpose(self)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        return ops.transpose(self, list(dims[0]))
    if len(dims) == 2:
        perm = list(range(self.ndim))
        a, b = (d % self.ndim for d in dims)
        perm[a], perm[b] = perm[b], perm[a]
        return ops.transpose(self, perm)
    return ops.transpose(self, list(dims))


def _reduction(reduce: Any, elementwise: Any = None, indexed: Any = None) -> Any:
    """A reduction method under numpy's and torch's keywords: ``x.sum(axis, keepdims)`` or
    ``x.sum(dim=1, keepdim=True)``; with ``elementwise``, a Tensor (or numpy array) argument is torch's binary form
    (``x.max(y)`` is ``gc.maximum(x, y)``); with ``indexed``, one int dim gives torch's
    ``(values, indices)`` (``ops_order.ValuesIndices``, also the values Tensor)."""
    def method(self: Tensor, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
               keepdim: bool | None = None) -> Tensor:
        if elementwise is not None and isinstance(axis, (Tensor, np.ndarray)):
            return elementwise(self, axis)
        if dim is not None and axis is not None:
            raise CaptureError(f"give the reduced dims once, as axis= or dim=, not both (at {user_source()})")
        axis, keepdims = axis if dim is None else dim, keepdims if keepdim is None else keepdim
        if indexed is not None and isinstance(axis, int):
            return indexed(self, axis, keepdims)
        return reduce(self, axis, keepdims)
    return method


def _softmax_method(softmax: Any) -> Any:
    """``x.softmax(axis)``, also as torch's ``x.softmax(dim=-1)``."""
    return lambda self, axis=-1, *, dim=None: softmax(self, axis if dim is None else dim)


# numpy ufuncs that are Python operators or methods on a Tensor: (method, reflected method), so
# ``np_array + t`` and ``np.add(np_array, t)`` build the same node as ``t.__radd__(np_array)``.
_UFUNC_OPERATORS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"), "multiply": ("__mul__", "__rmul__"),
    "divide": ("__truediv__", "__rtruediv__"),
    "floor_divide": ("__floordiv__", "__rfloordiv__"), "remainder": ("__mod__", "__rmod__"),
    "power": ("__pow__", "__rpow__"),
    "matmul": ("__matmul__", "__rmatmul__"), "less": ("__lt__", "__gt__"), "less_equal": ("__le__", "__ge__"),
    "greater": ("__gt__", "__lt__"), "greater_equal": ("__ge__", "__le__"), "equal": ("__eq__", "__eq__"),
    "not_equal": ("__ne__", "__ne__"), "bitwise_and": ("__and__", "__and__"), "bitwise_or": ("__or__", "__or__"),
    "bitwise_xor": ("__xor__", "__xor__"), "left_shift": ("__lshift__", "__rlshift__"),
    "right_shift": ("__rshift__", "__rrshift__"), "negative": ("__neg__",), "positive": ("__pos__",),
    "absolute": ("__abs__",), "invert": ("__invert__",),
    # one-input math ufuncs: the Tensor method of the same name (or torch's, for radians and degrees)
    **{name: (name,) for name in ("tan", "sinh", "cosh", "arcsin", "arccos", "arctan", "arcsinh", "arccosh",
                                  "arctanh", "log1p", "expm1", "log2", "log10", "exp2", "deg2rad", "rad2deg",
                                  "signbit")},
    "radians": ("deg2rad",), "degrees": ("rad2deg",),
}
# numpy names whose graphc function or Tensor method is spelled differently
_GC_NAMES = {"absolute": "abs", "concatenate": "concat", "power": "pow", "moveaxis": "movedim",
             "repeat": "repeat_interleave", "expand_dims": "unsqueeze", "around": "round", "ravel": "flatten"}


def _array_ufunc(self: Tensor, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
    dunders = _UFUNC_OPERATORS.get(ufunc.__name__)
    if dunders is not None and method == "__call__" and not kwargs:
        if len(inputs) == 1:
            return getattr(self, dunders[0])()
        a, b = inputs
        return getattr(a, dunders[0])(b) if isinstance(a, Tensor) else getattr(b, dunders[1])(a)
    raise _numpy_refused(f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"),
                         ufunc.__name__, self)


def _array_function(self: Tensor, func: Any, types: Any, args: Any, kwargs: Any):
    raise _numpy_refused(f"np.{func.__name__}", func.__name__, self)


def _numpy_refused(what: str, name: str, tensor: Tensor) -> CaptureError:
    """CaptureError for a numpy function given a traced value, suggesting what graphc has under
    that name (or its spelling in ``_GC_NAMES``): a ``gc.*`` function, else a Tensor method."""
    spelled = _GC_NAMES.get(name, name)
    # the public names, read from the front (loaded before any of its sub-packages), not imported:
    # the DSL's layers never import upward
    if spelled in sys.modules["graphc"].__all__:
        hint = f"use gc.{spelled}(...) instead"
    elif hasattr(Tensor, spelled):
        hint = f"use the Tensor method .{spelled}(...) instead"
    else:
        hint = "graphc has no function of that name: build it from gc.* ops"
    return CaptureError(f"{what} cannot run on traced value {tensor.value.name}: {tensor.type_str()} at "
                      f"{user_source()}: numpy cannot see inside the graph being captured; {hint}")


METHODS = {
    "__add__": lambda a, b: ops.binary("Add", a, b), "__radd__": lambda a, b: ops.binary("Add", b, a),
    "__sub__": lambda a, b: ops.binary("Sub", a, b), "__rsub__": lambda a, b: ops.binary("Sub", b, a),
    "__mul__": lambda a, b: ops.binary("Mul", a, b), "__rmul__": lambda a, b: ops.binary("Mul", b, a),
    "__truediv__": lambda a, b: ops_divide.true_divide(a, b),
    "__rtruediv__": lambda a, b: ops_divide.true_divide(b, a),
    "__floordiv__": lambda a, b: ops_divide.floor_divide(a, b),
    "__rfloordiv__": lambda a, b: ops_divide.floor_divide(b, a),
    "__mod__": lambda a, b: ops_divide.remainder(a, b), "__rmod__": lambda a, b: ops_divide.remainder(b, a),
    # CUDA autocast runs torch's pow, __pow__ and __rpow__ in float32
    "__pow__": autocast_op("pow")(lambda a, b: ops.binary("Pow", a, b)),
    "__rpow__": autocast_op("pow")(lambda a, b: ops.binary("Pow", b, a)),
    "__matmul__": lambda a, b: ops.matmul(a, b), "__rmatmul__": lambda a, b: ops.matmul(b, a),
    "__neg__": lambda a: ops.unary("Neg", a), "__pos__": lambda a: a, "__abs__": lambda a: ops.abs(a),
    "__lt__": lambda a, b: ops.binary("Less", a, b), "__le__": lambda a, b: ops.binary("LessOrEqual", a, b),
    "__gt__": lambda a, b: ops.binary("Greater", a, b), "__ge__": lambda a, b: ops.binary("GreaterOrEqual", a, b),
    "__eq__": lambda a, b: ops.binary("Equal", a, b),
    "__ne__": lambda a, b: ops.unary("Not", ops.binary("Equal", a, b)),
    "__invert__": ops_binary.bitwise_not,
    "__and__": ops_binary.bitwise_and, "__rand__": lambda a, b: ops_binary.bitwise_and(b, a),
    "__or__": ops_binary.bitwise_or, "__ror__": lambda a, b: ops_binary.bitwise_or(b, a),
    "__xor__": ops_binary.bitwise_xor, "__rxor__": lambda a, b: ops_binary.bitwise_xor(b, a),
    "__lshift__": ops_binary.bitwise_left_shift, "__rlshift__": lambda a, b: ops_binary.bitwise_left_shift(b, a),
    "__rshift__": ops_binary.bitwise_right_shift, "__rrshift__": lambda a, b: ops_binary.bitwise_right_shift(b, a),
    "__getitem__": getitem,
    "__array_ufunc__": _array_ufunc, "__array_function__": _array_function,
    "T": property(lambda a: ops.transpose(a)),
    "reshape": _reshape, "transpose": _transpose,
    "flatten": lambda a, start_dim=0, end_dim=-1: ops.flatten(a, start_dim, end_dim),
    "sum": _reduction(ops.sum), "mean": _reduction(ops.mean),
    "max": _reduction(ops.max, ops.maximum, ops_order.max_dim),
    "min": _reduction(ops.min, ops.minimum, ops_order.min_dim),
    "astype": lambda a, dtype: ops.cast(a, dtype), "detach": ops.detach,
    "relu": ops.relu, "exp": ops.exp, "log": ops.log, "sqrt": ops.sqrt,
    "softmax": _softmax_method(ops.softmax), "log_softmax": _softmax_method(ops.log_softmax),
}



def _defer_complex(name: str, method: Any) -> Any:
    """``method``; NotImplemented for a complex Tensor operand, so its reflected operator runs; a complex
    number or array operand makes the operation complex."""
    def either(a: Tensor, b: Any) -> Any:
        if isinstance(b, ComplexTensor):
            return NotImplemented
        if complex_ops.is_complex_value(b):
            return getattr(complex_ops.of_parts(a, None), name)(b)
        return method(a, b)
    return either


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__matmul__", "__rmatmul__", "__eq__", "__ne__", "__pow__", "__rpow__"):
    METHODS[_name] = _defer_complex(_name, METHODS[_name])
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
for _name, _method in dim_sizes.DIM_NAME_OPERATORS.items():
    setattr(DimName, _name, _method)

from graphc.dsl import complex_inplace, complex_math, complex_ops, complex_pow  # noqa: E402,F401 - binds ComplexTensor's operators and methods too
