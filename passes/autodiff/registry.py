"""The gradient-rule table: one VJP rule per ONNX op type (domain ``ai.onnx``).

A rule has the signature ``rule(g: GradBuilder, node: ir.Node, dy) -> sequence`` and returns
one entry per node input: the gradient for that input (an ``ir.Value`` whose shape is the
input's shape), or ``None`` where the input has no gradient (indices, shapes, integer
inputs, or an input the op does not depend on differentiably).

``dy`` is the gradient of output 0 for ordinary rules. Rules registered with
``multi_output=True`` receive a tuple with one entry per output instead (``None`` where that
output has no gradient). A rule may instead return a ``dict`` ``{value: gradient}`` when it
differentiates values the node does not list as inputs (``If`` branches capture outer values).
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


RULES: dict[str, GradRule] = {}


def grad_rule(*op_types: str, multi_output: bool = False) -> Callable[[GradRuleFn], GradRuleFn]:
    """Register ``fn`` as the VJP rule of each ONNX op type in ``op_types``."""

    def register(fn: GradRuleFn) -> GradRuleFn:
        for op_type in op_types:
            if op_type in RULES:
                raise RuntimeError(f"gradient rule for {op_type!r} registered twice")
            RULES[op_type] = GradRule(op_type, fn, multi_output)
        return fn

    return register


def get_grad_rule(op_type: str) -> GradRule | None:
    return RULES.get(op_type)
