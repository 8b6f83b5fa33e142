"""Level 2's shape-subgraph folding: ``Shape -> Gather/Slice/Concat/... -> Reshape`` chains
evaluated from the static dims they read, with symbolic dims kept symbolic."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.optimize.pipeline import Declared, all_nodes
from graphc.passes.optimize.rules import int64_initializer
from graphc.passes.values import fixed_array

__all__ = ["ShapeFolding", "same_shape", "shape_value"]

# A dim of a shape tensor: an int, or a key for a dim unknown until run time. Two keys are equal
# only when the dims are equal for every input: the same named symbol, or the same (value, axis).
Dim = object


def _dim_key(value: ir.Value, axis: int) -> Dim:
    dim = value.shape[axis]
    if isinstance(dim, int):
        return dim
    return ("sym", dim.value) if dim.value is not None else ("dim", id(value), axis)


def same_shape(a: ir.Value, b: ir.Value) -> bool:
    """Shapes known to be equal for every input: same value, or same rank with each dim the same
    int or the same named symbol."""
    if a is b:
        return True
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(_dim_key(a, i) == _dim_key(b, i) for i in range(len(a.shape)))


def _ints(value: ir.Value | None) -> list[int] | None:
    array = fixed_array(value)
    if array is None or array.dtype.kind not in "iu" or array.ndim > 1:
        return None
    return [int(a) for a in array.reshape(-1)]


def shape_value(value: ir.Value | None, depth: int = 0, memo: dict | None = None) -> list[Dim] | None:
    """The elements of a 0/1-D int tensor that carries (part of) a shape, else None. ``memo``
    (value id -> result) spares re-tracing a chain that several shapes share; it stays valid
    while nodes are visited in order, as only values upstream of the visited node are traced."""
    if value is None or depth > 32:
        return None
    if memo is not None and id(value) in memo:
        return memo[id(value)]
    traced = _traced(value, depth, memo)
    result = traced if traced is not None else _opaque(value)
    if memo is not None:
        memo[id(value)] = result
    return result


def _traced(value: ir.Value, depth: int, memo: dict | None) -> list[Dim] | None:
    known = _ints(value)
    if known is not None:
        return known
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    op, ins = node.op_type, node.inputs
    if op == "Shape":
        x = ins[0]
        if x.shape is None:
            return None
        rank = len(x.shape)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", rank)
        return [_dim_key(x, i) for i in range(rank)[slice(start, end)]]
    if op in ("Cast", "Squeeze", "Unsqueeze", "Identity") and ins[0] is not None:
        to = node.attributes.get_int("to") if op == "Cast" else ir.DataType.INT64
        if to not in (ir.DataType.INT64, ir.DataType.INT32):
            return None
        source = shape_value(ins[0], depth + 1, memo)
        if to == ir.DataType.INT32 and source is not None and any(
                isinstance(d, int) and not -_INT32 <= d < _INT32 for d in source):
            return None
        return source
    if op == "Concat" and node.attributes.get_int("axis", 0) in (0, -1):  # 1-D: the same axis
        parts = [shape_value(v, depth + 1, memo) for v in ins]
        return None if any(p is None for p in parts) else [d for p in parts for d in p]
    if op == "Gather" and node.attributes.get_int("axis", 0) == 0:
        source, index = shape_value(ins[0], depth + 1, memo), _ints(ins[1])
        if source is None or index is None or not all(-len(source) <= i < len(source) for i in index):
            return None
        return [source[i] for i in index]
    if op == "Slice" and len(ins) >= 3:
        source = shape_value(ins[0], depth + 1, memo)
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else [0]
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1]
        if source is None or starts is None or ends is None or axes not in ([0], [-1]) or steps != [1]:
            return None
        return source[slice(starts[0], ends[0])]
    if op in _ARITHMETIC:
        a, b = shape_value(ins[0], depth + 1, memo), shape_value(ins[1], depth + 1, memo)
        if a is None or b is None or not all(isinstance(d, int) for d in a + b):
            return None
        if len(a) != len(b):  # a scalar or a 1-element operand broadcasts
            if min(len(a), len(b)) != 1:
                return None
            a, b = (a * len(b), b) if len(a) == 1 else (a, b * len(a))
        if op == "Div" and 0 in b:
            return None
        return [_ARITHMETIC[op](x, y) for x, y in zip(a, b)]
    return None


# Paddle2ONNX casts shapes to int32 and back: a run-time dim passes through as itself, which
# holds for every dim below 2**31 (a tensor with more elements than that along one axis, 8 GiB
# of float32 in one row, is beyond what such a graph computes right anyway: the cast wraps).
_INT32 = 2**31


def _trunc_div(a: int, b: int) -> int:
    """ONNX integer Div: the quotient truncated toward zero (C semantics), not Python's floor."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


# int64 elementwise ops on static dims (e.g. head_dim = embed // heads in attention exports)
_ARITHMETIC = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
               "Div": _trunc_div}


def _opaque(value: ir.Value) -> list[Dim] | None:
    """Elements computed in a way not followed here: their count is known from the value's
    static shape, each is a run-time dim equal to nothing else (it can still become the one -1
    of a Reshape)."""
    shape = value.shape
    if value.dtype != ir.DataType.INT64 or shape is None or len(shape) > 1:
        return None
    if len(shape) == 1 and not isinstance(shape[0], int):
        return None
    return [("opaque", id(value), i) for i in range(shape[0] if len(shape) else 1)]


def _reshape_target(node: ir.Node, dims: list[Dim]) -> list[int] | None:
    """A constant shape for ``Reshape(data, dims)`` with the same meaning, if one exists: a
    run-time dim equal to data's dim at the same axis becomes 0 ("copy", allowzero=0 only); one
    remaining run-time dim becomes -1 (inferred). Otherwise None."""
    data = node.inputs[0]
    allowzero = node.attributes.get_int("allowzero", 0)
    target: list[int | None] = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            target.append(d)
        elif not allowzero and data.shape is not None and i < len(data.shape) and _dim_key(data, i) == d:
            target.append(0)
        else:
            target.append(None)
    unknown = target.count(None)
    if unknown > 1 or (unknown == 1 and -1 in target) or (allowzero and 0 in target and unknown):
        return None
    return [-1 if t is None else t for t in target]


def _annotate_reshape(node: ir.Node, target: list[int]) -> None:
    """Record the output dims the constant shape now makes static (so a later ``Shape`` of this
    output folds too); the -1 dim keeps what was known about it."""
    out, data = node.outputs[0], node.inputs[0]
    old = list(out.shape) if out.shape is not None and len(out.shape) == len(target) else None
    dims = []
    for i, t in enumerate(target):
        if t > 0:
            dims.append(t)
        elif t == 0 and data.shape is not None and i < len(data.shape):
            dims.append(data.shape[i])
        else:
            dims.append(old[i] if old is not None else ir.SymbolicDim(None))
    out.shape = ir.Shape(dims)


class ShapeFolding(Declared, ir.passes.InPlacePass):
    """1. A shape-carrying int64 value (``Shape``, then ``Gather``/``Slice``/``Concat``/``Cast``
    (to int64, or int32 and back)/``Unsqueeze``/``Squeeze``/``Mul`` of them) whose elements are
    all static dims becomes a constant; onnxscript's folder misses e.g. a ``Gather`` without an
    explicit ``axis``.
    2. ``Reshape(x, s)`` with a computed s becomes ``Reshape(x, const)`` when s's run-time
    dims can be written as 0 (copy x's dim at that axis) or one -1 (inferred from the size), so
    the shape subgraph dies. Sound because the constant denotes the same shape for every input
    that satisfies the declared static and symbolic dims; symbolic dims are never fixed."""

    name = "ShapeFolding"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        memo: dict = {}
        for node in all_nodes(model.graph):
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Reshape" and _ints(node.inputs[1]) is None:
                dims = shape_value(node.inputs[1], memo=memo)
                target = None if dims is None else _reshape_target(node, dims)
                if target is not None:
                    node.replace_input_with(1, self._constant(node, target, "shape"))
                    _annotate_reshape(node, target)
                    modified = True
            elif node.op_type in ("Gather", "Concat", "Slice", "Shape") and len(node.outputs) == 1:
                out = node.outputs[0]
                if out.is_graph_output() or out.dtype != ir.DataType.INT64 or _ints(out) is not None or not out.uses():
                    continue
                dims = shape_value(out, memo=memo)
                if dims is not None and all(isinstance(d, int) for d in dims):
                    scalar = node.op_type == "Gather" and fixed_array(node.inputs[1]).ndim == 0
                    ir.convenience.replace_all_uses_with(out, self._constant(node, dims, "value", scalar))
                    modified = True
        return ir.passes.PassResult(model, modified)

    @staticmethod
    def _constant(node: ir.Node, dims: list[int], what: str, scalar: bool = False) -> ir.Value:
        array = np.array(dims, dtype=np.int64)
        return int64_initializer(node.graph, f"{node.name or node.op_type}/{what}_folded",
                                 array.reshape(()) if scalar else array)
