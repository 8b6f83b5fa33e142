"""Running onnxscript rewrite rules as one named pass, and graph helpers the rules share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RULE_NAME_TAG, RewriteRule, RewriteRuleSet

from graphc.passes.optimize.pipeline import all_nodes

__all__ = ["RulePass", "const_array", "is_constant"]


class _AnchoredRule(RewriteRule):
    """A rule that is tried only on nodes of its pattern's root op type. onnxscript tries every
    rule on every node and pays ~30 us per failed attempt; commuted rule sets run to 100+ rules,
    so on a 1000-node training graph this check alone saves seconds."""

    def __init__(self, rule: RewriteRule, root_op: str | None, guard):  # noqa: D107 - a copy
        self.__dict__.update(rule.__dict__)
        self._root_op, self._guard = root_op, guard

    def try_rewrite(self, model, graph_or_function, node, **kwargs):
        if (self._root_op is not None and node.op_type != self._root_op) or not self._guard(node):
            return None
        return super().try_rewrite(model, graph_or_function, node, **kwargs)


def _anchored(rule: RewriteRule, guard) -> RewriteRule:
    pattern = rule._target_pattern
    single = pattern.num_outputs == 1 and pattern.has_single_output_node
    return _AnchoredRule(rule, pattern.output_nodes[0].op_type if single else None, guard)


def _always(node: ir.Node) -> bool:
    return True


class RulePass(ir.passes.InPlacePass):
    """Applies a set of onnxscript pattern rules (pattern, check, rewrite) everywhere they
    match, subgraphs included. Soundness is each rule's own (see the rule's docstring). The
    rewriter copies the matched nodes' metadata onto the replacement, first match first, and the
    first matched node is the pattern's root, so a fused node keeps its anchor's
    ``graphc.source``. The rewriter's own rule-name tag is dropped again: it is not ours."""

    def __init__(self, name: str, rules: Sequence, guard=_always):
        """``guard(node)``: a cheap necessary condition on a root node, checked before the
        rules' pattern matching (which costs ~30 us per node and rule)."""
        super().__init__()
        self.name = name
        self.rules = RewriteRuleSet([_anchored(r, guard) for r in rules])
        # The op types each rule's pattern needs: a rule whose ops are not all in the graph
        # cannot match, and skipping it keeps the pass cheap (commuted rule sets run to 100+).
        self._needs = [frozenset(n.op_type for n in rule._target_pattern._nodes) for rule in self.rules.rules]

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        present = {n.op_type for n in all_nodes(model.graph)}
        rules = [r for r, needs in zip(self.rules.rules, self._needs) if needs <= present]
        if not rules:
            return ir.passes.PassResult(model, False)
        count = RewriteRuleSet(rules).apply_to_model(model)
        if count:
            for node in all_nodes(model.graph):
                node.metadata_props.pop(RULE_NAME_TAG, None)
        return ir.passes.PassResult(model, bool(count))


def is_constant(value: ir.Value | None) -> bool:
    """A value known at optimization time that no caller can override: a Constant node's output
    or an initializer that is not also a graph input."""
    if value is None or value.const_value is None:
        return False
    return not value.is_graph_input()


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The numpy value of a true constant (see ``is_constant``), else None."""
    if not is_constant(value):
        return None
    try:
        return value.const_value.numpy()
    except FileNotFoundError:  # external data that is not available
        return None
