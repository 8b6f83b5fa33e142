"""``gc.vmap``'s batching rule for ``If`` (``gc.cond``) on a condition the same for every example, added to
``vmap_rules.RULES``: both branches rewritten by the rules into branches on the batched values. A
per-example condition has no rule (the body runs as a Scan)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.control import run_graph
from graphc.dsl.vmap_rules import RULES, Arg, Batching, NoRule, rewrite
from graphc.model import SOURCE_KEY

__all__: list[str] = []


def _branch(b: Batching, graph: ir.Graph) -> tuple[list, list[Arg]]:
    """``graph``'s nodes rewritten in a scope of their own: (its nodes, its outputs)."""
    with b.builder.subgraph() as scope:
        outs = rewrite(b, list(graph), {id(n) for n in graph}, {}, list(graph.outputs), outer=dict(b.made))
    return scope, [Arg(*o) for o in outs]


def _finish(b: Batching, scope, outs: list[Arg], batched: list[bool], name: str) -> ir.Graph:
    """The branch's graph: each output batched where either branch's is, made in the branch and once."""
    b.builder.scopes.append(scope)
    try:
        values, made = [], {id(v) for node in scope.nodes for v in node.outputs}
        for a, flag in zip(outs, batched):
            t = b.expand(a.t) if flag and not a.batched else a.t
            if id(t.value) not in made or t.value in values:
                t = ops.emit("Identity", [t])
            made.add(id(t.value))
            values.append(t.value)
    finally:
        b.builder.scopes.pop()
    return ir.Graph([], values, nodes=scope.nodes, name=b.builder.unique(name))


def _shape(b: Batching, a: Arg, batched: bool) -> tuple | None:
    """The shape of a branch's output, batched (expanded where it was not) when ``batched``."""
    if a.t.shape is None:
        return None
    return (b.size, *a.t.shape) if batched and not a.batched else tuple(a.t.shape)


def _merged(x: tuple | None, y: tuple | None) -> list | None:
    """One shape for both branches' output: dims that differ unknown."""
    if x is None or y is None or len(x) != len(y):
        return None
    return [d if d == e else None for d, e in zip(x, y)]


def _if(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    if args[0].batched:
        raise NoRule("a per-example condition")
    then_scope, then_outs = _branch(b, node.attributes["then_branch"].value)
    else_scope, else_outs = _branch(b, node.attributes["else_branch"].value)
    batched = [x.batched or y.batched for x, y in zip(then_outs, else_outs)]
    then_g = _finish(b, then_scope, then_outs, batched, "then_branch")
    else_g = _finish(b, else_scope, else_outs, batched, "else_branch")
    out_types = [(x.t.dtype, _merged(_shape(b, x, flag), _shape(b, y, flag)))
                 for x, y, flag in zip(then_outs, else_outs, batched)]

    def evaluate(arrays: list) -> list:
        return run_graph(b.builder, then_g if bool(np.asarray(arrays[0]).reshape(-1)[0]) else else_g, [])

    outs = ops.emit("If", [args[0].t], {"then_branch": then_g, "else_branch": else_g}, len(out_types),
                    out_types=out_types, source=node.metadata_props.get(SOURCE_KEY), evaluator=evaluate)
    outs = outs if isinstance(outs, list) else [outs]
    return [Arg(t, flag) for t, flag in zip(outs, batched)]


RULES["If"] = _if
