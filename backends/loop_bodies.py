"""Loop bodies a cancelled onnxruntime run could not leave, in an onnxruntime session's copy of a model.

onnxruntime 1.31 checks ``RunOptions.terminate`` (``CancelToken``, the server's
``--request-timeout``) only before it runs a node, so a Loop whose body runs no node goes through
its trip count however it is cancelled: with a fed count of 1e12, a thread held for good. A body
runs no node when it has none (it passes its carries straight out), or when onnxruntime's graph
rewrites leave it none: Constants become initializers at load, and from level "basic" a body whose
nodes read no body input is constant-folded away and an Identity whose output nothing reads is
dropped. A body keeps a node when one of its outputs is computed, through nodes, from one of its
inputs: such a node can be neither folded nor dropped (a body input cannot be wired straight to a
body output). Each Loop body without one, in every graph (subgraphs at any depth) and local
function, gets its condition output as ``And(condition, condition input)``: the same value, since a
running body's condition input is true (the Loop's condition, true without one, then the last
iteration's), and a node that reads a body input and writes a body output, which stays; it works
where no carry passes straight through too (outputs that are constants). Other bodies are left as
they are: a node more costs a one-Add body 0.11 us an iteration (18%).
"""

from __future__ import annotations

import onnx
from onnx import helper

from graphc.model.file import all_graphs, model_graphs
from graphc.passes.values import fresh_name

__all__ = ["terminable"]


def terminable(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when every Loop body keeps a node (the module docstring), else a copy in
    which each body that does not gets one."""
    if not any(_runs_no_node(body) for body in _loop_bodies(model)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    taken = {name for g in model_graphs(copy) for name in [*(v.name for v in [*g.input, *g.output]),
                                                           *(t.name for t in g.initializer),
                                                           *(o for n in g.node for o in n.output)]}
    for body in _loop_bodies(copy):
        if _runs_no_node(body):
            cond = body.output[0]
            fresh = fresh_name(taken, f"{cond.name}_running", sep="")
            body.node.append(helper.make_node("And", [cond.name, body.input[1].name], [fresh]))
            cond.name = fresh
    return copy


def _loop_bodies(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The body of every Loop of ``model``'s main graph, its local functions' nodes and their
    subgraphs at any depth: the model's own messages."""
    function_nodes = [node for f in model.functions for node in f.node]
    graphs = [*all_graphs(model.graph), *(g for node in function_nodes for sub in _subgraphs(node) for g in all_graphs(sub))]
    return [a.g for nodes in [function_nodes, *(g.node for g in graphs)] for node in nodes
            if node.op_type == "Loop" and node.domain in ("", "ai.onnx") for a in node.attribute if a.name == "body"]


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _runs_no_node(body: onnx.GraphProto) -> bool:
    """Whether no output of ``body`` is computed, through its nodes, from one of its inputs (the
    names a node's subgraphs read count as the node's inputs)."""
    varying = {v.name for v in body.input}
    computed = set()
    for node in body.node:
        read = {*node.input, *(name for sub in _subgraphs(node) for g in all_graphs(sub) for n in g.node for name in n.input)}
        if read & varying:
            varying.update(node.output)
            computed.update(node.output)
    return len(body.input) > 1 and len(body.output) > 0 and not any(out.name in computed for out in body.output)
