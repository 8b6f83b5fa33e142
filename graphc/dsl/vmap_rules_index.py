"""``gc.vmap``'s batching rules for padding, tiling and indexing ops (Pad, Tile, OneHot, Gather of mapped
indices into mapped data, GatherND, ScatterND), added to ``vmap_rules.RULES``: each as its op on the
batched values, the mapped dim first, as torch's vmap batching rules do."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap_rules import (
    RULES,
    Arg,
    Batching,
    NoRule,
    as_args,
    as_batched,
    const_of,
    node_attrs,
    only_first,
    rank_of,
    reemit,
    shift_axis,
)

__all__: list[str] = []


def _leading_zero(pads: Tensor, rank: int) -> Tensor:
    """ONNX ``pads`` (begins, then ends, of ``rank`` axes) with a zero pair for a new first axis."""
    zero = ops.const_i64([0])
    begins = ops.emit("Slice", [pads, ops.const_i64([0]), ops.const_i64([rank])])
    ends = ops.emit("Slice", [pads, ops.const_i64([rank]), ops.const_i64([2 * rank])])
    return ops.concat([zero, begins, zero, ends])


def _pad(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Pad along the example's axes only: its ``axes`` shifted, or none padding the mapped dim."""
    only_first(args)
    if "pads" in node_attrs(node):
        raise NoRule("pads as an attribute")
    rank, ins = rank_of(node.inputs[0], args[0]), [a and a.t for a in args]
    if len(ins) > 3 and ins[3] is not None:
        axes = const_of(b, node.inputs[3])
        if axes is None:
            raise NoRule("axes not constant")
        ins[3] = ops.const_i64([shift_axis(int(a), rank) for a in axes.ravel()])
    else:
        ins[1] = _leading_zero(ins[1], rank)
    return as_args(reemit(node, ins))


def _tile(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Tile with one repeat for the mapped dim."""
    only_first(args)
    return as_args(reemit(node, [args[0].t, ops.concat([ops.const_i64([1]), args[1].t])]))


def _one_hot(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """OneHot of mapped indices: its ``axis`` (of the output, one rank more) shifted."""
    only_first(args)
    axis = shift_axis(node_attrs(node).get("axis", -1), rank_of(node.inputs[0], args[0]) + 1)
    return as_args(reemit(node, [a.t for a in args], node_attrs(node, axis=axis)))


def _gather(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Gather: mapped indices into mapped data as a GatherND of one batch dim (the gathered axis moved
    after the mapped dim, the indexed dims back in its place after); the other cases as before."""
    data, idx = args
    if not (data.batched and idx.batched):
        return _plain_gather(b, node, args)
    rank, rank_idx = rank_of(node.inputs[0], args[0]), rank_of(node.inputs[1], args[1])
    axis = node_attrs(node).get("axis", 0) % rank
    front = [0, axis + 1, *(i for i in range(1, rank + 1) if i != axis + 1)]
    x = ops.transpose(data.t, front) if axis else data.t
    out = ops.emit("GatherND", [x, ops.unsqueeze(idx.t, [-1])], {"batch_dims": 1})
    if axis:  # (B, I..., D[:axis], D[axis+1:]) -> (B, D[:axis], I..., D[axis+1:])
        lead = list(range(1 + rank_idx, 1 + rank_idx + axis))
        out = ops.transpose(out, [0, *lead, *range(1, 1 + rank_idx), *range(1 + rank_idx + axis, rank + rank_idx)])
    return [Arg(out, True)]


def _gather_nd(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """GatherND: one more batch dim, both operands batched (mapped indices into data the same for
    all without batch dims: as they are)."""
    data, idx = args
    dims = node_attrs(node).get("batch_dims", 0)
    if not data.batched and dims == 0:
        return as_args(reemit(node, [data.t, idx.t]))
    return as_args(reemit(node, [as_batched(b, data), as_batched(b, idx)], node_attrs(node, batch_dims=dims + 1)))


def _scatter_nd(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """ScatterND: each index tuple led by its example's number."""
    data, idx, updates = (as_batched(b, a) for a in args)
    rank_idx = rank_of(node.inputs[1], args[1])
    count = ops.emit("Range", [ops.constant(np.int64(0)), ops.emit("Squeeze", [b.batch_shape()]),
                               ops.constant(np.int64(1))])
    count = ops.emit("Reshape", [count, ops.const_i64([-1] + [1] * rank_idx)])
    lead = ops.emit("Shape", [idx], {"start": 0, "end": -1})
    count = ops.emit("Expand", [count, ops.concat([lead, ops.const_i64([1])])])
    return as_args(reemit(node, [data, ops.concat([count, idx], axis=-1), updates]))


_plain_gather = RULES["Gather"]
RULES.update({"Pad": _pad, "Tile": _tile, "OneHot": _one_hot, "Gather": _gather, "GatherND": _gather_nd,
              "ScatterND": _scatter_nd})
