"""Running onnxscript rewrite rules as one named pass, and graph helpers the rules share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import onnxscript.optimizer
from onnxscript.rewriter import RULE_NAME_TAG, RewriteRule, RewriteRuleSet
from onnxscript.rewriter._pattern_ir import NodeOutputPattern, StringConstantPattern

from graphc.passes.optimize.library import NameFix, RemoveUnusedNodes
from graphc.passes.optimize.pipeline import all_nodes

__all__ = ["RulePass", "const_array", "initializer", "int64_initializer", "is_constant"]


class _AnchoredRule(RewriteRule):
    """A rule that is tried only on nodes of its pattern's root op type. onnxscript tries every
    rule on every node and pays ~30 us per failed attempt; commuted rule sets run to 100+ rules,
    so on a 1000-node training graph this check alone saves seconds."""

    def __init__(self, rule: RewriteRule, root_op: str | None, guard, producers=()):  # noqa: D107 - a copy
        self.__dict__.update(rule.__dict__)
        self._root_op, self._guard, self._producers = root_op, guard, producers

    def try_rewrite(self, model, graph_or_function, node, **kwargs):
        if (self._root_op is not None and node.op_type != self._root_op) or not self._guard(node):
            return None
        inputs = node.inputs
        for i, op in self._producers:  # the pattern's first level: input i comes from an `op`
            value = inputs[i] if i < len(inputs) else None
            producer = value.producer() if value is not None else None
            if producer is None or producer.op_type != op:
                return None
        return super().try_rewrite(model, graph_or_function, node, **kwargs)


def _anchored(rule: RewriteRule, guard) -> RewriteRule:
    pattern = rule._target_pattern
    if not (pattern.num_outputs == 1 and pattern.has_single_output_node):
        return _AnchoredRule(rule, None, guard)
    root = pattern.output_nodes[0]
    # The matcher matches root input i against a node pattern's output only if the graph
    # node's input i is that output of a node whose op_type equals the pattern's op name
    # (a missing or None input fails): a necessary condition checked before matching.
    producers = tuple((i, p.producer().op.value()) for i, p in enumerate(root.inputs)
                      if isinstance(p, NodeOutputPattern) and isinstance(p.producer().op, StringConstantPattern))
    return _AnchoredRule(rule, root.op_type, guard, producers)


class _Dispatch:
    """Stands in for a list of rules inside a ``RewriteRuleSet``: the rewriter tries every rule
    on every node, this tries only the rules rooted at the node's op type (and the unanchored
    ones), in the list's order, first match wins, as the rewriter's own loop does. What the
    rewriter reads off the rule that matched (name, remove_nodes, as_function) is that rule's."""

    def __init__(self, rules: Sequence[RewriteRule]):
        self.rules = list(rules)
        self._by_op: dict[str, list[RewriteRule]] = {}
        self._last: RewriteRule | None = None

    def _for(self, op_type: str) -> list[RewriteRule]:
        rules = self._by_op.get(op_type)
        if rules is None:
            rules = self._by_op[op_type] = [r for r in self.rules if r._root_op in (op_type, None)]
        return rules

    def try_rewrite(self, model, graph_or_function, node, **kwargs):
        for rule in self._for(node.op_type):
            delta = rule.try_rewrite(model, graph_or_function, node, **kwargs)
            if delta is not None:
                self._last = rule
                return delta
        return None

    def graph_pre_visitor(self):
        for rule in self.rules:
            if rule.graph_pre_visitor:
                rule.graph_pre_visitor()

    def graph_post_visitor(self):
        for rule in self.rules:
            if rule.graph_post_visitor:
                rule.graph_post_visitor()

    @property
    def name(self):
        return self._last.name if self._last is not None else None

    @property
    def remove_nodes(self) -> bool:
        return self._last.remove_nodes if self._last is not None else all(r.remove_nodes for r in self.rules)

    @property
    def as_function(self) -> bool:
        return self._last.as_function if self._last is not None else False


class _RuleSet(RewriteRuleSet):
    """onnxscript's ``RewriteRuleSet.apply_to_model``, step for step, except that the dead-node
    sweep after rewriting (needed when a rule keeps its matched nodes) is graphc's
    ``RemoveUnusedNodes`` and the closing name fix ``NameFix``: the same effects as onnx-ir's
    passes at a fraction of the cost."""

    def apply_to_model(self, model: ir.Model, *, verbose: int | None = None, tracer=None) -> int:
        onnxscript.optimizer.basic_constant_propagation(model.graph)
        original_functions = list(model.functions.values())
        count = self._apply_to_graph_or_function(model, model.graph, verbose=verbose, tracer=tracer)
        for function in original_functions:
            onnxscript.optimizer.basic_constant_propagation(function)
            count += self._apply_to_graph_or_function(model, function, verbose=verbose, tracer=tracer)
        if self.remove_unused_nodes:
            RemoveUnusedNodes()(model)
        if count > 0:
            # as onnxscript: values the rewrites created may clash in name with existing ones
            NameFix()(model)
        return count


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
        self.guard = guard
        self.rules = RewriteRuleSet([_anchored(r, guard) for r in rules])
        # The op types each rule's pattern needs: a rule whose ops are not all in the graph
        # cannot match, and skipping it keeps the pass cheap (commuted rule sets run to 100+).
        self._needs = [frozenset(n.op_type for n in rule._target_pattern._nodes) for rule in self.rules.rules]

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        nodes = all_nodes(model.graph)
        present = {n.op_type for n in nodes}
        rules = [r for r, needs in zip(self.rules.rules, self._needs) if needs <= present]
        if not rules:
            return ir.passes.PassResult(model, False)
        ruleset = _RuleSet([_Dispatch(rules)])
        ruleset.remove_unused_nodes = any(not r.remove_nodes for r in rules)
        roots = {r._root_op for r in rules}
        if (None not in roots and not ruleset.remove_unused_nodes and not model.functions
                and not any(n.op_type in roots and self.guard(n) for n in nodes)):
            # No node any rule may be rooted at (``_AnchoredRule``): nothing can match, and the
            # rewriter would only walk the graph (it has no dead-node sweep to run either).
            return ir.passes.PassResult(model, False)
        count = ruleset.apply_to_model(model)
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


def initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """A new initializer of ``graph`` holding ``array``, named ``name`` (with ``_`` appended
    until no initializer has that name)."""
    while name in graph.initializers:
        name += "_"
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.Tensor(array, name=name))  # ir.tensor(): the same, slower
    graph.register_initializer(value)
    return value


def int64_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """``initializer`` of ``array`` as int64."""
    return initializer(graph, name, np.asarray(array, dtype=np.int64))
