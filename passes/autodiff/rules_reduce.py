"""VJP rules of reductions (ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, global pools)
and Softmax/LogSoftmax.

Axes come from the attribute (ReduceSum before opset 13, the others before 18) or from the
second input, a constant or a value known only at run time; ``keepdims=0`` outputs are unsqueezed
back at those axes before broadcasting to the input.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, attr, folded_array, is_static, static_shape
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.rules_indexing import scattered


def _reduce_axes(g: GradBuilder, node: ir.Node):
    """(axes, noop): axes as sorted non-negative ints, None for all axes, or a Value if dynamic."""
    axes = attr(node, "axes")
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = folded_array(node.inputs[1])
        if axes is None:
            return node.inputs[1], False
    noop = bool(attr(node, "noop_with_empty_axes", 0))
    if axes is None or len(axes) == 0:
        return None, noop
    rank = g.rank(node.inputs[0])
    return sorted(int(a) % rank for a in axes), False


def _expand_back(g: GradBuilder, node: ir.Node, dy: ir.Value, axes) -> ir.Value:
    """dy with the reduced axes restored (size 1), ready to broadcast against the input."""
    if attr(node, "keepdims", 1):
        return dy
    if isinstance(axes, ir.Value):  # counted in the input's rank, as Unsqueeze's output has it
        return g.op("Unsqueeze", dy, axes)
    if axes is None:  # reduced to a scalar, which broadcasts as it is, or not reduced (noop)
        return dy
    return g.unsqueeze(dy, axes)


def count_ratio(g: GradBuilder, x: ir.Value, y: ir.Value, like: ir.Value) -> ir.Value:
    """size(x) / size(y): how many inputs each output of a mean averages."""
    sx, sy = static_shape(x), static_shape(y)
    if is_static(sx) and is_static(sy):
        return g.scalar(math.prod(sx) / max(math.prod(sy), 1), like)
    return g.div(g.cast_like(g.op("Size", x), like), g.cast_like(g.op("Size", y), like))


def _broadcast_back(g: GradBuilder, node: ir.Node, dy: ir.Value, axes) -> ir.Value:
    """dy spread over the input's shape: the gradient of a sum over ``axes``."""
    return g.op("Expand", _expand_back(g, node, dy, axes), g.shape_of(node.inputs[0]))


def _unless_noop(g: GradBuilder, node: ir.Node, dy: ir.Value, grad) -> tuple:
    """``(grad(axes), None)`` for the reduction's axes, or ``(dy, None)`` when it reduces nothing."""
    axes, noop = _reduce_axes(g, node)
    return (dy if noop else grad(axes)), None


@grad_rule("ReduceSum")
def grad_reduce_sum(g, node, dy):
    return _unless_noop(g, node, dy, lambda axes: _broadcast_back(g, node, dy, axes))


@grad_rule("ReduceMean")
def grad_reduce_mean(g, node, dy):
    return _unless_noop(g, node, dy, lambda axes: _broadcast_back(
        g, node, g.div(dy, count_ratio(g, node.inputs[0], node.outputs[0], dy)), axes))


def _select_reduced(g: GradBuilder, node: ir.Node, dy: ir.Value, axes) -> ir.Value:
    # Ties share the gradient evenly, like torch.amax/amin (and torch.max() without dim).
    x = node.inputs[0]
    y = _expand_back(g, node, node.outputs[0], axes)
    mask = g.cast_like(g.op("Equal", x, y), dy)
    count = _reduce_kept(g, node, "ReduceSum", mask, axes)
    return g.mul(mask, g.div(_expand_back(g, node, dy, axes), count))


def _reduce_kept(g: GradBuilder, node: ir.Node, op_type: str, x: ir.Value, axes) -> ir.Value:
    """``op_type`` over the node's ``axes`` with keepdims; axes known only at run time may be
    empty, which then means what the node's ``noop_with_empty_axes`` says."""
    return g.reduce(op_type, x, axes, keepdims=True, empty_is_noop=bool(attr(node, "noop_with_empty_axes", 0)))


@grad_rule("ReduceMax", "ReduceMin")
def grad_reduce_extreme(g, node, dy):
    return _unless_noop(g, node, dy, lambda axes: _select_reduced(g, node, dy, axes))


@grad_rule("ReduceSumSquare")
def grad_reduce_sum_square(g, node, dy):
    axes, _ = _reduce_axes(g, node)  # a noop still squares: dy * 2x (its axes None: dy as it is)
    x = node.inputs[0]
    return g.mul(_expand_back(g, node, dy, axes), g.mul(x, g.scalar(2.0, x))), None


@grad_rule("GlobalAveragePool")
def grad_global_average_pool(g, node, dy):
    # (dy spread by one broadcasting Div by a [1, 1, H, W] table of the count, here and in the
    # ReduceMean/Sum rules, instead of the Div and the Expand, which onnxruntime runs on one
    # thread: alone 5x faster ([32, 1280, 1, 1] to 2x2, 2 threads, 0.82 vs 0.16 ms), but Trainer
    # steps at batch 32, 64 px 0.997x-1.004x (ResNets, EfficientNet-B0, MobileNetV3-small) and
    # RegNetY-400MF 1.19x.)
    x = node.inputs[0]
    dy = g.div(dy, count_ratio(g, x, node.outputs[0], dy))
    return (g.op("Expand", dy, g.shape_of(x)),)


@grad_rule("GlobalMaxPool")
def grad_global_max_pool(g, node, dy):
    x = node.inputs[0]
    y = node.outputs[0]
    mask = g.cast_like(g.op("Equal", x, y), dy)
    count = g.reduce("ReduceSum", mask, list(range(2, g.rank(x))), keepdims=True)
    return (g.mul(mask, g.div(dy, count)),)


def _softmax_axes(g: GradBuilder, node: ir.Node) -> list[int]:
    rank = g.rank(node.inputs[0])
    if g.opset >= 13:
        return [attr(node, "axis", -1) % rank]
    # Before opset 13 (Log)Softmax works on the input coerced to 2-D at `axis` (default 1).
    return list(range(attr(node, "axis", 1) % rank, rank))


@grad_rule("Softmax")
def grad_softmax(g, node, dy):
    # dx = y * (dy - sum(dy * y, axis)). A row of all -inf (fully masked attention) is NaN; when
    # a Where selects past the softmax (Attention's body zeroes such rows), NaN entries count as
    # 0, so the rows the Where discards (dy = 0 there) get 0, like torch's SDPA, not NaN * 0
    y = node.outputs[0]
    if _feeds_where(y):
        y = g.op("Where", g.op("IsNaN", y), g.scalar(0.0, y), y)
    s = g.reduce("ReduceSum", g.mul(dy, y), _softmax_axes(g, node), keepdims=True)
    return (g.mul(y, g.sub(dy, s)),)


def _feeds_where(value: ir.Value, depth: int = 0) -> bool:
    """Whether ``value`` reaches a Where's selected inputs, through Cast/Identity only."""
    for use in value.uses():
        op = use.node.op_type
        if (op == "Where" and use.idx > 0) or (op in ("Cast", "Identity") and depth < 4
                                               and _feeds_where(use.node.outputs[0], depth + 1)):
            return True
    return False


@grad_rule("LogSoftmax")
def grad_log_softmax(g, node, dy):
    # dx = dy - exp(y) * sum(dy, axis). Where dy is a few values scattered into zeros along the
    # axis (a cross-entropy's GatherElements of its labels), the sum is the updates' and they are
    # scattered onto -exp(y) * sum: three full-size passes (Exp, Mul, the scatter's copy) where
    # the zeros, their scatter, ReduceSum, Exp, Mul and Sub made six (onnxruntime scatters in
    # place: 0.4 ms). bench_zoo's GPT at batch 32 ([4096, 2048] logits, 2 threads, profiles of
    # two sessions each): the loss's kernel time forward and backward 20.7 -> 11.7 ms a step.
    y = node.outputs[0]
    axes = _softmax_axes(g, node)
    sparse = scattered(dy)
    if sparse is not None and axes == [sparse[2]]:
        idx, updates, axis = sparse
        s = g.reduce("ReduceSum", updates, axes, keepdims=True)
        return (g.scatter_elements(g.mul(g.op("Exp", y), g.neg(s)), idx, updates, axis),)
    s = g.reduce("ReduceSum", dy, axes, keepdims=True)
    return (g.sub(dy, g.mul(g.op("Exp", y), s)),)


@grad_rule("ReduceL2")
def grad_reduce_l2(g, node, dy):
    # dx = dy * x / y; 0 where y == 0 (PyTorch's norm backward gives 0 there rather than nan)
    axes, _ = _reduce_axes(g, node)  # a noop's axes are None: y and dy as they are
    x = node.inputs[0]
    y, dyk = _expand_back(g, node, node.outputs[0], axes), _expand_back(g, node, dy, axes)
    zero = g.scalar(0.0, y)
    safe = g.op("Where", g.op("Equal", y, zero), g.scalar(1.0, y), y)
    return g.op("Where", g.op("Equal", y, zero), zero, g.mul(dyk, g.div(x, safe))), None


@grad_rule("ReduceL1")
def grad_reduce_l1(g, node, dy):
    # dx = dy * sign(x): 0 at x == 0, as PyTorch's norm backward (a rule: before opset 18 ONNX
    # gives ReduceL1 no function body to differentiate)
    axes, _ = _reduce_axes(g, node)  # a noop's axes are None: dy as it is
    return g.mul(_expand_back(g, node, dy, axes), g.op("Sign", node.inputs[0])), None


@grad_rule("ReduceLogSum")
def grad_reduce_log_sum(g, node, dy):
    # y = log(sum(x)): dx = dy / sum(x) = dy / exp(y), spread over the summed axes
    q = g.div(dy, g.op("Exp", node.outputs[0]))
    return _unless_noop(g, node, q, lambda axes: _broadcast_back(g, node, q, axes))


@grad_rule("ReduceLogSumExp")
def grad_reduce_log_sum_exp(g, node, dy):
    # dx = dy * exp(x - y): the softmax over the reduced axes
    x, y = node.inputs[0], node.outputs[0]
    return _unless_noop(g, node, dy, lambda axes: g.mul(
        _expand_back(g, node, dy, axes), g.op("Exp", g.sub(x, _expand_back(g, node, y, axes)))))


@grad_rule("ReduceProd")
def grad_reduce_prod(g, node, dy):
    return _unless_noop(g, node, dy, lambda axes: _prod_backward(g, node, dy, axes))


def _prod_backward(g: GradBuilder, node: ir.Node, dy: ir.Value, axes) -> ir.Value:
    """d x_i = dy * (product of the group's other elements), exact with zeros as well: with no
    zero in the group it is prod / x_i; with one zero, the zero gets the product of the nonzero
    elements and the rest 0; with two or more, every element gets 0."""
    x = node.inputs[0]
    zero, one = g.scalar(0.0, x), g.scalar(1.0, x)
    is_zero = g.op("Equal", x, zero)
    zeros = _reduce_kept(g, node, "ReduceSum", g.cast_like(is_zero, x), axes)
    safe = g.op("Where", is_zero, one, x)
    nonzero_product = _reduce_kept(g, node, "ReduceProd", safe, axes)
    lone_zero = g.op("And", is_zero, g.op("Equal", zeros, one))
    others = g.op("Where", g.op("Equal", zeros, zero), g.div(nonzero_product, safe),
                  g.op("Where", lone_zero, g.op("Expand", nonzero_product, g.shape_of(x)), zero))
    return g.mul(_expand_back(g, node, dy, axes), others)
