"""The flat index torch.onnx's TorchScript exporter writes for ``z[torch.arange(B), y]`` (an ``index`` by
more than one tensor), as ``row_positions`` rules: ``z`` flattened from its batch axis through the indexed
axes (a ``Flatten``), picked by a ``Gather`` at ``arange(B) * C + y``. A position times a size read from the
shapes (``C``: ``Shape``, ``Gather``, ``Mul`` of those, a constant) is a ``Linear`` of that stride; plus the
same rows' label, or a constant below the stride, an offset within each row's block; a Gather along a batch
axis of ``B * C`` elements by it picks from each row's own block. The label is taken to lie in ``[0, C)``,
as torch checks it (the exporter's graph is wrong for others, negative ones included). A flipped, rolled,
shifted or halved position, a stride from the batch's size, or an offset of another row's, is no fact: the
Gather mixes, as before."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import onnx_ir as ir

from graphc.passes.training.row_axes import RULES, Mixes, Rows, constant, int_attr, norm_axis, product, rank_of
from graphc.passes.training.row_extents import extent, size_of
from graphc.passes.training.row_positions import INTS, Fact, Linear, Own, rule
from graphc.passes.training.row_shapes import shape_of

__all__: list[str] = []

def _stride(fact: Fact) -> Counter | None:
    """The stride of a position a size may scale: a plain one's 1, an unshifted flat index's own."""
    if isinstance(fact, Own) and fact.parts is None and fact.rows is None:
        return Counter({1: 1})
    return Counter(dict(fact.stride)) if isinstance(fact, Linear) and not fact.offset else None


def _placed(node: ir.Node, at: int, axis: int) -> int | None:
    """``axis`` of input ``at`` in the output it broadcasts into."""
    out_rank, rank = rank_of(node.outputs[0]), rank_of(node.inputs[at])
    return None if out_rank is None or rank is None else axis + out_rank - rank


@rule("Mul")
def _scaled(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A position times a size not from the batch: a flat index of that stride."""
    at = next((i for i, f in enumerate(facts[:2]) if _stride(f) is not None), None)
    if at is None or facts[1 - at] is not None:
        return None
    own, size = facts[at], size_of(node.inputs[1 - at])
    axis = _placed(node, at, own.axis)
    if size is None or axis is None or set(product([own.length]) or {None}) & set(size) - {1}:
        return None
    return [Linear(axis, own.length, frozenset(product([_stride(own), size]).items()))]


@rule("Add")
def _offset(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A flat index plus the same rows' label (placed on its axis), or a constant within its stride."""
    at = next((i for i, f in enumerate(facts[:2]) if isinstance(f, Linear) and not f.offset), None)
    if at is None:
        return None
    flat, other, value = facts[at], facts[1 - at], node.inputs[1 - at]
    axis = _placed(node, at, flat.axis)
    if axis is None:
        return None
    if isinstance(other, Rows):
        keeps = other.copies == 1 and _placed(node, 1 - at, other.axis) == axis
        return [Linear(axis, flat.length, flat.stride, True, Rows(axis))] if keeps else None
    stride, array = Counter(dict(flat.stride)), constant(value)
    below = stride[1] if set(stride) == {1} else 1  # a stride with a symbol: only 0 is known to lie within it
    if other is not None or array is None or np.any(np.asarray(array) < 0) or np.any(np.asarray(array) >= below):
        return None
    return [Linear(axis, flat.length, flat.stride, True)]


@rule("Cast", "Identity", "Unsqueeze")
def _kept(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A flat index kept as integers, or moved by an Unsqueeze (GatherND's index tuples of one)."""
    flat = facts[0]
    if not isinstance(flat, Linear) or node.op_type == "Cast" and node.attributes.get_int("to", 0) not in INTS:
        return None
    if node.op_type != "Unsqueeze":
        return [flat]
    try:
        axis = RULES["Unsqueeze"](node, [Rows(flat.axis), None])[0].axis
    except Mixes:  # axes or rank not known
        return None
    return [replace(flat, axis=axis, rows=flat.rows and Rows(axis))]


@rule("Gather", "GatherND")
def _flat_pick(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """Data whose batch axis holds ``length`` blocks of ``stride``, picked by each row's flat index (a
    GatherND's by tuples of one, the batch axis its first): the output's rows are the index's axis."""
    data, flat = facts[0], facts[1]
    rank = rank_of(node.inputs[0])
    if not isinstance(flat, Linear) or not isinstance(data, Rows) or data.copies != 1 or rank is None:
        return None
    if node.op_type == "GatherND":
        tuples = shape_of(node.inputs[1])
        if data.axis or int_attr(node, "batch_dims", 0) or not tuples or tuples[-1] != 1 or flat.axis == len(tuples) - 1:
            return None
    elif norm_axis(int_attr(node, "axis", 0), rank) != data.axis:
        return None
    if extent(node.inputs[0], data.axis) != product([flat.length, Counter(dict(flat.stride))]):
        return None
    return [Rows(data.axis + flat.axis)]
