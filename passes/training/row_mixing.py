"""Which forward nodes mix the batch's rows, so that data-parallel workers, each on its shard,
compute what one process on the whole batch does not: ``mixing_nodes``."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from graphc.passes.training import row_axes_select, row_linear, row_merged  # noqa: F401 - register their rules
from graphc.passes.training.row_axes import RULES, Mixes, Rows
from graphc.passes.training.row_counts import Counted, bare, counted, reaching
from graphc.passes.training.row_extents import BATCH
from graphc.passes.training.row_positions import Fact, plain, positions
from graphc.passes.training.row_shapes import SHAPES, BodyShapes, shape_of
from graphc.passes.training.row_subgraphs import SUBGRAPH_RULES, Body
from graphc.passes.values import SYNC_BATCHNORM_KEY, needed_values

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
    along it (but for an index that is each row's own position, ``x[gc.arange(N), labels]``:
    ``row_positions``), rows paired with rows (``x @ x.T``, ``x[:, None] - x[None]``) mix. So does such a
    position, or the batch's size, read as a value on its way to an analysed output (``row_counts``: each worker
    counts its own shard; the node that first reads it is reported). So does what the
    analysis cannot follow: an op type with no rule, a computed axis, a reshape of unknown shapes.
    If, Loop and Scan are followed into their subgraphs with the same rules (``row_subgraphs``);
    a node inside one that mixes is reported itself, its message saying where it sits; a
    condition or trip count from the rows, or a Scan along the batch axis, mixes. A constant
    input is read through the nodes that compute it from constants (``folded_array``), and a
    body's values the model has no shapes for get onnx's inferred ones (``row_shapes``), beside
    the model: torch.onnx's TorchScript Loops have both. The model is not changed.
    BatchNormalization is per row here (its batch statistics are per worker, documented, as
    PyTorch DDP); so are a SyncBatchNorm's statistics without running ones (the nodes marked "mean"
    and "variance"): the workers' gradients graph takes them over every worker's shard. Each node
    that makes rows mix is reported once; its outputs, mixed, are not followed further. A count that leaves a
    subgraph is reported there, at the node that first read it, and not again by the Loop, Scan or If
    or the nodes that read what they compute from it."""
    target = next((v for v in graph.outputs if v.name == output), None)
    if target is None:
        raise ValueError(f"{output!r} is not an output of the graph; outputs: {[v.name for v in graph.outputs]}")
    found = _Found({}, {})
    rows = {v: Rows(batched[v.name]) for v in graph.inputs if v.name in batched}
    token = SHAPES.set(BodyShapes(graph.opset_imports))
    names = BATCH.set(frozenset(shape[r.axis] for v, r in rows.items()
                                if (shape := shape_of(v)) is not None and r.axis < len(shape)))
    try:
        _walk(graph, rows, [target], (), found)
    finally:
        BATCH.reset(names)
        SHAPES.reset(token)
    return list(found.nodes.values())


@dataclass(frozen=True)
class _Found:
    """What one ``mixing_nodes`` has found: the nodes that mix, and each subgraph pass's outputs' Rows by
    the subgraph, those outputs and the Rows of the values it reads (its inputs' and the outer ones it
    captures): a body is walked once per state of its inputs' rows, not on each fixed-point pass of every
    loop around it (a pass that finds a node that mixes finds it again from the same state)."""

    nodes: dict[ir.Node, Mixing]
    passes: dict[tuple, list[Fact]]


def _walk(graph: ir.Graph, rows: MutableMapping[ir.Value, Fact | Counted], outputs: Sequence[ir.Value],
          where: tuple[str, ...], found: _Found) -> list[Fact]:
    """Follow the rows through the nodes of ``graph`` that compute ``outputs`` (``rows``: the
    facts known, outer values' included), recording in ``found`` the nodes that mix; the outputs'
    facts. ``where``: the subgraphs ``graph`` sits in, innermost first, for the messages."""
    needed, subgraph_reads = needed_values(graph, outputs)
    for node in graph:
        wanted = [v in needed for v in node.outputs]
        if not any(wanted):
            continue
        facts = [rows.get(v) if v is not None else None for v in node.inputs]
        reads = subgraph_reads.get(node)
        if node.metadata_props.get(SYNC_BATCHNORM_KEY) in SYNCED:
            continue
        told = next((f for f in facts if isinstance(f, Counted) and f.origin in found.nodes), None)
        if told is not None:  # from a count reported where it left a subgraph: not reported again
            rows.update(dict.fromkeys(node.outputs, told))
            continue
        outs = positions(node, [bare(f) for f in facts])
        count = counted(node, facts, outs is not None, where)
        if outs is None:
            try:
                outs = _rows(node, [bare(f) for f in facts], wanted, rows, reads, where, found)
            except Mixes as mixes:
                found.nodes.setdefault(node, Mixing(node, f"{mixes}{_inside(where)}"))
                continue
        if count is not None:
            outs = [Counted(count.origin, count.what, count.where, plain(f)) for f in outs]
        rows.update({v: r for v, r in zip(node.outputs, outs) if r is not None})
    for value in outputs:  # (a body's positions and sizes go to its node's rule, which follows them)
        count = reaching(value, rows.get(value), where) if not where or isinstance(rows.get(value), Counted) else None
        if count is not None:
            found.nodes.setdefault(count.origin, Mixing(count.origin, f"{count.why}{_inside(count.where)}"))
    return [f if isinstance(f, Counted) and f.origin in found.nodes else bare(f) for f in map(rows.get, outputs)]


def _inside(where: tuple[str, ...]) -> str:
    return f" (inside {', inside '.join(where)})" if where else ""


def _rows(node: ir.Node, ins: list[Fact], wanted: list[bool], rows: Mapping[ir.Value, Fact | Counted],
          reads: Sequence[ir.Value] | None, where: tuple[str, ...], found: _Found) -> list[Fact]:
    """``node``'s outputs' facts by the ``row_axes`` rules (``ins``: its inputs' facts, which they see as
    ``plain`` Rows), its subgraphs walked where it reads rows, a size or a position (bound to its body's
    inputs or captured); raises ``Mixes``."""
    if reads is None:
        ins = [plain(f) for f in ins]
    if not any(ins) and not any(rows.get(v) is not None for v in reads or ()):
        return [None] * len(node.outputs)
    if node.domain not in ("", "ai.onnx") or node.op_type not in (RULES if reads is None else SUBGRAPH_RULES):
        raise Mixes("graphc cannot follow the rows through it" + ("" if reads is None else " (a subgraph)"))
    if reads is not None:
        return SUBGRAPH_RULES[node.op_type](node, ins, wanted, _body(node, rows, reads, where, found))
    return RULES[node.op_type](node, ins)


def _body(node: ir.Node, rows: Mapping[ir.Value, Fact | Counted], reads: Sequence[ir.Value], where: tuple[str, ...],
          found: _Found) -> Body:
    """One pass of a subgraph of ``node``, its inputs bound, on a layer of its own over ``rows``
    (``reads``: the values ``node``'s subgraphs read), or the outputs' Rows of an earlier pass from the same
    rows."""
    captured = frozenset((v, rows[v]) for v in reads if v in rows)

    def body(attribute: str, bound: Mapping[ir.Value, Fact], outputs: Sequence[ir.Value]) -> list[Fact]:
        graph = node.attributes[attribute].value
        state = {v: r for v, r in bound.items() if r is not None}
        key = (graph, tuple(outputs), frozenset(state.items()), captured)
        if key not in found.passes:
            SHAPES.get().add(graph)
            here = (f"the {attribute} of {node.op_type} {node.name!r}", *where)
            found.passes[key] = _walk(graph, ChainMap(state, rows), outputs, here, found)
        return list(found.passes[key])
    return body

