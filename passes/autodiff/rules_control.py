"""VJP rule of If: each branch is differentiated as a subgraph of a backward If.

The backward If takes the same condition. Each of its branches is a clone of the forward
branch (recomputing the branch's intermediates, which are invisible outside it) followed by
that branch's gradient nodes; both output the gradients of every differentiable outer value
either branch reads (zeros where a branch does not read it).
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder
from graphc.passes.autodiff.registry import grad_rule


def _branch_gradients(g: GradBuilder, branch: ir.Graph, dys, targets: list[ir.Value]) -> ir.Graph:
    from graphc.passes.autodiff.core import backprop  # core imports the rule modules

    clone = branch.clone(allow_outer_scope_values=True)
    sub = g.subgraph_builder(clone)
    sub.node_name = g.node_name
    for node in clone:  # fresh names: the clone must not repeat the forward branch's names
        for out in node.outputs:
            out.name = sub._fresh("fwd")
    seeds: dict[ir.Value, ir.Value] = {}
    for out, dy in zip(clone.outputs, dys):
        if dy is not None:
            seeds[out] = sub.add(seeds[out], dy) if out in seeds else dy
    nodes = list(clone)
    grads = backprop(sub, nodes, seeds, targets)
    outputs = []
    for t in targets:
        grad = grads.get(t)
        value = sub.op("Identity", grad) if grad is not None else sub.zeros_like(t)
        value.type, value.shape = t.type, t.shape
        outputs.append(value)
    clone.outputs.clear()
    clone.outputs.extend(outputs)
    clone.name = sub._fresh("branch")
    return clone


@grad_rule("If", multi_output=True)
def grad_if(g, node, dys):
    from graphc.passes.autodiff.core import captured_values

    then_graph = node.attributes["then_branch"].value
    else_graph = node.attributes["else_branch"].value
    targets: dict[ir.Value, None] = {}
    for branch in (then_graph, else_graph):
        for v in captured_values(branch):
            if g.wants(v):
                targets.setdefault(v, None)
    targets_list = list(targets)
    if not targets_list:
        return {}
    then_bwd = _branch_gradients(g, then_graph, dys, targets_list)
    else_bwd = _branch_gradients(g, else_graph, dys, targets_list)
    outs = g.op("If", node.inputs[0], num_outputs=len(targets_list), then_branch=then_bwd, else_branch=else_bwd)
    if len(targets_list) == 1:
        outs = (outs,)
    return dict(zip(targets_list, outs))
