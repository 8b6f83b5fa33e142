"""Data-parallel workers' graphs for an embedding with ``max_norm`` looked up inside a ``gc.cond`` branch of the
main graph: the branch, when it runs, renormalises the rows the whole batch looks up there, as torch's Python
``if`` over the whole batch does; a branch not taken renormalises nothing.

That is one process's step only where every worker takes the branch one process takes on the whole batch. A
predicate that reads no batch input (a param, a constant) is the same on every worker and on the whole batch (the
workers hold the same params, renormalised rows included); one that reads the batch is computed by each worker
from its own shard, and a shard's (its sum, its size) is not the whole batch's in general, so a worker's forward
itself is not one process's: ``refuse_batch_predicate``. The rows graph computes each branch write-back's flat
indices whether or not the branch runs (``hoist``), the workers take their union, and the branch, where it runs,
renormalises and writes back those rows (``max_norm_shards``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import onnx_ir as ir
from graphc.passes.values import MAX_NORM_KEY, needed_values

from graphc.errors import ArtifactsError

__all__ = ["hoist", "refuse_batch_predicate"]


def refuse_batch_predicate(graph: ir.Graph, node: ir.Node, written: Sequence[ir.Node], data: Collection[str]) -> None:
    """An ArtifactsError where the predicate of the If ``node`` (of ``graph``, the main graph), whose branches make
    the write-backs ``written``, reads any of the batch inputs ``data`` (directly or through a body)."""
    read = sorted(v.name for v in needed_values(graph, [node.inputs[0]])[0] if v.name in data and v in graph.inputs)
    if read:
        param, _, at = next(use.metadata_props[MAX_NORM_KEY] for s in written for use, _ in s.outputs[0].uses()
                            if MAX_NORM_KEY in use.metadata_props).partition(" at ")
        raise ArtifactsError(
            f"the embedding of {param!r} with max_norm at {at} renormalises rows in a gc.cond branch (node "
            f"{node.name!r}) whose predicate reads the batch ({read}): each worker computes the predicate from its "
            "own shard, one process from the whole batch, and the two differ in general (a shard's sum or size is "
            "not the batch's), so a worker cannot take the branch, nor renormalise the rows, one process would; "
            "make the predicate read no batch input (a param, a constant) or train with one worker")


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
