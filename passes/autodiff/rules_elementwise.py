"""VJP rules of elementwise ops (arithmetic, activations, comparisons-free selections).

Rules registered with ``broadcast=True`` return gradients in the output's (broadcast) shape; the
driver (``core``) sums each back to its input's shape.
Subgradients at kinks follow PyTorch; each rule says which value it picks.
"""

from __future__ import annotations

import math

import numpy as np

import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, attr, is_float
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.rules_activations import grad_gelu_erf, grad_silu, gelu_input, silu_input
from graphc.passes.values import EXCHANGE_KEY, const_scalar, exchange_kind


@grad_rule("Add", broadcast=True)
def grad_add(g, node, dy):
    return dy, dy


@grad_rule("Sub", broadcast=True)
def grad_sub(g, node, dy):
    return dy, (g.neg(dy) if g.wants(node.inputs[1]) else None)


@grad_rule("Mul", broadcast=True)
def grad_mul(g, node, dy):
    a, b = node.inputs
    silu = silu_input(node)
    if silu is not None:
        return grad_silu(g, node, dy, silu)
    gelu = gelu_input(node)
    if gelu is not None:
        return grad_gelu_erf(g, node, dy, gelu)
    if g.wants(a) != g.wants(b):  # dy read once: a broadcast one may stay unexpanded
        return (g.mul_grad(dy, b), None) if g.wants(a) else (None, g.mul_grad(dy, a))
    da = g.mul(dy, b) if g.wants(a) else None
    db = g.mul(dy, a) if g.wants(b) else None
    return da, db


@grad_rule("Div", broadcast=True)
def grad_div(g, node, dy):
    # y = a / b: da = dy / b, db = -dy * y / b
    a, b = node.inputs
    y = node.outputs[0]
    dy_b = g.div(dy, b)
    da = dy_b if g.wants(a) else None
    db = g.neg(g.mul(dy_b, y)) if g.wants(b) else None
    return da, db


@grad_rule("Neg")
def grad_neg(g, node, dy):
    return (g.neg(dy),)


@grad_rule("Pow", broadcast=True)
def grad_pow(g, node, dy):
    # y = a ** b: da = dy * b * a**(b-1); db = dy * y * log(a), and 0 where a == 0 and b >= 0
    # (PyTorch's pow_backward_exponent convention, so 0**b does not give nan).
    a, b = node.inputs
    y = node.outputs[0]
    bf = b if b.dtype == a.dtype else g.cast_like(b, a)
    if not g.wants(b) and const_scalar(b) == 2.0:
        da = g.mul(dy, g.mul(a, g.scalar(2.0, a)))  # the common square: no Pow in the backward
    else:
        da = g.mul(dy, g.mul(bf, g.op("Pow", a, g.sub(bf, g.scalar(1.0, a)))))
    db = None
    if g.wants(b):
        zero = g.scalar(0.0, a)
        safe = g.op("And", g.op("Equal", a, zero), g.op("GreaterOrEqual", bf, zero))
        log_a = g.op("Log", g.op("Where", safe, g.scalar(1.0, a), a))  # no log(0) where it is masked
        db = g.op("Where", safe, zero, g.mul(dy, g.mul(y, log_a)))
    return da, db


@grad_rule("Sqrt")
def grad_sqrt(g, node, dy):
    # dy / (2 sqrt(x)); inf at x == 0 like PyTorch
    return (g.div(dy, g.mul(node.outputs[0], g.scalar(2.0, dy))),)


@grad_rule("Exp")
def grad_exp(g, node, dy):
    return (g.mul(dy, node.outputs[0]),)


@grad_rule("Log")
def grad_log(g, node, dy):
    return (g.div(dy, node.inputs[0]),)


@grad_rule("Abs")
def grad_abs(g, node, dy):
    # dy * sign(x); at x == 0 the gradient is 0 (PyTorch: sgn(0) = 0)
    return (g.mul(dy, g.op("Sign", node.inputs[0])),)


@grad_rule("Reciprocal")
def grad_reciprocal(g, node, dy):
    y = node.outputs[0]
    return (g.neg(g.mul(dy, g.mul(y, y))),)


@grad_rule("Relu")
def grad_relu(g, node, dy):
    # dy where x > 0, else 0; at x == 0 the gradient is 0 (PyTorch's threshold_backward).
    # Read from the output y (y > 0 exactly where x > 0), which the next op's gradient keeps
    # anyway, so x (a BatchNorm's output, say) is freed after the forward. As dy * Cast(y > 0):
    # onnxruntime (CPU, 1 thread, interleaved, fwd+bwd, ms) runs Where(y > 0, dy, 0) slower
    # ([32,256,16,16] 6.8 vs 5.4; [32,512,4,4] 0.62 vs 0.50; LeNet's [64,6,28,28] 123 vs 94 us)
    # and dy * Sign(y) too (6.1, 0.84); Where on y cast to bool, 2 threads, [32,48,64,64]: 5.7 vs
    # 2.8 for this form below. Unlike Where, an inf/NaN dy where y = 0 gives NaN.
    # In float32 the mask is one pass: y >= 0, so HardSigmoid(y, alpha=FLT_MAX, beta=0) =
    # min(1, y * FLT_MAX) is 0 at 0 and 1 for every y from 2.9e-39 on (a smaller denormal gives
    # a fraction; the Trainer's CPU sessions flush denormals to zero). Forward and backward, 2
    # threads, ms, dy * Cast(y > 0) vs this (``bench_lowerings.py --only relu``): [32,256,16,16]
    # 3.33 vs 2.34; [32,64,32,32] 3.19 vs 2.32; [32,512,4,4] 0.29 vs 0.21; [2,64,32,32] 0.17 vs
    # 0.13. (Its alpha is a float32 attribute: too small for float64's normal range, which keeps
    # the Cast.) Before a MaxPool the mask could be taken on the pooled output, a quarter of the
    # values, since the pool's gradient lands where y is its window's maximum; not done: with no
    # mask at all there (wrong values, timed only), ResNet-18's step at batch 32, 64 px took
    # 0.996x (Trainers interleaved, either order).
    y = node.outputs[0]
    if y.dtype == ir.DataType.FLOAT:
        return (g.mul(dy, g.op("HardSigmoid", y, alpha=float(np.finfo(np.float32).max), beta=0.0)),)
    return (g.mul(dy, g.cast_like(g.op("Greater", y, g.scalar(0.0, y)), dy)),)


@grad_rule("LeakyRelu")
def grad_leaky_relu(g, node, dy):
    # dy where x > 0, else alpha * dy; at x == 0 the slope is alpha (PyTorch's leaky_relu_backward)
    x = node.inputs[0]
    alpha = attr(node, "alpha", 0.01)
    return (g.op("Where", g.op("Greater", x, g.scalar(0.0, x)), dy, g.mul(dy, g.scalar(alpha, dy))),)


@grad_rule("Sigmoid")
def grad_sigmoid(g, node, dy):
    y = node.outputs[0]
    return (g.mul(dy, g.mul(y, g.sub(g.scalar(1.0, y), y))),)


@grad_rule("Tanh")
def grad_tanh(g, node, dy):
    y = node.outputs[0]
    return (g.mul(dy, g.sub(g.scalar(1.0, y), g.mul(y, y))),)


@grad_rule("Erf")
def grad_erf(g, node, dy):
    x = node.inputs[0]
    e = g.op("Exp", g.neg(g.mul(x, x)))
    return (g.mul(dy, g.mul(e, g.scalar(2.0 / math.sqrt(math.pi), x))),)


@grad_rule("Identity")
def grad_identity(g, node, dy):
    # a data-parallel gather (every worker's value stacked in rank order) has for adjoint the
    # workers' cotangents summed, each worker taking its own row: marked "gather_grad" (the
    # exchange weights them by share)
    if exchange_kind(node) is None:
        return (dy,)
    out = g.op("Identity", dy)
    out.producer().metadata_props[EXCHANGE_KEY] = "gather_grad"
    out.dtype, out.shape = node.inputs[0].dtype, node.inputs[0].shape
    return (out,)


@grad_rule("Cast", "CastLike")
def grad_cast(g, node, dy):
    # the gradient comes back in the input's dtype (CastLike's target gets none)
    x = node.inputs[0]
    rest = (None,) * (len(node.inputs) - 1)
    if not is_float(x):
        return (None,) + rest
    return (g.cast_like(dy, x),) + rest


@grad_rule("Where", broadcast=True)
def grad_where(g, node, dy):
    cond, a, b = node.inputs
    zero = g.scalar(0.0, dy)
    da = g.op("Where", cond, dy, zero) if g.wants(a) else None
    db = g.op("Where", cond, zero, dy) if g.wants(b) else None
    return None, da, db


@grad_rule("Clip")
def grad_clip(g, node, dy):
    # Clip is min(max(x, lo), hi), differentiated as that composition with PyTorch's
    # clamp_backward ties: x gets the gradient where lo <= x <= hi (boundaries included), lo where
    # x < lo, hi where max(x, lo) > hi (all of it when lo > hi: every output is then hi); the
    # bounds are scalars, so theirs is summed.
    x = node.inputs[0]
    lo = node.inputs[1] if len(node.inputs) > 1 else None
    hi = node.inputs[2] if len(node.inputs) > 2 else None
    zero = g.scalar(0.0, dy)
    dlo = dhi = None
    if hi is not None:
        raised = x if lo is None else g.op("Max", x, lo)
        above = g.op("Greater", raised, hi)
        if g.wants(hi):
            dhi = g.reduce("ReduceSum", g.op("Where", above, dy, zero), None, keepdims=False)
        dy = g.op("Where", above, zero, dy)
    if lo is not None:
        below = g.op("Less", x, lo)
        if g.wants(lo):
            dlo = g.reduce("ReduceSum", g.op("Where", below, dy, zero), None, keepdims=False)
        dy = g.op("Where", below, zero, dy)
    return dy, dlo, dhi


@grad_rule("Sum", broadcast=True)
def grad_sum(g, node, dy):
    return (dy,) * len(node.inputs)


def _select_extreme(g: GradBuilder, node: ir.Node, dy: ir.Value):
    # Ties share the gradient evenly (torch.maximum/minimum give 0.5/0.5 between two equal
    # inputs; with n tied inputs each gets dy / n).
    y = node.outputs[0]
    masks = [g.cast_like(g.op("Equal", x, y), dy) for x in node.inputs]
    if len(masks) == 1:
        return (dy,)
    count = g.sum_values(masks)
    share = g.div(dy, count)
    return tuple(g.mul(share, m) for m in masks)


@grad_rule("Max", broadcast=True)
def grad_max(g, node, dy):
    return _select_extreme(g, node, dy)


@grad_rule("Min", broadcast=True)
def grad_min(g, node, dy):
    return _select_extreme(g, node, dy)


@grad_rule("Mean", broadcast=True)
def grad_mean(g, node, dy):
    share = g.div(dy, g.scalar(float(len(node.inputs)), dy))
    return (share,) * len(node.inputs)


@grad_rule("Softplus")
def grad_softplus(g, node, dy):
    return (g.mul(dy, g.op("Sigmoid", node.inputs[0])),)


@grad_rule("Elu")
def grad_elu(g, node, dy):
    # dy where x > 0, else dy * alpha * exp(x); at x == 0 the slope is alpha (PyTorch's elu_backward)
    x = node.inputs[0]
    neg = g.mul(dy, g.mul(g.op("Exp", x), g.scalar(attr(node, "alpha", 1.0), dy)))
    return (g.op("Where", g.op("Greater", x, g.scalar(0.0, x)), dy, neg),)


@grad_rule("Selu")
def grad_selu(g, node, dy):
    # scale * (x > 0 ? 1 : alpha * exp(x)); at x == 0 the negative branch, like PyTorch
    x = node.inputs[0]
    alpha, gamma = attr(node, "alpha", 1.67326319217681884765625), attr(node, "gamma", 1.05070102214813232421875)
    pos = g.mul(dy, g.scalar(gamma, dy))
    neg = g.mul(dy, g.mul(g.op("Exp", x), g.scalar(alpha * gamma, dy)))
    return (g.op("Where", g.op("Greater", x, g.scalar(0.0, x)), pos, neg),)


@grad_rule("HardSigmoid")
def grad_hard_sigmoid(g, node, dy):
    # alpha where 0 < alpha*x + beta < 1 (strict, as PyTorch's hardsigmoid_backward), else 0
    x = node.inputs[0]
    alpha, beta = attr(node, "alpha", 0.2), attr(node, "beta", 0.5)
    z = g.add(g.mul(x, g.scalar(alpha, x)), g.scalar(beta, x))
    inside = g.op("And", g.op("Greater", z, g.scalar(0.0, x)), g.op("Less", z, g.scalar(1.0, x)))
    return (g.op("Where", inside, g.mul(dy, g.scalar(alpha, dy)), g.scalar(0.0, dy)),)


@grad_rule("HardSwish")
def grad_hard_swish(g, node, dy):
    # PyTorch's hardswish_backward: 0 for x < -3, dy * (x/3 + 0.5) for -3 <= x <= 3, dy above;
    # the slope as HardSigmoid(x; 1/6, 1/2) + x/6 where |x| <= 3 (a Cast mask, no Where). Forward
    # and backward on onnxruntime (CPU, interleaved, ms; ``bench_lowerings.py --only hardswish``),
    # this vs dy * (x/3 + 1/2) picked by two Wheres vs the slope so picked: [32,96,16,16] 3.7 vs
    # 5.6 vs 6.2 (2 threads), 5.5 vs 7.2 vs 7.0 (1 thread); [32,576,2,2] 0.20 vs 0.25 vs 0.26. x * mask
    # as x - Shrink(x, lambd=3), two nodes fewer: 3.9 vs 0.9 ms on [32,96,16,16] (its Shrink is slow).
    x = node.inputs[0]
    inside = g.op("Cast", g.op("LessOrEqual", g.op("Abs", x), g.scalar(3.0, x)), to=x.dtype)
    slope = g.add(g.op("HardSigmoid", x, alpha=1 / 6, beta=0.5), g.mul(g.mul(x, inside), g.scalar(1 / 6, x)))
    return (g.mul(dy, slope),)


@grad_rule("PRelu", broadcast=True)
def grad_prelu(g, node, dy):
    # dy where x > 0, else slope * dy; the slope gets dy * x where x <= 0 (PyTorch: at 0, slope)
    x, slope = node.inputs
    positive = g.op("Greater", x, g.scalar(0.0, x))
    zero = g.scalar(0.0, dy)
    dx = g.op("Where", positive, dy, g.mul(dy, slope)) if g.wants(x) else None
    dslope = g.op("Where", positive, zero, g.mul(dy, x)) if g.wants(slope) else None
    return dx, dslope


@grad_rule("Sin")
def grad_sin(g, node, dy):
    return (g.mul(dy, g.op("Cos", node.inputs[0])),)


@grad_rule("Cos")
def grad_cos(g, node, dy):
    return (g.neg(g.mul(dy, g.op("Sin", node.inputs[0]))),)


@grad_rule("Tan")
def grad_tan(g, node, dy):
    # 1 + tan(x)^2
    y = node.outputs[0]
    return (g.mul(dy, g.add(g.scalar(1.0, dy), g.mul(y, y))),)


@grad_rule("Sinh")
def grad_sinh(g, node, dy):
    return (g.mul(dy, g.op("Cosh", node.inputs[0])),)


@grad_rule("Cosh")
def grad_cosh(g, node, dy):
    return (g.mul(dy, g.op("Sinh", node.inputs[0])),)


@grad_rule("Atan")
def grad_atan(g, node, dy):
    # 1 / (1 + x^2)
    x = node.inputs[0]
    return (g.div(dy, g.add(g.scalar(1.0, dy), g.mul(x, x))),)


@grad_rule("Asin", "Acos", "Asinh", "Acosh", "Atanh")
def grad_inverse_trig(g, node, dy):
    # asin: 1/sqrt(1 - x^2), acos: -1/sqrt(1 - x^2), asinh: 1/sqrt(x^2 + 1),
    # acosh: 1/sqrt(x^2 - 1), atanh: 1/(1 - x^2); inf at the domain's edges, like PyTorch
    x = node.inputs[0]
    x2, one = g.mul(x, x), g.scalar(1.0, dy)
    op = node.op_type
    if op == "Atanh":
        return (g.div(dy, g.sub(one, x2)),)
    root = g.op("Sqrt", g.sub(one, x2) if op in ("Asin", "Acos") else g.add(x2, one) if op == "Asinh" else g.sub(x2, one))
    dx = g.div(dy, root)
    return (g.neg(dx) if op == "Acos" else dx,)


@grad_rule("Mod", broadcast=True)
def grad_mod(g, node, dy):
    # float Mod: y = a - b * k with k = trunc(a / b) (fmod=1, C's fmod) or floor(a / b) (fmod=0,
    # Python's %), so da = dy and db = -dy * k away from the jumps where a / b is whole
    a, b = node.inputs
    quotient = g.div(a, b)
    if attr(node, "fmod", 0):
        k = g.mul(g.op("Sign", quotient), g.op("Floor", g.op("Abs", quotient)))
    else:
        k = g.op("Floor", quotient)
    db = g.neg(g.mul(dy, k)) if g.wants(b) else None
    return dy, db


@grad_rule("Floor", "Ceil", "Round", "Sign", "Hardmax")
def grad_piecewise_constant(g, node, dy):
    # zero almost everywhere (PyTorch returns zeros): no gradient flows back (Hardmax: a one-hot
    # of the argmax, constant between ties)
    return (None,)


@grad_rule("Softsign")
def grad_softsign(g, node, dy):
    # y = x / (1 + |x|): dx = dy / (1 + |x|)^2
    x = node.inputs[0]
    d = g.add(g.scalar(1.0, x), g.op("Abs", x))
    return (g.div(dy, g.mul(d, d)),)


@grad_rule("ThresholdedRelu")
def grad_thresholded_relu(g, node, dy):
    # dy where x > alpha, else 0 (0 at x == alpha, like PyTorch's threshold)
    x = node.inputs[0]
    keep = g.op("Greater", x, g.scalar(attr(node, "alpha", 1.0), x))
    return (g.op("Where", keep, dy, g.scalar(0.0, dy)),)
