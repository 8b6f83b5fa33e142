"""VJP rules of Concat and Split: dy cut into the inputs' blocks, and the parts joined back.

A Concat of Slices that permute one value's blocks (the gate reorder before an exported RNN's
W, R and B) sends dy's blocks straight back to that value in its order (``_permuted_blocks``)."""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.autodiff.builder import attr, static_shape
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.slice_pads import static_slice_pads


def _dim_once(g, x: ir.Value, axis: int, read: dict):
    """``g.dim(x, axis)``, the Shape read of a named symbolic dim shared through ``read``."""
    dim = x.shape[axis] if x.shape is not None else None
    name = getattr(dim, "value", None)
    if not isinstance(name, str):
        return g.dim(x, axis)
    if name not in read:
        read[name] = g.dim(x, axis)
    return read[name]


def _permuted_blocks(node: ir.Node, axis: int) -> tuple[ir.Value, list[int], list[int]] | None:
    """(x, sizes, order) when each input of the Concat ``node`` is a static unit-step Slice of one
    value x along ``axis`` alone and the blocks tile x's axis exactly (a permutation of x's blocks,
    as torch.onnx and ``graphc.nn``'s RNNs reorder gates): ``sizes`` in the Concat's order, ``order``
    the Concat's inputs by where their block starts in x; else None."""
    slices = [v.producer() for v in node.inputs]
    if any(s is None or s.op_type != "Slice" or s.domain not in ("", "ai.onnx") for s in slices):
        return None
    x = slices[0].inputs[0]
    blocks = []
    for s in slices:
        pads = static_slice_pads(s) if s.inputs[0] is x else None
        rank = len(pads) // 2 if pads is not None else 0
        if pads is None or any(pads[i] or pads[rank + i] for i in range(rank) if i != axis):
            return None
        blocks.append((pads[axis], static_shape(x)[axis] - pads[rank + axis]))
    order = sorted(range(len(blocks)), key=lambda i: blocks[i][0])
    ends = [0] + [blocks[i][1] for i in order]
    if any(blocks[i][0] != end or blocks[i][1] <= end for i, end in zip(order, ends)) \
            or ends[-1] != static_shape(x)[axis]:
        return None
    return x, [end - start for start, end in blocks], order


@grad_rule("Concat")
def grad_concat(g, node, dy):
    rank = g.rank(node.outputs[0])
    axis = attr(node, "axis") % rank
    permuted = _permuted_blocks(node, axis)
    if permuted is not None and g.wants(permuted[0]):
        # dx is dy's blocks put back in x's order: one Split and Concat, not a Pad per Slice and a Sum
        x, sizes, order = permuted
        parts = g.split(dy, sizes, axis, len(sizes))
        return {x: g.op("Concat", *[parts[i] for i in order], axis=axis)}
    read: dict[str, ir.Value] = {}  # a dim named alike is one size: read off Shape once (an unrolled RNN's B)
    sizes = [_dim_once(g, x, axis, read) for x in node.inputs]
    if not all(isinstance(s, int) for s in sizes):
        sizes = g.op("Concat", *[g.ints([s]) if isinstance(s, int) else s for s in sizes], axis=0)
    parts = g.split(dy, sizes, axis, len(node.inputs))
    return tuple(p if g.wants(x) else None for p, x in zip(parts, node.inputs))


@grad_rule("Split", multi_output=True)
def grad_split(g, node, dys):
    rank = g.rank(node.inputs[0])
    parts = [d if d is not None else g.zeros_like(y) for d, y in zip(dys, node.outputs)]
    return (g.op("Concat", *parts, axis=attr(node, "axis", 0) % rank),) + (None,) * (len(node.inputs) - 1)
