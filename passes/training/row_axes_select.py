"""``row_axes`` rules (where an op sends the batch's rows) for ops that select, join or repeat
along an axis, values made from shapes only, and recurrent layers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_ir as ir

from graphc.passes.training.row_axes import (BIG, Ins, Mixes, Rows, constant, int_attr, norm_axis, only_rows, rank_of,
                                              rule)
from graphc.passes.values import MAX_NORM_KEY, const_axes

__all__: list[str] = []


# -- values made from shapes only ------------------------------------------------------------------
@rule("Shape", "Size", "ConstantOfShape", "EyeLike", "RandomNormalLike", "RandomUniformLike", "Range")
def shape_only(node: ir.Node, ins: Ins) -> list[Rows | None]:
    """Outputs that depend on the rows' count, not their values: they hold no rows. A shard's count
    is its own, not the whole batch's: ``row_counts`` follows it and warns where it is read as a
    value (a Range over the batch axis as positions, a Shape or Size as the batch's size)."""
    return [None] * len(node.outputs)


# -- indexing --------------------------------------------------------------------------------------
def _full_slice(node: ir.Node, axis: int, rank: int | None) -> bool:
    """Whether a Slice takes every row of ``axis`` in order (or does not slice it)."""
    starts, ends = (constant(v) for v in node.inputs[1:3])
    axes_v = node.inputs[3] if len(node.inputs) > 3 else None
    steps_v = node.inputs[4] if len(node.inputs) > 4 else None
    axes = constant(axes_v) if axes_v is not None else np.arange(len(starts) if starts is not None else 0)
    steps = constant(steps_v) if steps_v is not None else None
    if starts is None or ends is None or axes is None or steps_v is not None and steps is None:
        raise Mixes("its starts, ends, axes or steps are not constant")
    for i, a in enumerate(np.asarray(axes).reshape(-1)):
        if norm_axis(int(a), rank) == axis:
            step = 1 if steps is None else int(steps[i])
            return int(starts[i]) == 0 and int(ends[i]) >= BIG and step == 1
    return True


@rule("Slice")
def slice_(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r = only_rows(node, ins, 0)
    if not _full_slice(node, r.axis, rank_of(node.inputs[0])):
        raise Mixes(f"it slices the batch axis {r.axis}: a shard's slice is not the batch's")
    return [r]


@rule("Gather")
def gather(node: ir.Node, ins: Ins) -> list[Rows | None]:
    data, idx = ins[0], ins[1]
    rank, idx_rank = rank_of(node.inputs[0]), rank_of(node.inputs[1])
    axis = norm_axis(int_attr(node, "axis", 0), rank)
    if idx_rank is None:
        raise Mixes("its indices' rank is unknown")
    placed = set()
    if data is not None:
        if data.axis == axis:
            raise Mixes(f"it picks rows of the batch axis {axis} by index")
        placed.add(replace(data, axis=data.axis if data.axis < axis else data.axis + idx_rank - 1))
    if idx is not None:
        placed.add(replace(idx, axis=idx.axis + axis))
    if len(placed) > 1:
        raise Mixes("its data's and indices' rows land on different axes")
    return [placed.pop()]


@rule("GatherElements", "ScatterElements", "Scatter")
def gather_elements(node: ir.Node, ins: Ins) -> list[Rows | None]:
    rows = {r for r in ins if r is not None}
    axis = norm_axis(int_attr(node, "axis", 0), rank_of(node.inputs[0]))
    if len(rows) > 1:
        raise Mixes("its operands' rows are on different axes")
    r = rows.pop()
    if r.axis == axis:
        raise Mixes(f"it indexes along the batch axis {axis}")
    if node.op_type != "GatherElements" and ins[0] is None:
        raise Mixes("it scatters rows into a value not by rows")
    return [r]


@rule("GatherND", "ScatterND")
def gather_nd(node: ir.Node, ins: Ins) -> list[Rows | None]:
    """Rows within the leading ``batch_dims`` (GatherND) are kept; ScatterND keeps its data's rows
    where its indices and updates are not by rows. An embedding's max_norm write-back (its new
    weight marked ``MAX_NORM_KEY``) mixes none: the workers write back every shard's rows there
    (``runtime/distributed/renorm_rows.py``), as one process."""
    if node.op_type == "ScatterND":
        if any(MAX_NORM_KEY in use.metadata_props for use, _ in node.outputs[0].uses()):
            return [ins[0]]
        return [only_rows(node, ins, 0)]
    rows = {r for r in ins if r is not None}
    if len(rows) > 1 or rows.pop().axis >= int_attr(node, "batch_dims", 0):
        raise Mixes("it indexes the batch axis")
    return [next(r for r in ins if r is not None)]


@rule("OneHot")
def one_hot(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r, rank = only_rows(node, ins, 0), rank_of(node.outputs[0])
    at = norm_axis(int_attr(node, "axis", -1), rank)
    return [replace(r, axis=r.axis if r.axis < at else r.axis + 1)]


@rule("Compress")
def compress(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r = only_rows(node, ins, 0)
    axis = node.attributes.get_int("axis", None)
    if axis is None or norm_axis(axis, rank_of(node.inputs[0])) == r.axis:
        raise Mixes("it selects along the batch axis (or flattens it)")
    return [r]


# -- joining, splitting, repeating -----------------------------------------------------------------
@rule("Concat")
def concat(node: ir.Node, ins: Ins) -> list[Rows | None]:
    axis = norm_axis(int_attr(node, "axis", 0), rank_of(node.outputs[0]))
    rows = [r for r in ins if r is not None]
    if len({r.axis for r in rows}) > 1:
        raise Mixes("its inputs' rows are on different axes")
    if rows[0].axis != axis:
        if len(set(rows)) > 1:
            raise Mixes("its inputs hold the batch stacked different times")
        return [rows[0]]
    if len(rows) < len(ins):
        raise Mixes(f"it joins values not by rows to the rows along the batch axis {axis}: each shard gets them")
    return [Rows(axis, sum(r.copies for r in rows))]


@rule("Split")
def split(node: ir.Node, ins: Ins) -> list[Rows | None]:
    """Along the batch axis only into as many parts as the batch's copies (a Concat's inverse)."""
    r = only_rows(node, ins, 0)
    if norm_axis(int_attr(node, "axis", 0), rank_of(node.inputs[0])) != r.axis:
        return [r] * len(node.outputs)
    parts = len(node.outputs)
    if r.copies % parts:
        raise Mixes(f"it cuts the batch axis {r.axis} into {parts} parts: a shard's parts are not the batch's")
    return [replace(r, copies=r.copies // parts)] * parts


@rule("Tile")
def tile(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r = only_rows(node, ins, 0)
    repeats = constant(node.inputs[1])
    if repeats is None:
        raise Mixes("its repeats are not constant")
    return [replace(r, copies=r.copies * int(np.asarray(repeats).reshape(-1)[r.axis]))]


@rule("Pad")
def pad(node: ir.Node, ins: Ins) -> list[Rows | None]:
    r, rank = only_rows(node, ins, 0), rank_of(node.inputs[0])
    pads = constant(node.inputs[1]) if len(node.inputs) > 1 else node.attributes.get_ints("pads", None)
    axes = const_axes(node, constant) if len(node.inputs) > 3 else []
    if pads is None or axes is None or rank is None:
        raise Mixes("its pads are not constant")
    axes = [norm_axis(a, rank) for a in axes] or list(range(rank))
    pads = np.asarray(pads).reshape(-1)
    if r.axis in axes and (pads[axes.index(r.axis)] or pads[len(axes) + axes.index(r.axis)]):
        raise Mixes(f"it pads the batch axis {r.axis}")
    return [r]


# -- recurrent layers --------------------------------------------------------------------------------
@rule("RNN", "GRU", "LSTM")
def recurrent(node: ir.Node, ins: Ins) -> list[Rows | None]:
    """X is [seq, batch, ...] (layout 0) or [batch, seq, ...]; the states and sequence_lens are
    by batch; Y is [seq, dirs, batch, ...] or [batch, seq, dirs, ...], Y_h and Y_c [dirs, batch, ...]
    or [batch, dirs, ...]."""
    batch_first = int_attr(node, "layout", 0)
    want = {0: 0 if batch_first else 1, 4: 0, 5: 0 if batch_first else 1, 6: 0 if batch_first else 1}
    for i, r in enumerate(ins):
        if r is not None and want.get(i) != r.axis:
            raise Mixes(f"its input {node.inputs[i].name!r} holds the rows on axis {r.axis}, not its batch axis")
    r = next(r for r in ins if r is not None)
    y = Rows(0 if batch_first else 2, r.copies)
    return [y] + [Rows(0 if batch_first else 1, r.copies)] * (len(node.outputs) - 1)
