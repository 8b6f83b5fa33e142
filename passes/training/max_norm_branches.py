"""Data-parallel workers' graphs for an embedding with ``max_norm`` looked up inside a ``gc.cond`` branch (of the
main graph, or of a loop's body: ``max_norm_steps``): the branch, when it runs, renormalises the rows the whole
batch looks up there, as torch's Python ``if`` over the whole batch does; a branch not taken renormalises nothing.

That is one process's step only where every worker takes the branch one process takes on the whole batch. A
predicate that reads no batch input (a param, a constant) is the same on every worker and on the whole batch (the
workers hold the same params, renormalised rows included). One that reads the batch (its sum, its size) would be
each worker's shard's, not the whole batch's, so each worker computes it from the whole batch instead
(``whole_batch``): the rows graph also outputs the batch inputs it reads (``<input>.whole``), the workers
concatenate the shards' in rank order (the whole batch, as one process holds it), and the predicate's nodes that
depend on the batch are copied to read them. The rows graph computes each branch write-back's flat indices whether
or not the branch runs (``hoist``), the workers take their union, and the branch, where it runs, renormalises and
writes back those rows (``max_norm_shards``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import onnx_ir as ir
from graphc.passes.emit import Emitter
from graphc.passes.values import MAX_NORM_KEY, ancestors, needed_values, subgraph_reads, subgraphs

from graphc.errors import ArtifactsError

__all__ = ["WHOLE", "batch_read", "hoist", "where", "whole_batch"]

WHOLE = ".whole"  # a batch input, every shard's rows in rank order: ``<input>.whole``


def batch_read(graph: ir.Graph, values: Sequence[ir.Value], data: Collection[str]) -> list[ir.Value]:
    """The inputs of ``graph`` among the batch inputs ``data`` that ``values`` are computed from (through bodies too)."""
    needed = needed_values(graph, values)[0]
    return [v for v in graph.inputs if v.name in data and v in needed]


def where(written: Sequence[ir.Node]) -> tuple[str, str]:
    """The param and the DSL line of the first lookup whose write-backs are among ``written``."""
    param, _, at = next(use.metadata_props[MAX_NORM_KEY] for s in written for use, _ in s.outputs[0].uses()
                        if MAX_NORM_KEY in use.metadata_props).partition(" at ")
    return param, at


def whole_batch(graph: ir.Graph, e: Emitter, branches: dict[ir.Node, list[ir.Node]], data: Collection[str]) -> None:
    """Each If of ``branches`` (``graph``'s, the main graph, sorted; its branches' write-backs) whose predicate reads
    batch inputs among ``data`` made to compute it from the whole batch's: a new input ``<input>.whole`` for each
    input read ([whole batch, ...]), the predicate's nodes that depend on it copied (``e``) to read that instead,
    and every reader of the predicate reading the copy.
    An ArtifactsError where those nodes hold a control-flow body."""
    clones: dict[ir.Value, ir.Value] = {}
    for node, written in branches.items():
        read = batch_read(graph, [node.inputs[0]], data)
        for v in (v for v in read if v not in clones):
            whole = ir.Value(name=f"{v.name}{WHOLE}", type=v.type, shape=ir.Shape([f"{v.name}{WHOLE}_rows", *v.shape[1:]]))
            graph.inputs.append(whole)
            clones[v] = whole
        cone, after = ancestors([node.inputs[0]]), set(read)
        copied = []
        for n in graph:
            if n in cone and any(v in after for v in [*n.inputs, *subgraph_reads(n)]):
                after.update(n.outputs)
                copied.append(n)
        held = [n.name for n in copied if subgraphs(n)]
        if held:
            param, at = where(written)
            raise ArtifactsError(
                f"the embedding of {param!r} with max_norm at {at} renormalises rows in a gc.cond branch (node "
                f"{node.name!r}) whose predicate reads the batch ({[v.name for v in read]}) through a control-flow node "
                f"({held}): the workers compute such a predicate from the whole batch by copying the nodes between, "
                "not yet a gc.cond/gc.fori_loop/gc.while_loop/gc.scan among them; compute the predicate without one, "
                "make it read no batch input (a param, a constant) or train with one worker")
        e.copy([n for n in copied if n.outputs[0] not in clones], clones)
        if read:  # the gradients' If (the branch's backward) reads it too
            ir.convenience.replace_all_uses_with(node.inputs[0], clones[node.inputs[0]])


def hoist(graph: ir.Graph, branches: dict[str, list[str]]) -> list[ir.Value]:
    """In ``graph`` (the rows graph, a clone), the nodes of each If named in ``branches`` that compute the flat
    indices of its branches' write-backs (the ``ScatterND``\\ s named there) moved out before it, so they run
    whether or not the branch does; returns those flat indices, in the order named."""
    out: list[ir.Value] = []
    for node in [n for n in graph if n.name in branches]:
        for key in ("then_branch", "else_branch"):
            branch = node.attributes[key].as_graph()
            for scatter in [n for n in branch if n.name in branches[node.name]]:
                flat = scatter.inputs[1]
                needed = needed_values(branch, [flat])[0]
                moved = [n for n in branch if any(v in needed for v in n.outputs)]
                branch.remove(moved)
                graph.insert_before(node, moved)
                out.append(flat)
    return out
