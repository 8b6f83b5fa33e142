"""Activations whose gradient is taken whole rather than node by node: SiLU and exact GELU as
exporters write them (several nodes, recognized by the Mul rule in ``rules_elementwise``) and
the ``Gelu`` op; each from x alone, in as few full-size passes as measured best."""

from __future__ import annotations

import math

import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, attr
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.values import const_scalar

__all__ = ["gelu_input", "grad_gelu_erf", "grad_silu", "silu_input"]


def silu_input(node: ir.Node) -> int | None:
    """Which input of the Mul is x when the node is SiLU, x * Sigmoid(x), with the Sigmoid read
    by this Mul alone (so its gradient is all this rule's to give); else None."""
    for i, (x, s) in enumerate((node.inputs, node.inputs[::-1])):
        gate = s.producer() if s is not None else None
        if (gate is not None and gate.op_type == "Sigmoid" and gate.domain in ("", "ai.onnx")
                and gate.inputs[0] is x and len(s.uses()) == 1 and not s.is_graph_output()):
            return i
    return None


def grad_silu(g, node, dy, x_index: int):
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


def gelu_input(node: ir.Node) -> int | None:
    """Which input of the Mul is x when the node is ``x * (1 + Erf(x / sqrt(2)))`` (exact GELU as
    torch.onnx writes it, before its ``* 0.5``; ``x * (1/sqrt(2))`` too), the Div, Erf and Add
    outputs read by that chain alone; else None."""
    def scalar(value: ir.Value, expected: float) -> bool:
        found = const_scalar(value)
        return found is not None and abs(found - expected) < 1e-6

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


def grad_gelu_erf(g, node, dy, x_index: int):
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
    if x.dtype == ir.DataType.BFLOAT16 and g.opset < 22:  # HardSigmoid takes bfloat16 from opset 22
        cdf = g.mul(g.add(erf, g.scalar(1.0, x)), g.scalar(0.5, x))
    else:
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
        if const_scalar(node.inputs[scale]) == factor:
            d = node.inputs[keep]
            node.graph.remove(node, safe=True)
            return d
    return None


def _to_input(index: int, grad: ir.Value) -> tuple[ir.Value | None, ir.Value | None]:
    """A binary op's gradients when all of it goes to input ``index``."""
    return (grad, None) if index == 0 else (None, grad)


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
