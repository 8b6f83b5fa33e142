"""Reshaping, splitting and picking functions under torch's names (``gc.unbind``, ``gc.tensor_split``,
``gc.squeeze``, ``gc.rot90``, ``gc.broadcast_tensors``, ``gc.atleast_2d``, ``gc.take_along_dim``, ...)
and the dtype queries (``gc.numel``, ``gc.is_floating_point``), each written in standard ONNX ops
(Slice, Squeeze, Unsqueeze, Transpose, Expand, Gather, GatherElements) that have kernels and
gradient rules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl.builder import known_value, op_error, user_source
from graphc.dsl.ops import const_i64, constant, emit, lift, reshape, transpose
from graphc.dsl.ops import squeeze as squeeze_axes
from graphc.dsl.ops import unsqueeze as unsqueeze_axes
from graphc.dsl.ops_array import dim_index, expand, flip, split, static_dim
from graphc.dsl.ops_views import movedim
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES
from graphc.passes.infer import InferenceError, broadcast


# -- splitting --------------------------------------------------------------------------------


def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.unbind``: the slices of ``dim`` (a static size), which goes away. Signature: ai.onnx@13::Gather"""
    x = lift(x)
    dim = dim_index(x, dim, "Gather")
    return tuple(emit("Gather", [x, constant(np.asarray(i, np.int64))], {"axis": dim})
                 for i in range(static_dim(x, dim, "Gather")))


def _slice(x: Tensor, dim: int, start: int, end: int) -> Tensor:
    return emit("Slice", [x, const_i64([start]), const_i64([end]), const_i64([dim])])


def tensor_split(x: Tensor, indices_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.tensor_split``: an int ``n`` gives ``n`` pieces, the first ``size % n`` one longer;
    a list of indices cuts before each (pieces may be empty, as torch's), and so does a 1-D int64
    Tensor of them (of static length; the cuts read at run time, the dim's size may be symbolic); a
    0-d one is an int, when a constant. One Slice per piece. Signature: ai.onnx@13::Slice"""
    x = lift(x)
    dim = dim_index(x, dim, "Slice")
    if isinstance(indices_or_sections, Tensor):
        indices_or_sections = _sections_or_cuts(x, indices_or_sections)
        if isinstance(indices_or_sections, Tensor):
            cuts = [emit("Slice", [indices_or_sections, const_i64([i]), const_i64([i + 1])])
                    for i in range(indices_or_sections.shape[0])]
            bounds = [const_i64([0]), *cuts, const_i64([np.iinfo(np.int64).max])]
            return tuple(emit("Slice", [x, a, b, const_i64([dim])]) for a, b in zip(bounds, bounds[1:]))
    size = static_dim(x, dim, "Slice")
    if isinstance(indices_or_sections, (int, np.integer)) and not isinstance(indices_or_sections, bool):
        n = int(indices_or_sections)
        if n < 1:
            raise op_error("Slice", [x], f"tensor_split needs sections >= 1, got {n}", user_source())
        cuts = [i * (size // n) + min(i, size % n) for i in range(1, n)]
    elif isinstance(indices_or_sections, (list, tuple)) and all(
            isinstance(i, (int, np.integer)) for i in indices_or_sections):
        cuts = [int(i) for i in indices_or_sections]
    else:
        raise CaptureError(f"tensor_split takes an int or a list of ints as indices_or_sections, got "
                           f"{indices_or_sections!r} (at {user_source()})")
    bounds = [0, *cuts, size]
    return tuple(_slice(x, dim, a, b) for a, b in zip(bounds, bounds[1:]))


def _sections_or_cuts(x: Tensor, t: Tensor) -> Tensor | int:
    """A Tensor ``indices_or_sections`` checked as torch's: int64, 1-D (returned; its length static) or 0-d
    (its int, which must be a constant: the number of pieces is the graph's)."""
    if t.dtype != "int64" or t.shape is None or len(t.shape) > 1:
        raise op_error("Slice", [x, t], "tensor_split takes as indices_or_sections an int64 Tensor of rank 0 or 1, "
                       "as torch's", user_source())
    if len(t.shape) == 1:
        if not isinstance(t.shape[0], int):
            raise op_error("Slice", [x, t], "tensor_split needs a static number of indices (the number of pieces)",
                           user_source())
        return t
    sections = known_value(t)
    if sections is None:
        raise op_error("Slice", [x, t], "tensor_split takes a 0-d Tensor of sections only as a constant: the number "
                       "of pieces must be known at capture (pass an int)", user_source())
    return int(sections)


def _split_at(fn: str, dim: int, min_rank: int):
    """torch's ``hsplit``/``vsplit``/``dsplit``: ``tensor_split`` along ``dim`` of a Tensor of rank at
    least ``min_rank``; an int number of sections must divide the dim."""
    def split_fn(x: Tensor, indices_or_sections: Any) -> tuple[Tensor, ...]:
        x = lift(x)
        if x.ndim < min_rank:
            raise op_error("Slice", [x], f"{fn} needs a Tensor of rank >= {min_rank}, got rank {x.ndim}",
                           user_source())
        axis = 0 if fn == "hsplit" and x.ndim == 1 else dim
        if isinstance(indices_or_sections, (int, np.integer)):
            size = static_dim(x, axis, "Slice")
            if indices_or_sections < 1 or size % indices_or_sections:
                raise op_error("Slice", [x], f"{fn}: {indices_or_sections} sections do not divide dim {axis} "
                               f"of size {size}", user_source())
        return tensor_split(x, indices_or_sections, axis)
    split_fn.__name__ = fn
    split_fn.__doc__ = f"``torch.{fn}``: ``tensor_split`` along dim {dim}{' (0 for a 1-D Tensor)' * (dim == 1)}."
    return split_fn


hsplit = _split_at("hsplit", 1, 1)
vsplit = _split_at("vsplit", 0, 2)
dsplit = _split_at("dsplit", 2, 3)


def split_with_sizes(x: Tensor, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.split_with_sizes``: pieces of the listed sizes, which add up to the dim's.
    Signature: ai.onnx@18::Split"""
    if isinstance(split_sizes, (int, np.integer)):
        raise CaptureError(f"split_with_sizes takes a list of sizes, got {split_sizes!r}; gc.split takes one size "
                           f"(at {user_source()})")
    return split(x, list(split_sizes), dim)


# -- axes -------------------------------------------------------------------------------------


def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    """``torch.squeeze``: every size-1 dim, or those of ``dim`` (an int or a tuple); a listed dim of
    another size stays, as in torch. Without ``dim`` a symbolic dim is taken not to be 1 and stays,
    so the result has a known rank. Signature: ai.onnx@21::Squeeze"""
    x = lift(x)
    if dim is None:
        out = squeeze_axes(x, None if x.shape is None else [d for d, n in enumerate(x.shape) if n == 1])
    else:
        dims = [dim] if isinstance(dim, (int, np.integer)) else list(dim)
        out = squeeze_axes(x, [dim_index(x, int(d), "Squeeze") for d in dims]) if x.ndim else x
    return emit("Identity", [x]) if out is x else out  # nothing squeezed: still a view of its own, as torch's


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """``torch.unsqueeze``: a size-1 dim inserted at ``dim`` (``-1`` appends). Signature: ai.onnx@21::Unsqueeze"""
    x = lift(x)
    if not isinstance(dim, (int, np.integer)) or not -x.ndim - 1 <= dim <= x.ndim:
        raise op_error("Unsqueeze", [x], f"unsqueeze dim {dim!r} out of range [{-x.ndim - 1}, {x.ndim}]",
                       user_source())
    return unsqueeze_axes(x, [int(dim) % (x.ndim + 1)])


def swapaxes(x: Tensor, axis0: int, axis1: int) -> Tensor:
    """``torch.swapaxes`` (and ``swapdims``): two axes exchanged. Signature: ai.onnx@21::Transpose"""
    x = lift(x)
    perm = list(range(x.ndim))
    a, b = dim_index(x, axis0, "Transpose"), dim_index(x, axis1, "Transpose")
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def swapdims(x: Tensor, dim0: int, dim1: int) -> Tensor:
    """``torch.swapdims``: ``swapaxes``."""
    return swapaxes(x, dim0, dim1)


moveaxis = movedim


def rot90(x: Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
    """``torch.rot90``: ``k`` quarter turns from the first of ``dims`` towards the second (a flip
    and a transpose, as torch computes it)."""
    x = lift(x)
    dims = list(dims)
    if len(dims) != 2 or x.ndim < 2:
        raise op_error("Transpose", [x], f"rot90 takes 2 dims of a Tensor of rank >= 2, got dims {dims} and rank "
                       f"{x.ndim}", user_source())
    a, b = (dim_index(x, d, "Transpose") for d in dims)
    if a == b:
        raise op_error("Transpose", [x], f"rot90 dims must differ, got {dims}", user_source())
    k %= 4
    if k == 0:
        return x
    if k == 2:
        return flip(x, [a, b])
    return swapaxes(flip(x, [b if k == 1 else a]), a, b)


def fliplr(x: Tensor) -> Tensor:
    """``torch.fliplr``: dim 1 reversed (rank >= 2)."""
    x = lift(x)
    if x.ndim < 2:
        raise op_error("Slice", [x], f"fliplr needs a Tensor of rank >= 2, got rank {x.ndim}", user_source())
    return flip(x, [1])


def flipud(x: Tensor) -> Tensor:
    """``torch.flipud``: dim 0 reversed (rank >= 1)."""
    x = lift(x)
    if x.ndim < 1:
        raise op_error("Slice", [x], "flipud needs a Tensor of rank >= 1, got rank 0", user_source())
    return flip(x, [0])


def ravel(x: Tensor) -> Tensor:
    """``torch.ravel``: the 1-D Tensor of all entries. Signature: ai.onnx@21::Reshape"""
    return reshape(x, [-1])


# -- broadcasting -----------------------------------------------------------------------------


def broadcast_to(x: Tensor, size: Sequence[Any]) -> Tensor:
    """``torch.broadcast_to``: ``x.expand(size)`` (-1 keeps a dim). Signature: ai.onnx@13::Expand"""
    return expand(x, tuple(size))


def broadcast_tensors(*tensors: Tensor) -> tuple[Tensor, ...]:
    """``torch.broadcast_tensors``: every Tensor expanded to their common shape (read at run time:
    symbolic dims too; ONNX's Expand broadcasts both ways, so each is expanded by the others'
    shapes). Signature: ai.onnx@13::Expand"""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    tensors = [lift(t) for t in tensors]
    try:
        target = broadcast(*(t.shape for t in tensors))
    except InferenceError as exc:
        shapes = ", ".join(t.type_str() for t in tensors)
        raise op_error("Expand", tensors, f"broadcast_tensors: {shapes} do not broadcast: {exc}",
                       user_source()) from None
    static = target is not None and all(isinstance(d, int) for d in target)
    shapes = [(const_i64(target), target)] if static else [(emit("Shape", [t]), t.shape) for t in tensors]
    out = []
    for t in tensors:
        for shape, dims in shapes:
            if t.shape != target:
                t = emit("Expand", [t, shape], out_types=[(t.dtype, broadcast(t.shape, dims))])
        out.append(t)
    return tuple(out)


def _at_least(rank: int):
    """torch's ``atleast_<rank>d``: each Tensor with leading (and for 3-D, trailing) size-1 dims."""
    where = {1: {0: [0]}, 2: {0: [0, 1], 1: [0]}, 3: {0: [0, 1, 2], 1: [0, 2], 2: [2]}}[rank]

    def at_least(*tensors: Any) -> Any:
        many = len(tensors) != 1 or isinstance(tensors[0], (list, tuple))
        items = tensors[0] if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tensors
        out = []
        for t in items:
            t = lift(t)
            out.append(unsqueeze_axes(t, where[t.ndim]) if t.ndim in where else t)
        return tuple(out) if many else out[0]
    at_least.__name__ = f"atleast_{rank}d"
    at_least.__doc__ = (f"``torch.atleast_{rank}d``: a Tensor of rank < {rank} with size-1 dims added as torch "
                        "adds them; several Tensors (or one list) give a tuple. Signature: ai.onnx@21::Unsqueeze")
    return at_least


atleast_1d, atleast_2d, atleast_3d = (_at_least(r) for r in (1, 2, 3))


def clone(x: Tensor, *, memory_format: Any = None) -> Tensor:
    """``torch.clone``: a copy, so an in-place write to either never reaches the other, and a hook on it sees its
    reads only: an ``Identity`` not recorded as a view (``inplace`` takes one for a view)."""
    x = lift(x)
    out = emit("Identity", [x], name_hint="clone")
    out._view = None
    x._views = [ref for ref in x._views if ref() is not out]
    return out


# -- picking ----------------------------------------------------------------------------------


def _int_index(op: str, x: Tensor, index: Any) -> Tensor:
    index = lift(index)
    if index.dtype not in ("int64", "int32"):
        raise op_error(op, [x, index], f"indices must be int64 or int32, got {index.dtype}", user_source())
    return index


def take(x: Tensor, index: Tensor) -> Tensor:
    """``torch.take``: entries of the flattened ``x`` at ``index`` (any shape; negative counts from
    the end), in ``index``'s shape. Signature: ai.onnx@13::Gather"""
    x = lift(x)
    return emit("Gather", [reshape(x, [-1]), _int_index("Gather", x, index)], {"axis": 0})


def take_along_dim(x: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """``torch.take_along_dim``: ``gather`` whose ``indices`` broadcast with ``x`` on the dims
    other than ``dim``; ``dim=None`` picks from the flattened ``x``. Signature: ai.onnx@13::GatherElements"""
    x = lift(x)
    indices = _int_index("GatherElements", x, indices)
    if dim is None:
        return emit("GatherElements", [reshape(x, [-1]), reshape(indices, [-1])], {"axis": 0})
    if x.ndim != indices.ndim:
        raise op_error("GatherElements", [x, indices], f"take_along_dim: the indices have rank {indices.ndim}, "
                       f"the input {x.ndim}", user_source())
    dim = dim_index(x, dim, "GatherElements")
    x, indices = _broadcast_except(x, indices, dim)
    return emit("GatherElements", [x, indices], {"axis": dim})


def _broadcast_except(x: Tensor, indices: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """``x`` and ``indices`` expanded to their common shape on every dim but ``dim``."""
    try:
        common = broadcast(tuple(d for i, d in enumerate(x.shape) if i != dim),
                           tuple(d for i, d in enumerate(indices.shape) if i != dim))
    except InferenceError as exc:
        raise op_error("GatherElements", [x, indices], f"take_along_dim: {exc}", user_source()) from None
    out = []
    for t in (x, indices):
        want = [*common[:dim], t.shape[dim], *common[dim:]]
        if t.shape != tuple(want):
            if not all(isinstance(d, int) for d in want):
                raise op_error("GatherElements", [x, indices], "take_along_dim broadcasts static dims only, got "
                               f"{want}", user_source())
            t = emit("Expand", [t, const_i64(want)])
        out.append(t)
    return out[0], out[1]


# -- sizes and dtypes -------------------------------------------------------------------------


def numel(x: Tensor) -> int:
    """``torch.numel``: the number of entries, where every dim is static."""
    x = lift(x)
    if x.shape is None or not all(isinstance(d, int) for d in x.shape):
        raise op_error("Size", [x], "numel() needs static dims; gc.sum(gc.ones_like(x)) counts at run time",
                       user_source())
    return math.prod(x.shape)


def is_floating_point(x: Tensor) -> bool:
    """``torch.is_floating_point``: whether ``x``'s dtype is float16, bfloat16, float32 or float64."""
    return lift(x).dtype in FLOAT_DTYPES


__all__ = [
    "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_tensors", "broadcast_to", "clone", "dsplit", "fliplr",
    "flipud", "hsplit", "is_floating_point", "moveaxis", "numel", "ravel", "rot90", "split_with_sizes", "squeeze",
    "swapaxes", "swapdims", "take", "take_along_dim", "tensor_split", "unbind", "unsqueeze", "vsplit",
]
