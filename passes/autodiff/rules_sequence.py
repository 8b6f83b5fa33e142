"""Gradient rules of the sequence ops, for sequences whose length is known only at run time
(``lower_sequences`` turns a sequence of known length into tensors before autodiff).

A sequence's gradient is a sequence of the same length whose element ``i`` is the gradient of
element ``i``. Where a sequence is read twice the two gradients are summed element by element,
and an unused element's gradient is zeros of its shape: both are ``SequenceMap`` (opset >= 17;
``GradBuilder.sum_values``/``zeros_like``). ``SequenceLength`` and ``SequenceEmpty`` need no
rule: no float value flows through them (a length is an integer; an empty sequence has no
input). A position is taken as the ops take it: negative counts from the back.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import attr
from graphc.passes.autodiff.registry import grad_rule


def _index(g, position: ir.Value, length: ir.Value) -> ir.Value:
    """``position`` (int32 or int64, negative from the back) as an index in [0, length]."""
    p = g.op("Cast", position, to=int(ir.DataType.INT64))
    return g.op("Where", g.op("Less", p, g.const(0, np.int64)), g.add(p, length), p)


def _position(g, node: ir.Node, slot: int, default_last: bool) -> ir.Value:
    """The index a SequenceInsert/SequenceErase acts at (its input ``slot``), in its input
    sequence's terms; without that input: the end (insert) or the last element (erase)."""
    length = g.op("SequenceLength", node.inputs[0])
    at = node.inputs[slot] if len(node.inputs) > slot else None
    if at is None:
        return g.sub(length, g.const(1, np.int64)) if default_last else length
    return _index(g, at, length)


@grad_rule("SequenceConstruct")
def grad_sequence_construct(g, node, ds):
    """Element i of the sequence is input i: its gradient is element i of ``ds``."""
    return tuple(g.op("SequenceAt", ds, g.const(i, np.int64)) if g.wants(x) else None
                 for i, x in enumerate(node.inputs))


@grad_rule("SequenceAt")
def grad_sequence_at(g, node, dy):
    """Zeros at every position but the one read, which gets ``dy``."""
    seq, position = node.inputs
    at = _index(g, position, g.op("SequenceLength", seq))
    return g.op("SequenceInsert", g.op("SequenceErase", g.zeros_like(seq), at), dy, at), None


@grad_rule("SequenceInsert")
def grad_sequence_insert(g, node, ds):
    """The inserted tensor's gradient is ``ds`` at its position; the sequence's is ``ds`` without it."""
    seq, x = node.inputs[:2]
    at = _position(g, node, 2, default_last=False)
    dseq = g.op("SequenceErase", ds, at) if g.wants(seq) else None
    dx = g.op("SequenceAt", ds, at) if g.wants(x) else None
    return (dseq, dx, None)[:len(node.inputs)]


@grad_rule("SequenceErase")
def grad_sequence_erase(g, node, ds):
    """The erased element gets zeros; the others their gradients in ``ds``."""
    seq = node.inputs[0]
    at = _position(g, node, 1, default_last=True)
    zeros = g.zeros_like(g.op("SequenceAt", seq, at))
    return (g.op("SequenceInsert", ds, zeros, at), None)[:len(node.inputs)]


@grad_rule("SplitToSequence")
def grad_split_to_sequence(g, node, ds):
    """The parts joined again along the axis (stacked where ``keepdims=0`` squeezed them)."""
    axis = attr(node, "axis", 0)
    stacked = len(node.inputs) < 2 or node.inputs[1] is None
    new_axis = int(stacked and not attr(node, "keepdims", 1))
    return (g.op("ConcatFromSequence", ds, axis=axis, new_axis=new_axis), None)[:len(node.inputs)]


@grad_rule("ConcatFromSequence")
def grad_concat_from_sequence(g, node, dy):
    """``dy`` split back into the elements: one slice per element along a new axis, else slices
    as long as each element is along ``axis`` (their lengths read at run time)."""
    axis = attr(node, "axis")
    if attr(node, "new_axis", 0):
        return (g.op("SplitToSequence", dy, axis=axis, keepdims=0),)
    lengths = g.seq_map(lambda sub, x: sub.op("Gather", sub.op("Shape", x), sub.ints([axis])), node.inputs[0],
                        dtype=ir.DataType.INT64)
    return (g.op("SplitToSequence", dy, g.op("ConcatFromSequence", lengths, axis=0), axis=axis),)
