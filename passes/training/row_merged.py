"""A batch axis merged with the axes after it, as a language model's loss written by hand flattens its
tokens (``logits.reshape(-1, V)[torch.arange(N * T), y.reshape(-1)]``), as ``row_positions`` rules: the
batch's count times a size the shapes give (``N * T``) counts the merged axis (``Dims``), a ``Range`` to it
is each token's own position there (``Own``, of that length); and a value whose batch axis is its first,
reshaped to a shape whose first length is the batch's count (``.reshape(N, T)``: a ``Dims`` from a
``Shape`` or one of the analysed inputs' batch dims by name), has each row's block as a slice of its first
axis again. A count times the batch's size is no fact."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import onnx_ir as ir

from graphc.passes.training.row_axes import Rows, product
from graphc.passes.training.row_extents import BATCH, extent, size_of
from graphc.passes.training.row_positions import Dims, Fact, rule
from graphc.passes.training.row_shapes import shape_of

__all__: list[str] = []

ONE = Counter({1: 1})  # the product of no dims, or of dims of 1


@rule("Mul")
def _merged_count(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """The batch's count times a size not from the batch: the count of the batch axis merged with others."""
    at = next((i for i, f in enumerate(facts[:2]) if isinstance(f, Dims) and f.at == 0), None)
    if at is None or facts[1 - at] is not None or shape_of(node.outputs[0]) not in ((), (1,)):
        return None
    count, size = product([facts[at].length]), size_of(node.inputs[1 - at])
    if count is None or size is None or set(count) & set(size) - {1}:
        return None
    return [Dims(0, frozenset(product([count, size]).items()))]


@rule("Reshape")
def _unmerged(node: ir.Node, facts: Sequence[Fact]) -> list[Fact] | None:
    """Rows on a first axis (or after dims of 1) split into the batch's count of blocks: each a row's."""
    rows, shape, before = facts[0], facts[1], shape_of(node.inputs[0])
    if not isinstance(rows, Rows) or rows.copies != 1 or rows.axis and product((before or [None])[:rows.axis]) != ONE:
        return None
    if isinstance(shape, Dims):
        return [Rows(0)] if shape.at == 0 and shape.length in BATCH.get() else None
    first, length = (shape_of(node.outputs[0]) or [None])[0], extent(node.inputs[0], rows.axis)
    symbols = length and {s: n for s, n in length.items() if s != 1 and n}
    return [Rows(0)] if shape is None and first in BATCH.get() and symbols == {first: 1} else None
