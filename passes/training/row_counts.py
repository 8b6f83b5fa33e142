"""Values computed from the batch's size or its rows' positions, for the ``row_mixing`` analysis. Each
data-parallel worker's batch axis is its shard's: ``x.shape[0]`` is the shard's size and ``gc.arange(N)``
counts the shard's rows from 0. Read as a shape (a Reshape's, an Expand's) or as an index the
``row_positions`` rules accept (``p[gc.arange(N), y]``), such a count keeps rows apart; read as a value
(``x + gc.arange(N)[:, None]``, ``y / N``, ``gc.arange(N) % 2``, a position embedding looked up by it)
it makes what follows differ between a shard and the whole batch. ``counted`` marks a node's outputs
computed so (``Counted``); ``row_mixing`` reports the node that first read the count as a value where
such a value reaches the outputs it analyses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir

from graphc.passes.training.row_axes import Rows
from graphc.passes.training.row_positions import Dims, Fact, Linear, Own

__all__ = ["SHAPE_INPUTS", "Counted", "bare", "counted", "reaching"]

# the inputs an op reads for their shape only, or as a shape: a count there sizes the output alike on
# every row (Expand(cls_token, [N, 1, D]), zeros_like(x), x.reshape(N, -1))
SHAPE_INPUTS = {"Reshape": {1}, "Expand": {1}, "Tile": {1}, "ConstantOfShape": {0}, "Shape": {0}, "Size": {0},
                "EyeLike": {0}, "RandomNormalLike": {0}, "RandomUniformLike": {0}, "CastLike": {1}}
# the first input a Loop or Scan binds to its body's: a position or size there is followed inside (``row_subgraphs``)
BOUND_FROM = {"Loop": 2, "Scan": 0}

WHY = {
    "positions": "it computes per-shard positions: a Range over the batch axis counts each worker's rows from 0 "
                 "on its own shard, not their places in the whole batch",
    "size": "it computes per-shard sizes: the batch axis' length it reads is each worker's shard's, not the "
            "whole batch's",
}


@dataclass(frozen=True)
class Counted:
    """A value computed from the batch's ``what`` ("positions" or "size") read as a value by ``origin``
    (in the subgraphs ``where``, innermost first); ``rows``: the Rows it also holds, for the ``row_axes``
    rules."""

    origin: ir.Node
    what: str
    where: tuple[str, ...] = ()
    rows: Rows | None = None

    @property
    def why(self) -> str:
        return WHY[self.what]


def bare(fact: Fact | Counted) -> Fact:
    """The fact without its count: what the ``row_positions`` rules see."""
    return fact.rows if isinstance(fact, Counted) else fact


def counted(node: ir.Node, facts: Sequence[Fact | Counted], followed: bool, where: tuple[str, ...]) -> Counted | None:
    """What ``node``'s outputs compute from a count: a ``Counted`` input's, read for its values; or, where
    no ``row_positions`` rule followed ``node``, a position (``Own``, ``Linear``) or size (``Dims``) it reads
    as a value (not one a Loop or Scan binds to its body's), ``node`` the origin."""
    shapes = SHAPE_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
    values = [f for i, f in enumerate(facts) if i not in shapes]
    first = next((f for f in values if isinstance(f, Counted)), None)
    if first is not None or followed:
        return first
    bound = BOUND_FROM.get(node.op_type, len(facts)) if node.domain in ("", "ai.onnx") else len(facts)
    for kind, what in (((Own, Linear), "positions"), (Dims, "size")):
        if any(isinstance(f, kind) for f in values[:bound]):
            return Counted(node, what, where)
    return None


def reaching(value: ir.Value, fact: Fact | Counted, where: tuple[str, ...]) -> Counted | None:
    """The count an analysed output holds: a ``Counted``, or a size or position itself (its producer the
    origin)."""
    if isinstance(fact, Counted):
        return fact
    if isinstance(fact, (Dims, Own, Linear)) and value.producer() is not None:
        return Counted(value.producer(), "size" if isinstance(fact, Dims) else "positions", where)
    return None
