"""The flat index torch.onnx's TorchScript exporter writes for ``z[torch.arange(B), y]`` (an ``index`` by
more than one tensor), as ``row_positions`` rules: ``z`` flattened from its batch axis through the indexed
axes (a ``Flatten``), picked by a ``Gather`` at ``arange(B) * C + y``; and a language model's written by hand,
``lp.reshape(-1)[(arange(B)[:, None] * T + arange(T)) * C + y]``. A position times a size read from the
shapes (``C``: ``Shape``, ``Gather``, ``Mul`` of those, a constant) is a ``Linear`` of that stride; plus the
same rows' label, or a value the shapes bound below the room its offset leaves (a constant, ``arange(T)``), an
offset within each row's block, which a size may scale again; a Gather along a batch axis of ``B * C``
elements by it picks from each row's own block. The label is taken to lie in the room left (``[0, C)``), as
torch checks it (the exporter's graph is wrong for others, negative ones included). A flipped, rolled,
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

ONE = Counter({1: 1})


def _flat(fact: Fact) -> Linear | None:
    """A position as a flat index of stride 1 (a plain one), or a flat index."""
    if isinstance(fact, Own) and fact.parts is None and fact.rows is None:
        return Linear(fact.axis, fact.length, frozenset(ONE.items()), frozenset(ONE.items()))
    return fact if isinstance(fact, Linear) else None


def _placed(node: ir.Node, at: int, axis: int) -> int | None:
    """``axis`` of input ``at`` in the output it broadcasts into."""
    out_rank, rank = rank_of(node.outputs[0]), rank_of(node.inputs[at])
    return None if out_rank is None or rank is None else axis + out_rank - rank


def _times(items: frozenset, size: Counter) -> frozenset:
    return frozenset(product([Counter(dict(items)), size]).items())


@rule("Mul")
def _scaled(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A position (or a flat index, its offset and room alike) times a size not from the batch: a flat index
    of that stride."""
    at = next((i for i, f in enumerate(facts[:2]) if _flat(f) is not None), None)
    if at is None or facts[1 - at] is not None:
        return None
    flat, size = _flat(facts[at]), size_of(node.inputs[1 - at])
    axis = _placed(node, at, flat.axis)
    if size is None or axis is None or set(product([flat.length]) or {None}) & set(size) - {1}:
        return None
    return [Linear(axis, flat.length, _times(flat.stride, size), _times(flat.room, size),
                   flat.rows and Rows(axis), frozenset(size.items()))]


@rule("Add")
def _offset(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A flat index plus the same rows' label (placed on its axis, taken to lie below the size it was last
    scaled by, as torch checks an exported pick's, which its room must hold), or a value the shapes bound within
    its room: a constant, a ``Range(0, n, 1)``."""
    at = next((i for i, f in enumerate(facts[:2]) if isinstance(f, Linear)), None)
    if at is None:
        return None
    flat, other = facts[at], facts[1 - at]
    axis, room = _placed(node, at, flat.axis), Counter(dict(flat.room))
    if axis is None:
        return None
    if isinstance(other, Rows):
        keeps = _holds(room, Counter(dict(flat.scale))) and other.copies == 1 and \
            _placed(node, 1 - at, other.axis) == axis
        return [Linear(axis, flat.length, flat.stride, frozenset(ONE.items()), Rows(axis))] if keeps else None
    left = _left(room, _bound(node.inputs[1 - at])) if other is None else None
    return None if left is None else [Linear(axis, flat.length, flat.stride, frozenset(left.items()),
                                             flat.rows and Rows(axis), flat.scale)]


def _holds(room: Counter, scale: Counter) -> bool:
    """Whether a label below ``scale`` (more than 0) stays within ``room``: ``scale``'s symbols among ``room``'s
    and its int factor no larger (an offset added since the scaling may have taken part of it: ``r * C + 1 + y``
    reaches the next row's block for ``y = C - 1``)."""
    room, scale = Counter(room), Counter(scale)
    rn, sn = room.pop(1, 1), scale.pop(1, 1)
    return (bool(scale) or sn > 1) and not scale - room and rn >= sn


def _bound(value: ir.Value) -> Counter | None:
    """A bound the shapes give on the non-negative integers ``value`` holds (each below it): a constant's
    largest plus one, a ``Range(0, n, 1)``'s ``n``; else None."""
    array = constant(value)
    if array is not None:
        array = np.asarray(array)
        return None if np.any(array < 0) else Counter({1: int(array.max(initial=0)) + 1})
    node = value.producer()
    if node is None or node.op_type != "Range" or node.domain not in ("", "ai.onnx"):
        return None
    start, delta = (constant(v) for v in (node.inputs[0], node.inputs[2]))
    if start is None or delta is None or np.asarray(start).reshape(-1)[0] != 0 or np.asarray(delta).reshape(-1)[0] != 1:
        return None
    return size_of(node.inputs[1])


def _left(room: Counter, bound: Counter | None) -> Counter | None:
    """The room a value below ``bound`` leaves of ``room``, else None: all of it for zeros, none for a bound
    equal to it (1: a last index may be added), the difference of two numbers."""
    if bound is None:
        return None
    if bound == ONE or bound == room:
        return room if bound == ONE else ONE
    numbers = set(room) == set(bound) == {1}
    return Counter({1: room[1] - bound[1] + 1}) if numbers and bound[1] <= room[1] else None


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
