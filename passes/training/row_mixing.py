"""Which forward nodes mix the batch's rows, so that data-parallel workers, each on its shard,
compute what one process on the whole batch does not: ``mixing_nodes``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx_ir as ir

from graphc.passes.training import row_axes_select  # noqa: F401 - registers its rules in RULES
from graphc.passes.training.row_axes import RULES, Mixes, Rows
from graphc.passes.values import SYNC_BATCHNORM_KEY, ancestors, subgraphs

__all__ = ["Mixing", "mixing_nodes"]

SYNCED = ("mean", "variance")  # a SyncBatchNorm's statistics (``ops_nn.batch_statistics_norm``): every worker's


@dataclass(frozen=True)
class Mixing:
    node: ir.Node
    why: str


def mixing_nodes(graph: ir.Graph, batched: Mapping[str, int], output: str) -> list[Mixing]:
    """The nodes of ``graph`` that compute ``output`` (the model output the loss reads: the
    loss's own mean over the batch is the intended mix) and combine rows of the batch, or may.

    ``batched``: {input name: its batch axis}. The batch axis is followed forward (``row_axes``:
    one rule per op type): elementwise ops, moves (Transpose, Reshape where the shapes show rows
    stay whole), indexing beside it, Concat along it of rows, Conv and pools over N keep it;
    a reduction, product, Softmax, CumSum, TopK, normalisation or sort over it, a Slice or Gather
    along it, rows paired with rows (``x @ x.T``, ``x[:, None] - x[None]``) mix. So does what the
    analysis cannot follow: an op type with no rule, a subgraph (If, Loop, Scan) reading the
    rows, a computed axis, a reshape of unknown shapes. BatchNormalization is per row here (its
    batch statistics are per worker, documented, as PyTorch DDP); so are a SyncBatchNorm's
    statistics without running ones (the nodes marked "mean" and "variance"): the workers' gradients
    graph takes them over every worker's shard. Each node that makes rows mix is reported once; its
    outputs, mixed, are not followed further."""
    target = next((v for v in graph.outputs if v.name == output), None)
    if target is None:
        raise ValueError(f"{output!r} is not an output of the graph; outputs: {[v.name for v in graph.outputs]}")
    needed = ancestors([target])
    rows: dict[ir.Value, Rows] = {v: Rows(batched[v.name]) for v in graph.inputs if v.name in batched}
    found: list[Mixing] = []
    for node in graph:
        if node not in needed:
            continue
        ins = [rows.get(v) if v is not None else None for v in node.inputs]
        reads = _subgraph_reads(node)
        if node.metadata_props.get(SYNC_BATCHNORM_KEY) in SYNCED or (
                not any(ins) and not any(v in rows for v in reads or ())):
            continue
        try:
            if reads is not None or node.domain not in ("", "ai.onnx") or node.op_type not in RULES:
                raise Mixes("graphc cannot follow the rows through it" + (" (a subgraph)" if reads is not None else ""))
            outs = RULES[node.op_type](node, ins)
        except Mixes as mixes:
            found.append(Mixing(node, str(mixes)))
            continue
        rows.update({v: r for v, r in zip(node.outputs, outs) if r is not None})
    return found


def _subgraph_reads(node: ir.Node) -> list[ir.Value] | None:
    """The values a node's subgraphs' nodes read (the outer ones they capture among them); None
    for a node without subgraphs."""
    subs = subgraphs(node)
    if not subs:
        return None
    return [v for sub in subs for n in ir.traversal.RecursiveGraphIterator(sub) for v in n.inputs if v is not None]
