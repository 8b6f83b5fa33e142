"""``gc.vmap``'s batching rules: a node of the per-example body rewritten on batched values (the mapped
dim first), as torch's vmap batching rules. A rule takes the node and its inputs, each a Tensor and
whether it is batched, and returns its outputs likewise; ``NoRule`` (no rule for the op, or not for
these inputs: a mapped shape, a mapped index into mapped data) sends the whole body to a ``Scan``."""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import onnx_ir as ir

from graphc.dsl import control, ops
from graphc.dsl.builder import Builder
from graphc.dsl.tensor import Tensor
from graphc.model import CHECKPOINT_KEY, SOURCE_KEY
from graphc.passes.emit import AXES_AS_INPUT
from graphc.passes.values import AUTOGRAD_KEY, autograd_function_label, const_array, draws_random, static_shape

__all__ = ["RAGGED", "RULES", "Arg", "Batching", "NoRule", "as_args", "as_batched", "const_of", "has_random", "hoist",
           "node_attrs", "only_first", "rank_of", "reemit", "rewrite", "shift_axis"]


class NoRule(Exception):
    """The body has a node no batching rule rewrites."""


class Arg(NamedTuple):
    t: Tensor
    batched: bool


class Batching:
    """What the rules share: the builder, the mapped size, a batched Tensor to read it from at run
    time, the ``randomness`` mode, and ``ragged``: the batched values (by id) whose dim 1 is stacked to
    the longest of a length that differs per example, with those lengths (``(B,)`` int64)."""

    def __init__(self, builder: Builder, size: Any, ref: Tensor, randomness: str):
        self.builder, self.size, self.ref, self.randomness = builder, size, ref, randomness
        self.made: dict[int, Arg] = {}
        self.ragged: dict[int, Tensor] = {}
        self._shapes: dict[int, Tensor] = {}  # by Scope.id: one made in a body is read there and in its bodies only

    def batch_shape(self) -> Tensor:
        """``[B]``, int64."""
        if isinstance(self.size, int):
            return ops.const_i64([self.size])
        made = next((self._shapes[s.id] for s in reversed(self.builder.scopes) if s.id in self._shapes), None)
        if made is None:
            made = self._shapes[self.builder.scope.id] = ops.emit("Shape", [self.ref], {"start": 0, "end": 1})
        return made

    def expand(self, t: Tensor) -> Tensor:
        """``t`` repeated along a new dim 0 of the mapped size."""
        ones = ops.const_i64([1] * t.ndim)
        return ops.emit("Expand", [ops.unsqueeze(t, [0]), ops.concat([self.batch_shape(), ones])])


def hoist(builder: Builder, node: ir.Node) -> None:
    """Record a traced body ``node`` that computes the same for every example in the current scope,
    evaluated where that scope is eager."""
    builder.scope.nodes.append(node)
    if builder.eager:
        control.record(builder, node)


def has_random(node: ir.Node) -> bool:
    """``node`` draws random numbers, or a node of its subgraphs (at any depth) does."""
    return draws_random(node) or any(has_random(inner) for attr in node.attributes.values()
                                     if isinstance(attr.value, ir.Graph) for inner in attr.value)


def rewrite(b: Batching, nodes: list[ir.Node], batched: set[int], env: dict[int, Tensor],
            outputs: list[ir.Value], outer: dict[int, Arg] | None = None) -> list[tuple[Tensor, bool]]:
    """The body's ``outputs`` (Tensor, batched) with its ``batched`` nodes rewritten by the rules and the
    others hoisted; ``env`` maps the body's inputs to the batched Tensors, ``outer`` (a subgraph's
    rewrite) the values of the graph around it as that graph's rewrite made them. A rule finds the
    values made so far as ``b.made``."""
    args: dict[int, Arg] = {**(outer or {}), **{k: Arg(t, True) for k, t in env.items()}}

    def arg(value: ir.Value | None) -> Arg | None:
        if value is None:
            return None
        return args.get(id(value)) or Arg(Tensor(value, b.builder.eager_value(value)), False)

    for node in nodes:
        if id(node) not in batched:
            hoist(b.builder, node)
            continue
        if (record := node.metadata_props.get(AUTOGRAD_KEY)) is not None:  # its backward binds the body's values
            raise NoRule(f"the output of gc.autograd.Function {autograd_function_label(json.loads(record))}, whose "
                         "backward runs per example in the Scan")
        inputs = [arg(v) for v in node.inputs]
        if node.op_type == "Constant" and "value" in node.attributes:  # known to the builder's inference
            args[id(node.outputs[0])] = Arg(ops.constant(node.attributes["value"].value.numpy()), False)
            continue
        scope = b.builder.scope
        made = len(scope.nodes)
        if not any(a is not None and a.batched for a in inputs) and not _own_per_example(node):
            # it reads only what is the same for every example (a mapped value's Shape or Size)
            args.update((id(v), r) for v, r in zip(node.outputs, as_args(reemit(node, [a and a.t for a in inputs]),
                                                                          False)))
            _join_region(node, scope.nodes[made:])
            continue
        rule, line = RULES.get(node.op_type), node.metadata_props.get(SOURCE_KEY, "?")
        if any(a is not None and id(a.t.value) in b.ragged for a in inputs):
            rule = RAGGED.get(node.op_type)
            if rule is None:
                raise NoRule(f"{node.op_type} at {line} (it reads a Loop's per-step outputs, of a number of steps "
                             f"that differs per example)")
        if rule is None:
            raise NoRule(f"{node.op_type} at {line}")
        b.made = args
        try:
            results = rule(b, node, inputs)
        except NoRule as exc:
            raise NoRule(f"{node.op_type} at {line} ({exc})") from None
        _join_region(node, scope.nodes[made:])
        args.update((id(v), r) for v, r in zip(node.outputs, results))
    found = [tuple(arg(v)) for v in outputs]
    if any(id(t.value) in b.ragged for t, _ in found):
        raise NoRule("a Loop's per-step outputs, of a number of steps that differs per example, as an output")
    return found


# -- helpers ---------------------------------------------------------------------------------------


def _join_region(node: ir.Node, made: list[ir.Node]) -> None:
    """The nodes ``made`` by batching ``node`` join its checkpoint region (``gc.utils.checkpoint``), if any."""
    region = node.metadata_props.get(CHECKPOINT_KEY)
    if region is not None:
        for new in made:
            new.metadata_props[CHECKPOINT_KEY] = region



def _own_per_example(node: ir.Node) -> bool:
    """``node`` may differ per example whatever its inputs: it draws random numbers, or its subgraphs
    may read mapped values."""
    return draws_random(node) or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                                     for a in node.attributes.values())


def rank_of(value: ir.Value, a: Arg | None = None) -> int:
    """The per-example rank of ``value``: the trace's, else (where it did not infer it) that of its
    rewritten form ``a``."""
    shape = static_shape(value)
    if shape is None and a is not None and a.t.shape is not None:
        return a.t.ndim - a.batched
    if shape is None:
        raise NoRule("unknown rank")
    return len(shape)


def const_of(b: Batching, value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    found = b.builder.known(value)
    return const_array(value) if found is None else found


def node_attrs(node: ir.Node, **changed: Any) -> dict:
    return {a.name: a.value for a in node.attributes.values()} | changed


def reemit(node: ir.Node, inputs: list[Tensor | None], attrs: dict | None = None) -> list[Tensor]:
    """``node``'s op again on ``inputs`` (with ``attrs``, else its own), its metadata (source line,
    stop-gradient mark) kept."""
    source = node.metadata_props.get(SOURCE_KEY)
    outs = ops.emit(node.op_type, inputs, node_attrs(node) if attrs is None else attrs, len(node.outputs),
                    source=source)
    outs = outs if isinstance(outs, list) else [outs]
    made = outs[0].value.producer()
    for key, value in node.metadata_props.items():
        made.metadata_props.setdefault(key, value)
    return outs


def as_args(outs: list[Tensor], flag: bool = True) -> list[Arg]:
    return [Arg(t, flag) for t in outs]


def _pad(t: Tensor, rank: int, to: int) -> Tensor:
    """A batched ``t`` of per-example rank ``rank`` as rank ``to``: size-1 dims after the mapped one."""
    return t if rank >= to else ops.unsqueeze(t, list(range(1, 1 + to - rank)))


def only_first(args: list[Arg | None]) -> None:
    if not args[0].batched or any(a is not None and a.batched for a in args[1:]):
        raise NoRule("a mapped operand other than the data")


def shift_axis(axis: int, rank: int) -> int:
    """A per-example ``axis`` of a rank-``rank`` value, on the batched value."""
    return axis % rank + 1 if rank else 1


def as_batched(b: Batching, a: Arg) -> Tensor:
    return a.t if a.batched else b.expand(a.t)


# -- rules -----------------------------------------------------------------------------------------


def _same(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Ops that act on each element, or on the last dims only (``Trilu``), of their first input."""
    only_first(args)
    return as_args(reemit(node, [a and a.t for a in args]))


def _cast_like(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    return as_args(reemit(node, [args[0].t, args[1].t]), args[0].batched)


def _broadcast(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Broadcasting ops: batched operands padded to the highest per-example rank."""
    ranks = [None if a is None else rank_of(v, a) for a, v in zip(args, node.inputs)]
    top = max(r for r in ranks if r is not None)
    ins = [None if a is None else _pad(a.t, r, top) if a.batched else a.t for a, r in zip(args, ranks)]
    return as_args(reemit(node, ins))


def _matmul_values(a: Arg, b_: Arg, ra: int, rb: int, source: str | None) -> Tensor:
    """``a @ b`` per example (per-example ranks ``ra``, ``rb``): a mapped vector as a one-row (one-column)
    matrix, the batch dims aligned, the added dims dropped after."""
    x, y, ra2, rb2 = a.t, b_.t, ra, rb
    if a.batched and ra == 1:
        x, ra2 = ops.unsqueeze(x, [1]), 2
    if b_.batched and rb == 1:
        y, rb2 = ops.unsqueeze(y, [2]), 2
    lead = max(ra2 - 2 if ra2 > 1 else 0, rb2 - 2 if rb2 > 1 else 0)
    x = _pad(x, ra2, lead + 2) if a.batched else x
    y = _pad(y, rb2, lead + 2) if b_.batched else y
    out = ops.emit("MatMul", [x, y], source=source)
    drop = ([-1] if b_.batched and rb == 1 else []) + ([-2 if rb2 > 1 else -1] if a.batched and ra == 1 else [])
    return ops.emit("Squeeze", [out, ops.const_i64(sorted(drop))]) if drop else out


def _matmul(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    ra, rb = rank_of(node.inputs[0], args[0]), rank_of(node.inputs[1], args[1])
    return [Arg(_matmul_values(args[0], args[1], ra, rb, node.metadata_props.get(SOURCE_KEY)), True)]


def _gemm(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """``alpha A' B' + beta C`` as a MatMul of the batched operands (A', B': transposed where asked)."""
    attrs = node_attrs(node)
    a, b_, c = args[0], args[1], args[2] if len(args) > 2 else None
    if attrs.get("transA"):
        a = Arg(ops.transpose(a.t, [0, 2, 1] if a.batched else [1, 0]), a.batched)
    if attrs.get("transB"):
        b_ = Arg(ops.transpose(b_.t, [0, 2, 1] if b_.batched else [1, 0]), b_.batched)
    y = _matmul_values(a, b_, 2, 2, node.metadata_props.get(SOURCE_KEY))
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = y * ops.scalar(alpha, y)
    if c is not None:
        ct = c.t if beta == 1.0 else c.t * ops.scalar(beta, c.t)
        y = y + (_pad(ct, rank_of(node.inputs[2], args[2]), 2) if c.batched else ct)
    return [Arg(y, True)]


def _reduce(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Reduce*: the per-example axes shifted past the mapped dim (none given: all of the example's)."""
    only_first(args)
    attrs = node_attrs(node)
    in_attr = b.builder.opset < AXES_AS_INPUT.get(node.op_type, 18)
    no_axes = (not attrs.get("axes")) if in_attr else len(node.inputs) < 2 or node.inputs[1] is None
    if no_axes and not attrs.get("keepdims", 1) and static_shape(node.inputs[0]) is None and args[0].t.shape is None:
        # all of an example of unknown rank: its values as one axis
        flat = ops.emit("Reshape", [args[0].t, ops.const_i64([0, -1])])
        return as_args(reemit(node, [flat], node_attrs(node, axes=[1])) if in_attr else
                       reemit(node, [flat, ops.const_i64([1])]))
    rank = rank_of(node.inputs[0], args[0])
    given = attrs.get("axes") if in_attr else const_of(b, node.inputs[1]) if len(node.inputs) > 1 else None
    if not in_attr and len(node.inputs) > 1 and node.inputs[1] is not None and given is None:
        count = static_shape(node.inputs[1])
        some = count is not None and isinstance(count[0], int) and count[0] > 0
        if not (some or attrs.get("noop_with_empty_axes")):  # no axes: all of the example's
            raise NoRule("axes not constant, and maybe none")
        shifted = ops.emit("Mod", [args[1].t, ops.const_i64([rank])]) + ops.const_i64([1])  # computed axes
        return as_args(reemit(node, [args[0].t, shifted]))
    axes = [int(a) for a in np.ravel(given)] if given is not None else []
    if not axes:
        if attrs.get("noop_with_empty_axes"):
            return [Arg(args[0].t, True)]
        axes = list(range(rank))
    axes = [shift_axis(a, rank) for a in axes]
    if in_attr:
        return as_args(reemit(node, [args[0].t], node_attrs(node, axes=axes)))  # before axes were an input
    return as_args(reemit(node, [args[0].t, ops.const_i64(axes)]))


def _axis_attr(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Ops of one ``axis`` attribute over their first input (Softmax, ArgMax, TopK, Split, ...)."""
    only_first(args)
    rank, attrs = rank_of(node.inputs[0], args[0]), node_attrs(node)
    default = -1 if node.op_type in ("Softmax", "LogSoftmax", "Hardmax", "TopK", "LpNormalization") else 0
    axis = attrs.get("axis", default)
    if node.op_type == "LayerNormalization" and axis < 0:
        return as_args(reemit(node, [a and a.t for a in args]))
    return as_args(reemit(node, [a and a.t for a in args], node_attrs(node, axis=shift_axis(axis, rank))))


def _cumsum(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    only_first(args)
    axis = const_of(b, node.inputs[1])
    if axis is None:
        raise NoRule("axis not constant")
    return as_args(reemit(node, [args[0].t, ops.const_i64([shift_axis(int(np.ravel(axis)[0]), rank_of(node.inputs[0], args[0]))])]))


def _flatten(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    shape = static_shape(node.inputs[0])
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise NoRule("Flatten of dims not static")
    axis = node_attrs(node).get("axis", 1) % (len(shape) + 1) if shape else 0
    dims = [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))]
    return [Arg(ops.emit("Reshape", [args[0].t, ops.const_i64([0, *dims])]), True)]


def _transpose(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    rank = rank_of(node.inputs[0], args[0])
    perm = node_attrs(node).get("perm") or list(range(rank))[::-1]
    return as_args(reemit(node, [args[0].t], {"perm": [0, *(p + 1 for p in perm)]}))


def _reshape(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """The target shape after a 0 (the mapped dim copied), or with ``allowzero`` (where a 0 is a size)
    after the mapped size."""
    only_first(args)
    lead = b.batch_shape() if node_attrs(node).get("allowzero") else ops.const_i64([0])
    return as_args(reemit(node, [args[0].t, ops.concat([lead, args[1].t])]))


def _unsqueeze(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    only_first(args)
    axes = const_of(b, node.inputs[1])
    if axes is None:
        raise NoRule("axes not constant")
    out_rank = rank_of(node.inputs[0], args[0]) + axes.size
    return as_args(reemit(node, [args[0].t, ops.const_i64([shift_axis(int(a), out_rank) for a in axes.ravel()])]))


def _squeeze(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    only_first(args)
    shape = static_shape(node.inputs[0])
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const_of(b, node.inputs[1])
        if axes is None:
            raise NoRule("axes not constant")
        axes = [int(a) % rank_of(node.inputs[0], args[0]) for a in axes.ravel()]
    elif shape is not None and all(isinstance(d, int) for d in shape):
        axes = [i for i, d in enumerate(shape) if d == 1]
    else:
        raise NoRule("Squeeze of dims not static")
    return as_args(reemit(node, [args[0].t, ops.const_i64([a + 1 for a in axes])]))


def _shape(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """The example's shape, the same for all: not batched."""
    attrs = node_attrs(node)
    start, end = attrs.get("start", 0), attrs.get("end")
    changed = {"start": start + 1 if start >= 0 else start}
    if end is not None:
        changed["end"] = end + 1 if end >= 0 else end
    return as_args(reemit(node, [args[0].t], changed), False)


def _size(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    dims = ops.emit("Shape", [args[0].t], {"start": 1})
    return [Arg(ops.emit("ReduceProd", [dims], {"keepdims": 0}) if b.builder.opset < 18 else
                ops.emit("ReduceProd", [dims, ops.const_i64([0])], {"keepdims": 0}), False)]


def _concat(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    rank = rank_of(node.inputs[0], args[0])
    axis = shift_axis(node_attrs(node)["axis"], rank)
    return as_args(reemit(node, [as_batched(b, a) for a in args], {"axis": axis}))


def _slice(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    only_first(args)
    rank, ins = rank_of(node.inputs[0], args[0]), [a and a.t for a in args]
    if len(ins) > 3 and ins[3] is not None:
        axes = const_of(b, node.inputs[3])
        if axes is None:
            raise NoRule("axes not constant")
        axes = [shift_axis(int(a), rank) for a in axes.ravel()]
    else:
        count = static_shape(node.inputs[1])
        if count is None or not isinstance(count[0], int):
            raise NoRule("number of sliced axes not static")
        axes = list(range(1, count[0] + 1))
    ins = ins + [None] * (5 - len(ins))
    ins[3] = ops.const_i64(axes)
    return as_args(reemit(node, ins[:5] if ins[4] is not None else ins[:4]))


_ROW = 4  # a Gather of batched data copying rows of at most this many values moves the mapped dim innermost


def _gather(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Batched data: the axis shifted; batched indices into data the same for all: the mapped dim
    moved to the front."""
    data, idx = args
    rank = rank_of(node.inputs[0], args[0])
    axis = node_attrs(node).get("axis", 0) % rank
    if data.batched and not idx.batched:
        shape = static_shape(node.inputs[0])
        if shape is None or not all(isinstance(d, int) for d in shape) or int(np.prod(shape[axis + 1:])) > _ROW:
            return as_args(reemit(node, [data.t, idx.t], {"axis": axis + 1}))
        # rows of a few values: the mapped dim innermost, so that each index copies a row of B values
        out = reemit(node, [ops.transpose(data.t, [*range(1, rank + 1), 0]), idx.t], {"axis": axis})[0]
        return [Arg(ops.transpose(out, [out.ndim - 1, *range(out.ndim - 1)]), True)]
    if data.batched:
        raise NoRule("mapped indices into mapped data")
    out = reemit(node, [data.t, idx.t], {"axis": axis})[0]
    if axis:
        out = ops.transpose(out, [axis, *(i for i in range(out.ndim) if i != axis)])
    return [Arg(out, True)]


def _elements(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """GatherElements/ScatterElements: operands of one rank, each batched, the axis shifted."""
    axis = shift_axis(node_attrs(node).get("axis", 0), rank_of(node.inputs[0], args[0]))
    return as_args(reemit(node, [as_batched(b, a) for a in args], node_attrs(node, axis=axis)))


def _expand(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    only_first(args)
    count = static_shape(node.inputs[1])
    if count is None or not isinstance(count[0], int):
        raise NoRule("Expand to a shape of unknown length")
    rank = max(rank_of(node.inputs[0], args[0]), count[0])
    ones = ops.const_i64([1] * (rank + 1 - count[0]))
    return as_args(reemit(node, [_pad(args[0].t, rank_of(node.inputs[0], args[0]), rank), ops.concat([ones, args[1].t])]))


def _einsum(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """A letter the equation does not use for the mapped dim, on the batched operands and the result."""
    equation = node_attrs(node)["equation"].replace(" ", "")
    if "->" not in equation:
        raise NoRule("implicit einsum output")
    lhs, out = equation.split("->")
    letter = next(c for c in string.ascii_letters if c not in equation)
    terms = [letter + t if a.batched else t for t, a in zip(lhs.split(","), args)]
    return as_args(reemit(node, [a.t for a in args], {"equation": f"{','.join(terms)}->{letter}{out}"}))


_UNARY = ("Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Cast", "Ceil", "Celu", "Clip",
          "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "IsInf",
          "IsNaN", "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Shrink",
          "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
          "Trilu")
_BROADCAST = ("Add", "And", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Equal", "Greater",
              "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow", "Sub", "Sum",
              "Where", "Xor")
_REDUCE = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
           "ReduceProd", "ReduceSum", "ReduceSumSquare")
_AXIS = ("ArgMax", "ArgMin", "Softmax", "LogSoftmax", "Hardmax", "TopK", "Split", "LayerNormalization",
         "LpNormalization")

# The rules for ops that read a ``ragged`` value (``vmap_rules_ragged``); any other op has none.
RAGGED: dict[str, Callable[[Batching, ir.Node, list], list[Arg]]] = {}

RULES: dict[str, Callable[[Batching, ir.Node, list], list[Arg]]] = {
    **dict.fromkeys(_UNARY, _same), **dict.fromkeys(_BROADCAST, _broadcast), **dict.fromkeys(_REDUCE, _reduce),
    **dict.fromkeys(_AXIS, _axis_attr),
    "CastLike": _cast_like, "MatMul": _matmul, "Gemm": _gemm, "CumSum": _cumsum, "Flatten": _flatten,
    "Transpose": _transpose, "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Shape": _shape,
    "Size": _size, "Concat": _concat, "Slice": _slice, "Gather": _gather, "GatherElements": _elements,
    "ScatterElements": _elements, "Expand": _expand, "Einsum": _einsum,
}
