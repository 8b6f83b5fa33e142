"""Shape, selection, sorting and matrix-product functions under torch's names (``gc.unflatten``,
``gc.movedim``, ``gc.narrow``, ``gc.select``, ``gc.diff``, ``gc.sort``, ``gc.outer``, ``gc.addmm``,
``gc.index_add``, ...), written in standard ONNX ops that have kernels and gradient rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.indexing import getitem
from graphc.dsl.ops import (broadcast_shape, concat, const_i64, emit, lift, matmul, reshape, same_dim, same_dtype,
                            scalar, transpose, unsqueeze)
from graphc.dsl.ops_array import dim_index, gather, sort_order
from graphc.dsl.tensor import Tensor
from graphc.dsl.dims import one_element
from graphc.errors import CaptureError

_INT_MAX = np.iinfo(np.int64).max


class Sorted(NamedTuple):
    """``gc.sort``'s result, as torch's: ``values`` and their int64 ``indices`` in the input."""

    values: Tensor
    indices: Tensor


def unflatten(x: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """``dim`` split into ``sizes`` (one may be -1). Signature: ai.onnx@21::Reshape"""
    x = lift(x)
    dim = dim_index(x, dim, "Reshape")
    return reshape(x, [*x.shape[:dim], *sizes, *x.shape[dim + 1:]])


def movedim(x: Tensor, source: Any, destination: Any) -> Tensor:
    """The axes ``source`` (an int or a sequence) moved to ``destination``, the others keeping
    their order. Signature: ai.onnx@21::Transpose"""
    x = lift(x)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise CaptureError(f"movedim: source {source} and destination {destination} differ in length "
                           f"(at {user_source()})")
    src = [dim_index(x, d, "Transpose") for d in src]
    dst = [dim_index(x, d, "Transpose") for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise op_error("Transpose", [x], f"movedim: repeated dims in {source} or {destination}", user_source())
    rest = iter(d for d in range(x.ndim) if d not in src)
    where_from = dict(zip(dst, src))
    return transpose(x, [where_from[d] if d in where_from else next(rest) for d in range(x.ndim)])


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """``length`` entries of ``dim`` from ``start`` (negative counts from the end). Signature: ai.onnx@13::Slice"""
    x = lift(x)
    dim = dim_index(x, dim, "Slice")
    size = x.shape[dim]
    if isinstance(size, int):
        start = start % size if -size <= start < 0 else start
        if not (0 <= start and length >= 0 and start + length <= size):
            raise op_error("Slice", [x], f"narrow({dim}, {start}, {length}) is outside dim {dim} of size {size}",
                           user_source())
    elif start < 0:
        raise op_error("Slice", [x], f"narrow on the symbolic dim {dim} takes a start >= 0, got {start}",
                       user_source())
    return emit("Slice", [x, const_i64([start]), const_i64([start + length]), const_i64([dim])])


def select(x: Tensor, dim: int, index: int) -> Tensor:
    """``x`` at ``index`` of ``dim``, which goes away: ``x[:, index]`` for ``dim=1``, a view as torch's (an
    in-place write into it reaches ``x``). Signature: ai.onnx@13::Slice"""
    x = lift(x)
    dim = dim_index(x, dim, "Slice")
    size = x.shape[dim]
    if isinstance(size, int) and not -size <= index < size:
        raise op_error("Slice", [x], f"select index {index} out of range for dim {dim} of size {size}",
                       user_source())
    return getitem(x, (slice(None),) * dim + (int(index),))


def t(x: Tensor) -> Tensor:
    """``torch.t``: a matrix transposed; a 0-D or 1-D Tensor as it is."""
    x = lift(x)
    if x.ndim > 2:
        raise op_error("Transpose", [x], f"t() takes a Tensor of rank <= 2, got rank {x.ndim}; use .transpose(a, b) "
                       "or .mT", user_source())
    return transpose(x) if x.ndim == 2 else x


def swap_last(x: Tensor) -> Tensor:
    """``x.mT``: the last two axes swapped."""
    x = lift(x)
    if x.ndim < 2:
        raise op_error("Transpose", [x], f"mT needs a rank >= 2, got {x.ndim}", user_source())
    return transpose(x, [*range(x.ndim - 2), x.ndim - 1, x.ndim - 2])


def expand_as(x: Tensor, other: Tensor) -> Tensor:
    """``x`` broadcast to ``other``'s shape (read at run time: symbolic dims too). Signature: ai.onnx@13::Expand"""
    x, other = lift(x), lift(other)
    broadcast_shape("Expand", x, other)
    return emit("Expand", [x, emit("Shape", [other])], out_types=[(x.dtype, other.shape)])


def diff(x: Tensor, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Tensor:
    """``torch.diff``: ``x[1:] - x[:-1]`` along ``dim``, ``n`` times, after ``prepend`` and ``append`` (each
    of ``x``'s rank, as torch's) are concatenated to ``x`` along ``dim``.
    Signature: ai.onnx@13::Slice"""
    x = lift(x)
    dim = dim_index(x, dim, "Slice")
    parts = [_diff_edge(x, prepend, "prepend"), x, _diff_edge(x, append, "append")]
    if len(parts := [t for t in parts if t is not None]) > 1:
        x = concat(parts, axis=dim)
    for _ in range(n):
        tail, head = (emit("Slice", [x, const_i64([a]), const_i64([b]), const_i64([dim])])
                      for a, b in ((1, _INT_MAX), (0, -1)))
        x = tail - head
    return x


def _diff_edge(x: Tensor, edge: Any, name: str) -> Tensor | None:
    """``diff``'s ``prepend``/``append``, which must have ``x``'s rank, as torch's."""
    if edge is None:
        return None
    edge = lift(edge, x)
    if edge.shape is None or len(edge.shape) != x.ndim:
        raise op_error("diff", [x, edge], f"{name} must have input's rank {x.ndim}, got "
                       f"{'unknown rank' if edge.shape is None else f'shape {list(edge.shape)}'}", user_source())
    return edge


@one_element()
def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Sorted:
    """``(values, indices)`` along ``dim`` (its whole length, read at run time when symbolic);
    equal values keep their order (``stable`` is always true), a NaN is the largest (``sort_order``).
    Signature: ai.onnx@11::TopK"""
    x = lift(x)
    dim = dim_index(x, dim, "TopK")
    indices = sort_order(x, dim, descending)
    return Sorted(gather(x, dim, indices), indices)


@one_element()
def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The int64 indices that sort ``x`` along ``dim`` (``sort``'s)."""
    return sort(x, dim, descending).indices


def outer(a: Tensor, b: Tensor) -> Tensor:
    """``a[:, None] * b[None, :]`` of two 1-D Tensors. Signature: ai.onnx@14::Mul"""
    a, b = lift(a), lift(b)
    if a.ndim != 1 or b.ndim != 1:
        raise op_error("Mul", [a, b], "outer takes two 1-D Tensors", user_source())
    return unsqueeze(a, [1]) * unsqueeze(b, [0])


@autocast_op()
def addmm(input: Any, mat1: Tensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    """``beta * input + alpha * (mat1 @ mat2)`` (2-D ``mat1``, ``mat2``), as torch's."""
    return scaled_sum(input, ranked_matmul("addmm", mat1, mat2, (2, 2)), beta, alpha)


@autocast_op()
def baddbmm(input: Any, batch1: Tensor, batch2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    """``beta * input + alpha * (batch1 @ batch2)`` (3-D batches of matrices), as torch's."""
    return scaled_sum(input, ranked_matmul("baddbmm", batch1, batch2, (3, 3)), beta, alpha)


def ranked_matmul(fn: str, a: Any, b: Any, ranks: tuple[int, int]) -> Tensor:
    """``a @ b`` for torch's ``fn``, which takes operands of exactly ``ranks`` (``mm``: 2 and 2,
    ``mv``: 2 and 1) and, for two batches of matrices, equal batch sizes (torch's ``bmm`` does not
    broadcast them)."""
    a, b = lift(a), lift(b)
    if (a.ndim, b.ndim) != tuple(ranks):
        want = f"two {ranks[0]}-D Tensors" if ranks[0] == ranks[1] else f"a {ranks[0]}-D and a {ranks[1]}-D Tensor"
        raise op_error("MatMul", [a, b], f"{fn} takes {want}, got ranks {a.ndim} and {b.ndim}",
                       user_source())
    if ranks == (3, 3):
        same_dim("MatMul", [a, b], a.shape[0], b.shape[0], f"{fn} batch sizes")
    return matmul(a, b)


def scaled_sum(input: Any, product: Tensor, beta: float, alpha: float) -> Tensor:  # noqa: A002
    """``beta * input + alpha * product``, torch's ``addmm`` family."""
    if alpha != 1:
        product = product * scalar(alpha, product)
    if beta == 0:  # torch ignores input then (nan and inf in it do not propagate)
        return product
    input = lift(input, product)
    return product + (input if beta == 1 else input * scalar(beta, input))


def index_add(x: Tensor, dim: int, index: Tensor, source: Tensor, alpha: float = 1) -> Tensor:
    """``x`` with ``alpha * source``'s slices added at the entries of the 1-D ``index`` along
    ``dim`` (repeated indices add up). Signature: ai.onnx@18::ScatterElements (reduction="add")"""
    x, source = lift(x), lift(source)
    if alpha != 1:
        source = source * scalar(alpha, source)
    return _index_scatter("index_add", x, dim, index, source, {"reduction": "add"})


@autocast_op()
def index_copy(x: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """``x`` with ``source``'s slices written at the entries of the 1-D ``index`` along ``dim``.
    Signature: ai.onnx@18::ScatterElements"""
    return _index_scatter("index_copy", lift(x), dim, index, lift(source), {})


def _index_scatter(fn: str, x: Tensor, dim: int, index: Tensor, source: Tensor, attrs: dict) -> Tensor:
    """ScatterElements of ``source`` into ``x`` at the 1-D ``index`` along ``dim``, the index
    broadcast over ``source``'s other dims."""
    dim = dim_index(x, dim, "ScatterElements")
    index = lift(index)
    if index.dtype not in ("int64", "int32") or index.ndim != 1:
        raise op_error("ScatterElements", [x, index, source], f"{fn} takes a 1-D int64 or int32 index, got "
                       f"{index.type_str()}", user_source())
    same_dtype("ScatterElements", x, source)
    if source.ndim != x.ndim:
        raise op_error("ScatterElements", [x, index, source], f"{fn}: source has rank {source.ndim}, "
                       f"the tensor {x.ndim}", user_source())
    shape = [1] * x.ndim
    shape[dim] = -1
    spread = emit("Expand", [reshape(index, shape), emit("Shape", [source])], out_types=[(index.dtype, source.shape)])
    return emit("ScatterElements", [x, spread, source], {"axis": dim, **attrs})


def repeat_interleave(x: Tensor, repeats: int, dim: int | None = None) -> Tensor:
    """Each entry of ``dim`` repeated ``repeats`` times in place (``dim=None``: of the flattened
    Tensor), as torch's with an int ``repeats``. Signature: ai.onnx@13::Expand"""
    x = lift(x)
    if not isinstance(repeats, (int, np.integer)) or repeats < 0:
        raise CaptureError(f"repeat_interleave takes an int repeats >= 0, got {repeats!r} (at {user_source()})")
    if dim is None:
        x, dim = reshape(x, [-1]), 0
    dim = dim_index(x, dim, "Expand")
    ones = [1] * (x.ndim + 1)
    ones[dim + 1] = int(repeats)
    spread = emit("Expand", [unsqueeze(x, [dim + 1]), const_i64(ones)])
    size = x.shape[dim]
    merged = size * int(repeats) if isinstance(size, int) else -1
    return reshape(spread, [*x.shape[:dim], merged, *x.shape[dim + 1:]])


__all__ = [
    "addmm", "argsort", "baddbmm", "diff", "expand_as", "index_add", "index_copy", "movedim", "narrow", "outer",
    "repeat_interleave", "select", "sort", "t", "unflatten",
]
