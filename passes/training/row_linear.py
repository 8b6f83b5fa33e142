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
from graphc.passes.training.row_positions import INTS, Fact, Linear, Own, rule
from graphc.passes.training.row_shapes import shape_of

__all__ = ["extent", "size_of"]

SIZE_MOVES = ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape")  # one element in, the same one out


def size_of(value: ir.Value) -> Counter | None:
    """A one-element integer the shapes give before the model runs, as ``product``'s Counter: a positive
    constant, an element of a ``Shape``, a product of such; else None."""
    shape = shape_of(value)
    if shape is None or any(d != 1 for d in shape):
        return None
    array = constant(value)
    if array is not None:
        n = int(np.asarray(array).reshape(-1)[0])
        return Counter({1: n}) if n > 0 else None
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in SIZE_MOVES:
        return size_of(node.inputs[0])
    if node.op_type == "Mul":
        a, b = (size_of(v) for v in node.inputs)
        return None if a is None or b is None else product([a, b])
    source = node.inputs[0].producer() if node.op_type == "Gather" else None
    if source is None or source.op_type != "Shape" or (dims := shape_of(source.inputs[0])) is None:
        return None
    index, start = constant(node.inputs[1]), int_attr(source, "start", 0)
    if index is None or start != 0 or int_attr(source, "end", len(dims)) != len(dims):
        return None
    at = int(np.asarray(index).reshape(-1)[0])
    return product([dims[at]]) if -len(dims) <= at < len(dims) else None


def extent(value: ir.Value, axis: int) -> Counter | None:
    """The length of ``value``'s ``axis`` as ``product``'s Counter: from its shape, or where that is unknown
    (onnx's inference names ``N * 3`` anew) from the shape a ``Flatten`` flattens, or a ``Reshape`` to a
    constant shape whose -1 is ``axis`` takes."""
    shape = shape_of(value)
    known = product([shape[axis]]) if shape is not None and axis < len(shape) else None
    node = value.producer()
    before = shape_of(node.inputs[0]) if known is None and node is not None else None
    if before is None or node.op_type not in ("Flatten", "Reshape"):
        return known
    if node.op_type == "Flatten":
        at = norm_axis(int_attr(node, "axis", 1), len(before))
        return product(before[:at] if axis == 0 else before[at:]) if axis < 2 else None
    after = constant(node.inputs[1])
    after = None if after is None or int_attr(node, "allowzero", 0) else [int(d) for d in np.asarray(after).reshape(-1)]
    if after is None or axis >= len(after) or after[axis] != -1 or any(d < 1 for i, d in enumerate(after) if i != axis):
        return None
    whole, rest = product(before), int(np.prod([d for i, d in enumerate(after) if i != axis]))
    if whole is None or whole[1] % rest:
        return None
    whole[1] //= rest
    return whole


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
    if size is None or axis is None or own.length in size:
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
