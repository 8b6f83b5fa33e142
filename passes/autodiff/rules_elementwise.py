"""VJP rules of elementwise ops (arithmetic, activations, comparisons-free selections).

Rules registered with ``broadcast=True`` return gradients in the output's (broadcast) shape; the
driver (``core``) sums each back to its input's shape.
Subgradients at kinks follow PyTorch; each rule says which value it picks.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, attr, const_array, is_float
from graphc.passes.autodiff.registry import grad_rule


@grad_rule("Add", broadcast=True)
def grad_add(g, node, dy):
    return dy, dy


@grad_rule("Sub", broadcast=True)
def grad_sub(g, node, dy):
    return dy, (g.neg(dy) if g.wants(node.inputs[1]) else None)


@grad_rule("Mul", broadcast=True)
def grad_mul(g, node, dy):
    a, b = node.inputs
    silu = _silu_input(node)
    if silu is not None:
        return _grad_silu(g, node, dy, silu)
    gelu = _gelu_input(node)
    if gelu is not None:
        return _grad_gelu_erf(g, node, dy, gelu)
    if g.wants(a) != g.wants(b):  # dy read once: a broadcast one may stay unexpanded
        return (g.mul_grad(dy, b), None) if g.wants(a) else (None, g.mul_grad(dy, a))
    da = g.mul(dy, b) if g.wants(a) else None
    db = g.mul(dy, a) if g.wants(b) else None
    return da, db


def _silu_input(node: ir.Node) -> int | None:
    """Which input of the Mul is x when the node is SiLU, x * Sigmoid(x), with the Sigmoid read
    by this Mul alone (so its gradient is all this rule's to give); else None."""
    for i, (x, s) in enumerate((node.inputs, node.inputs[::-1])):
        gate = s.producer() if s is not None else None
        if (gate is not None and gate.op_type == "Sigmoid" and gate.domain in ("", "ai.onnx")
                and gate.inputs[0] is x and len(s.uses()) == 1 and not s.is_graph_output()):
            return i
    return None


def _grad_silu(g, node, dy, x_index: int):
    # SiLU's whole gradient goes to x, none through the Sigmoid: with s = Sigmoid(x) and the
    # output y = x * s, dx = dy * (s + y * (1 - s)), four full-size passes where the Mul and
    # Sigmoid rules with the sum of x's two gradients take six. Forward and backward on
    # onnxruntime (CPU, interleaved), ms, this vs the two rules: [32,96,32,32] 17.7 vs 24.2
    # (1 thread), 15.5 vs 28.0 (2 threads); [32,144,16,16] 6.9 vs 9.2; [32,672,4,4] 1.7 vs 2.2;
    # [2,96,32,32] 0.82 vs 0.99. It reads s and y, which live on for the next op's gradient, and
    # not x, which can then be freed after the forward. (dy * (y + s * (1 - y)): the same.)
    x, s = node.inputs[x_index], node.inputs[1 - x_index]
    if not g.wants(x):
        return None, None
    y = node.outputs[0]
    slope = g.add(s, g.mul(y, g.sub(g.scalar(1.0, s), s)))
    return _to_input(x_index, g.mul(dy, slope))


def _gelu_input(node: ir.Node) -> int | None:
    """Which input of the Mul is x when the node is ``x * (1 + Erf(x / sqrt(2)))`` (exact GELU as
    torch.onnx writes it, before its ``* 0.5``; ``x * (1/sqrt(2))`` too), the Div, Erf and Add
    outputs read by that chain alone; else None."""
    def scalar(value: ir.Value, expected: float) -> bool:
        array = const_array(value) if not value.is_graph_input() else None  # a fed one may differ
        return array is not None and array.size == 1 and abs(float(array.reshape(-1)[0]) - expected) < 1e-6

    def only(value: ir.Value, op: str) -> ir.Node | None:
        node = value.producer() if value is not None else None
        if node is None or node.op_type != op or node.domain not in ("", "ai.onnx"):
            return None
        return node if len(value.uses()) == 1 and not value.is_graph_output() else None

    for i, (x, a) in enumerate((node.inputs, node.inputs[::-1])):
        add = only(a, "Add")
        ones = [v for v in add.inputs if not scalar(v, 1.0)] if add is not None else []
        erf = only(ones[0], "Erf") if len(ones) == 1 else None
        div = only(erf.inputs[0], "Div") if erf is not None else None
        mul = only(erf.inputs[0], "Mul") if erf is not None else None
        if (div is not None and div.inputs[0] is x and scalar(div.inputs[1], math.sqrt(2))) or (
                mul is not None and x in mul.inputs and scalar(mul.inputs[1 - mul.inputs.index(x)], 1 / math.sqrt(2))):
            return i
    return None


def _grad_gelu_erf(g, node, dy, x_index: int):
    # x * a with a = 1 + erf(x/sqrt(2)): the whole gradient goes to x, none through a, from x
    # alone: the forward's x/sqrt(2) and a are freed once it is done, where the Mul, Add, Erf and
    # Div rules keep both (GPT b32: 2 x 16 MB a block). dy is half the GELU output's gradient
    # (torch.onnx closes with ``* 0.5``): when that Mul is the rule's own, unread, its input is
    # taken instead and the Mul dropped, one full-size pass fewer (see ``_gelu_grad``).
    x = node.inputs[x_index]
    if not g.wants(x):
        return None, None
    whole = _halved_gradient(dy)
    if whole is not None:
        return _to_input(x_index, _gelu_grad(g, whole, x))
    erf, bump = _gelu_parts(g, x)
    slope = g.add(g.add(erf, g.mul(bump, g.scalar(2 / math.sqrt(math.pi), x))), g.scalar(1.0, x))
    return _to_input(x_index, g.mul(dy, slope))


def _gelu_parts(g: GradBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """erf(u) and u / exp(u^2), u = x / sqrt(2): exact GELU's slope Phi(x) + x phi(x) is
    (1 + erf(u)) / 2 + (u / exp(u^2)) / sqrt(pi). (exp(u^2) overflows to inf past |x| ~ 13 in
    float32, where the quotient's 0 is its limit.)"""
    u = g.mul(x, g.scalar(1 / math.sqrt(2), x))
    return g.op("Erf", u), g.div(u, g.op("Exp", g.mul(u, u)))


def _gelu_grad(g: GradBuilder, dy: ir.Value, x: ir.Value) -> ir.Value:
    # dy * (Phi + x phi) in 9 full-size passes, Phi = HardSigmoid(erf(u), 0.5, 0.5) (in [0, 1]:
    # never clipped), x phi as ``_gelu_parts``' quotient. Forward (one fused Gelu) and backward on
    # onnxruntime (CPU, interleaved, ms; ``bench_lowerings.py --only gelu``), this / the same from
    # half of dy (``* 0.5`` before it; 1 + erf + 2/sqrt(pi) * quotient) / the rule before it
    # (exp(-x^2/2) written out, 2 passes more) / that reading the forward's 1 + erf / the Mul,
    # Add, Erf and Div rules: [4096, 1024] 33.3 / 36.6 / 40.9 / 46.5 / 50.0 (1 thread), 18.0 /
    # 20.2 / 22.4 / 23.6 / 26.0 (2 threads); [2080, 768] 11.4 / 12.4 / 13.8 / 14.9 / 17.1, 7.1 /
    # 6.9 / 7.9 / 8.1 / 9.2; [130, 768] 0.44 / 0.45 / 0.52 / 0.50 / 0.61, 0.42 / 0.44 / 0.46 /
    # 0.49 / 0.56.
    erf, bump = _gelu_parts(g, x)
    cdf = g.op("HardSigmoid", erf, alpha=0.5, beta=0.5)
    return g.mul(dy, g.add(cdf, g.mul(bump, g.scalar(1 / math.sqrt(math.pi), x))))


def _halved_gradient(dy: ir.Value) -> ir.Value | None:
    """d where ``dy`` is ``d * 0.5`` (or ``d / 2``) by a node nothing reads yet (a rule's, just
    made), which is then removed; else None."""
    node = dy.producer()
    if (node is None or node.op_type not in ("Mul", "Div") or node.domain not in ("", "ai.onnx")
            or dy.uses() or dy.is_graph_output()):
        return None
    sides = [(0, 1), (1, 0)] if node.op_type == "Mul" else [(0, 1)]
    factor = 0.5 if node.op_type == "Mul" else 2.0
    for keep, scale in sides:
        array = const_array(node.inputs[scale]) if not node.inputs[scale].is_graph_input() else None
        if array is not None and array.size == 1 and float(array.reshape(-1)[0]) == factor:
            d = node.inputs[keep]
            node.graph.remove(node, safe=True)
            return d
    return None


def _to_input(index: int, grad: ir.Value) -> tuple[ir.Value | None, ir.Value | None]:
    """A binary op's gradients when all of it goes to input ``index``."""
    return (grad, None) if index == 0 else (None, grad)


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
    b_const = None if g.wants(b) or b.is_graph_input() else const_array(b)
    if b_const is not None and b_const.size == 1 and float(b_const.reshape(())) == 2.0:
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
    # and dy * Sign(y) too (6.1, 0.84). Unlike Where, an inf/NaN dy where y = 0 gives NaN.
    y = node.outputs[0]
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


def _gelu_tanh_derivative(g: GradBuilder, x: ir.Value) -> ir.Value:
    # y = 0.5 x (1 + tanh(u)), u = k (x + c x^3): y' = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2)
    k, c = math.sqrt(2.0 / math.pi), 0.044715
    x2 = g.mul(x, x)
    u = g.mul(g.scalar(k, x), g.add(x, g.mul(g.scalar(c, x), g.mul(x2, x))))
    t = g.op("Tanh", u)
    half = g.scalar(0.5, x)
    left = g.mul(half, g.add(g.scalar(1.0, x), t))
    du = g.mul(g.scalar(k, x), g.add(g.scalar(1.0, x), g.mul(g.scalar(3 * c, x), x2)))
    right = g.mul(g.mul(half, x), g.mul(g.sub(g.scalar(1.0, x), g.mul(t, t)), du))
    return g.add(left, right)


@grad_rule("Gelu")
def grad_gelu(g, node, dy):
    # exact: y' = Phi(x) + x phi(x); "tanh": derivative of the tanh approximation
    x = node.inputs[0]
    if attr(node, "approximate", "none") == "tanh":
        return (g.mul(dy, _gelu_tanh_derivative(g, x)),)
    return (_gelu_grad(g, dy, x),)


@grad_rule("Identity")
def grad_identity(g, node, dy):
    return (dy,)


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
    # 5.6 vs 6.2 (2 threads), 5.5 vs 7.2 vs 7.0 (1 thread); [32,576,2,2] 0.20 vs 0.25 vs 0.26.
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
