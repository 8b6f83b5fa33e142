"""`gc.Tensor`: a symbolic value during capture (with its example value in eager capture).

The tensor layer of the DSL: it imports only the builder. Its operators (``+``, ``@``, ``[]``,
numpy's protocols) and methods (``.reshape``, ``.sum``, ...) are functions of the layer above,
bound to the class by ``graphc.dsl.methods``, which every capture imports first.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl.builder import active, type_str, user_source
from graphc.errors import CaptureError
from graphc.model.dtypes import DType, as_dtype
from graphc.passes.values import static_shape


class Tensor:
    """A value in the graph being captured. Operators record ONNX nodes.

    ``.shape`` holds ints and symbolic dim names (``"N"``), ``None`` for unknown dims.
    In eager capture (``gc.capture`` given example arrays) ``.numpy()`` returns the value.
    """

    # _view: (base, (op, inputs, attrs)) when torch's result would share ``base``'s storage; _views: weak
    # references to the views made of this one; _stale: why the value is out of date; _scope: the id of the
    # scope (main graph or control-flow body) it was made in (``graphc.dsl.inplace``)
    __slots__ = ("_ir", "_value", "_view", "_views", "_stale", "_scope", "__weakref__")
    __array_priority__ = 1000  # numpy scalars/arrays on the left defer to our reflected ops

    def __init__(self, value: ir.Value, eager_value: np.ndarray | None = None):
        self._ir = value
        self._value = eager_value
        self._view = self._views = self._stale = None
        builder = active()
        self._scope = None if builder is None else builder.scope.id

    @property
    def value(self) -> ir.Value:
        """The ONNX value; ``CaptureError`` when an in-place write made this view out of date."""
        if self._stale is not None:
            raise CaptureError(f"{self._stale}; it is used at {user_source()}")
        return self._ir

    # -- type -----------------------------------------------------------------------------------
    @property
    def dtype(self) -> DType:
        """The element type; ``CaptureError`` naming the value when ONNX inference could not tell it."""
        if self.value.dtype is None:
            raise CaptureError(f"the dtype of {self.value.name} is unknown (ONNX type inference could not tell "
                               f"it); cast it with .astype(dtype) first (at {user_source()})")
        return as_dtype(int(self.value.dtype))

    @property
    def shape(self) -> tuple | None:
        return static_shape(self.value)

    @property
    def ndim(self) -> int:
        shape = self.shape
        if shape is None:
            raise CaptureError(f"rank of {self.value.name} is unknown")
        return len(shape)

    @property
    def name(self) -> str:
        return self.value.name

    def type_str(self) -> str:
        return type_str(self.value)

    @property
    def eager_value(self) -> np.ndarray | None:
        """The example value in eager capture, else None."""
        if self._stale is not None:
            self.value  # noqa: B018 - raises: the value is out of date
        return self._value

    def numpy(self) -> np.ndarray:
        """The example value (eager capture only)."""
        if self.eager_value is None:
            raise CaptureError(f"{self.value.name}: {self.type_str()} has no value; pass example np.ndarrays "
                             f"to gc.capture for eager values (at {user_source()})")
        return self._value

    def __repr__(self) -> str:
        if self._value is not None:
            return f"Tensor({self.value.name}: {self.type_str()}, value=\n{self._value})"
        return f"Tensor({self.value.name}: {self.type_str()})"

    __hash__ = object.__hash__

    # -- Python protocol misuse ---------------------------------------------------------------
    def __bool__(self) -> bool:
        raise CaptureError(f"Python `if`/`and`/`or`/`bool()` on traced value {self.value.name}: {self.type_str()} "
                         f"at {user_source()}; the graph cannot branch on it. Use gc.where(cond, a, b) "
                         f"or gc.cond(pred, true_fn, false_fn, ...)")

    def __len__(self) -> int:
        shape = self.shape
        if shape and isinstance(shape[0], int):
            return shape[0]
        raise CaptureError(f"len() of {self.value.name}: {self.type_str()} is not static (at {user_source()})")

    def __iter__(self):
        n = len(self)
        return (self[i] for i in range(n))

    def __index__(self) -> int:
        raise CaptureError(f"traced value {self.value.name} used as a Python int at {user_source()}")

    def __array__(self, dtype: Any = None, copy: Any = None):
        hint = "; .numpy() gives its example value in eager capture" if self._value is not None else ""
        raise CaptureError(f"traced value {self.value.name}: {self.type_str()} cannot become a numpy array at "
                         f"{user_source()}: inside forward use gc.* functions on it{hint}")


# ops whose output torch would make a view of the first input (a Slice only with positive steps: torch has no
# negative-step views, and ``flip`` copies)
VIEW_OPS = frozenset({"Slice", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Identity",
                      "Split"})


def note_views(op: str, inputs: list, attrs: dict | None, outs: list[Tensor], steps: Any = None) -> None:
    """Record each of ``outs`` as a view of ``inputs[0]`` made by ``op`` (``steps``: a Slice's, when known)."""
    base = inputs[0]
    if op == "Slice" and (steps is None or (np.asarray(steps) < 0).any()):
        return
    if base._views is None or len(base._views) > 64:
        base._views = [ref for ref in base._views or () if ref() is not None]
    for out in outs:
        out._view = (base, (op, inputs, attrs or {}))
        base._views.append(weakref.ref(out))
