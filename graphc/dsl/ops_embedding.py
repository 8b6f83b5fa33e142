"""``embedding_bag`` with ``torch.nn.functional``'s signature: sums, means or maxima of bags of
embedding rows, written as Gather, a bag-membership mask and one MatMul (sum, mean) or a masked
ReduceMax (max), so the existing kernels and gradient rules apply."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import cast, concat, const_i64, emit, lift, matmul, maximum, scalar, squeeze, unsqueeze, where
from graphc.dsl.ops import max as reduce_max
from graphc.dsl.ops import min as reduce_min
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_array import cumsum, ones_like
from graphc.dsl.ops_math import any as reduce_any
from graphc.dsl.ops_nn import embedding
from graphc.dsl.tensor import Tensor

MODES = ("sum", "mean", "max")


def embedding_bag(input: Tensor, weight: Tensor, offsets: Any = None, max_norm: float | None = None,  # noqa: A002
                  norm_type: float = 2, scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Any = None, include_last_offset: bool = False,
                  padding_idx: int | None = None) -> Tensor:
    """``torch.nn.functional.embedding_bag``: ``[B, D]``, bag ``b`` reduced by ``mode``. Bags are the
    rows of a 2-D ``input [B, L]``, or the runs of a 1-D ``input`` that ``offsets`` start (with
    ``include_last_offset`` its last entry ends the last bag). Entries equal to ``padding_idx`` are
    left out (and uncounted in a mean); an empty bag gives zeros. ``per_sample_weights`` (``input``'s
    shape) scale the rows of a ``"sum"``. ``sparse`` is accepted (gradients are dense tensors).
    ``max_norm`` and ``scale_grad_by_freq`` are ``embedding``'s: every row ``input`` names (a padding
    one too) renormalised in place first, each row's gradient divided by its count in ``input``
    (refused with ``"max"``, as torch's)."""
    idx, w = lift(input), lift(weight)
    _check(idx, w, offsets, scale_grad_by_freq, mode, per_sample_weights, padding_idx)
    rows = embedding(idx, w, max_norm=max_norm, norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq)
    keep = None if padding_idx is None else idx != lift(padding_idx % w.shape[0], idx)
    if idx.ndim == 2:
        bags, mask = rows, keep  # [B, L, D], [B, L]
    else:
        mask = _members(idx, lift(offsets), include_last_offset)  # [B, T]
        mask = mask if keep is None else mask & unsqueeze(keep, [0])
        bags = unsqueeze(rows, [0])  # [1, T, D]
    mask = ones_like(idx, "bool") if mask is None else mask
    if mode == "max":
        picked = reduce_max(where(unsqueeze(mask, [-1]), bags, scalar(-np.inf, bags)), -2)
        return where(reduce_any(mask, -1, keepdim=True), picked, scalar(0.0, picked))
    scale = cast(mask, w.dtype)
    if per_sample_weights is not None:
        scale = scale * lift(per_sample_weights, w)
    total = squeeze(matmul(unsqueeze(scale, [-2]), bags), [-2])  # [B, 1, T] @ [B or 1, T, D]
    if mode == "sum":
        return total
    count = reduce_sum(cast(mask, w.dtype), -1, keepdims=True)
    return total / maximum(count, scalar(1.0, count))


def embedding_bag_with_bags(weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False,
                            mode: int = 0, sparse: bool = False, per_sample_weights: Any = None,
                            include_last_offset: bool = False,
                            padding_idx: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``torch.embedding_bag`` (``mode`` 0 sum, 1 mean, 2 max; a 1-D ``indices`` and its ``offsets``):
    ``embedding_bag``'s output and torch CPU's bookkeeping, in ``indices``' dtype: ``offset2bag`` (each position's
    bag; empty for a sum without ``padding_idx`` of a weight not float64), ``bag_size`` (each bag's non-padding
    count; zeros for a sum) and ``max_indices`` (a max's ``[B, D]`` row ids of the maxima, the first position's of
    tied ones, 0 for an empty bag; a mean's ``bag_size``, a sum's zeros)."""
    idx, w = lift(indices), lift(weight)
    if isinstance(mode, bool) or mode not in (0, 1, 2) or idx.shape is None or idx.ndim != 1 or offsets is None:
        raise op_error("embedding_bag", [idx, w], f"torch.embedding_bag takes a 1-D indices, its offsets and an "
                       f"int mode 0 sum, 1 mean or 2 max (got mode={mode!r}); F.embedding_bag takes 2-D bags and "
                       f"mode names", user_source())
    out = embedding_bag(idx, w, offsets, None, 2, scale_grad_by_freq, MODES[mode], sparse, per_sample_weights,
                        include_last_offset, padding_idx)
    offsets = cast(lift(offsets), "int64")
    starts = offsets[:-1] if include_last_offset else offsets
    mask = _members(idx, offsets, include_last_offset)  # [B, T]
    if padding_idx is not None:
        mask = mask & unsqueeze(idx != lift(padding_idx % w.shape[0], idx), [0])
    positions = cumsum(ones_like(idx, "int64"), 0) - const_i64([1])
    offset2bag = reduce_sum(cast(unsqueeze(starts, [1]) <= unsqueeze(positions, [0]), "int64"), 0) - const_i64([1])
    zeros = cast(reduce_sum(cast(mask, "int64"), -1) * const_i64([0]), idx.dtype)  # [B]
    if mode == 0 and padding_idx is None and w.dtype != "float64":  # torch CPU's fast path keeps no offset2bag
        offset2bag = const_i64(np.zeros(0, np.int64))
    bag_size = zeros if mode == 0 else cast(reduce_sum(cast(mask, "int64"), -1), idx.dtype)
    if mode < 2:
        return out, cast(offset2bag, idx.dtype), bag_size, bag_size
    rows = unsqueeze(embedding(idx, w), [0])  # [1, T, D]
    hit = unsqueeze(mask, [-1]) & (rows == unsqueeze(out, [1]))  # [B, T, D]: a maximum of its bag
    at = unsqueeze(unsqueeze(positions, [0]), [-1])  # [1, T, 1]
    # torch's id is the first position's of tied maxima (its scan replaces on a strict >)
    first = reduce_min(where(hit, at, const_i64([np.iinfo(np.int64).max])), 1, keepdims=True)
    ids = unsqueeze(unsqueeze(cast(idx, "int64"), [0]), [-1])
    picked = reduce_max(where(hit & (at == first), ids, const_i64([0])), 1)
    return out, cast(offset2bag, idx.dtype), bag_size, cast(picked, idx.dtype)


def _members(idx: Tensor, offsets: Tensor, include_last_offset: bool) -> Tensor:
    """``[B, T]``: whether position ``t`` of a 1-D ``idx`` is in bag ``b`` (``starts[b] <= t < ends[b]``)."""
    offsets = cast(offsets, "int64")
    positions = unsqueeze(cumsum(ones_like(idx, "int64"), 0) - const_i64([1]), [0])
    if include_last_offset:
        starts, ends = offsets[:-1], offsets[1:]
    else:
        starts, ends = offsets, concat([offsets[1:], emit("Shape", [idx])], 0)
    return (positions >= unsqueeze(starts, [1])) & (positions < unsqueeze(ends, [1]))


def _check(idx: Tensor, w: Tensor, offsets: Any, scale_grad_by_freq: bool, mode: str,
           per_sample_weights: Any, padding_idx: int | None) -> None:
    """torch's refusals, naming the argument."""
    def fail(message: str):
        raise op_error("embedding_bag", [idx, w], message, user_source())

    if mode not in MODES:
        fail(f"mode={mode!r}; expected 'sum', 'mean' or 'max'")
    if scale_grad_by_freq and mode == "max":
        fail("mode='max' does not support scale_grad_by_freq (scaling the gradient by the frequency)")
    if w.shape is None or len(w.shape) != 2 or not isinstance(w.shape[0], int):
        fail("weight has to be [num_embeddings, embedding_dim] with a static num_embeddings")
    rows = w.shape[0]
    if padding_idx is not None and not -rows <= padding_idx < rows:
        fail(f"padding_idx {padding_idx} is outside [-{rows}, {rows})")
    if idx.ndim not in (1, 2):
        fail(f"input has to be 1D or 2D, got rank {idx.ndim}")
    if idx.ndim == 2 and offsets is not None:
        fail("a 2-D input is a batch of fixed-length bags: offsets has to be None")
    if idx.ndim == 1:
        if offsets is None:
            fail("a 1-D input needs offsets (the start of each bag)")
        if (offsets.ndim if isinstance(offsets, Tensor) else np.ndim(offsets)) != 1:
            fail("offsets has to be a 1-D tensor")
        if not isinstance(offsets, Tensor) and len(offsets) and (first := int(np.asarray(offsets)[0])) != 0:
            fail(f"offsets[0] has to be 0 (the first bag starts at position 0), got {first}")
    if per_sample_weights is not None:
        if mode != "sum":
            fail(f"per_sample_weights is only supported for mode='sum', got mode={mode!r}")
        shape = per_sample_weights.shape if isinstance(per_sample_weights, Tensor) else np.shape(per_sample_weights)
        if idx.shape is not None and shape is not None and tuple(shape) != tuple(idx.shape):
            fail(f"per_sample_weights has shape {list(shape)}; expected input's {list(idx.shape)}")


__all__ = ["embedding_bag", "embedding_bag_with_bags"]
