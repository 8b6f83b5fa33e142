"""``gc.nn.utils.rnn``: torch.nn.utils.rnn's padding and packing of variable-length sequences.

A ``PackedSequence`` holds what ONNX's RNN/LSTM/GRU take: the padded, time-major batch ``(T, B, *)``
in the caller's batch order and each sequence's length (a Python list, or an int64 Tensor read at
run time), which ``gc.nn.RNN/LSTM/GRU`` pass as ``sequence_lens``. torch's packed layout
(``data``, ``batch_sizes``, ``sorted_indices``, ``unsorted_indices``) is computed from them on
request (NonZero + GatherND for ``data``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_array import dim_length, dim_positions
from graphc.dsl.ops_reshape import unbind
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError

__all__ = ["PackedSequence", "invert_permutation", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence",
           "pad_sequence", "unpack_sequence", "unpad_sequence"]


class PackedSequence:
    """torch's ``PackedSequence``, built by ``pack_padded_sequence``/``pack_sequence`` (not from
    ``data`` and ``batch_sizes``): ``padded`` ``(T, B, *)`` and ``lengths`` (``static_lengths``,
    a list, where they are Python numbers)."""

    def __init__(self, padded: Tensor, lengths: Tensor, static_lengths: list[int] | None, enforce_sorted: bool):
        self.padded, self.lengths, self.static_lengths = padded, lengths, static_lengths
        self.enforce_sorted = enforce_sorted

    def with_padded(self, padded: Tensor) -> "PackedSequence":
        """The same lengths over another padded batch (an RNN's output)."""
        return PackedSequence(padded, self.lengths, self.static_lengths, self.enforce_sorted)

    @property
    def sorted_indices(self) -> Tensor | None:
        """The batch in decreasing length (ties in batch order); None with ``enforce_sorted``, as torch."""
        if self.enforce_sorted:
            return None
        if self.static_lengths is not None:
            return ops.const_i64(np.argsort(-np.asarray(self.static_lengths), kind="stable"))
        return ops.emit("TopK", [self.lengths, dim_length(self.lengths, 0)], {"largest": 1, "sorted": 1},
                        num_outputs=2)[1]

    @property
    def unsorted_indices(self) -> Tensor | None:
        """The inverse permutation of ``sorted_indices``."""
        order = self.sorted_indices
        if order is None:
            return None
        if self.static_lengths is not None:
            return ops.const_i64(np.argsort(np.argsort(-np.asarray(self.static_lengths), kind="stable")))
        return invert_permutation(order)

    def _sorted(self) -> tuple[Tensor, Tensor]:
        """``(padded, lengths)`` with the batch in ``sorted_indices``' order."""
        order = self.sorted_indices
        if order is None:
            return self.padded, self.lengths
        return (ops.emit("Gather", [self.padded, order], {"axis": 1}),
                ops.emit("Gather", [self.lengths, order], {"axis": 0}))

    @property
    def data(self) -> Tensor:
        """``(sum(lengths), *)``: the valid steps, time-major, each step's batch in sorted order."""
        padded, lengths = self._sorted()
        where = ops.transpose(ops.emit("NonZero", [_valid(padded, lengths)]), [1, 0])
        return ops.emit("GatherND", [padded, where])

    @property
    def batch_sizes(self) -> Tensor:
        """int64 ``(max(lengths),)``: how many sequences are longer than each step."""
        if self.static_lengths is not None:
            steps = np.arange(max(self.static_lengths))[:, None]
            return ops.const_i64((steps < np.asarray(self.static_lengths)).sum(axis=1))
        counts = ops.sum(ops.cast(_valid(self.padded, self.lengths), "int64"), axis=1)
        return _first_steps(counts, self.lengths, self.static_lengths)


def invert_permutation(permutation: Any) -> Tensor | None:
    """torch's: the inverse of the 1-D ``permutation`` (``out[permutation[i]] = i``, int64, a ScatterElements);
    None for None."""
    if permutation is None:
        return None
    p = ops.lift(permutation)
    if p.ndim != 1 or p.dtype == "bool" or not str(p.dtype).startswith(("int", "uint")):
        raise op_error("ScatterElements", [p], f"invert_permutation takes a 1-D integer permutation, got "
                       f"{p.dtype} of rank {p.ndim}", user_source())
    p = ops.cast(p, "int64")
    return ops.emit("ScatterElements", [p, p, dim_positions(p, 0)], {"axis": 0})


def _valid(padded: Tensor, lengths: Tensor) -> Tensor:
    """bool ``(T, B)``: step ``t`` of sequence ``b`` is within its length."""
    return ops.unsqueeze(dim_positions(padded, 0), [1]) < ops.unsqueeze(lengths, [0])


def _first_steps(x: Tensor, lengths: Tensor, static: list[int] | None) -> Tensor:
    """``x[:max(lengths)]`` along dim 0."""
    end = ops.const_i64([max(static)]) if static is not None else ops.reshape(ops.max(lengths), [1])
    return ops.emit("Slice", [x, ops.const_i64([0]), end, ops.const_i64([0])])


def _time_major(x: Tensor, batch_first: bool) -> Tensor:
    return ops.transpose(x, [1, 0, *range(2, x.ndim)]) if batch_first else x


def _lengths(fn: str, padded: Tensor, lengths: Any) -> tuple[Tensor, list[int] | None]:
    """``lengths`` as an int64 Tensor and, where given as numbers, as a list; checked as torch
    checks them where they are known: one per sequence, each in ``1 .. T``."""
    if isinstance(lengths, Tensor):
        if lengths.dtype not in ("int64", "int32") or (lengths.shape is not None and len(lengths.shape) != 1):
            raise op_error(fn, [padded, lengths], f"lengths must be a 1-D int64 Tensor, got {lengths.dtype} "
                           f"{list(lengths.shape or [])}", user_source())
        return ops.cast(lengths, "int64"), None
    static = [int(n) for n in np.asarray(lengths).reshape(-1)]
    batch, steps = padded.shape[1], padded.shape[0]
    if isinstance(batch, int) and len(static) != batch:
        raise op_error(fn, [padded], f"expected len(lengths) to equal the batch size {batch}, got {len(static)}",
                       user_source())
    if min(static) <= 0:
        raise op_error(fn, [padded], f"every length must be greater than 0, got lengths={static}", user_source())
    if isinstance(steps, int) and max(static) > steps:
        raise op_error(fn, [padded], f"lengths={static} exceed the {steps} steps of the padded input",
                       user_source())
    return ops.const_i64(static), static


def pack_padded_sequence(input: Tensor, lengths: Any, batch_first: bool = False,  # noqa: A002 - torch's name
                         enforce_sorted: bool = True) -> PackedSequence:
    """``torch.nn.utils.rnn.pack_padded_sequence``: ``input`` ``(T, B, *)`` (``(B, T, *)`` with
    ``batch_first``) and each sequence's length. With ``enforce_sorted`` the lengths must
    decrease (checked when they are numbers; a Tensor of lengths is taken as given)."""
    x = ops.lift(input)
    if x.ndim < 2:
        raise op_error("pack_padded_sequence", [x], "input must have a time and a batch dim", user_source())
    x = _time_major(x, batch_first)
    tensor, static = _lengths("pack_padded_sequence", x, lengths)
    if enforce_sorted and static is not None and static != sorted(static, reverse=True):
        raise op_error("pack_padded_sequence", [x], f"lengths={static} must be sorted in decreasing order when "
                       "enforce_sorted=True; pass enforce_sorted=False", user_source())
    return PackedSequence(x, tensor, static, enforce_sorted)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, Tensor]:
    """``torch.nn.utils.rnn.pad_packed_sequence``: ``(padded, lengths)``, ``padded`` with
    ``max(lengths)`` steps (``total_length`` if given) and ``padding_value`` past each length."""
    if not isinstance(sequence, PackedSequence):
        raise CaptureError(f"pad_packed_sequence: sequence must be a PackedSequence, got "
                           f"{type(sequence).__name__} (at {user_source()})")
    x, lengths, static = sequence.padded, sequence.lengths, sequence.static_lengths
    if total_length is None:
        x = _first_steps(x, lengths, static)
    else:
        if static is not None and total_length < max(static):
            raise op_error("pad_packed_sequence", [x], f"total_length={total_length} is less than the longest "
                           f"sequence's length {max(static)}", user_source())
        x = _fit_steps(x, total_length)
    valid = _valid(x, lengths)
    valid = ops.unsqueeze(valid, list(range(2, x.ndim))) if x.ndim > 2 else valid
    x = ops.where(valid, x, ops.scalar(padding_value, x))
    return _time_major(x, batch_first), lengths


def _fit_steps(x: Tensor, steps: int) -> Tensor:
    """``x`` cut or padded (with zeros) to ``steps`` along dim 0."""
    have = x.shape[0]
    if isinstance(have, int) and have >= steps:
        return x[:steps]
    more = steps - have if isinstance(have, int) else \
        ops.maximum(ops.const_i64([steps]) - dim_length(x, 0), ops.const_i64([0]))
    return ops.emit("Pad", [x, _dim0_pads(more, "right", x.ndim)])[:steps]


def pad_sequence(sequences: Sequence[Tensor], batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """``torch.nn.utils.rnn.pad_sequence``: tensors ``(L_i, *)`` (the same ``*``) padded with
    ``padding_value`` on ``padding_side`` to the longest and stacked: ``(max L, B, *)``, or
    ``(B, max L, *)`` with ``batch_first``. Lengths may be symbolic (the padding is then computed)."""
    if padding_side not in ("left", "right"):
        raise CaptureError(f"pad_sequence: padding_side={padding_side!r}; expected 'left' or 'right' "
                           f"(at {user_source()})")
    seqs = list(unbind(sequences, 0)) if isinstance(sequences, Tensor) else [ops.lift(s) for s in sequences]
    if not seqs:
        raise CaptureError(f"pad_sequence: sequences is empty (at {user_source()})")
    first = seqs[0]
    for s in seqs[1:]:
        if s.ndim != first.ndim or s.dtype != first.dtype or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(s.shape[1:], first.shape[1:])):
            raise op_error("pad_sequence", [first, s], "every sequence must have the same trailing dims and dtype",
                           user_source())
    sizes = [s.shape[0] for s in seqs]
    if all(isinstance(n, int) for n in sizes):
        more = [max(sizes) - n for n in sizes]
    else:
        lengths = [dim_length(s, 0) for s in seqs]
        longest = ops.emit("Max", lengths) if len(lengths) > 1 else lengths[0]
        more = [longest - n for n in lengths]
    padded = [ops.emit("Pad", [s, _dim0_pads(m, padding_side, s.ndim), ops.scalar(padding_value, s)])
              for s, m in zip(seqs, more)]
    return ops.stack(padded, axis=0 if batch_first else 1)


def _dim0_pads(more: int | Tensor, side: str, rank: int) -> Tensor:
    """Pad's ``pads`` adding ``more`` steps on dim 0's ``side`` (left or right)."""
    zeros = [0] * (rank - 1)
    if isinstance(more, int):
        return ops.const_i64([more, *zeros, 0, *zeros] if side == "left" else [0, *zeros, more, *zeros])
    parts = [more, ops.const_i64(zeros + [0] + zeros)] if side == "left" else \
        [ops.const_i64([0] + zeros), more, ops.const_i64(zeros)]
    return ops.concat(parts, axis=0)


def pack_sequence(sequences: Sequence[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """``torch.nn.utils.rnn.pack_sequence``: ``pack_padded_sequence(pad_sequence(sequences), lengths)``."""
    seqs = [ops.lift(s) for s in sequences]
    sizes = [s.shape[0] if s.shape else None for s in seqs]
    lengths = sizes if all(isinstance(n, int) for n in sizes) else ops.concat([dim_length(s, 0) for s in seqs])
    return pack_padded_sequence(pad_sequence(seqs), lengths, enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences: Tensor, lengths: Any, batch_first: bool = False) -> list[Tensor]:
    """``torch.nn.utils.rnn.unpad_sequence``: each sequence cut to its length, ``[(L_i, *)]``; the
    batch size must be static."""
    x = _time_major(ops.lift(padded_sequences), batch_first)
    batch = x.shape[1] if x.shape is not None else None
    if not isinstance(batch, int):
        raise op_error("unpad_sequence", [x], "needs a static batch size to return a list", user_source())
    tensor, static = _lengths("unpad_sequence", x, lengths)
    if static is not None:
        return [x[:n, b] for b, n in enumerate(static)]
    return [ops.emit("Slice", [x[:, b], ops.const_i64([0]), ops.reshape(tensor[b], [1]), ops.const_i64([0])])
            for b in range(batch)]


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """``torch.nn.utils.rnn.unpack_sequence``: the packed sequences as a list ``[(L_i, *)]``."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    static = packed_sequences.static_lengths
    return unpad_sequence(padded, lengths if static is None else static, batch_first=True)
