"""What reverse mode reads off a loop body (``reverse_mode.Reverse``): whether a value has the same shape at every
step, the addends of a gradient and which of them sum over the steps without an accumulator (a Gemm over the
stacked steps' rows, a ReduceSum over their axis), and the backward body's clean-up (invariants hoisted out of
it, unread nodes pruned)."""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.autodiff.builder import attr, folded_array, is_static, rows_factors, static_shape
from graphc.passes.values import subgraphs

__all__ = ["hoist_invariants", "prune", "same_shape_every_step", "summed_over_steps", "terms", "unreshaped"]

# ops whose output's shape depends on their inputs' values, and ops that take a shape, sizes or axes as inputs
_DATA_SHAPED = frozenset({"NonZero", "Compress", "Unique", "Loop", "Scan", "If", "StringSplit"})
_SHAPE_TAKING = frozenset({"Reshape", "Expand", "Tile", "Pad", "Slice", "Range", "ConstantOfShape", "TopK", "OneHot",
                           "Resize", "Split", "Squeeze", "Unsqueeze", "ReduceSum", "ReduceMean", "ReduceMax",
                           "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare",
                           "Upsample", "CenterCropPad", "Col2Im", "DFT", "STFT"})
_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"})


def terms(value: ir.Value, graph: ir.Graph) -> list[ir.Value]:
    """The addends of ``value``: through the same-shape Adds and Sums ``graph`` computes it with."""
    node = value.producer()
    shape = static_shape(value)
    if node is None or node.graph is not graph or node.op_type not in ("Add", "Sum") or shape is None \
            or any(static_shape(v) != shape for v in node.inputs):
        return [value]
    return [term for v in node.inputs for term in terms(v, graph)]


def same_shape_every_step(value: ir.Value, graph: ir.Graph, seen: dict) -> bool:
    """Whether ``value`` of the loop body ``graph`` has the same shape at every step, its carried
    values and slices having one: no op with a data-dependent shape (a nested loop's stacks, NonZero)
    on its way, and every shape, axes or size input a constant, an outer value or a ``Shape`` of such
    a value. False where unsure: the steps' stacks would not stack."""
    node = value.producer()
    if node is None or node.graph is not graph:
        return True
    if node not in seen:
        seen[node] = False  # a cycle cannot occur; this only stops a revisit
        if node.op_type in _DATA_SHAPED or subgraphs(node):
            return False
        sizes = node.inputs[1:] if node.op_type in _SHAPE_TAKING else []
        seen[node] = all(v is None or same_shape_every_step(v, graph, seen) for v in node.inputs) and all(
            v is None or folded_array(v) is not None or v.producer() is None or v.producer().graph is not graph
            or (v.producer().op_type in ("Shape", "Size")
                and same_shape_every_step(v.producer().inputs[0], graph, seen)) for v in sizes)
    return seen[node]


def _inside(values, graph: ir.Graph) -> bool:
    return all(v in graph.inputs or (v.producer() is not None and v.producer().graph is graph) for v in values)


def summed_over_steps(term: ir.Value, like: ir.Value, graph: ir.Graph, bound: frozenset = frozenset()):
    """How the steps' ``term``s (the gradient of ``like``, of static shape) add up without an
    accumulator: ("rows", A, B) for ``Gemm(A, B, transA=1)`` or ``MatMul(Transpose(A), B)`` (A
    [rows, k], B [rows, m]: a sum over rows, which the steps' rows extend), ("axes", v, axes) for
    ``ReduceSum(v, axes, keepdims=0)`` (the steps an axis more), of values ``graph`` computes or
    reads as a step's slice (``bound``: its scanned inputs, listed as inputs once it is built; an
    LSTM's [B, H] h read off its tape is a Gemm's operand as it is); None for any other term."""
    node, shape = term.producer(), static_shape(like)
    if node is None or node.graph is not graph or shape is None or not is_static(shape) or not _inside(
            [v for v in node.inputs if v is not None and folded_array(v) is None and v not in bound], graph) \
            or not all(same_shape_every_step(v, graph, {}) for v in node.inputs if v is not None):
        return None
    rows = rows_factors(node) if len(shape) == 2 else None
    if rows is not None and (node.op_type == "Gemm" or _inside(rows[:1], graph)):  # MatMul: its Transpose's A too
        return "rows", *rows
    axes = folded_array(node.inputs[1]) if node.op_type == "ReduceSum" and len(node.inputs) == 2 else None
    if axes is not None and attr(node, "keepdims", 1) == 0 and axes.size and (axes >= 0).all():
        return "axes", node.inputs[0], [int(a) for a in axes.reshape(-1)]
    return None


def unreshaped(value: ir.Value, graph: ir.Graph) -> ir.Value:
    """``value`` without the Reshapes ``graph`` computes it with: a factor of a Gemm over the stacked
    steps is reshaped to rows after the loop anyway."""
    node = value.producer()
    while node is not None and node.graph is graph and node.op_type == "Reshape":
        value, node = node.inputs[0], node.inputs[0].producer()
    return value


def hoist_invariants(graph: ir.Graph, outer: ir.Graph) -> None:
    """Move the nodes of ``graph`` (a Loop body) that read no value it computes, nor a random one,
    to the end of ``outer``: computed once, not every step (the transposed recurrence weight)."""
    for node in list(graph):
        reads = [v for v in node.inputs if v is not None]
        if node.op_type in _RANDOM or subgraphs(node) \
                or any(v in graph.inputs or (v.producer() is not None and v.producer().graph is graph) for v in reads):
            continue
        graph.remove(node)
        outer.append(node)


def prune(graph: ir.Graph) -> None:
    """Remove the nodes of ``graph`` whose outputs nothing reads."""
    for node in reversed(list(graph)):
        if not any(v.uses() or v.is_graph_output() for v in node.outputs):
            graph.remove(node, safe=True)
