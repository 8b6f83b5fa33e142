# Over 500 lines: one node's dtype and shape inference, the schema's dtypes and graphc's shape rules
# (each a few lines, beside the driver that tests/test_infer.py checks them through).
"""Dtype and shape inference for one node: the one path the DSL's capture ``Builder`` and the
passes' ``Emitter`` share.

``infer(node, opset, const)`` gives each output's ``(dtype, shape)``; a shape is a tuple of ints,
strs (symbolic dims) and None (unknown dims), or None when even the rank is unknown.

- Dtypes come from the op's schema: the inputs are checked against its type constraints, and an
  output takes the type its constraint is bound to by an input, or the one type it allows
  (bool for comparisons, int64 for ``Shape``); a ``RULES`` entry sets it where an attribute
  decides (``Cast``, ``Constant``, ``ConstantOfShape``).
- ``RULES`` gives shapes in pure Python (a few microseconds a node) for the ops graphc emits most,
  counted on the example models' capture and ``train_step``. A rule agrees with onnx's inference
  wherever it answers (tests/test_infer.py checks that), but for two onnx 1.23 errors: a ceil_mode
  pool's last window that starts in the padding (dropped, as torch checks) and a Conv or pool with
  no window (refused; onnx answers 0 or less); and it keeps the rank of a Reduce of computed
  axes with keepdims, where onnx infers nothing (``gc.func.hessian``'s broadcast gradients need it
  to batch). Where it cannot decide (an unknown rank, an input that is not constant, an invalid
  attribute) it returns None. It raises
  ``InferenceError`` for dims that cannot agree (broadcasting, MatMul/Gemm inner dims, Concat).
- ``fallback=True`` (the DSL) asks onnx's per-node inference (about 0.1 ms a node) for the other
  ops and the undecided shapes, and turns its errors into ``InferenceError``. The passes'
  ``Emitter`` does not fall back (its other outputs get a dtype only): measured on the ResNet and
  transformer examples' ``gc.training.generate``, 117 of its 1,341 nodes would go to onnx (Reshapes
  of computed shapes, Pad, Conv, ...) and make it about 8 % slower.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from graphc.errors import InferenceError
from graphc.model.windows import windows
from graphc.passes.values import Dim, StaticShape, attr, static_shape

__all__ = ["InferenceError", "RULES", "ceil_adds_nothing", "correct_onnx_inference", "infer", "known_array",
           "takes_widened"]

Result = tuple[ir.DataType | None, StaticShape | None]


def known_array(value: ir.Value) -> np.ndarray | None:
    """``value``'s numpy value if it is a ``Constant``'s output or an initializer no caller feeds."""
    if value.const_value is not None and not value.is_graph_input():
        return value.const_value.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
        return producer.attributes["value"].value.numpy()
    return None


def infer(node: ir.Node, opset: int, const: Callable[[ir.Value], np.ndarray | None] = known_array,
          fallback: bool = False) -> list[Result]:
    """``(dtype, shape)`` of each output of ``node`` (an ``ai.onnx`` node); ``const`` gives an
    input's value where it is known (a Reshape's target shape, Unsqueeze's axes)."""
    dtypes = _dtypes(node, opset)
    rule = RULES.get(node.op_type)
    if rule is not None:
        dtype, shape = rule(_Node(node, const), dtypes[0])
        if shape is not None or not fallback:  # (MaxPool's Indices: a second output of the same shape)
            return [(dtype, shape)] + [(other, shape) for other in dtypes[1:]]
    if fallback:
        return _onnx(node, opset, const)
    return [(dtype, None) for dtype in dtypes]


# -- dtypes from the schema ---------------------------------------------------------------------
_DTYPES = {f"tensor({t.name.lower()})": t for t in ir.DataType if t != ir.DataType.UNDEFINED}
_FROM_BODIES = frozenset({"If", "Loop", "Scan"})


class _Signature:
    """An op's schema at one opset, as checks: per formal input its type parameter, the dtypes
    it allows (None: not a tensor) and whether it is variadic; per output its type parameter and
    the one dtype it allows (else None)."""

    def __init__(self, schema: onnx.defs.OpSchema):
        allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}

        def dtypes(type_str):
            strs = allowed.get(type_str, [type_str])
            return frozenset(_DTYPES[s] for s in strs if s in _DTYPES) or None

        variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
        self.inputs = [(p.type_str, dtypes(p.type_str), p.option == variadic and not p.is_homogeneous)
                       for p in schema.inputs]
        self.variadic = bool(schema.inputs) and schema.inputs[-1].option == variadic
        self.outputs = [(p.type_str, dtypes(p.type_str)) for p in schema.outputs]


@functools.lru_cache(maxsize=None)
def _signature(op_type: str, opset: int) -> _Signature:
    try:
        return _Signature(onnx.defs.get_schema(op_type, opset, ""))
    except onnx.defs.SchemaError as exc:
        raise InferenceError(str(exc)) from None


def _dtypes(node: ir.Node, opset: int) -> list[ir.DataType | None]:
    """Each output's dtype as the schema binds it from the inputs (the first input's, for the
    sequence ops whose schemas say only "some sequence"); the inputs' dtypes are checked."""
    inputs = tuple([None if v is None else (v.dtype, isinstance(v.type, ir.TensorType)) for v in node.inputs])
    return list(_bind(node.op_type, opset, inputs, len(node.outputs)))


@functools.lru_cache(maxsize=4096)
def _bind(op_type: str, opset: int, inputs: tuple, outputs: int) -> tuple[ir.DataType | None, ...]:
    """``_dtypes`` for inputs given as ``(dtype, is a tensor)`` (None: a missing input)."""
    sig = _signature(op_type, opset)
    bound: dict[str, ir.DataType] = {}
    last = len(sig.inputs) - 1
    for i, typed in enumerate(inputs):
        if typed is None or typed[0] is None:
            continue
        if i > last and not sig.variadic:
            raise InferenceError(f"{op_type} takes at most {len(sig.inputs)} inputs, got {len(inputs)}")
        dtype, tensor = typed
        type_str, allowed, heterogeneous = sig.inputs[min(i, last)]
        if tensor and allowed is not None and dtype not in allowed:
            raise InferenceError(f"input {i} has dtype {_name(dtype)}, which {op_type} does not take")
        if heterogeneous:
            continue
        other = bound.setdefault(type_str, dtype)
        if other != dtype:
            raise InferenceError(f"operand dtypes differ ({_name(other)} vs {_name(dtype)})")
    first = next((typed[0] for typed in inputs if typed is not None), None)
    from_inputs = {type_str for type_str, _, _ in sig.inputs}
    out = []
    for i in range(outputs):
        type_str, allowed = sig.outputs[min(i, len(sig.outputs) - 1)]
        dtype = bound.get(type_str)
        if dtype is None and allowed is not None and len(allowed) == 1:
            (dtype,) = allowed
        # an output typed like an input whose dtype is not known is not known either (CastLike's
        # output with its target untyped is not its input's dtype)
        if dtype is None and op_type not in _FROM_BODIES and type_str not in from_inputs:
            dtype = first
        out.append(dtype)
    return tuple(out)


def _name(dtype: ir.DataType) -> str:
    return dtype.name.lower()


@functools.lru_cache(maxsize=1024)
def takes_widened(op_type: str, opset: int, dtypes: tuple[ir.DataType | None, ...], narrow: ir.DataType) -> bool:
    """Whether ``op_type``'s schema at ``opset`` refuses tensor inputs of ``dtypes`` (None: missing or
    untyped) but takes them with each ``narrow`` one float32 (Conv and Sin take no bfloat16 before
    opset 22)."""
    def binds(types: tuple) -> bool:
        try:
            _bind(op_type, opset, tuple(None if t is None else (t, True) for t in types), 0)
        except InferenceError:
            return False
        return True

    return not binds(dtypes) and binds(tuple(ir.DataType.FLOAT if t == narrow else t for t in dtypes))


# -- shape rules --------------------------------------------------------------------------------
class _Node:
    """What a rule reads of its node: input shapes, attributes, constant inputs."""

    __slots__ = ("node", "_const")

    def __init__(self, node: ir.Node, const):
        self.node, self._const = node, const

    def shape(self, i: int = 0) -> StaticShape | None:
        inputs = self.node.inputs
        return static_shape(inputs[i]) if i < len(inputs) and inputs[i] is not None else None

    def shapes(self) -> list[StaticShape | None]:
        return [None if v is None else static_shape(v) for v in self.node.inputs]

    def attr(self, name: str, default=None):
        return attr(self.node, name, default)

    def const(self, i: int) -> np.ndarray | None:
        inputs = self.node.inputs
        return self._const(inputs[i]) if i < len(inputs) and inputs[i] is not None else None

    def axes(self, i: int = 1) -> Sequence[int] | None | bool:
        """The axes input ``i`` (or the ``axes`` attribute where the opset has no such input)
        as ints; None when neither is given; False when the input is not constant."""
        if len(self.node.inputs) > i and self.node.inputs[i] is not None:
            array = self.const(i)
            return False if array is None else [int(a) for a in array.reshape(-1)]
        return self.attr("axes")


def _axes(axes: Sequence[int], rank: int) -> list[int] | None:
    """``axes`` in ``[0, rank)`` (negative ones counted from the end), None if out of range or repeated."""
    out = [a + rank if a < 0 else a for a in axes]
    return out if all(0 <= a < rank for a in out) and len(set(out)) == len(out) else None


def broadcast(*shapes: StaticShape | None) -> StaticShape | None:
    """numpy broadcasting as onnx infers it: a fixed dim other than 1 wins, a symbolic dim shared
    by all non-1 dims stays, different symbols give an unknown dim. Of several dims that cannot
    agree, the last axis's are named."""
    if any(s is None for s in shapes):
        return None
    if all(s == shapes[0] for s in shapes):
        return shapes[0]
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for dims in reversed(list(zip(*((1,) * (rank - len(s)) + s for s in shapes)))):
        value, symbols = 1, set()
        for d in dims:
            if not isinstance(d, int):
                symbols.add(d)
            elif d != 1:
                if value not in (1, d):
                    raise InferenceError(f"shapes do not broadcast (dim {value} vs {d})")
                value = d
        out.append(value if value != 1 or not symbols else next(iter(symbols)) if len(symbols) == 1 else None)
    return tuple(reversed(out))


def _inner(a: Dim, b: Dim) -> None:
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise InferenceError(f"inner dimensions differ ({a} vs {b})")


def _elementwise(n: _Node, dtype):
    return dtype, broadcast(*n.shapes())


def _same(n: _Node, dtype):
    return dtype, n.shape(0)


def _softmax(n: _Node, dtype):
    shape = n.shape(0)
    if shape is None or _axes([n.attr("axis", -1)], len(shape)) is None:
        return dtype, None
    return dtype, shape


def _cast(n: _Node, dtype):
    return ir.DataType(n.attr("to")), n.shape(0)


def _constant(n: _Node, dtype):
    for name, a in n.node.attributes.items():
        if name == "value":
            return a.value.dtype, tuple(a.value.shape)
        if name in _CONSTANT_ATTRS:
            dtype, listed = _CONSTANT_ATTRS[name]
            return dtype, (len(a.value),) if listed else ()
    return None, None


_CONSTANT_ATTRS = {"value_float": (ir.DataType.FLOAT, False), "value_floats": (ir.DataType.FLOAT, True),
                   "value_int": (ir.DataType.INT64, False), "value_ints": (ir.DataType.INT64, True),
                   "value_string": (ir.DataType.STRING, False), "value_strings": (ir.DataType.STRING, True)}


def _constant_of_shape(n: _Node, dtype):
    value = n.attr("value")
    dtype = ir.DataType.FLOAT if value is None else value.dtype
    dims = n.const(0)
    return dtype, None if dims is None else tuple(int(d) for d in dims)


def _shape(n: _Node, dtype):
    shape = n.shape(0)
    if shape is None:
        return dtype, None
    return dtype, (len(range(len(shape))[n.attr("start", 0):n.attr("end")]),)


def _size(n: _Node, dtype):
    return dtype, ()


def _reshape(n: _Node, dtype):
    target, shape = n.const(1), n.shape(0)
    if target is None:
        return dtype, None
    out: list[Dim] = []
    minus = None
    for i, t in enumerate(int(t) for t in target.reshape(-1)):
        if t == -1 and minus is None:
            minus = i
            out.append(None)
        elif t == 0 and not n.attr("allowzero", 0):
            if shape is None or i >= len(shape):
                return dtype, None
            out.append(shape[i])
        elif t >= 0:
            out.append(t)
        else:
            return dtype, None
    if minus is not None:
        rest = out[:minus] + out[minus + 1:]
        if shape is None or not all(isinstance(d, int) for d in (*shape, *rest)):
            return dtype, None
        total, part = math.prod(shape), math.prod(rest)
        if part == 0 or total % part:
            return dtype, None
        out[minus] = total // part
    return dtype, tuple(out)


def _transpose(n: _Node, dtype):
    shape = n.shape(0)
    if shape is None:
        return dtype, None
    perm = n.attr("perm") or list(range(len(shape)))[::-1]
    if sorted(perm) != list(range(len(shape))):
        return dtype, None
    return dtype, tuple(shape[p] for p in perm)


def _unsqueeze(n: _Node, dtype):
    shape, axes = n.shape(0), n.axes()
    if shape is None or not axes:
        return dtype, None
    axes = _axes(axes, len(shape) + len(axes))
    if axes is None:
        return dtype, None
    rest = iter(shape)
    return dtype, tuple(1 if i in axes else next(rest) for i in range(len(shape) + len(axes)))


def _squeeze(n: _Node, dtype):
    shape, axes = n.shape(0), n.axes()
    if shape is None or axes is False:
        return dtype, None
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
        if not all(isinstance(d, int) for d in shape):
            return dtype, None
    axes = _axes(axes, len(shape))
    if axes is None or any(shape[a] != 1 for a in axes):
        return dtype, None
    return dtype, tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce(n: _Node, dtype):
    shape, axes = n.shape(0), n.axes()
    if shape is None:
        return dtype, None
    if axes is False:  # computed axes: keepdims keeps the rank, each dim itself or 1 (onnx infers nothing)
        return dtype, tuple(1 if d == 1 else None for d in shape) if n.attr("keepdims", 1) else None
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            return dtype, shape
        axes = range(len(shape))
    axes = _axes(axes, len(shape))
    if axes is None:
        return dtype, None
    if n.attr("keepdims", 1):
        return dtype, tuple(1 if i in axes else d for i, d in enumerate(shape))
    return dtype, tuple(d for i, d in enumerate(shape) if i not in axes)


def _concat(n: _Node, dtype):
    shapes = n.shapes()
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return dtype, None
    axis = n.attr("axis")
    axis = None if axis is None else _axes([axis], len(shapes[0]))
    if axis is None:
        return dtype, None
    out: list[Dim] = []
    for i, dims in enumerate(zip(*shapes)):
        fixed = {d for d in dims if isinstance(d, int)}
        if i == axis[0]:
            out.append(dims[0] if len(dims) == 1 else sum(dims) if all(isinstance(d, int) for d in dims) else None)
        elif len(fixed) > 1:
            raise InferenceError(f"dims differ on axis {i} ({' vs '.join(map(str, sorted(fixed)))})")
        else:
            out.append(fixed.pop() if fixed else next((d for d in dims if d is not None), None))
    return dtype, tuple(out)


def _slice(n: _Node, dtype):
    shape = n.shape(0)
    args = [n.const(i) for i in range(1, 5)]
    if not shape or any(a is None and i < len(n.node.inputs) and n.node.inputs[i] is not None
                            for i, a in enumerate(args, 1)):
        return dtype, None
    starts, ends, axes, steps = ([int(v) for v in a.reshape(-1)] if a is not None else None for a in args)
    axes = _axes(range(len(starts)) if axes is None else axes, len(shape))
    steps = steps or [1] * len(starts)
    if axes is None or not len(starts) == len(ends) == len(axes) == len(steps) or 0 in steps:
        return dtype, None
    out = list(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        if not isinstance(shape[axis], int):
            return dtype, None
        out[axis] = _slice_length(shape[axis], start, end, step)
    return dtype, tuple(out)


def _pad(n: _Node, dtype):
    """Pad by constant pads over all axes (opset 11+; with an ``axes`` input, left to onnx): a
    dim grows by its two pads; a symbolic dim padded leaves the shape unknown."""
    shape, pads = n.shape(0), n.const(1)
    if shape is None or pads is None or (len(n.node.inputs) > 3 and n.node.inputs[3] is not None):
        return dtype, None
    pads = [int(p) for p in pads.reshape(-1)]
    if len(pads) != 2 * len(shape):
        return dtype, None
    begin, end = pads[:len(shape)], pads[len(shape):]
    if any(not isinstance(d, int) and (b or e) for d, b, e in zip(shape, begin, end)):
        return dtype, None  # (onnx keeps a padded symbolic dim's name)
    return dtype, tuple(d + b + e if b or e else d for d, b, e in zip(shape, begin, end))


def _slice_length(dim: int, start: int, end: int, step: int) -> int:
    """As ONNX's Slice counts (unlike Python's, a negative step clamps the start to [0, dim-1])."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return max(0, -((start - end) // step))


def _matmul(n: _Node, dtype):
    a, b = n.shape(0), n.shape(1)
    if not a or not b:
        return dtype, None
    a2, b2 = (1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b
    _inner(a2[-1], b2[-2])
    batch = broadcast(a2[:-2], b2[:-2])
    return dtype, (*batch, *a2[-2:-1][:len(a) - 1], *b2[-1:][:len(b) - 1])


def _gemm(n: _Node, dtype):
    a, b = n.shape(0), n.shape(1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return dtype, None
    m, k = a[::-1] if n.attr("transA", 0) else a
    k2, cols = b[::-1] if n.attr("transB", 0) else b
    _inner(k, k2)
    return dtype, (m, cols)


def _gather(n: _Node, dtype):
    data, indices = n.shape(0), n.shape(1)
    if data is None or indices is None:
        return dtype, None
    axis = _axes([n.attr("axis", 0)], len(data))
    if axis is None:
        return dtype, None
    return dtype, (*data[:axis[0]], *indices, *data[axis[0] + 1:])


def _expand(n: _Node, dtype):
    target = n.const(1)
    if target is None:
        return dtype, None
    return dtype, broadcast(n.shape(0), tuple(int(d) for d in target))


def _einsum(n: _Node, dtype):
    """Einsum without "...": each letter's dim broadcast over its operands, as numpy, torch and
    onnxruntime do (onnx 1.23's inference takes the first operand's: ``ij,ij->ij`` of [2, 1] and
    [2, 3] is [2, 1] there, [2, 3] when run); the implicit output is the letters used once, in
    alphabetical order."""
    eq = n.attr("equation", "").replace(" ", "")
    lhs, out = eq.split("->") if "->" in eq else (eq, None)
    terms, shapes = lhs.split(","), n.shapes()
    if "." in eq or len(terms) != len(shapes) or any(s is None or len(s) != len(t) for s, t in zip(shapes, terms)):
        return dtype, None
    letters = [c for t in terms for c in t]
    if out is None:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if not set(out) <= set(letters):
        return dtype, None
    return dtype, tuple(broadcast(*[(s[t.index(c)],) for t, s in zip(terms, shapes) if c in t])[0] for c in out)


def ceil_adds_nothing(dims: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                      dilations: Sequence[int], pads: Sequence[int]) -> bool:
    """Whether ceil_mode slides the same windows as floor mode over the static spatial ``dims``
    (``pads``: begins, then ends): its extra window would start in the end padding, or none fits.
    Those windows lie inside the padded input, so a pool may drop its ceil_mode, which onnx's and
    onnxruntime's own inference miscount there (``_window``)."""
    n = len(dims)
    axes = [(d, kernel[i], strides[i], dilations[i], pads[i], pads[n + i]) for i, d in enumerate(dims)]
    return all(windows(*a, 1) == windows(*a, 0) for a in axes)


def _window(n: _Node, dtype):
    """Conv and the pools, explicit pads: ``(N, C, *sizes)`` to ``(N, C_out, *windows)``, a size
    giving ``floor((size + pads - dilation * (kernel - 1) - 1) / stride) + 1`` windows. With
    ``ceil_mode`` it rounds up, then drops a last window that would start in the right padding, as
    the ONNX spec, onnxruntime and PyTorch count (onnx 1.23's inference keeps it: 4 windows for
    7 wide, kernel 4, stride 3, pads 2, not 3). No window raises (onnx answers 0 or less)."""
    x, conv = n.shape(0), n.node.op_type == "Conv"
    w = n.shape(1) if conv else None
    if x is None or len(x) < 3 or n.attr("auto_pad", "NOTSET") != "NOTSET":
        return dtype, None
    nd, channels = len(x) - 2, x[1]
    if conv:  # onnx checks the input channels against the weight's
        if w is None or len(w) != len(x) or not isinstance(x[1], int) or x[1] != w[1] * n.attr("group", 1):
            return dtype, None
        channels = w[0]
    kernel = n.attr("kernel_shape") or (w[2:] if conv else None)
    strides, dilations = n.attr("strides") or [1] * nd, n.attr("dilations") or [1] * nd
    pads = n.attr("pads") or [0] * (2 * nd)
    if (kernel is None or not all(isinstance(k, int) for k in kernel) or len(pads) != 2 * nd
            or not len(kernel) == len(strides) == len(dilations) == nd or min(*kernel, *strides, *dilations) < 1
            or min(pads) < 0):
        return dtype, None
    out: list[Dim] = [x[0], channels]
    for i, size in enumerate(x[2:]):
        if not isinstance(size, int):
            out.append(None)
            continue
        count = windows(size, kernel[i], strides[i], dilations[i], pads[i], pads[nd + i], n.attr("ceil_mode", 0))
        if count < 1:
            raise InferenceError(f"output size is too small: the window ({kernel[i]} wide, dilation {dilations[i]}) "
                                 f"does not fit axis {i + 2} (size {size}, pads {pads[i]} and {pads[nd + i]})")
        out.append(count)
    return dtype, tuple(out)


_Rule = Callable[[_Node, "ir.DataType | None"], Result]

RULES: dict[str, _Rule] = {
    **dict.fromkeys(["Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor",
                     "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Where"], _elementwise),
    **dict.fromkeys(["Identity", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Relu", "Tanh", "Sigmoid",
                     "Erf", "Sin", "Cos", "Sinh", "Cosh", "Floor", "Ceil", "Round", "Sign", "Not", "IsNaN",
                     "IsInf", "Softplus", "LeakyRelu", "Elu", "HardSigmoid", "Gelu", "Clip", "CastLike"], _same),
    **dict.fromkeys(["Softmax", "LogSoftmax"], _softmax),
    **dict.fromkeys(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                     "ReduceL1", "ReduceL2", "ReduceLogSumExp"], _reduce),
    "Cast": _cast, "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Shape": _shape, "Size": _size,
    "Reshape": _reshape, "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Concat": _concat, "Slice": _slice, "Pad": _pad, "MatMul": _matmul, "Gemm": _gemm, "Gather": _gather,
    "Expand": _expand, "Einsum": _einsum, **dict.fromkeys(["Conv", "MaxPool", "AveragePool", "LpPool"], _window),
}
# where onnx 1.23's inference gives a shape the op does not have when run (see ``_window``, ``_einsum``)
_ONNX_MISCOUNTS = frozenset({"MaxPool", "AveragePool", "LpPool", "Einsum"})


def correct_onnx_inference(graph: ir.Graph, opset: int) -> int:
    """Where onnx 1.23's inference is wrong or silent, what the ops compute when run: the outputs
    of the ops it miscounts (``_ONNX_MISCOUNTS``) get the shapes their rules find, and the values
    computed from those the shapes ``infer`` then finds; LayerNormalization's Mean and InvStdDev,
    which it leaves untyped with ``stash_type=0`` (the spec names no dtype 0), get x's dtype, the
    one the numpy backend computes them in (onnx's reference refuses stash_type 0; onnxruntime
    infers no type for them, and runs a float32 one typed so). In place, main graph only;
    returns how many values changed."""
    changed: set[ir.Value] = set()
    for node in graph:
        if node.op_type == "LayerNormalization" and node.attributes.get_int("stash_type", 1) == 0:
            for value in node.outputs[1:]:
                if value.dtype in (None, ir.DataType.UNDEFINED) and node.inputs[0].dtype is not None:
                    value.dtype = node.inputs[0].dtype
                    changed.add(value)
        if node.domain not in ("", "ai.onnx") or not (
                node.op_type in _ONNX_MISCOUNTS or any(v in changed for v in node.inputs)):
            continue
        try:
            results = infer(node, opset, fallback=node.op_type not in _ONNX_MISCOUNTS)
        except InferenceError:
            results = [(None, None)] * len(node.outputs)
        for value, (dtype, shape) in zip(node.outputs, results):
            if shape is not None and shape != static_shape(value):
                value.shape = ir.Shape(list(shape))
                changed.add(value)
            if value.dtype in (None, ir.DataType.UNDEFINED) and dtype is not None:  # (where onnx failed)
                value.dtype = dtype
                changed.add(value)
    return len(changed)


# -- onnx's per-node inference ------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _opset_imports(opset: int) -> list:
    return [onnx.helper.make_opsetid("", opset)]


def _onnx(node: ir.Node, opset: int, const) -> list[Result]:
    types, data = {}, {}
    for v in node.inputs:
        if v is None:
            continue
        shape = static_shape(v)
        types[v.name] = onnx.helper.make_tensor_type_proto(
            v.dtype if v.dtype is not None else onnx.TensorProto.FLOAT,
            None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape])
        array = const(v)
        if array is not None:
            data[v.name] = onnx.numpy_helper.from_array(array, v.name)
    try:
        result = onnx.shape_inference.infer_node_outputs(onnx.defs.get_schema(node.op_type, opset, ""),
                                                         ir.serde.serialize_node(node), types, data,
                                                         opset_imports=_opset_imports(opset))
    except Exception as exc:  # onnx raises InferenceError, ValidationError, SchemaError
        msg = str(exc).replace("[ShapeInferenceError] ", "").replace("[TypeInferenceError] ", "").strip()
        raise InferenceError(msg) from None
    out = []
    for value in node.outputs:
        tp = result.get(value.name)
        if tp is None or not tp.HasField("tensor_type"):
            out.append((None, None))
            continue
        tt = tp.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        out.append((ir.DataType(tt.elem_type) if tt.elem_type else None, shape))
    return out
