"""In-place writes in a captured forward: ``x[index] = v``, ``x += y`` and torch's ``_`` methods
(``x.add_(y)``, ``x.clamp_(0, 1)``, ``x.zero_()``, ...), bound to ``gc.Tensor`` at import.

A graph has no in-place ops, so a write is functional: the Tensor object is rebound to a new value
(a ScatterND of ``v`` into the positions ``index`` picks, or a Where for a bool mask), and returns
itself, so every name bound to that object sees the write, as in torch. Views follow torch too
(``tensor.VIEW_OPS`` records them): a write into a view also writes its base (``x[0] += 1``,
``y = x.view(-1); y[3] = 0``), through basic indexing, reshapes, transposes and (un)squeezes; any
other live view of the written storage is then out of date, and using it is a ``CaptureError``
naming the write's line (take the view again after the write, or ``.clone()`` it before). Writes
into a parameter, through an ``expand``/``split`` view, or inside a ``gc.cond``/``gc.fori_loop``/``gc.scan``
body into a Tensor from outside it, are refused. A write into a buffer of the captured Module
(``self.u.copy_(new)``) in training mode is detached and marked for the training graphs to carry (see
``_as_buffer_write``); in eval mode it is refused.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np

from graphc.dsl import ops, ops_array, ops_divide, ops_views
from graphc.dsl.builder import current, op_error, user_source
from graphc.dsl.indexing import getitem
from graphc.dsl.promotion import can_cast, number_dtype
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import to_numpy
from graphc.passes.infer import InferenceError, broadcast
from graphc.passes.values import BUFFER_UPDATE_KEY, BUFFER_WRITE_KEY


def setitem(x: Tensor, index: Any, value: Any) -> None:
    """``x[index] = value`` as torch writes it: ``value`` (a Python number or array takes ``x``'s
    dtype; a Tensor of another dtype is cast where torch casts it: ``_casts``) broadcast to ``x[index]``'s
    shape. Any index ``x[index]`` reads: a bool mask over leading axes with a value that broadcasts to the
    trailing ones is a Where, everything else a ScatterND into the positions the same index picks from
    ``x``'s flat iota."""
    advanced = _advanced(index)
    v = _as_value(x, value, cast=not advanced or _masked_fill(advanced, value))
    if advanced and isinstance(value, Tensor) and value.dtype != x.dtype:
        ops.known_in_range(x.dtype, value)  # torch's masked_fill_ reads a number, checks its range
    if not masked_write(x, index, v):
        write(x, _put(x, lambda positions: getitem(positions, index), v))


def masked_write(x: Tensor, index: Any, v: Tensor) -> bool:
    """``x[index] = v`` as a Where where ``index`` (or its one item) is a bool mask over ``x``'s leading dims and
    ``v`` broadcasts to the trailing ones; False, nothing written, for any other index."""
    mask = index[0] if isinstance(index, tuple) and len(index) == 1 else index
    if not (isinstance(mask, Tensor) and mask.dtype == "bool" and v.ndim <= x.ndim - mask.ndim):
        return False
    mask = ops.unsqueeze(mask, list(range(mask.ndim, x.ndim))) if mask.ndim < x.ndim else mask
    ops.broadcast_shape("Where", x, mask)
    write(x, ops.where(mask, v, x))
    return True


def _advanced(index: Any) -> list:
    """The items of ``index`` torch indexes by ``index_put_`` (arrays, lists, Tensors other than a 0-D integer
    one): without them ``x[index] = value`` is its ``copy_``, which casts a Tensor ``value`` of another dtype."""
    items = index if isinstance(index, tuple) else (index,)
    return [i for i in items if isinstance(i, (list, np.ndarray)) or isinstance(i, Tensor) and (
        i.ndim or i.dtype in ("bool", "uint8"))]


def _masked_fill(advanced: list, value: Any) -> bool:
    """Whether torch's ``index_put_`` by the ``advanced`` items is its ``masked_fill_`` (one bool mask, a
    one-element Tensor ``value``), which casts ``value``; otherwise it requires ``x``'s dtype."""
    one = isinstance(value, Tensor) and value.shape is not None and all(d == 1 for d in value.shape)
    return one and len(advanced) == 1 and getattr(advanced[0], "dtype", None) == "bool"


def write(t: Tensor, new: Any) -> Tensor:
    """Rebind ``t`` to ``new`` (same shape) in place, writing through ``t``'s bases; the other live views of
    what was written become out of date. A result of another dtype is cast back where torch casts it
    (``promotion.can_cast``: ``int8_t.mul_(int64_t)`` stays int8), refused where torch refuses (a float into an
    integer Tensor, an integer into a bool one, a complex one into a real one). Returns ``t``."""
    _refuse_complex(t, new)
    new = ops.lift(new, t)
    if new.dtype != t.dtype and not can_cast(new.dtype, t.dtype):
        raise op_error("in-place", [t, new], f"the result's dtype {new.dtype} can't be cast to the written "
                       f"tensor's {t.dtype} (as torch's); write out of place: y = ...", user_source())
    if new.dtype != t.dtype:
        new = ops.cast(new, t.dtype)
    if new.shape is None or len(new.shape) != t.ndim or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(new.shape, t.shape)):
        raise op_error("in-place", [t, new], f"the result's shape {new.shape} is not the written tensor's "
                       f"{t.shape}; write out of place: y = ...", user_source())
    _check_writable(t)
    _assign(t, new, None, f"{t.name} was written in place at {user_source()}")
    return t


def rebind(t: Tensor, new: Tensor, why: str) -> None:
    """Rebind ``t`` to ``new`` as an op that writes its input in place does (torch's
    ``embedding_renorm_``), through ``t``'s bases, a parameter too; ``why`` says so to a stale view.
    The caller checks ``outside_body`` first."""
    _assign(t, new, None, why)


def _assign(t: Tensor, new: Tensor, keep: Tensor | None, why: str) -> None:
    for ref in t._views or ():
        view = ref()
        if view is not None and view is not keep:
            _mark_stale(view, why)
    if t._view is not None:
        base, how = t._view
        _assign(base, _unview(base, how, new), t, why)
    else:
        new = _as_buffer_write(t, new)
    t._ir, t._value = new.value, new.eager_value


def _as_buffer_write(t: Tensor, new: Tensor) -> Tensor:
    """``new`` as the value written into ``t``: for a buffer of the captured Module, detached (torch
    writes buffers under ``no_grad``) and marked with the buffer's name (``BUFFER_WRITE_KEY``)."""
    entry = current().buffer_tensors.get(id(t))
    if entry is None:
        return new
    written = ops.detach(new)
    written.value.producer().metadata_props[BUFFER_WRITE_KEY] = entry[2].name
    return written


def mark_buffer_updates(builder: Any) -> None:
    """Mark the last write of each buffer the forward wrote (``BUFFER_UPDATE_KEY``): its output is the
    buffer's value after the forward, which the training graphs carry to the next step."""
    for tensor, _, initial in builder.buffer_tensors.values():
        node = tensor._ir.producer()
        if node is not None and node.metadata_props.get(BUFFER_WRITE_KEY) == initial.name:
            node.metadata_props[BUFFER_UPDATE_KEY] = initial.name


def _mark_stale(t: Tensor, why: str) -> None:
    t._stale = (f"{t._ir.name} is a view of a tensor that changed after it was taken ({why}): torch would see "
                f"the write through the view, a captured graph cannot; take the view again after the write, or "
                f".clone() it before")
    for ref in t._views or ():
        if ref() is not None:
            _mark_stale(ref(), why)


def _check_writable(t: Tensor) -> None:
    """Refuse a write into a parameter, into a buffer in eval mode or of a module the captured function
    closes over (it would not persist: the graph's initializers are its inputs), or through a view torch
    cannot write (several elements of one memory location). A buffer of the captured Module in training
    mode is written (``_as_buffer_write``)."""
    _check_in_body(t)
    while t._view is not None:
        t, (op, _, _) = t._view[0], t._view[1]
        if op in ("Expand", "Split"):
            raise CaptureError(f"in-place write into a view made by {'expand' if op == 'Expand' else 'split'} of "
                               f"{t.name}: {t.type_str()} at {user_source()}; .clone() the view first")
    buffer = current().buffer_tensors.get(id(t))
    if buffer is not None and not buffer[1].training:
        raise CaptureError(f"in-place write into the buffer {buffer[2].name} in eval mode at {user_source()}: torch "
                           f"would keep the new value for the next call, which an inference graph cannot carry; "
                           f"write it in training mode only (`if self.training:`, as torch's BatchNorm and "
                           f"spectral_norm do) and capture in training mode (gc.capture(..., training=True)) for "
                           f"the training graphs to carry it")
    # the parameter's own Tensor, not a clone, which holds the same value until written
    if buffer is None and any(t is p for p in current().param_tensors.values()):
        raise CaptureError(f"in-place write into the parameter or buffer {t.name} at {user_source()}: a captured "
                           f"graph reads it, never stores it, so the write would not persist; compute a new "
                           f"tensor (w = {t.name.rsplit('.', 1)[-1]} * ...) or .clone() it first")


def outside_body(t: Tensor) -> bool:
    """Whether ``t`` (or a tensor it is a view of) was made outside the control-flow body being traced:
    the body is traced once into a subgraph, which cannot rebind it."""
    builder = current()
    while len(builder.scopes) > 1 and t is not None:
        if t._scope != builder.scope.id:
            return True
        t = t._view[0] if t._view is not None else None
    return False


def _check_in_body(t: Tensor) -> None:
    """Refuse a write, inside a control-flow body, into a Tensor made outside it (``outside_body``)."""
    if outside_body(t):
        raise CaptureError(f"in-place write into {t.name}, a value from outside the gc.cond/gc.fori_loop/"
                           f"gc.scan body being traced, at {user_source()}: a body cannot change an outer "
                           f"value; return the new value from the body instead (a carried value or a branch "
                           f"output)")


def _unview(base: Tensor, how: tuple, new: Tensor) -> Tensor:
    """``base`` with its view by ``how`` (op type, inputs, attributes) replaced by ``new``."""
    op, inputs, attrs = how
    if op == "Slice":
        return _put(base, lambda positions: ops.emit("Slice", [positions, *inputs[1:]]), new)
    if op == "Diagonal":
        return _put(base, attrs["pick"], new)
    if op == "Transpose":
        perm = attrs.get("perm", list(range(new.ndim))[::-1])
        return ops.transpose(new, [int(p) for p in np.argsort(perm)])
    return ops.reshape_like(new, base)  # Reshape, Flatten, Squeeze, Unsqueeze, Identity


def _put(x: Tensor, select: Any, v: Tensor) -> Tensor:
    """``x`` with ``v`` written at the flat positions ``select`` picks from ``x``'s iota: one ScatterND."""
    iota = ops.emit("Range", [ops.constant(np.asarray(0, np.int64)), ops.emit("Size", [x]),
                              ops.constant(np.asarray(1, np.int64))])
    positions = select(ops.reshape_like(iota, x))
    v = broadcast_value(v, positions, x)
    flat = ops.reshape(x, [-1])
    scattered = ops.emit("ScatterND", [flat, ops.reshape(positions, [-1, 1]), ops.reshape(v, [-1])])
    return ops.reshape_like(scattered, x)


def broadcast_value(v: Tensor, positions: Tensor, x: Tensor) -> Tensor:
    """``v`` expanded to the written slots' shape; leading size-1 dims beyond it dropped, as torch does."""
    shape = positions.shape
    while v.ndim > len(shape) and v.shape[0] == 1:
        v = ops.squeeze(v, [0])
    try:
        fits = v.ndim <= len(shape) and broadcast(v.shape, shape) == tuple(shape)
    except InferenceError:
        fits = False
    if not fits:
        raise op_error("ScatterND", [x, v], f"the value of shape {list(v.shape)} cannot be written into "
                       f"{x.name}[...] of shape {list(shape)}", user_source())
    return ops_views.expand_as(v, positions) if v.shape != shape else v


def _refuse_complex(t: Tensor, value: Any) -> None:
    """Refuse a complex value (a complex Tensor, number or array) written into the real Tensor ``t``, as torch."""
    dtype = value.dtype if isinstance(value, ComplexTensor) else np.asarray(value).dtype if isinstance(
        value, (complex, np.complexfloating, np.ndarray)) else None
    if dtype is not None and np.dtype(str(dtype)).kind == "c":
        raise op_error("in-place", [t], f"a complex value ({dtype}) can't be written into the real tensor {t.name} "
                       f"of {t.dtype} (as torch's); take its .real, or write out of place: y = ...", user_source())


def _as_value(x: Tensor, value: Any, cast: bool = False) -> Tensor:
    """A Tensor ``value`` of ``x``'s dtype as it is, of another one cast to it where it ``cast``s (torch's
    ``copy_`` and ``fill_``), else refused; a Python or numpy value cast to it, as torch casts (an int out of an
    integer dtype's range refused, as torch's). A complex one is refused (``_refuse_complex``)."""
    _refuse_complex(x, value)
    if isinstance(value, Tensor):
        if cast and value.dtype != x.dtype:
            return ops.cast(value, x.dtype)
        ops.same_dtype("ScatterND", x, value)
        return value
    ops.in_range(x.dtype, value)
    return ops.constant(np.asarray(value).astype(to_numpy(x.dtype)))


def _refuse_non_tensor(what: str, name: str, x: Any) -> None:
    if not isinstance(x, Tensor):
        raise CaptureError(f"{what} writes its result into {name}, which must be a Tensor (as torch's), got "
                           f"{type(x).__name__}; write out of place: y = ... (at {user_source()})")


def writes_input(fn: Any) -> Any:
    """Decorator for a function with torch's ``inplace`` flag: with ``inplace=True`` its first argument,
    which ``into`` rebinds to the result, must be a Tensor (checked before the function lifts it: a Python
    or numpy value would become a constant and the write be lost); a CaptureError names it otherwise."""
    signature = inspect.signature(fn)
    first = next(iter(signature.parameters))

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("inplace"):
            _refuse_non_tensor(f"{fn.__name__}(inplace=True)", f"its argument {first!r}", bound.arguments.get(first))
        return fn(*args, **kwargs)
    return run


def into(x: Tensor, out: Tensor, inplace: bool) -> Tensor:
    """``out``; with torch's ``inplace=True``, ``x`` (a Tensor: ``writes_input``) rebound to it (``write``)
    and returned, as torch's."""
    return write(x, out) if inplace and out is not x else out


def in_place(fn: Any) -> Any:
    """The in-place form of ``fn(t, *args)``: ``t`` (a Tensor) rebound to the result (``write``), and returned."""
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        _refuse_non_tensor(f"{getattr(fn, '__name__', 'fn')}_", "its first argument", self)
        return write(self, fn(self, *args, **kwargs))
    method.__doc__ = f"In place: ``t`` rebound to ``{getattr(fn, '__name__', 'fn')}(t, ...)``; returns ``t``."
    return method


def method_in_place(name: str) -> Any:
    """``t.<name>_(...)``: ``t`` rebound to ``t.<name>(...)``."""
    def fn(t: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return getattr(t, name)(*args, **kwargs)
    fn.__name__ = name
    return in_place(fn)


def reshaped_in_place(fn: Any) -> Any:
    """``unsqueeze_``/``squeeze_``/``t_``: only ``t``'s shape changes, so a view or a viewed ``t`` is refused."""
    def method(self: Tensor, *args: Any) -> Tensor:
        if self._view is not None or any(ref() is not None for ref in self._views or ()) or (
                id(self) in current().buffer_tensors):
            raise CaptureError(f"a shape-changing in-place method on {self.name}, which is a buffer or is or has "
                               f"a view, at "
                               f"{user_source()}; rebind the name instead: t = t.unsqueeze(...)")
        _check_in_body(self)
        new = fn(self, *args)
        self._ir, self._value = new.value, new.eager_value
        return self
    return method


def _fill(t: Tensor, value: Any) -> Tensor:
    ops_array.zero_dim_value("fill_", t, value)
    return ops_views.expand_as(_as_value(t, value, cast=True), t)


def _copy(t: Tensor, src: Any, non_blocking: bool = False) -> Tensor:
    """``t.copy_(src)``: a Python number is torch's wrapped number (int64, float64, bool), cast as a Tensor is; of a
    complex ``src``, its real part (as torch's)."""
    if number_dtype(src) is not None:
        src = ops.constant(np.asarray(src))
    if isinstance(src, ComplexTensor):
        src = src.real
    if not isinstance(src, Tensor):
        raise CaptureError(f"copy_ takes a Tensor or a number src, got {type(src).__name__} (at {user_source()})")
    return broadcast_value(_as_value(t, src, cast=True), t, t)


def _add(a: Tensor, b: Any, *, alpha: Any = 1) -> Tensor:
    return a + (b if alpha == 1 else b * alpha)


def _sub(a: Tensor, b: Any, *, alpha: Any = 1) -> Tensor:
    return a - (b if alpha == 1 else b * alpha)


def _div(a: Tensor, b: Any, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode not in (None, "floor"):
        raise CaptureError(f"div_ rounding_mode={rounding_mode!r}: expected None or 'floor' (at {user_source()})")
    return ops_divide.true_divide(a, b) if rounding_mode is None else ops_divide.floor_divide(a, b)


METHODS = {
    "__setitem__": setitem,
    "__iadd__": in_place(_add), "__isub__": in_place(_sub), "__imul__": in_place(lambda a, b: a * b),
    "__itruediv__": in_place(ops_divide.true_divide), "__ifloordiv__": in_place(ops_divide.floor_divide),
    "__imod__": in_place(ops_divide.remainder), "__ipow__": in_place(lambda a, b: a ** b),
    "__iand__": in_place(lambda a, b: a & b), "__ior__": in_place(lambda a, b: a | b),
    "__ixor__": in_place(lambda a, b: a ^ b),
    "add_": in_place(_add), "sub_": in_place(_sub), "mul_": in_place(lambda a, b: a * b), "div_": in_place(_div),
    "clamp_": in_place(ops_array.clamp), "clamp_min_": in_place(lambda a, m: ops_array.clamp(a, min=m)),
    "clamp_max_": in_place(lambda a, m: ops_array.clamp(a, max=m)), "fill_": in_place(_fill),
    "zero_": in_place(lambda a: _fill(a, 0)), "masked_fill_": in_place(ops_array.masked_fill),
    "copy_": in_place(_copy), "relu_": in_place(ops.relu), "sigmoid_": in_place(ops.sigmoid),
    "tanh_": in_place(ops.tanh), "exp_": in_place(ops.exp), "log_": in_place(ops.log), "sqrt_": in_place(ops.sqrt),
    "pow_": in_place(ops_array.pow), "neg_": in_place(lambda a: -a), "abs_": in_place(ops.abs),
    "index_add_": in_place(ops_views.index_add), "scatter_": in_place(ops_array.scatter),
    "unsqueeze_": reshaped_in_place(lambda a, dim: ops.unsqueeze(a, [dim])),
    "squeeze_": reshaped_in_place(lambda a, dim=None: ops.squeeze(a, None if dim is None else [dim])),
    "t_": reshaped_in_place(ops_views.t),
}
METHODS.update({f"{name}_": method_in_place(name) for name in (
    "index_copy", "ceil", "floor", "round", "trunc", "frac", "reciprocal", "square", "rsqrt", "sin", "cos", "erf",
    "sign", "fmod", "remainder", "nan_to_num", "tril", "triu", "cumsum", "cumprod",
    "scatter_add", "scatter_reduce", "index_fill", "masked_scatter", "lerp", "addcmul", "addcdiv", "atan2", "hypot",
    "copysign", "xlogy", "floor_divide", "true_divide", "heaviside", "tan", "sinh", "cosh", "asin", "acos", "atan",
    "asinh", "acosh", "atanh", "log1p", "expm1", "log2", "log10", "exp2", "erfc", "erfinv", "logit", "sinc", "deg2rad",
    "rad2deg", "sgn", "fix")})

for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
