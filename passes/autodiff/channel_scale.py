"""A training BatchNorm's dx = z * k (k one factor per channel) marked, so that the gradient rule of
the product that made the BatchNorm's input (a Conv, or the MatMul of per-channel products
``dense_conv`` makes a small-map depthwise conv) reads z and takes k into its own operands instead
of that full-size multiply."""

from __future__ import annotations

import math

import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, attr, static_shape

CHANNEL_SCALE_KEY = "graphc.channel_scale"


def scaled_by_channel(g: GradBuilder, z: ir.Value, k: ir.Value) -> ir.Value:
    """``z * k`` (``k`` one factor per channel of axis 1, broadcast against ``z`` [N, C, *S] or
    [rows, C]), marked for ``channel_scaled``."""
    out = g.mul(z, k)
    out.producer().metadata_props[CHANNEL_SCALE_KEY] = "1"
    return out


def channel_scaled(g: GradBuilder, dy: ir.Value, axes: tuple[int, ...]) -> tuple[ir.Value, ir.Value, int] | None:
    """(z, k, axis) of a ``dy`` that is ``scaled_by_channel``'s product, directly or through the
    Reshapes and Transposes between the product and the BatchNorm (their gradients: ``dense_conv``'s
    products back to channel-major): z is that product's unscaled operand with the same Reshapes
    and Transposes replayed on it, typed as dy (autodiff types a rule's results, not what it made on
    the way), and ``axis``, one of ``axes``, the axis of dy along which k's factors run. None (and
    nothing made) for any other dy, k along another axis, or a Reshape that splits or merges it."""
    chain: list[ir.Node] = []
    value, node = dy, dy.producer()
    while node is not None and CHANNEL_SCALE_KEY not in node.metadata_props:
        if node.op_type not in ("Reshape", "Transpose") or node.domain not in ("", "ai.onnx"):
            return None
        chain.append(node)
        value, node = node.inputs[0], node.inputs[0].producer()
        if len(value.uses()) != 1:  # read elsewhere too: replaying the chain would not free it
            return None
    if node is None:
        return None
    axis = 1
    for step in reversed(chain):
        axis = _moved_axis(step, axis)
        if axis is None:
            return None
    if axis not in axes:
        return None
    z, k = node.inputs
    z.dtype, z.shape = value.dtype, value.shape
    clones = {value: z}
    g.copy(list(reversed(chain)), clones)
    for step in chain:
        clones[step.outputs[0]].dtype, clones[step.outputs[0]].shape = step.outputs[0].dtype, step.outputs[0].shape
    return clones[dy], k, axis


def _moved_axis(node: ir.Node, axis: int) -> int | None:
    """Where a Reshape or Transpose ``node`` puts its input's ``axis``: a Reshape keeps it where an
    output axis of its size has as many values before it (or after it) as the input's has, all
    static; None where none does."""
    if node.op_type == "Transpose":  # the gradient rules' Transposes all name their perm
        perm = attr(node, "perm")
        return None if perm is None else list(perm).index(axis)
    before, after = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    if before is None or after is None:
        return None
    for j, size in enumerate(after):
        if size == before[axis] and (_same_count(before[:axis], after[:j]) or
                                     _same_count(before[axis + 1:], after[j + 1:])):
            return j
    return None


def _same_count(dims: list, others: list) -> bool:
    """Whether two static runs of dims hold as many values."""
    return all(isinstance(d, int) for d in [*dims, *others]) and math.prod(dims) == math.prod(others)
