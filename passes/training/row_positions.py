"""Indices that are each row's own position, for the ``row_mixing`` analysis: a ``Range(0, n, 1)`` whose
``n`` is a batch axis' length, read from a value's shape at run time, is ``0 .. n-1`` on every worker's
shard as on the whole batch, so indexing a batch axis of that length by it (``x[gc.arange(N), labels]``,
flex_attention's document mask ``ids[b, q_idx]``) keeps each row its own. ``POSITIONS`` maps an op type
to a rule that takes a node and its inputs' facts (``Rows``, ``Dims``, ``Own`` or None) and returns its
outputs' facts, or None where it does not apply (the ``row_axes`` rules then see ``plain`` facts). A
position shifted, permuted or computed (``(b + 1) % N``, a flip) is no fact here: indexing rows by it
mixes, as before, and ``row_counts`` reports a position or a count read as a value. A shape's other
elements (``x.shape[1]``) and a position times zeros are no fact either. ``row_linear`` adds the flat index
torch.onnx's TorchScript exporter writes for ``z[torch.arange(B), y]`` (``Linear``), ``row_merged`` the batch axis
merged with time (``arange(N * T)``); an op may have more than one rule: the first that applies gives its outputs'
facts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from graphc.passes.training.row_axes import RULES, Mixes, Rows, constant, int_attr, norm_axis, rank_of
from graphc.passes.training.row_extents import extent, same_length
from graphc.passes.training.row_shapes import shape_of

__all__ = ["POSITIONS", "Dims", "Linear", "Own", "plain", "positions", "rule"]


@dataclass(frozen=True)
class Dims:
    """An integer vector (or one element) whose element ``at`` is the length of a batch axis, ``length``
    (the dim's name in the model's shapes, or a product's items: ``row_merged``'s ``N * T``): a ``Shape`` of
    a value by rows or of a position, sliced, gathered or concatenated."""

    at: int
    length: str | int | frozenset


@dataclass(frozen=True)
class Own:
    """Each row's own position: the value's slice ``i`` along ``axis`` (of ``length``) holds ``i``, the
    same along any other axis. Indexing a batch axis of the same ``length`` by it picks each slice where
    it stands, on a shard as on the batch. With ``parts``, an index tuple as GatherND reads it (its last
    axis stacks one index per data axis): ``parts[k]`` whether index ``k`` is the position; ``rows``: the
    Rows the others carry (a label's), which the ``row_axes`` rules see."""

    axis: int
    length: str | int | frozenset
    parts: tuple[bool, ...] | None = None
    rows: Rows | None = None


@dataclass(frozen=True)
class Linear:
    """A flat index of each row's own block: the position along ``axis`` (of ``length``) times ``stride``
    (a product of dims, ``row_axes.product``'s Counter as a frozenset of its items), plus an offset within
    the block (constants, positions along other axes, the row's own label, ``rows``) that leaves ``room``
    (a product alike; the stride where there is none): adding a value in ``[0, room)`` keeps it within
    the block. Indexing a batch axis of ``length`` times ``stride`` elements, each row's ``stride`` in
    turn, by it picks from each row's own block."""

    axis: int
    length: str | int | frozenset
    stride: frozenset
    room: frozenset
    rows: Rows | None = None
    scale: frozenset = frozenset({(1, 1)})  # the size it was last scaled by: a label added lies in [0, scale)


Fact = Rows | Dims | Own | Linear | None
Rule = Callable[[ir.Node, Sequence[Fact]], "list[Fact] | None"]
POSITIONS: dict[str, list[Rule]] = {}
INTS = {int(t) for t in (ir.DataType.INT32, ir.DataType.INT64)}  # a Cast keeps a count or a position as these


def plain(fact: Fact) -> Rows | None:
    """The Rows a fact means to the ``row_axes`` rules: a position or a count holds no row's values."""
    return fact.rows if isinstance(fact, (Own, Linear)) else fact if isinstance(fact, Rows) else None


def positions(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """``node``'s outputs' facts by the first rule that follows it, else None."""
    rules = POSITIONS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
    return next((outs for outs in (fn(node, facts) for fn in rules) if outs is not None), None)


def rule(*op_types: str):
    def register(fn: Rule) -> Rule:
        for op_type in op_types:
            POSITIONS.setdefault(op_type, []).append(fn)
        return fn
    return register


def _ints(value: ir.Value | None) -> np.ndarray | None:
    array = constant(value) if value is not None else None
    return None if array is None else np.asarray(array).astype(np.int64).reshape(-1)


def _one_element(value: ir.Value) -> bool:
    shape = shape_of(value)
    return shape is not None and all(d == 1 for d in shape)


def _own(fact: Fact) -> Own | None:
    return fact if isinstance(fact, Own) and fact.parts is None else None


# -- the row count -----------------------------------------------------------------------------------
@rule("Shape")
def _shape(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """The shape of a value by rows (its batch axis' length named), or of positions (their count's)."""
    r, shape = facts[0], shape_of(node.inputs[0])
    if isinstance(r, (Own, Linear)) and shape is not None:
        axis, length = r.axis, r.length
    elif isinstance(r, Rows) and r.copies == 1 and shape is not None and _named(shape[r.axis]):
        axis, length = r.axis, shape[r.axis]
    else:
        return None
    start, end = _span(node, len(shape))
    return [Dims(axis - start, length)] if start <= axis < end else None


def _span(node: ir.Node, rank: int) -> tuple[int, int]:
    """The axes ``[start, end)`` a Shape node of a value of ``rank`` axes reads."""
    start, end = (min(max(a + rank if a < 0 else a, 0), rank)
                  for a in (int_attr(node, "start", 0), int_attr(node, "end", rank)))
    return start, end


def _named(length) -> bool:
    """A length known by its name or size (not a name shape inference made up for an unknown one)."""
    return isinstance(length, int) or isinstance(length, str) and not length.startswith("unk__")


@rule("Slice")
def _slice(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    d, given = facts[0], [*node.inputs[1:5], None, None][:4]
    starts, ends, axes, steps = (_ints(v) if v is not None else default
                                 for v, default in zip(given, (None, None, np.zeros(1, np.int64), np.ones(1, np.int64))))
    if (not isinstance(d, Dims) or rank_of(node.inputs[0]) not in (1, None)
            or any(a is None for a in (starts, ends, axes, steps)) or len(starts) != 1 or axes[0] not in (0, -1)):
        return None
    return _picked(d, node.inputs[0], lambda kept: kept[int(starts[0]):int(ends[0]):int(steps[0])],
                   min(starts[0], ends[0], steps[0]) < 0)


def _picked(d: Dims, vector: ir.Value, pick: Callable[[np.ndarray], np.ndarray], signed: bool) -> list[Fact] | None:
    """The fact of the elements ``pick`` takes from the shape vector ``vector`` (of the places it is
    given): the count where it takes the batch axis' length (its first place there), no fact where it
    takes only other lengths. Where ``vector``'s length is unknown, picks that count from its start (not
    ``signed``) take its first ``d.at + 1`` places alike."""
    size = _length(vector)
    if size is None and signed:
        return None
    hits = np.flatnonzero(np.asarray(pick(np.arange(d.at + 1 if size is None else size))).reshape(-1) == d.at)
    return [Dims(int(hits[0]), d.length) if len(hits) else None]


def _length(vector: ir.Value) -> int | None:
    """A shape vector's length: its own shape's, or its Shape node's input's rank."""
    shape, node = shape_of(vector), vector.producer()
    if shape is not None:
        return shape[0] if len(shape) == 1 and isinstance(shape[0], int) else None
    rank = rank_of(node.inputs[0]) if node is not None and node.op_type == "Shape" else None
    if rank is None:
        return None
    start, end = _span(node, rank)
    return max(end - start, 0)


@rule("Squeeze", "Unsqueeze", "Reshape", "Flatten", "Cast", "Identity", "Expand")
def _move(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A count kept as one element; a position moved by an Unsqueeze, a Reshape that only adds or drops
    dims of 1, an Expand (of its other axes: along its own, its length is the count already)."""
    fact = facts[0]
    if node.op_type == "Cast" and node.attributes.get_int("to", 0) not in INTS:
        return None
    if isinstance(fact, Dims):
        keeps = node.op_type in ("Cast", "Identity") or node.op_type != "Expand" and fact.at == 0 and \
            _one_element(node.inputs[0]) and _one_element(node.outputs[0])
        return [fact] if keeps else None
    own = _own(fact)
    if own is None or any(plain(f) is not None for f in facts[1:]):
        return None
    if node.op_type in ("Cast", "Identity"):
        return [own]
    if node.op_type in ("Unsqueeze", "Expand"):
        try:
            moved = RULES[node.op_type](node, [Rows(own.axis), *[None] * (len(facts) - 1)])[0]
        except Mixes:  # axes or ranks not known
            return None
        return [Own(moved.axis, own.length)]
    if node.op_type == "Reshape":
        return _reshaped(own, shape_of(node.inputs[0]), shape_of(node.outputs[0]))
    return None


def _reshaped(own: Own, before: Sequence | None, after: Sequence | None) -> list[Fact] | None:
    """The position's axis after a reshape that only adds or drops dims of 1 around it."""
    if before is None or after is None or before[own.axis] in (1, None):
        return None
    if any(d != 1 for i, d in enumerate(before) if i != own.axis):
        return None
    kept = [j for j, d in enumerate(after) if d != 1]
    return [Own(kept[0], own.length)] if len(kept) == 1 and after[kept[0]] == before[own.axis] else None


@rule("Range")
def _range(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    start, limit, delta = node.inputs[:3]
    fact = facts[1]
    if not isinstance(fact, Dims) or fact.at != 0 or not _one_element(limit):
        return None
    first, step = _ints(start), _ints(delta)
    counts = first is not None and step is not None and first[0] == 0 and step[0] == 1
    return [Own(0, fact.length)] if counts else None


# -- positions as indices ------------------------------------------------------------------------------
def _zero(value: ir.Value | None) -> bool:
    """Whether ``value`` is all zeros: a constant, or of an integer type a product with zeros or a sum
    of zeros (the DSL broadcasts index tensors by adding ``other * 0``)."""
    if value is None:
        return False
    array = constant(value)
    if array is not None:
        return not np.any(array)
    node = value.producer()
    if node is None or value.dtype is None or not value.dtype.is_integer():
        return False
    if node.op_type == "Mul":
        return any(_zero(v) for v in node.inputs)
    return node.op_type in ("Add", "Sub") and all(_zero(v) for v in node.inputs)


@rule("Add", "Sub")
def _add(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A position plus zeros (broadcast along other axes) is the position."""
    at = next((i for i, f in enumerate(facts) if _own(f) is not None), None)
    if at is None or (node.op_type == "Sub" and at != 0) or not _zero(node.inputs[1 - at]):
        return None
    out_rank, rank = rank_of(node.outputs[0]), rank_of(node.inputs[at])
    if out_rank is None or rank is None:
        return None
    return [Own(facts[at].axis + out_rank - rank, facts[at].length)]


@rule("Mul")
def _times_zero(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A position or a count times zeros (the other index's broadcast term) is zeros: no fact."""
    return [None] if _zero(node.outputs[0]) and not any(plain(f) for f in facts) else None


@rule("Concat")
def _shape_vector(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """Shape vectors joined (``x.reshape(N, T)``'s): the count where the first one holding it lands."""
    at = next((i for i, f in enumerate(facts) if isinstance(f, Dims)), None)
    if at is None or any(plain(f) is not None for f in facts) or rank_of(node.outputs[0]) != 1:
        return None
    before = [_length(v) for v in node.inputs[:at]]
    return None if None in before else [Dims(sum(before) + facts[at].at, facts[at].length)]


@rule("Concat")
def _concat(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """Indices stacked along a last axis of 1 into GatherND's tuples: one position, the others by the
    same rows (a label's) or by none."""
    rank = rank_of(node.outputs[0])
    owns = {f for f in facts if isinstance(f, Own)}
    if rank is None or len(owns) != 1 or norm_axis(int_attr(node, "axis", 0), rank) != rank - 1:
        return None
    own = owns.pop()
    rows = {plain(f) for f in facts} - {None}
    if own.parts is not None or own.axis >= rank - 1 or rows - {Rows(own.axis)} or \
            any((shape_of(v) or [None])[-1] != 1 for v in node.inputs):
        return None
    return [Own(own.axis, own.length, tuple(isinstance(f, Own) for f in facts), rows.pop() if rows else None)]


@rule("GatherND")
def _gather_nd(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """Data whose batch axis the tuples index by each row's own position: the output's rows are the
    tuples' axis."""
    data, idx = facts[0], facts[1]
    if not isinstance(idx, Own) or not isinstance(data, Rows) or data.copies != 1:
        return None
    parts, shape = idx.parts, shape_of(node.inputs[1])
    if parts is None and shape and shape[-1] == 1 and idx.axis < len(shape) - 1:
        parts = (True,)
    k = data.axis - int_attr(node, "batch_dims", 0)
    if parts is None or not 0 <= k < len(parts) or not parts[k] or not _spans(node.inputs[0], data, idx):
        return None
    return [Rows(idx.axis)]


def _spans(value: ir.Value, data: Rows, own: Own) -> bool:
    """Whether the positions ``own`` run over the whole of ``value``'s batch axis (the same length)."""
    return same_length(extent(value, data.axis), own.length)


@rule("Gather")
def _gather(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """A count's element picked from a shape; data's batch axis picked by each row's position."""
    data, idx = facts[0], facts[1]
    if isinstance(data, Dims) and int_attr(node, "axis", 0) == 0 and rank_of(node.inputs[0]) in (1, None):
        index = constant(node.inputs[1])
        if index is None or np.ndim(index) > 1:
            return None
        index = np.asarray(index, np.int64)
        return _picked(data, node.inputs[0], lambda places: np.where(index < 0, index + len(places), index),
                       bool(np.any(index < 0)))
    own, rank = _own(idx), rank_of(node.inputs[0])
    if own is None or not isinstance(data, Rows) or data.copies != 1 or rank is None:
        return None
    if norm_axis(int_attr(node, "axis", 0), rank) != data.axis or not _spans(node.inputs[0], data, own):
        return None
    return [Rows(data.axis + own.axis)]
