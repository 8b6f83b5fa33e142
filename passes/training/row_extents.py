"""Lengths the shapes give before the model runs, for the ``row_positions`` rules, as ``row_axes.product``'s
Counter of symbols and an int factor: ``size_of`` a one-element integer (a stride ``C``, a count ``N * T``),
``extent`` an axis' length where shape inference names it anew (``unk__3``) but the Flatten or Reshape that
made it shows it; ``same_length`` compares two such lengths, a dim's name (``"5*N"``) or a product's items."""

from __future__ import annotations

from collections import Counter
from contextvars import ContextVar

import numpy as np
import onnx_ir as ir

from graphc.passes.training.row_axes import constant, int_attr, norm_axis, product
from graphc.passes.training.row_shapes import shape_of

__all__ = ["BATCH", "extent", "same_length", "size_of"]

SIZE_MOVES = ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape")  # one element in, the same one out
# the names of the analysed inputs' batch dims (``row_mixing.mixing_nodes`` sets them)
BATCH: ContextVar[frozenset] = ContextVar("BATCH", default=frozenset())


def same_length(a, b) -> bool:
    """Whether two lengths (a dim, or a product's items) are the same product of known dims."""
    known = product([a])
    return known is not None and known == product([b])


def size_of(value: ir.Value) -> Counter | None:
    """A one-element integer the shapes give before the model runs: a positive constant, an element of a
    ``Shape``, a product of such; else None."""
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
    """The length of ``value``'s ``axis``: from its shape, or where that is unknown (onnx's inference names
    ``N * 3`` anew) from the lengths a ``Flatten`` flattens, or a ``Reshape`` to a constant shape whose -1 is
    ``axis`` takes (those lengths found alike)."""
    shape = shape_of(value)
    known = product([shape[axis]]) if shape is not None and axis < len(shape) else None
    node = value.producer()
    before = shape_of(node.inputs[0]) if known is None and node is not None else None
    if before is None or node.op_type not in ("Flatten", "Reshape"):
        return known
    if node.op_type == "Flatten":
        at = norm_axis(int_attr(node, "axis", 1), len(before))
        return _extents(node.inputs[0], range(at) if axis == 0 else range(at, len(before))) if axis < 2 else None
    after = constant(node.inputs[1])
    after = None if after is None else [int(d) for d in np.asarray(after).reshape(-1)]
    if after is None or axis >= len(after) or after[axis] != -1 or any(d < 1 for i, d in enumerate(after) if i != axis):
        return None
    whole = _extents(node.inputs[0], range(len(before)))
    rest = int(np.prod([d for i, d in enumerate(after) if i != axis]))
    if whole is None or whole[1] % rest:
        return None
    whole[1] //= rest
    return whole


def _extents(value: ir.Value, axes: range) -> Counter | None:
    """The product of the lengths of ``value``'s ``axes`` (``extent``'s)."""
    lengths = [extent(value, a) for a in axes]
    return None if any(n is None for n in lengths) else product(lengths)
