"""`gc.Tensor`: a symbolic value during capture (with its example value in eager capture).

The tensor layer of the DSL: it imports only the builder. Its operators (``+``, ``@``, ``[]``,
numpy's protocols) and methods (``.reshape``, ``.sum``, ...) are functions of the layer above,
bound to the class by ``graphc.dsl.methods``, which every capture imports first.
"""

from __future__ import annotations

import math
import sys
import weakref
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl.builder import active, current, made_outside, type_str, user_source
from graphc.errors import CaptureError
from graphc.model.dtypes import DType, as_dtype, type_text
from graphc.passes.values import static_shape


class DimName(str):
    """A symbolic dim of ``Tensor.shape``: the name (``"T"``, equal to the str), on which torch code's arithmetic
    (``T - 1``, ``B * T``, ``T // 2``) is the dim's size read at run time, as torch's SymInt is an int (operators
    bound by ``graphc.dsl.methods``, from ``graphc.dsl.dim_sizes``). It pickles and copies as the plain str."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return str, (str(self),)


class Size(tuple):
    """``torch.Size``: what ``.shape`` and ``.size()`` of a Tensor or Parameter are, a tuple of ints and ``DimName``s
    (symbolic dims) with torch's ``numel()``; a slice, a concatenation with a tuple (either side) and a repeat of one
    are one (``x.shape[:-1] + (4,)``); ``gc.Size([2, 3])``."""

    __slots__ = ()

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        return Size(item) if isinstance(index, slice) else item

    def __add__(self, other: Any) -> Any:
        joined = super().__add__(other)
        return joined if joined is NotImplemented else Size(joined)

    def __radd__(self, other: Any) -> Any:
        return Size(other + tuple(self)) if isinstance(other, tuple) else NotImplemented

    def __mul__(self, times: Any) -> Any:
        repeated = super().__mul__(times)
        return repeated if repeated is NotImplemented else Size(repeated)

    __rmul__ = __mul__

    def numel(self) -> Any:
        """The product of the dims (a ``DimName``'s arithmetic where one is symbolic)."""
        return math.prod(self)


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
    def shape(self) -> Size | None:
        """A ``Size`` of ints, ``DimName``s (symbolic dims) and None (unknown dims); None where the rank is unknown."""
        shape = static_shape(self.value)
        return None if shape is None else Size(DimName(d) if isinstance(d, str) else d for d in shape)

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
        if made_outside(self.value):  # computed outside any capture (a module's __init__): its value
            return self._value if dtype is None else self._value.astype(dtype)
        hint = "; .numpy() gives its example value in eager capture" if self._value is not None else ""
        raise CaptureError(f"traced value {self.value.name}: {self.type_str()} cannot become a numpy array at "
                         f"{user_source()}: inside forward use gc.* functions on it{hint}")


# ops whose output torch would make a view of the first input (a Slice only with positive steps: torch has no
# negative-step views, and ``flip`` copies; a Reshape or Flatten only where the strides allow one)
VIEW_OPS = frozenset({"Slice", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Identity",
                      "Split"})


def note_views(op: str, inputs: list, attrs: dict | None, outs: list[Tensor], steps: Any = None) -> None:
    """Record each of ``outs`` as a view of ``inputs[0]`` made by ``op`` (``steps``: a Slice's, when known)."""
    base = inputs[0]
    if op == "Slice" and (steps is None or (np.asarray(steps) < 0).any()):
        return
    if op in ("Reshape", "Flatten") and base._view is not None and not _viewable(base, outs[0].shape):
        return  # torch's reshape copies
    if base._views is None or len(base._views) > 64:
        base._views = [ref for ref in base._views or () if ref() is not None]
    for out in outs:
        out._view = (base, (op, inputs, attrs or {}))
        base._views.append(weakref.ref(out))


def _viewable(base: Tensor, shape: tuple | None) -> bool:
    """Whether torch can view ``base`` as ``shape`` (True where either's strides are unknown)."""
    old = strides(base)
    if old is None or shape is None or not all(isinstance(d, int) for d in shape):
        return True
    return view_strides(base.shape, old, shape) is not None


# -- torch's strides of a view, read from the ops that made it (``Tensor._view``): whether a reshape of a view
# is itself a view (torch's ``computeStride``; else ``reshape``/``flatten`` copy) and whether a Tensor is
# contiguous. Static shapes only: where a shape or a Slice's steps are unknown, so are the strides.


def strides(t: Any) -> tuple[int, ...] | None:
    """``t``'s strides in the storage of the Tensor it is a view of, as torch's; None where unknown (a
    symbolic dim, a Slice's axes or steps not constants, an ``expand`` or a ``diagonal``)."""
    shape = t.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    if t._view is None:
        return contiguous_strides(shape)
    base, (op, inputs, attrs) = t._view
    old = strides(base)
    if old is None or op in ("Expand", "Diagonal"):
        return None
    if op in ("Identity", "Split"):
        return old
    if op == "Transpose":
        return tuple(old[p] for p in attrs.get("perm", range(len(old))[::-1]))
    if op == "Slice":
        return _sliced(old, inputs)
    return view_strides(base.shape, old, shape)  # Reshape, Flatten, Squeeze, Unsqueeze


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def is_contiguous(t: Any) -> bool:
    """Whether ``t`` is contiguous, as torch's ``is_contiguous`` (size-1 dims' strides do not count); True
    where its strides are unknown."""
    found = strides(t)
    return found is None or all(s == c for s, c, d in zip(found, contiguous_strides(t.shape), t.shape) if d != 1)


def view_strides(old_shape: tuple[int, ...], old: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of ``old_shape`` (strides ``old``) viewed as ``shape``, or None where no view can be,
    so torch's ``reshape`` copies: torch's ``computeStride``, chunk by chunk of dims that are contiguous
    with each other."""
    if math.prod(old_shape) == 0 or not old_shape:
        return contiguous_strides(shape)
    new = [0] * len(shape)
    view_d, chunk_stride, tensor_numel, view_numel = len(shape) - 1, old[-1], 1, 1
    for tensor_d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[tensor_d]
        if tensor_d == 0 or (old_shape[tensor_d - 1] != 1 and old[tensor_d - 1] != tensor_numel * chunk_stride):
            while view_d >= 0 and (view_numel < tensor_numel or shape[view_d] == 1):
                new[view_d] = view_numel * chunk_stride
                view_numel *= shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_stride, tensor_numel, view_numel = old[tensor_d - 1], 1, 1
    return tuple(new) if view_d == -1 else None


def _sliced(old: tuple[int, ...], inputs: list) -> tuple[int, ...] | None:
    builder = current()
    axes = builder.known(inputs[3]._ir) if len(inputs) > 3 and inputs[3] is not None else range(len(old))
    steps = builder.known(inputs[4]._ir) if len(inputs) > 4 and inputs[4] is not None else np.ones(len(old))
    if axes is None or steps is None:
        return None
    out = list(old)
    for axis, step in zip(np.asarray(axes).tolist(), np.asarray(steps).tolist()):
        out[axis] *= int(step)
    return tuple(out)


class ComplexTensor:
    """A complex value in the graph being captured (``gc.complex64``/``complex128``): one real Tensor with a
    trailing dim of 2 (real, imaginary), ONNX's DFT layout and torch's ``view_as_real``, so every graph value
    stays real and gradients come from the real ops. It may be held as its two parts instead (what most ops
    make and read); the pair is built from them on first need, and the parts serve until the pair is written.
    Its operators and methods are bound by ``graphc.dsl.complex_ops``; any other is a ``CaptureError`` naming it."""

    __slots__ = ("_pair", "_parts", "_built")
    __array_priority__ = 1001  # before a real Tensor's reflected operators

    def __init__(self, pair: Tensor | None = None, parts: tuple[Tensor, Tensor] | None = None):
        if parts is not None:  # its own Tensors: a later write into one it was made of is not its (torch copies)
            parts = tuple(Tensor(p.value, p.eager_value) for p in parts)
        self._pair, self._parts, self._built = pair, parts, None

    @property
    def dtype(self) -> DType:
        part = (self._parts[0] if self._parts is not None else self._pair).dtype
        return as_dtype("complex128" if part == "float64" else "complex64")

    @property
    def shape(self) -> Size | None:
        if self._parts is not None:
            return self._parts[0].shape
        shape = self._pair.shape
        return None if shape is None else shape[:-1]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return self.ndim

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def is_complex(self) -> bool:
        return True

    def type_str(self) -> str:
        return type_text(self.dtype, self.shape)

    def __repr__(self) -> str:
        return f"ComplexTensor({self.type_str()})"

    __hash__ = object.__hash__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        internal = name in ("value", "_ir", "_value", "eager_value", "_view", "_views", "_stale", "_scope")
        raise complex_refusal(graphc_function() if internal else name, self)

    def __bool__(self) -> bool:
        raise CaptureError(f"Python `if`/`bool()` on a complex traced value {self.type_str()} at {user_source()}")

    def numpy(self) -> np.ndarray:
        """The example value as a complex array (eager capture, or made outside any capture)."""
        if self._pair is None:
            re, im = (part.numpy() for part in self._parts)
        else:
            pair = self._pair.numpy()
            re, im = pair[..., 0], pair[..., 1]
        return (re + 1j * im).astype(self.dtype.numpy)

    def __array__(self, dtype: Any = None, copy: Any = None):
        held = self._parts[0] if self._pair is None else self._pair
        if not made_outside(held.value):
            raise CaptureError(f"complex traced value {self.type_str()} cannot become a numpy array at "
                               f"{user_source()}: inside forward use gc.* functions on it")
        return self.numpy() if dtype is None else self.numpy().astype(dtype)


def complex_refusal(op: str, z: ComplexTensor) -> CaptureError:
    """The error for ``op`` given the complex Tensor ``z``, which it does not take."""
    return CaptureError(f"{op} does not take complex Tensors (got {z.type_str()} at {user_source()}); graphc's "
                        f"complex ops: + - * / @, **, .real, .imag, .conj(), .abs(), .angle(), the elementwise "
                        f"math (exp, log, sqrt, sin, tanh, asin, sigmoid, isfinite, isclose, ...), sum, mean, "
                        f"indexing and writes, reshape/permute, einsum, matmul and gc.fft; gc.view_as_real(z) "
                        f"gives the real [..., 2] Tensor every other op takes")


# modules whose functions wrap the op the user called (torch's keywords, autocast's casts, float32 upcasts)
_WRAPPERS = ("graphc.dsl.torch_keywords", "graphc.dsl.autocast", "graphc.dsl.upcast", "graphc.dsl.devices")


def graphc_function() -> str:
    """The name of the graphc function the user's code called: the outermost graphc frame on the stack that
    is not a wrapper's."""
    frame, name = sys._getframe(1), "this op"
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("graphc."):
            name = name if module in _WRAPPERS else frame.f_code.co_name
        elif name != "this op":
            break
        frame = frame.f_back
    return name
