"""Running onnxscript rewrite rules as one named pass, and graph helpers the rules share.

A rewrite is written one way: an onnxscript ``RewriteRuleClassBase`` (pattern, check, rewrite),
or one of onnxscript's public rules, run by ``RulePass`` through onnxscript's public
``RewriteRuleSet``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RULE_NAME_TAG, MatchResult, RewriteRule, RewriteRuleClassBase, RewriteRuleSet
from onnxscript.rewriter.pattern import SimplePatternMatcher

from graphc.passes.optimize.pipeline import Declared, all_nodes

__all__ = ["RulePass", "initializer", "int64_initializer"]


def _always(node: ir.Node) -> bool:
    return True


class _AnchoredMatcher(SimplePatternMatcher):
    """onnxscript's matcher, asked only about nodes that can match: of the pattern's root op
    type, passing the pass's ``guard``, whose inputs come from the ops the pattern's first
    level names, in a graph holding every op the pattern needs. onnxscript tries every rule on
    every node and pays ~30 us per failed attempt; commuted rule sets run to 100+ rules, so on
    a 1000-node training graph this check saves seconds (9x less time in the rule passes).
    It reads the pattern through its public attributes; ``RewriteRule.commute`` builds each
    commuted rule's matcher with this class too. A ``RulePass`` subclasses it to set ``guard``
    and, per run, ``present`` (the op types in the model)."""

    guard = staticmethod(_always)
    present: frozenset[str] = frozenset()

    def __init__(self, pattern):
        super().__init__(pattern)
        self.needs = frozenset(n.op_type for n in pattern)
        root = pattern.output_node if pattern.num_outputs == 1 and pattern.has_single_output_node else None
        self.root_op = _fixed_op(root) if root is not None else None
        # The matcher matches root input i against a node pattern's output only if the graph
        # node's input i is that output of a node of that op (a missing input fails): a
        # necessary condition checked before matching.
        producers = [] if self.root_op is None else [(i, p.producer()) for i, p in enumerate(root.inputs) if p is not None]
        self.producers = tuple((i, _fixed_op(p)) for i, p in producers if p is not None and _fixed_op(p) is not None)

    def match(self, model, graph_or_function, node, **kwargs):
        if not self.can_match(node):
            return _NO_MATCH
        return super().match(model, graph_or_function, node, **kwargs)

    def can_match(self, node: ir.Node) -> bool:
        if (self.root_op is not None and node.op_type != self.root_op) or not self.needs <= self.present:
            return False
        inputs = node.inputs
        for i, op in self.producers:
            value = inputs[i] if i < len(inputs) else None
            producer = value.producer() if value is not None else None
            if producer is None or producer.op_type != op:
                return False
        return self.guard(node)  # last: a guard may look further than the producers


def _fixed_op(node_pattern) -> str | None:
    """The one op type a node pattern matches, else None. ``op_identifier()`` says, except on
    the copies ``GraphPattern.commute()`` makes: onnxscript 0.7's ``NodePattern.clone`` passes
    the op on as a string pattern, and the constructor sets the identifier only for a ``str``
    op, so every commuted rule would lose its anchor (no upstream issue found for it). Such an
    op is a constant pattern with ``value()``."""
    identifier = node_pattern.op_identifier()
    if identifier is not None:
        return identifier[1]
    op, domain = node_pattern.op, node_pattern.domain
    if callable(getattr(op, "value", None)) and callable(getattr(domain, "value", None)):
        return op.value()
    return None


_NO_MATCH = MatchResult().fail("not of the root op, or the guard or the first-level producers differ")


class RulePass(Declared, ir.passes.InPlacePass):
    """Applies a set of pattern rules (pattern, check, rewrite) everywhere they match,
    subgraphs included, first rule in the list first. Soundness is each rule's own (see the
    rule's docstring). ``rules``: ``RewriteRuleClassBase`` instances (matched through
    ``_AnchoredMatcher``; ``commute=True`` adds their commuted forms) or onnxscript's
    prebuilt rules. The rewriter copies the matched nodes' metadata onto the replacement,
    first match first, and the first matched node is the pattern's root, so a fused node keeps
    its anchor's ``graphc.source``. The rewriter's own rule-name tag is dropped again: it is
    not ours."""

    def __init__(self, name: str, rules: Sequence[RewriteRuleClassBase | RewriteRule], guard=_always,
                 commute: bool = False):
        """``guard(node)``: a cheap necessary condition on a root node, checked before the
        rules' pattern matching (which costs ~30 us per node and rule)."""
        super().__init__()
        self.name = name
        self.guard = guard
        matchers: list[_AnchoredMatcher] = []

        class Matcher(_AnchoredMatcher):
            def __init__(self, pattern):
                super().__init__(pattern)
                matchers.append(self)

        Matcher.guard = staticmethod(guard)
        self._matcher = Matcher
        built: list[RewriteRule] = []
        for rule in rules:
            if isinstance(rule, RewriteRuleClassBase):
                rule = RewriteRule(rule.pattern, rule.rewrite, rule.check, Matcher, name=rule.name,
                                   remove_nodes=rule.remove_nodes, graph_pre_visitor=rule.setup,
                                   graph_post_visitor=rule.cleanup, as_function=rule.as_function)
                built.extend(rule.commute() if commute else [rule])
            else:
                built.append(rule)
        self.rules = RewriteRuleSet(built)
        self._matchers = matchers  # one per anchored rule, commuted forms included
        self._plain = len(matchers) < len(built)  # a prebuilt rule: anchored by onnxscript alone

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        nodes = all_nodes(model.graph)
        present = frozenset(n.op_type for n in nodes)
        self._matcher.present = present
        if not self._plain:
            roots = {m.root_op for m in self._matchers if m.needs <= present}
            if not roots:
                return ir.passes.PassResult(model, False)  # no rule's ops are all in the graph
            if (None not in roots and not self.rules.remove_unused_nodes and not model.functions
                    and not any(n.op_type in roots and self.guard(n) for n in nodes)):
                # No node any rule may be rooted at: nothing can match, and the rewriter would
                # only walk the graph (it has no dead-node sweep to run either).
                return ir.passes.PassResult(model, False)
        count = self.rules.apply_to_model(model)
        if count:
            for node in all_nodes(model.graph):
                node.metadata_props.pop(RULE_NAME_TAG, None)
        return ir.passes.PassResult(model, bool(count))


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
