# Over 500 lines: the base functions (operands, elementwise, matmul, shapes, reductions) every DSL module builds on.
"""DSL functions on Tensors (`gc.relu`, `gc.matmul`, ...). Each records ONNX nodes.

Composite ops (gelu before opset 20, stack) are lowered to primitive ONNX ops here, so
autodiff and backends only need primitives. Neural-network ops live in ``ops_nn``, above this
module (``ops_nn`` imports ``ops``, never the reverse).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.model.dtypes import COMPLEX_PARTS, FLOAT_DTYPES, as_dtype, to_numpy
from graphc.errors import CaptureError
from graphc.dsl.tensor import VIEW_OPS, ComplexTensor, Tensor, complex_refusal, graphc_function, note_views
from graphc.dsl.builder import Outside, current, known_value, made_outside, op_error, user_source
from graphc.dsl.dims import dim_index, one_element
from graphc.dsl.promotion import common_dtype, kind, number_dtype
from graphc.dsl.upcast import in_float32
from graphc.passes.infer import InferenceError, broadcast
from graphc.passes.values import STOP_GRADIENT_KEY

# -- operands ---------------------------------------------------------------------------------


def constant(array: Any) -> Tensor:
    """A ``Constant`` node holding ``array`` (equal small constants are shared)."""
    builder = current()
    value = builder.constant(array)
    return _real(Tensor(value, builder.eager_value(value)))


def _real(t: Tensor) -> Tensor:
    """``t``, which must not be of ONNX's complex dtypes: graphc holds a complex value as a ComplexTensor."""
    if t.dtype in COMPLEX_PARTS:
        raise CaptureError(f"{graphc_function()} makes a {t.type_str()} Tensor, which graphc does not hold: a complex "
                           f"value is a gc.ComplexTensor of real parts (gc.complex(real, imag), x.to({t.dtype}), "
                           f"gc.zeros(..., dtype={t.dtype})) (at {user_source()})")
    return t


def lift(x: Any, like: Tensor | None = None) -> Tensor:
    """A Tensor for ``x``: Python/numpy scalars and arrays become constants of ``like``'s dtype."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, np.number, np.bool_, np.ndarray, list, tuple)):
        arr = np.asarray(x)
        if like is not None and not isinstance(x, (bool, np.bool_)):
            arr = arr.astype(to_numpy(like.dtype))  # scalars and arrays take the tensor's dtype
        elif arr.dtype == np.float64:
            arr = arr.astype(np.float32)  # a bare Python float is float32, as in PyTorch
        return constant(arr)
    if isinstance(x, str):
        return _dim_size(x, like)
    if isinstance(x, ComplexTensor):
        raise complex_refusal(graphc_function(), x)
    raise CaptureError(f"cannot use {type(x).__name__} {x!r} as a tensor (at {user_source()})")


def _dim_size(name: str, like: Tensor | None) -> Tensor:
    """A dim name of the captured inputs (``loss / x.shape[0]`` with a symbolic batch) as its size read at
    run time, where torch has an int: 0-d, ``like``'s dtype (int64 without one)."""
    sources = current().dim_sources
    if name not in sources:
        raise CaptureError(f"cannot use str {name!r} as a tensor: it is not a dim name of the captured inputs "
                           f"{sorted(sources)} (at {user_source()})")
    value, axis = sources[name]
    size = dim_of(Tensor(value), axis)
    return size if like is None or like.dtype == "int64" else cast(size, like.dtype)


def dim_read(x: Tensor, axis: int) -> Tensor:
    """Dim ``axis`` (non-negative) of ``x`` as an int64 ``[1]`` read at run time: ``Shape(x, start=axis,
    end=axis + 1)``, the one form every run-time dim read emits."""
    return emit("Shape", [x], {"start": axis, "end": axis + 1})


def dim_of(x: Tensor, axis: int) -> Tensor:
    """Dim ``axis`` (non-negative) of ``x`` as a 0-d int64 read at run time (``dim_read`` squeezed)."""
    return squeeze(dim_read(x, axis), [0])


def checked_int(value: Any, what: str, op: str, counts: bool = False) -> int | str | Tensor:
    """``value`` as torch's int argument in a capture: an int (>= 0 where it ``counts``), a dim name of the captured
    inputs (as given) or a 0-d integer Tensor such as ``B * T`` (as int64); a CaptureError for ``op`` naming
    ``what`` otherwise."""
    names = current().dim_sources
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and (value >= 0 or not counts):
        return int(value)
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, Tensor) and value.shape == () and value.dtype not in (*FLOAT_DTYPES, "bool"):
        return value if value.dtype == "int64" else cast(value, "int64")
    got = value.type_str() if isinstance(value, Tensor) else repr(value)
    raise op_error(op, [], f"{what}: expected {'ints >= 0' if counts else 'ints'} or dim names of the captured "
                           f"inputs ({sorted(names)}), got {got}; a size computed from them (B * T) is a 0-d "
                           f"integer Tensor", user_source())


def run_time_int(value: Any, what: str, op: str) -> int | Tensor:
    """``checked_int``'s value, a dim name as its size read at run time (0-d int64)."""
    value = checked_int(value, what, op)
    return lift(value) if isinstance(value, str) else value


def operand_pair(a: Any, b: Any, wraps: bool = True) -> tuple[Tensor, Tensor]:
    """``a`` and ``b`` as Tensors of one dtype: ``promote``'s; an int constant wraps into a narrower integer
    dtype (``int8_t + 300`` adds 44), as torch's elementwise ops of two operands, unless not ``wraps``."""
    a, b = promote(a, b, wraps=wraps)
    return a, b


def promote(*operands: Any, wraps: bool = False) -> list[Tensor]:
    """``operands`` as Tensors of the dtype torch computes their elementwise op in (``promotion.common_dtype``):
    a bool or integer Tensor beside a float one, and the narrower of two widths of one category, take the
    other's dtype, Tensors with dims above 0-D ones within a category (float32 ``[3]`` with float64 ``[]`` is
    float32). Constants (Python and numpy numbers and arrays) take the Tensors' dtype (``_fits``; an int out of
    an integer dtype's range wraps where it ``wraps``), except that an int or float number beside bool Tensors
    promotes them as torch (``b + 1`` is int64, not a logical or)."""
    items = [lift(x) if isinstance(x, str) else x for x in operands]  # a dim name is a 0-d int64 Tensor
    tensors = [x for x in items if isinstance(x, Tensor)]
    if not tensors:
        return [lift(x) for x in items]
    dtype = common_dtype(*tensors)
    if dtype == "bool":
        dtype = common_dtype(*tensors, *(x for x in items if number_dtype(x) is not None))
    out = []
    for x in items:
        if isinstance(x, Tensor):
            out.append(x if x.dtype == dtype else cast(x, dtype))
        else:
            _fits(dtype, x, wraps)
            out.append(_constant_as(x, dtype))
    return out


def _constant_as(x: Any, dtype: str) -> Tensor:
    """A Python or numpy number or array ``x`` as a constant of ``dtype`` (anything else is ``lift``'s error)."""
    if number_dtype(x) is None and not isinstance(x, (np.ndarray, list, tuple)):
        return lift(x)
    return constant(np.asarray(x).astype(to_numpy(dtype)))


def _fits(dtype: str, other: Any, wraps: bool) -> None:
    """Refuse a constant ``other`` that an integer or bool ``dtype`` would change (``int_t * 0.5``
    as ``int_t * 0``, ``int_t >= 0.5`` as ``int_t >= 0``): the constant takes the Tensor's dtype, and
    torch would have promoted the Tensor instead, so the two silently differed. An int out of the
    range wraps where it ``wraps`` (torch's elementwise ops), else is refused, as torch's ``where``,
    ``clamp`` and ``pow`` refuse it. Float Tensors round a constant to their precision, as torch does."""
    if isinstance(other, (Tensor, bool, np.bool_)) or kind(dtype) == 2:
        return
    value = np.asarray(other)
    if value.dtype.kind in "iu" and not wraps:
        in_range(dtype, value)
    if value.dtype.kind not in "bf":
        return
    with np.errstate(all="ignore"):
        kept = value.astype(to_numpy(dtype))
        same = np.array_equal(kept.astype(value.dtype), value)
    if not same:
        shown = value if value.size <= 4 else f"an array of {value.dtype} {list(value.shape)}"
        raise CaptureError(f"the constant {shown} would become {kept if value.size <= 4 else 'other values'} as a "
                           f"{dtype} like the Tensor operands; cast the Tensor first, e.g. "
                           f"t.astype('float32') (at {user_source()})")


def known_in_range(dtype: str, t: Tensor) -> None:
    """``in_range`` of a Tensor ``t``'s value where it is known at capture (outside one, or a constant), as
    torch reads a 0-D Tensor value as a number and checks it."""
    known = known_value(t, eager=True)
    if known is not None:
        in_range(dtype, known)


def in_range(dtype: str, value: Any) -> None:
    """Refuse ints ``value`` out of an integer ``dtype``'s range, as torch checks a Scalar argument (``where``,
    ``clamp``, ``pow``'s exponent, ``masked_fill``), where its elementwise ops wrap it."""
    value, target = np.asarray(value), to_numpy(dtype)
    if target.kind not in "iu" or value.dtype.kind not in "iu" or not value.size:
        return  # not torch's integer category: bool, floats, and the complex dtypes the factory refuses by name
    info = np.iinfo(target)
    if value.min() < info.min or value.max() > info.max:
        raise CaptureError(f"the constant {value if value.size <= 4 else 'array'} does not fit in {dtype}, the "
                           f"Tensor operands' dtype (torch: value cannot be converted to type {dtype} without "
                           f"overflow); cast the Tensor first, e.g. t.astype('int64') (at {user_source()})")


def not_for_bool(op: str, operands: Sequence[Tensor], what: str) -> CaptureError:
    """The error for ``what`` of bool Tensors, which torch's kernel refuses (``not implemented for 'Bool'``)."""
    return op_error(op, operands, f"torch's {what} is not implemented for bool Tensors (not implemented for "
                    "'Bool'); cast them first, e.g. t.float()", user_source())


def broadcast_shape(op: str, a: Tensor, b: Tensor) -> None:
    """Raise CaptureError when static dims of ``a`` and ``b`` cannot broadcast (symbolic dims are
    trusted): ``infer.broadcast``'s check, naming just this pair (Where checks two pairs of its
    three operands; a binary op's node gets the same check from inference as it is emitted)."""
    try:
        broadcast(a.shape, b.shape)
    except InferenceError as exc:
        raise op_error(op, [a, b], str(exc), user_source()) from None


def same_dtype(op: str, a: Tensor, b: Tensor) -> None:
    if a.dtype != b.dtype:
        raise op_error(op, [a, b], f"dtype mismatch {a.dtype} vs {b.dtype}; cast one with .astype()",
                       user_source())


def same_dim(op: str, operands: Sequence[Tensor], a: Any, b: Any, what: str) -> None:
    """Raise CaptureError when dims ``a`` and ``b`` cannot be equal: two sizes that differ, or a dim
    name against a size (``N`` vs ``32``: the graph would work only when ``N == 32``, so it is a
    capture error, not a run-time one). Two different dim names, or an unknown dim, pass."""
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise op_error(op, operands, f"{what} differ ({a} vs {b})", user_source())
    elif isinstance(a, str) != isinstance(b, str) and a is not None and b is not None:
        name, size = (a, b) if isinstance(a, str) else (b, a)
        raise op_error(op, operands, f"{what} differ ({a} vs {b}): they agree only if the dim {name} is "
                       f"{size}; if it always is, give that input the static dim {size}", user_source())


def emit(op: str, inputs: Sequence[Tensor | None], attrs: dict | None = None, num_outputs: int = 1, **kw):
    """Record one ``op`` node on ``inputs``; its output Tensor (a list when ``num_outputs > 1``).
    Keywords go to ``Builder.emit`` (``out_types``, ``name_hint``, ``source``, ``evaluator``). An input that is
    not a Tensor (a numpy array, a Python number) is ``lift``ed, as an op on numpy arrays alone lifts each."""
    inputs = [t if t is None or isinstance(t, Tensor) else lift(t) for t in inputs]
    builder = current()
    if not isinstance(builder, Outside):  # a Tensor computed outside any capture is a constant in it
        inputs = [constant(t.numpy()) if t is not None and made_outside(t.value) else t for t in inputs]
    values = builder.emit(op, [None if t is None else t.value for t in inputs], attrs, num_outputs,
                          operands=inputs, **kw)
    outs = [Tensor(v, builder.eager_value(v)) for v in values]
    for out in outs:
        _real(out)
    if op in VIEW_OPS and inputs[0] is not None:
        steps = builder.known(inputs[4].value) if op == "Slice" and len(inputs) > 4 else 1
        note_views(op, list(inputs), attrs, outs, steps)
    return outs[0] if num_outputs == 1 else outs


def const_i64(values: Sequence[int]) -> Tensor:
    return constant(np.asarray(list(values), dtype=np.int64))


def scalar(value: float, like: Tensor) -> Tensor:
    return constant(np.asarray(value, dtype=to_numpy(like.dtype)))


# -- elementwise ------------------------------------------------------------------------------


def unary(op: str, x: Tensor, **attrs: Any) -> Tensor:
    return emit(op, [lift(x)], attrs)


def binary(op: str, a: Any, b: Any) -> Tensor:
    """``op`` on ``a`` and ``b`` promoted as torch (``promote``); for Pow a Python float base is float32
    (``2.0 ** int_t``, as torch), and an integer Tensor to a negative constant power is refused, as torch."""
    if op == "Pow" and number_dtype(a) == "float32" and isinstance(b, Tensor) and b.dtype not in FLOAT_DTYPES:
        a = constant(np.asarray(a, np.float32))
    base = a.dtype if isinstance(a, Tensor) else np.asarray(a).dtype
    if op == "Pow" and number_dtype(b) is not None and b < 0 and float(b).is_integer() and kind(base) < 2:
        raise op_error(op, [lift(a), lift(b)], "integers to negative integer powers are not allowed (as torch); "
                       "use a float base, e.g. t.double() ** -2", user_source())
    bool_power = op == "Pow" and isinstance(b, (bool, np.bool_))
    if op == "Pow" and any(isinstance(t, Tensor) and t.dtype in ("uint16", "uint32", "uint64") for t in (a, b)):
        from graphc.dsl.integer_powers import wide_unsigned_power  # it builds on this module

        return wide_unsigned_power(a, b)
    a, b = operand_pair(a, b, wraps=op != "Pow" or isinstance(b, Tensor))  # torch's pow(Tensor, Scalar) refuses
    if a.dtype == "bool":
        return _of_bools(op, a, b, bool_power)
    if op == "Pow" and a.dtype in ("int8", "int16", "uint8", "int32", "int64"):
        from graphc.dsl.integer_powers import integer_power  # it builds on this module

        return integer_power(a, b)
    return emit(op, [a, b])


_BOOL_OPS = {"Add": "Or", "Max": "Or", "Mul": "And", "Min": "And"}


def _of_bools(op: str, a: Tensor, b: Tensor, bool_power: bool) -> Tensor:
    """``op`` on two bool Tensors as torch's: ``+`` and max an Or, ``*`` and min an And, the orderings on 0
    and 1, a power by a Python bool ``a or not b``; ``-``, and a power by a bool Tensor, refused, as torch."""
    if op in _BOOL_OPS:
        return emit(_BOOL_OPS[op], [a, b])
    if op in ("Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        return emit(op, [cast(a, "uint8"), cast(b, "uint8")])
    if op == "Pow" and bool_power:
        return emit("Or", [a, emit("Not", [b])])
    if op in ("Sub", "Pow"):
        raise op_error(op, [a, b], f"torch has no {'- (subtraction)' if op == 'Sub' else 'pow'} of bool Tensors; "
                       f"{'use ^ (logical_xor) or ~ (logical_not)' if op == 'Sub' else 'cast one first'}",
                       user_source())
    return emit(op, [a, b])


def relu(x: Tensor) -> Tensor:
    """max(x, 0). Signature: ai.onnx@14::Relu"""
    return unary("Relu", x)


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + exp(-x)). Signature: ai.onnx@13::Sigmoid"""
    return unary("Sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    """Signature: ai.onnx@13::Tanh"""
    return unary("Tanh", x)


@autocast_op()
def exp(x: Tensor) -> Tensor:
    """Signature: ai.onnx@13::Exp"""
    return unary("Exp", x)


@autocast_op()
def log(x: Tensor) -> Tensor:
    """Natural log. Signature: ai.onnx@13::Log"""
    return unary("Log", x)


def sqrt(x: Tensor) -> Tensor:
    """Signature: ai.onnx@13::Sqrt"""
    return unary("Sqrt", x)


def abs(x: Tensor) -> Tensor:  # noqa: A001 - public DSL name
    """Signature: ai.onnx@13::Abs"""
    return unary("Abs", x)


def erf(x: Tensor) -> Tensor:
    return unary("Erf", x)


@in_float32
def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``Gelu`` from opset 20, lowered to Erf (or Tanh) arithmetic before and in float64
    (onnxruntime has no float64 Gelu, and its Gelu expands to an Erf the session cannot rewrite)."""
    if approximate not in ("none", "tanh"):
        raise CaptureError(f"gelu approximate={approximate!r}; expected 'none' or 'tanh' (at {user_source()})")
    x = lift(x)
    if current().opset >= 20 and x.dtype != "float64":
        return emit("Gelu", [x], {"approximate": approximate})
    if approximate == "tanh":
        inner = scalar(math.sqrt(2.0 / math.pi), x) * (x + scalar(0.044715, x) * x * x * x)
        return scalar(0.5, x) * x * (scalar(1.0, x) + tanh(inner))
    return scalar(0.5, x) * x * (scalar(1.0, x) + erf(x * scalar(1.0 / math.sqrt(2.0), x)))


@one_element("axis")
@autocast_op()
@in_float32
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Softmax along ``axis``. Signature: ai.onnx@13::Softmax"""
    return emit("Softmax", [x], {"axis": axis})


@one_element("axis")
@autocast_op()
@in_float32
def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Signature: ai.onnx@13::LogSoftmax"""
    return emit("LogSoftmax", [x], {"axis": axis})


def maximum(a: Any, b: Any) -> Tensor:
    """Elementwise max with broadcasting. Signature: ai.onnx@13::Max"""
    return binary("Max", a, b)


def minimum(a: Any, b: Any) -> Tensor:
    """Elementwise min with broadcasting. Signature: ai.onnx@13::Min"""
    return binary("Min", a, b)


def clip(x: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """Clamp to [min, max] (either may be None, either a number or a Tensor), the three promoted as torch
    (``promote``).
    Signature: ai.onnx@13::Clip"""
    x, *bounds = promote(x, *(bound for bound in (min, max) if bound is not None))
    lo = None if min is None else bounds[0]
    hi = None if max is None else bounds[-1]
    if x.dtype == "bool" and (len(bounds) != 1 or not isinstance(min if max is None else max, Tensor)):
        raise not_for_bool("Clip", [x, *bounds], "clamp with a number bound or two bounds")
    if x.dtype == "bool":  # one Tensor bound: torch's clamp_min / clamp_max, an Or / an And
        return binary("Max", x, lo) if hi is None else binary("Min", x, hi)
    if any(t is not None and t.ndim for t in (lo, hi)):
        return _clip_by_tensors(x, lo, hi)
    if x.dtype in FLOAT_DTYPES and (lo is None) != (hi is None):  # ONNX's default bound is the largest
        lo, hi = (scalar(-np.inf, x), hi) if lo is None else (lo, scalar(np.inf, x))  # so inf stays inf
    return emit("Clip", [x, lo, hi])


def _clip_by_tensors(x: Tensor, lo: Tensor | None, hi: Tensor | None) -> Tensor:
    """``torch.clamp`` with bounds of rank >= 1 (ONNX Clip takes scalar bounds): two Wheres, in
    the broadcast shape of all three; their gradients are clamp's (``x`` keeps its gradient on
    a boundary, ``hi`` gets all of it where ``lo > hi``)."""
    if lo is not None:
        x = where(x < lo, lo, x)
    return x if hi is None else where(x > hi, hi, x)


def where(condition: Any, input: Any, other: Any) -> Tensor:
    """``input`` where ``condition`` else ``other`` (torch's names). Signature: ai.onnx@16::Where"""
    a, b = operand_pair(input, other, wraps=False)
    cond = lift(condition)
    if cond.dtype != "bool":
        raise op_error("Where", [cond, a, b], f"condition must be bool, got {cond.dtype}", user_source())
    broadcast_shape("Where", a, b)
    broadcast_shape("Where", cond, a)
    return emit("Where", [cond, a, b])


def cast(x: Tensor, dtype: Any) -> Tensor | ComplexTensor:
    """``x`` as ``dtype``; a complex one gives a ComplexTensor, ``x`` cast to its parts' dtype and a zero
    imaginary part, as torch's ``x.to(torch.complex64)``. Signature: ai.onnx@21::Cast"""
    part = COMPLEX_PARTS.get(str(as_dtype(dtype)))
    if part is not None:
        from graphc.dsl.ops_array import zeros_like  # ops_array imports this module

        re = cast(x, part)
        return ComplexTensor(parts=(re, zeros_like(re)))
    return emit("Cast", [lift(x)], {"to": as_dtype(dtype).onnx})


def detach(x: Tensor) -> Tensor:
    """``x``'s value, through which no gradient flows back (``torch.Tensor.detach``,
    ``jax.lax.stop_gradient``): ``x + (q - x).detach()`` is a straight-through estimator.
    An Identity node marked ``graphc.stop_gradient`` in its metadata, so the mark survives save
    and load; ``gc.optimize`` keeps it below level 3. Signature: ai.onnx@21::Identity"""
    y = emit("Identity", [lift(x)], name_hint="detach")
    y.value.producer().metadata_props[STOP_GRADIENT_KEY] = "true"
    return y


# -- linear algebra ---------------------------------------------------------------------------


@autocast_op()
def matmul(a: Any, b: Any) -> Tensor:
    """numpy-style matmul (batched, broadcast); two Tensors of two dtypes are refused, as torch's (no
    promotion). Signature: ai.onnx@13::MatMul"""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        same_dtype("MatMul", a, b)
    a, b = operand_pair(a, b)
    sa, sb = a.shape, b.shape
    if sa is not None and sb is not None:
        if len(sa) == 0 or len(sb) == 0:
            raise op_error("MatMul", [a, b], "operands must have rank >= 1", user_source())
        same_dim("MatMul", [a, b], sa[-1], sb[0] if len(sb) == 1 else sb[-2], "inner dimensions")
        if len(sa) > 2 and len(sb) > 2:
            for da, db in zip(reversed(sa[:-2]), reversed(sb[:-2])):
                if isinstance(da, int) and isinstance(db, int) and da != db and 1 not in (da, db):
                    raise op_error("MatMul", [a, b], f"batch dims do not broadcast ({da} vs {db})", user_source())
    return emit("MatMul", [a, b])


# -- shapes -----------------------------------------------------------------------------------


@autocast_op("cat")
def concat(tensors: Sequence[Tensor], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Join along ``axis`` (torch's ``dim``); Tensors of several dtypes promote as torch's ``cat``
    (``promotion.common_dtype``: float32 with float64 is float64, int64 with float16 float16). Signature:
    ai.onnx@13::Concat"""
    axis, tensors = axis if dim is None else dim, list(tensors)
    if not tensors:
        raise CaptureError(f"concat of no tensors (at {user_source()})")
    first = lift(tensors[0])
    tensors = [lift(t, first) for t in tensors]
    if len({t.dtype for t in tensors}) > 1:
        tensors = promote(*tensors)
    return emit("Concat", tensors, {"axis": axis})


@autocast_op()
def stack(tensors: Sequence[Tensor], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Join along a new ``axis`` (torch's ``dim``; Unsqueeze + Concat)."""
    axis, tensors = axis if dim is None else dim, [lift(t) for t in tensors]
    rank = tensors[0].ndim + 1
    axis = axis % rank
    return concat([unsqueeze(t, [axis]) for t in tensors], axis=axis)


def unsqueeze(x: Tensor, axes: Sequence[int]) -> Tensor:
    return emit("Unsqueeze", [x, const_i64(axes)])


def squeeze(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """Drop every size-1 dim, or those of ``axes``; an axis of another static size stays, as in torch."""
    x = lift(x)
    if axes is not None and x.shape is not None:
        rank = len(x.shape)
        axes = [a for a in axes if not (-rank <= a < rank and isinstance(x.shape[a], int) and x.shape[a] != 1)]
        if not axes:
            return x
    return emit("Squeeze", [x] + ([] if axes is None else [const_i64(axes)]))


def transpose(x: Tensor, perm: Sequence[int] | None = None) -> Tensor:
    """Permute axes (``perm=None`` reverses them). Signature: ai.onnx@21::Transpose"""
    x = lift(x)
    rank = x.ndim
    perm = list(range(rank))[::-1] if perm is None else [p % rank if rank else p for p in perm]
    if sorted(perm) != list(range(rank)):
        raise op_error("Transpose", [x], f"perm {perm} is not a permutation of {rank} axes", user_source())
    return emit("Transpose", [x], {"perm": perm})


def reshape(x: Tensor, shape: Sequence[Any]) -> Tensor:
    """Reshape; dims are ints, -1, dim names (kept symbolic; read from ``x`` where it has them, else as the
    name's size) or 0-d integer Tensors read at run time (``B * T``). A shape with any dim read at run time is
    ``int64_vector`` of the dims in order (a dim of ``x`` a Slice of one Shape of it). A 0 asks for a size-0
    dim (``allowzero``), as in torch, not ONNX's copy of ``x``'s dim."""
    x = lift(x)
    in_shape = x.shape
    allowzero = any(isinstance(d, (int, np.integer)) and d == 0 for d in shape)
    dims, out_shape, shp, sized = [], [], None, False  # dims: an int each, or a [1] int64 Tensor
    for i, d in enumerate(shape):
        if isinstance(d, (int, np.integer)):
            dims.append(int(d))
            out_shape.append(int(d) if d != -1 else None)
        elif isinstance(d, str) and in_shape is not None and i < len(in_shape) and in_shape[i] == d and not allowzero:
            dims.append(0)  # copy the dim from the input (allowzero=0)
            out_shape.append(d)
        elif isinstance(d, str) and in_shape is not None and d in in_shape:
            shp = emit("Shape", [x]) if shp is None else shp
            src = in_shape.index(d)
            dims.append(emit("Slice", [shp, const_i64([src]), const_i64([src + 1])]))
            out_shape.append(d)
        else:  # read at run time: another input's dim name, B * T
            dims.append(unsqueeze(run_time_int(d, f"reshape's dim {i}", "Reshape"), [0]))
            sized = True
            out_shape.append(str(d) if isinstance(d, str) else None)
    if [d for d in dims if isinstance(d, int)].count(-1) > 1:  # (a Tensor's == would emit an Equal)
        raise op_error("Reshape", [x], f"shape {tuple(shape)} has more than one -1", user_source())
    if not sized:  # a run-time size's count is not known here
        _check_reshape(x, out_shape, shape)
    return emit("Reshape", [x, int64_vector(dims)], {"allowzero": 1} if allowzero else None,
                out_types=[(x.dtype, out_shape)])


def int64_vector(values: Iterable[Any]) -> Tensor:
    """An int64 ``[n]`` of ``values`` (ints, 0-d and ``[1]`` integer Tensors): one constant for a list or tuple
    of ints, else each made in turn as it is reached (a generator's nodes interleave with its own): an int a
    constant ``[1]``, a 0-d Tensor reshaped to ``[1]``, a ``[1]`` Tensor as it is; then concatenated."""
    if isinstance(values, (list, tuple)) and not any(isinstance(v, Tensor) for v in values):
        return const_i64(values)
    return concat([const_i64([v]) if not isinstance(v, Tensor) else reshape(v, [1]) if v.ndim == 0 else v
                   for v in values])


def reshape_like(x: Tensor, like: Tensor) -> Tensor:
    """``x`` in ``like``'s shape, read at run time (its dims may be symbolic), typed as ``like``."""
    return emit("Reshape", [x, emit("Shape", [like])], out_types=[(x.dtype, like.shape)])


def _check_reshape(x: Tensor, out_shape: list, requested: Sequence[Any]) -> None:
    """Fill in a -1 (with the input's one unmatched dim name where the static sizes agree) and
    check element counts where they are static (symbols cancel)."""
    in_shape = x.shape
    if in_shape is None or None in in_shape:
        return
    in_syms = sorted(d for d in in_shape if isinstance(d, str))
    out_syms = sorted(d for d in out_shape if isinstance(d, str))
    in_n = math.prod(d for d in in_shape if isinstance(d, int))
    out_n = math.prod(d for d in out_shape if isinstance(d, int))
    if None in out_shape:
        leftover = list(in_syms)
        for s in out_syms:
            if s in leftover:
                leftover.remove(s)
            else:
                return
        if len(leftover) == 1 and in_n == out_n:  # [N, 64] -> (-1, 1, 8, 8): the -1 is N
            out_shape[out_shape.index(None)] = leftover[0]
            return
        if leftover or out_n == 0 or in_n % out_n:
            if not leftover:
                raise op_error("Reshape", [x], f"cannot reshape to {tuple(requested)}", user_source())
            return
        out_shape[out_shape.index(None)] = in_n // out_n
    elif in_syms == out_syms and in_n != out_n:
        raise op_error("Reshape", [x], f"cannot reshape {in_n} elements to {tuple(requested)}", user_source())


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    x = lift(x)
    rank = x.ndim
    if rank == 0:  # torch: a scalar flattens to one element
        return reshape(x, [1])
    start, end = start_dim % rank, end_dim % rank
    merged = x.shape[start:end + 1]
    if 0 in x.shape and all(isinstance(d, int) for d in merged):  # x empty: a -1 would be ambiguous
        return reshape(x, list(x.shape[:start]) + [math.prod(merged)] + list(x.shape[end + 1:]))
    if end == rank - 1:
        if start == 0:
            return reshape(x, [-1])
        out = emit("Flatten", [x], {"axis": start})
        if start == 1:
            return out
        # Flatten gives 2-D [prod(:start), prod(start:)]; restore the leading dims
        return reshape(out, list(x.shape[:start]) + [-1])
    return reshape(x, list(x.shape[:start]) + [-1] + list(x.shape[end + 1:]))


# -- reductions -------------------------------------------------------------------------------


_ACCUMULATED = frozenset({"ReduceSum", "ReduceMean", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2",
                          "ReduceLogSum", "ReduceLogSumExp"})  # in float32 for float16/bfloat16, as torch's


def reduction(op: str, x: Tensor, axis: Any, keepdims: bool) -> Tensor:
    """The ONNX reduction ``op`` over ``axis`` (None: all); the axes an input or an attribute by opset;
    an accumulating one computed in float32 for a narrow float (``upcast``)."""
    x = lift(x)
    if isinstance(axis, (Tensor, np.ndarray)):
        raise op_error(op, [x, lift(axis)], "the axes must be ints, not a Tensor (for the elementwise max or min of two "
                       "Tensors use gc.maximum or gc.minimum)", user_source())
    attrs: dict[str, Any] = {"keepdims": int(bool(keepdims))}
    axes = None if axis is None else ([axis] if isinstance(axis, int) else list(axis))
    if axes is not None and x.shape is not None:
        axes = [dim_index(x, a, op) for a in axes]
        axes = axes if x.shape else None  # 0-d: its one element, reduced over no axis, as torch
    axes_input = []
    # NOTE: ReduceSum takes axes as an input from opset 13, the other reductions from opset 18.
    if axes is not None:
        if op == "ReduceSum" or current().opset >= 18:
            axes_input.append(const_i64(axes))
        else:
            attrs["axes"] = axes

    def reduce(x: Tensor) -> Tensor:
        return emit(op, [x, *axes_input], attrs)

    return (in_float32(reduce) if op in _ACCUMULATED else reduce)(x)


def int64_accumulated(x: Tensor) -> Tensor:
    """``x`` cast to int64 when it is bool or a narrower integer: torch sums, multiplies and
    accumulates those in int64. An unknown dtype is left as it is."""
    if x.value.dtype is not None and x.dtype not in FLOAT_DTYPES and x.dtype not in ("int64", "uint64"):
        return cast(x, "int64")
    return x


@autocast_op()
def sum(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """ReduceSum over ``axis`` (None: all); bool and integer Tensors sum in int64 (a bool counts
    its Trues), as torch. Signature: ai.onnx@13::ReduceSum"""
    return reduction("ReduceSum", int64_accumulated(lift(x)), axis, keepdims)


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """ReduceMean over ``axis`` (None: all); axes are an input from opset 18, an attribute before."""
    return reduction("ReduceMean", x, axis, keepdims)


def nan_if_any(found: Tensor, x: Tensor, axis: Any, keepdims: bool) -> Tensor:
    """``found`` (``x``'s max or min over ``axis``) as NaN where those entries hold one, as torch's."""
    if x.dtype not in FLOAT_DTYPES:
        return found
    nans = unary("IsNaN", x)  # ReduceMax takes bool from opset 20
    nans = reduction("ReduceMax", nans if current().opset >= 20 else cast(nans, "int32"), axis, keepdims)
    return where(nans if nans.dtype == "bool" else nans > scalar(0, nans), scalar(np.nan, found), found)


def max(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """ReduceMax over ``axis`` (None: all), NaN where a NaN is; the elementwise max is ``gc.maximum``."""
    x = lift(x)
    return nan_if_any(reduction("ReduceMax", x, axis, keepdims), x, axis, keepdims)


def min(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """ReduceMin over ``axis`` (None: all), NaN where a NaN is; the elementwise min is ``gc.minimum``."""
    x = lift(x)
    return nan_if_any(reduction("ReduceMin", x, axis, keepdims), x, axis, keepdims)


__all__ = [
    "abs", "cast", "clip", "concat", "detach", "exp", "gelu", "log", "log_softmax", "matmul", "max", "maximum",
    "mean", "min", "minimum", "relu", "reshape", "sigmoid", "softmax", "sqrt", "stack", "sum",
    "tanh", "transpose", "where", "flatten", "squeeze", "unsqueeze", "erf",
]
