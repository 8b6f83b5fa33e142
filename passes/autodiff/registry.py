"""The gradient-rule table: one VJP rule per ONNX op type (domain ``ai.onnx``).

A rule has the signature ``rule(g: GradBuilder, node: ir.Node, dy) -> sequence`` and returns
exactly one entry per node input: the gradient for that input (an ``ir.Value`` of the input's
dtype and shape), or ``None`` where the input has no gradient (indices, shapes, integer
inputs, or an input the op does not depend on differentiably). The driver (``core``) checks
the count, dtype and static shape of what a rule returns and names the op when they are wrong.

Broadcasting is undone by the driver, never by a rule: a rule registered with
``broadcast=True`` (or a tuple of input indices) returns those inputs' gradients in the
output's shape, and a rule whose gradient has another broadcast shape (MatMul's batch dims)
says so with ``g.broadcast_from(dx, shape)``; the driver sums each down to its input's shape.

``dy`` is the gradient of output 0 for ordinary rules. Rules registered with
``multi_output=True`` receive a tuple with one entry per output instead (``None`` where that
output has no gradient). A rule may instead return a ``dict`` ``{value: gradient}`` when it
differentiates values the node does not list as inputs (``If`` branches capture outer values).

``FUSED_RULES`` holds the backward of fused kernels that a pass wrote out as several nodes: the
kernel's last node names its rule (``FUSED_GRADIENT_KEY``), which returns a ``dict`` for the
kernel's inputs; its other nodes then receive no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

GradRuleFn = Callable[[Any, ir.Node, Any], Any]


@dataclass(frozen=True)
class GradRule:
    op_type: str
    fn: GradRuleFn
    multi_output: bool = False
    # outputs of a single-output rule's op that carry no gradient by convention (BatchNorm's
    # running statistics); a gradient reaching any other output is an error, never dropped
    no_grad_outputs: tuple[int, ...] = ()
    # inputs whose gradient the rule returns in the output's (broadcast) shape; None: all
    broadcast: frozenset[int] | None = frozenset()

    def broadcasts(self, index: int) -> bool:
        return self.broadcast is None or index in self.broadcast


RULES: dict[str, GradRule] = {}


def grad_rule(*op_types: str, multi_output: bool = False, no_grad_outputs: tuple[int, ...] = (),
              broadcast: bool | tuple[int, ...] = False) -> Callable[[GradRuleFn], GradRuleFn]:
    """Register ``fn`` as the VJP rule of each ONNX op type in ``op_types``. ``broadcast``: the
    rule returns the gradients of all inputs (True) or of these inputs in the output's shape."""
    inputs = None if broadcast is True else frozenset(broadcast or ())

    def register(fn: GradRuleFn) -> GradRuleFn:
        for op_type in op_types:
            if op_type in RULES:
                raise RuntimeError(f"gradient rule for {op_type!r} registered twice")
            RULES[op_type] = GradRule(op_type, fn, multi_output, no_grad_outputs, inputs)
        return fn

    return register


FUSED_RULES: dict[str, GradRule] = {}


def fused_grad_rule(kernel: str) -> Callable[[GradRuleFn], GradRuleFn]:
    """Register ``fn`` as the backward of the fused kernel ``kernel`` (``FUSED_GRADIENT_KEY``)."""
    def register(fn: GradRuleFn) -> GradRuleFn:
        if kernel in FUSED_RULES:
            raise RuntimeError(f"fused gradient rule {kernel!r} registered twice")
        FUSED_RULES[kernel] = GradRule(kernel, fn)
        return fn

    return register


def get_grad_rule(op_type: str) -> GradRule | None:
    return RULES.get(op_type)


# Float inputs that set how an op behaves rather than carry learned values: PyTorch keeps these
# as constants or buffers (clamp bounds, interpolation roi/scales, a pad value, class weights of
# a loss, a dropout rate, an exponent: x.pow(2), LPPool's p, which torch.onnx's dynamo exporter
# writes as initializers; OneHot's [off, on] values). An initializer read only through them is not trained by default
# (``gc.training.generate`` with no ``trainable``); named in ``trainable`` it trains with its
# exact gradient where the rule has one (Resize's roi/scales and Dropout's ratio get none).
SETTING_INPUTS: dict[str, frozenset[int]] = {
    "Clip": frozenset({1, 2}), "Resize": frozenset({1, 2}), "Upsample": frozenset({1}), "Pad": frozenset({2}),
    "SoftmaxCrossEntropyLoss": frozenset({2}), "NegativeLogLikelihoodLoss": frozenset({2}),
    "Dropout": frozenset({1}), "Pow": frozenset({1}), "OneHot": frozenset({2}),
}


# ops that only move or retype values: a setting built with them (Resize scales as
# Concat(Constant, Constant), as torch.onnx writes them) is still a setting
_PASS_THROUGH = frozenset({"Identity", "Cast", "Concat", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice",
                           "Gather"})


def settings_only(value: ir.Value, depth: int = 0) -> bool:
    """Whether ``value`` only ever reaches ``SETTING_INPUTS`` (directly, or through ops that
    merely move values, ``_PASS_THROUGH``), never an input an op computes with."""
    uses = value.uses()
    if not uses or depth > 8 or value.is_graph_output():
        return False
    for use in uses:
        op = use.node.op_type
        if use.idx in SETTING_INPUTS.get(op, ()):
            continue
        if op not in _PASS_THROUGH or not all(settings_only(out, depth + 1) for out in use.node.outputs):
            return False
    return True
