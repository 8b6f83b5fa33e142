"""Sequence and optional kernels. A sequence is a Python list of arrays (never mutated: every
kernel returns a new list); an empty optional is ``None``."""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel, scalar
from graphc.backends.numpy.shape import check_concat


def _pos(p, length, insert=False):
    """``position`` as an index from the front, checked against the spec's range: [-n, n - 1],
    and [-n, n] for an insert (n appends; -1 is before the last, as for the others)."""
    p = int(scalar(p))
    last = length if insert else length - 1
    if not -length <= p <= last:
        raise ValueError(f"position {p} is outside [{-length}, {last}] for a sequence of {length} tensors")
    return p + length if p < 0 else p


@kernel("SequenceEmpty", since=11)
def sequence_empty(*, dtype=None):
    return ([],)


@kernel("SequenceConstruct", since=11)
def sequence_construct(*xs):
    return (list(xs),)


@kernel("SequenceInsert", since=11)
def sequence_insert(seq, x, position=None):
    out = list(seq)
    out.insert(len(out) if position is None else _pos(position, len(out), insert=True), x)
    return (out,)


@kernel("SequenceAt", since=11)
def sequence_at(seq, position):
    return (seq[_pos(position, len(seq))],)


@kernel("SequenceErase", since=11)
def sequence_erase(seq, position=None):
    out = list(seq)
    del out[_pos(-1 if position is None else position, len(out))]
    return (out,)


@kernel("SequenceLength", since=11)
def sequence_length(seq):
    return (np.array(len(seq), np.int64),)


@kernel("SplitToSequence", since=11)
def split_to_sequence(x, split=None, *, axis=0, keepdims=1):
    if split is None:  # pieces of 1 (none of an empty axis: np.split refuses 0 sections)
        parts = np.split(x, range(1, x.shape[axis]), axis=axis) if x.shape[axis] else []
        return ([p if keepdims else np.squeeze(p, axis) for p in parts],)
    sizes = np.asarray(split).ravel()
    if sizes.size == 1 and np.asarray(split).ndim == 0:
        n = int(sizes[0])
        cuts = list(range(n, x.shape[axis], n))
    else:
        cuts = np.cumsum(sizes)[:-1]
    return (list(np.split(x, cuts, axis=axis)),)


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence(seq, *, axis, new_axis=0):
    """The tensors joined on ``axis`` as Concat joins them, or with ``new_axis`` stacked on a new
    ``axis`` (in [-r - 1, r]; tensors of one shape). An empty sequence has no result: a sequence
    holds no element shape, so ONNX defines neither the result's rank nor its other dims
    (onnxruntime and onnx.reference refuse it too)."""
    if not seq:
        raise ValueError(f"the sequence is empty: concatenating (new_axis {new_axis}) no tensors has no result in "
                         "ONNX, which gives a sequence no element shape to take the result's rank and dims from")
    if not new_axis:
        check_concat(seq, axis, "sequence tensor")
        return (np.concatenate(seq, axis=axis),)
    rank = seq[0].ndim
    if not -rank - 1 <= axis <= rank:
        raise ValueError(f"axis {axis} is outside [{-rank - 1}, {rank}] for new_axis 1 and tensors of rank {rank}")
    for k, x in enumerate(seq):
        if x.shape != seq[0].shape:
            raise ValueError(f"sequence tensor {k} has shape {list(x.shape)} and sequence tensor 0 {list(seq[0].shape)}: "
                             "new_axis 1 stacks tensors of one shape")
    return (np.stack(seq, axis=axis),)


@kernel("Optional", since=15)
def optional(x=None, *, type=None):  # noqa: A002 - spec name
    return (x,)


@kernel("OptionalHasElement", since=15)
def optional_has_element(x=None):
    return (np.array(x is not None),)


@kernel("OptionalGetElement", since=15)
def optional_get_element(x):
    return (x,)






@kernel("SequenceMap", since=17, context=True)
def sequence_map(ctx, seq, *additional, body):
    """Runs ``body`` on each position: sequences are indexed, tensors passed whole."""
    outputs: list[list] = [[] for _ in body.output_names]
    for i in range(len(seq)):
        extra = [a[i] if isinstance(a, list) else a for a in additional]
        for acc, value in zip(outputs, body.call(ctx, [seq[i], *extra])):
            acc.append(value)
    return tuple(outputs)
