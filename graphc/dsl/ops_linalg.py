"""Matrix products, diagonals, determinants and cumulative products under torch's names
(``gc.mm``, ``gc.bmm``, ``gc.mv``, ``gc.dot``, ``gc.inner``, ``gc.kron``, ``gc.cross``,
``gc.diagonal``, ``gc.diag_embed``, ``gc.trace``, ``gc.addmv``, ``gc.det``, ``gc.slogdet``,
``gc.cumprod``, ``gc.logcumsumexp``, ...), written in standard ONNX ops that have kernels and
gradient rules. Operands of two dtypes are a capture error (graphc's contract, where torch
promotes some pairs)."""

from __future__ import annotations

import string
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import (binary, broadcast_shape, cast, constant, emit, int64_accumulated, lift, log, reduction,
                            reshape, same_dim, same_dtype, scalar, unsqueeze, where)
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_array import dim_index, dim_positions, einsum, logsumexp, pad, static_dim
from graphc.dsl.ops_views import movedim, outer, ranked_matmul, scaled_sum
from graphc.dsl.tensor import Tensor, note_views
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES


class SignLogAbsDet(NamedTuple):
    """``gc.slogdet``'s result, as torch's: the determinant's ``sign`` and ``log(|det|)``."""

    sign: Tensor
    logabsdet: Tensor


# -- products ---------------------------------------------------------------------------------


@autocast_op()
def mm(input: Any, mat2: Any) -> Tensor:  # noqa: A002 - torch's names
    """The product of two matrices (2-D only, as torch's). Signature: ai.onnx@13::MatMul"""
    return ranked_matmul("mm", input, mat2, (2, 2))


@autocast_op()
def bmm(input: Any, mat2: Any) -> Tensor:  # noqa: A002
    """Batched matrix product of two 3-D Tensors with equal batch sizes (no broadcasting, as torch's).
    Signature: ai.onnx@13::MatMul"""
    return ranked_matmul("bmm", input, mat2, (3, 3))


@autocast_op()
def mv(input: Any, vec: Any) -> Tensor:  # noqa: A002
    """A matrix times a 1-D vector. Signature: ai.onnx@13::MatMul"""
    return ranked_matmul("mv", input, vec, (2, 1))


@autocast_op()
def dot(input: Any, tensor: Any) -> Tensor:  # noqa: A002
    """The 0-D inner product of two 1-D Tensors of one length. Signature: ai.onnx@13::MatMul"""
    return ranked_matmul("dot", input, tensor, (1, 1))


@autocast_op()
def vdot(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``dot``: graphc has no complex dtypes, so there is nothing to conjugate."""
    return ranked_matmul("vdot", input, other, (1, 1))


@autocast_op()
def chain_matmul(*matrices: Any) -> Tensor:
    """The product of 2-D matrices from left to right (torch picks another order, with the same
    result up to rounding)."""
    if not matrices:
        raise CaptureError(f"chain_matmul takes at least one matrix (at {user_source()})")
    out = lift(matrices[0])
    if out.ndim != 2:
        raise op_error("MatMul", [out], f"chain_matmul takes 2-D Tensors, got rank {out.ndim}", user_source())
    for m in matrices[1:]:
        out = mm(out, m)
    return out


def inner(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Sum over the last dims of both (a 0-D operand multiplies): the dims of ``input`` but its last,
    then those of ``other`` but its last. Signature: ai.onnx@12::Einsum"""
    a, b = lift(input), lift(other)
    if a.ndim == 0 or b.ndim == 0:
        return binary("Mul", a, b)
    same_dim("Einsum", [a, b], a.shape[-1], b.shape[-1], "inner: the last dims")
    letters = iter(string.ascii_lowercase)
    sa, sb = ("".join(next(letters) for _ in range(t.ndim - 1)) for t in (a, b))
    return einsum(f"{sa}z,{sb}z->{sa}{sb}", a, b)


def kron(input: Any, other: Any) -> Tensor:  # noqa: A002
    """The Kronecker product: the ranks are padded with leading 1s to the larger, and each dim is
    ``input``'s times ``other``'s (static dims only)."""
    a, b = lift(input), lift(other)
    rank = max(a.ndim, b.ndim)
    sa, sb = ([1] * (rank - t.ndim) + [static_dim(t, d, "Mul") for d in range(t.ndim)] for t in (a, b))
    spread = binary("Mul", reshape(a, [d for n in sa for d in (n, 1)]), reshape(b, [d for n in sb for d in (1, n)]))
    return reshape(spread, [m * n for m, n in zip(sa, sb)])


def cross(input: Any, other: Any, dim: int | None = None) -> Tensor:  # noqa: A002
    """The cross product of 3-vectors along ``dim`` of two operands of one rank, broadcast;
    ``dim=None``, torch's deprecated default, is ``input``'s first dim of size 3. Signature: ai.onnx@13::Gather"""
    a, b = lift(input), lift(other)
    same_dtype("Mul", a, b)
    if a.ndim != b.ndim:
        raise op_error("Gather", [a, b], f"cross takes two Tensors of one rank, got ranks {a.ndim} and {b.ndim}",
                       user_source())
    broadcast_shape("Mul", a, b)
    if dim is None:
        dim = next((d for d, n in enumerate(a.shape) if n == 3), None)
        if dim is None:
            raise op_error("Gather", [a, b], "cross: no dim of size 3 in input", user_source())
    dim = dim_index(a, dim, "Gather")
    if a.shape[dim] != 3 or b.shape[dim] != 3:
        raise op_error("Gather", [a, b], f"cross: dim {dim} must have size 3 in both operands, got "
                       f"{a.shape[dim]} and {b.shape[dim]}", user_source())

    def turned(t: Tensor, order: list[int]) -> Tensor:
        return emit("Gather", [t, constant(np.asarray(order, np.int64))], {"axis": dim})

    return turned(a, [1, 2, 0]) * turned(b, [2, 0, 1]) - turned(a, [2, 0, 1]) * turned(b, [1, 2, 0])


@autocast_op()
def addmv(input: Any, mat: Any, vec: Any, *, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    """``beta * input + alpha * (mat @ vec)``, as torch's."""
    return scaled_sum(input, mv(mat, vec), beta, alpha)


@autocast_op()
def addr(input: Any, vec1: Any, vec2: Any, *, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    """``beta * input + alpha * outer(vec1, vec2)``, as torch's."""
    return scaled_sum(input, outer(vec1, vec2), beta, alpha)


@autocast_op()
def addbmm(input: Any, batch1: Any, batch2: Any, *, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    """``beta * input + alpha * sum(batch1 @ batch2 over the batch)``, as torch's."""
    return scaled_sum(input, reduce_sum(bmm(batch1, batch2), 0), beta, alpha)


# -- diagonals --------------------------------------------------------------------------------


def diagonal(input: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:  # noqa: A002
    """The diagonal of the matrices in ``dim1`` and ``dim2`` (above the main one for ``offset > 0``),
    those dims removed and the diagonal appended last; their sizes must be static. A view of ``input``, as
    torch's: a write into it (``x.diagonal().fill_(0)``) writes ``input``'s diagonal.
    Signature: ai.onnx@13::Gather"""
    x = lift(input)
    out = _diagonal(x, offset, dim1, dim2)
    note_views("Diagonal", [x], {"pick": lambda positions: _diagonal(positions, offset, dim1, dim2)}, [out])
    return out


def _diagonal(x: Tensor, offset: int, dim1: int, dim2: int) -> Tensor:
    d1, d2 = dim_index(x, dim1, "Gather"), dim_index(x, dim2, "Gather")
    if d1 == d2:
        raise op_error("Gather", [x], f"diagonal: dim1 and dim2 are the same dim ({dim1}, {dim2})", user_source())
    rows, cols = static_dim(x, d1, "Gather"), static_dim(x, d2, "Gather")
    x = movedim(x, (d1, d2), (-2, -1))
    flat = reshape(x, [*x.shape[:-2], rows * cols])
    at = [r * cols + c for r, c in diagonal_cells(rows, cols, offset)]
    return emit("Gather", [flat, constant(np.asarray(at, np.int64))], {"axis": flat.ndim - 1})


def diagonal_cells(rows: int, cols: int, offset: int) -> list[tuple[int, int]]:
    """The (row, column) pairs of diagonal ``offset`` of a ``rows`` x ``cols`` matrix, as torch's ``diagonal``."""
    first_row, first_col = max(-offset, 0), max(offset, 0)
    return [(first_row + k, first_col + k) for k in range(max(min(rows - first_row, cols - first_col), 0))]


def diag_embed(input: Any, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:  # noqa: A002
    """Matrices (in the output's ``dim1`` and ``dim2``) whose diagonal ``offset`` holds the last dim
    of ``input`` (static), zeros elsewhere. Signature: ai.onnx@13::Gather"""
    x = lift(input)
    if x.ndim == 0:
        raise op_error("Gather", [x], "diag_embed takes a Tensor of rank >= 1, got a 0-D one", user_source())
    n = static_dim(x, x.ndim - 1, "Gather")
    rank = x.ndim + 1
    d1, d2 = (_output_dim(x, d, rank) for d in (dim1, dim2))
    if d1 == d2:
        raise op_error("Gather", [x], f"diag_embed: dim1 and dim2 are the same dim ({dim1}, {dim2})", user_source())
    size = n + abs(offset)
    at = np.full((size, size), n, np.int64)  # index n reads the zero appended below
    for k, cell in enumerate(diagonal_cells(size, size, offset)):  # the n cells of diagonal offset
        at[cell] = k
    out = emit("Gather", [pad(x, (0, 1)), constant(at)], {"axis": x.ndim - 1})
    return movedim(out, (rank - 2, rank - 1), (d1, d2))


def _output_dim(x: Tensor, dim: int, rank: int) -> int:
    if not -rank <= dim < rank:
        raise op_error("Gather", [x], f"dim {dim} out of range for the output's rank {rank}", user_source())
    return dim % rank


def diag(input: Any, diagonal: int = 0) -> Tensor:  # noqa: A002
    """Of a 1-D Tensor, the square matrix with it on diagonal ``diagonal``; of a 2-D one, that
    diagonal, as torch's."""
    x = lift(input)
    if x.ndim == 1:
        return diag_embed(x, diagonal)
    if x.ndim == 2:
        return _diagonal(x, diagonal, 0, 1)
    raise op_error("Gather", [x], f"diag takes a 1-D or 2-D Tensor, got rank {x.ndim}", user_source())


def diagflat(input: Any, offset: int = 0) -> Tensor:  # noqa: A002
    """The square matrix with the flattened ``input`` on diagonal ``offset``."""
    return diag_embed(reshape(lift(input), [-1]), offset)


@autocast_op()
def trace(input: Any) -> Tensor:  # noqa: A002
    """The sum of a matrix's main diagonal (2-D only; integers sum in int64, as torch's)."""
    x = lift(input)
    if x.ndim != 2:
        raise op_error("Gather", [x], f"trace takes a 2-D Tensor, got rank {x.ndim}", user_source())
    return reduce_sum(diagonal(x))


# -- determinants -----------------------------------------------------------------------------


def det(input: Any) -> Tensor:  # noqa: A002
    """The determinant of each square matrix in the last two dims (floating point only, as torch's).
    Signature: ai.onnx@11::Det"""
    x = lift(input)
    if x.dtype not in FLOAT_DTYPES:
        raise op_error("Det", [x], f"det takes a floating-point Tensor, got {x.dtype}", user_source())
    if x.ndim < 2:
        raise op_error("Det", [x], f"det takes square matrices in the last two dims, got rank {x.ndim}",
                       user_source())
    same_dim("Det", [x], x.shape[-2], x.shape[-1], "det: the matrices are not square: their two dims")
    return emit("Det", [x])


def logdet(input: Any) -> Tensor:  # noqa: A002
    """``log(det(input))``: nan where the determinant is negative and -inf where it is 0, as torch's."""
    return log(det(input))


def slogdet(input: Any) -> SignLogAbsDet:  # noqa: A002
    """``(sign, logabsdet)`` of the determinant: ``sign(det)`` and ``log(|det|)`` (0 and -inf for a
    singular matrix); ``logabsdet``'s gradient is the inverse transposed, as torch's."""
    d = det(input)
    return SignLogAbsDet(emit("Sign", [d]), log(abs_(d)))


# -- cumulative products ----------------------------------------------------------------------


def _running_window(x: Tensor, dim: int, fill: float) -> tuple[Tensor, int]:
    """``x`` spread into ``[..., j, k, ...]`` at ``dim`` (``k`` a new axis after it) holding ``x[k]``
    for ``k <= j`` and ``fill`` after: a reduction over ``k`` is the running one over ``dim``, with the
    reduction's own gradient (exact at zeros for a product). Returns it and the axis ``k``."""
    size = x.shape[dim]
    if isinstance(size, int):
        mask = constant(np.tril(np.ones((size, size), bool)))
    else:
        at = dim_positions(x, dim)
        mask = emit("GreaterOrEqual", [unsqueeze(at, [1]), unsqueeze(at, [0])])
    mask = unsqueeze(mask, list(range(2, x.ndim - dim + 1))) if dim < x.ndim - 1 else mask
    return where(mask, unsqueeze(x, [dim]), scalar(fill, x)), dim + 1


@autocast_op()
def cumprod(input: Any, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """Running product along ``dim`` (bool and integers in int64, as torch's; ``dtype`` casts first),
    exact with zeros and with torch's gradient there. ``O(n^2)`` in the dim's length ``n``: a
    ReduceProd over a masked ``[n, n]`` spread (ONNX has CumProd from opset 26 only)."""
    x = lift(input)
    x = int64_accumulated(x if dtype is None else cast(x, dtype))
    dim = dim_index(x, dim, "ReduceProd")
    if x.ndim == 0:
        return x
    spread, axis = _running_window(x, dim, 1)
    return reduction("ReduceProd", spread, axis, False)


def logcumsumexp(input: Any, dim: int) -> Tensor:  # noqa: A002
    """``log(cumsum(exp(x)))`` along ``dim`` with no overflow or underflow: each prefix's log-sum-exp
    from its own maximum (-inf entries allowed; floating point only, as torch's). ``O(n^2)`` in the
    dim's length."""
    x = lift(input)
    if x.dtype not in FLOAT_DTYPES:
        raise op_error("ReduceLogSumExp", [x], f"logcumsumexp takes a floating-point Tensor, got {x.dtype}",
                       user_source())
    dim = dim_index(x, dim, "ReduceLogSumExp")
    if x.ndim == 0:
        return x
    spread, axis = _running_window(x, dim, -np.inf)
    return logsumexp(spread, axis)


__all__ = [
    "SignLogAbsDet", "addbmm", "addmv", "addr", "bmm", "chain_matmul", "cross", "cumprod", "det", "diag", "diag_embed",
    "diagflat", "diagonal", "dot", "inner", "kron", "logcumsumexp", "logdet", "mm", "mv", "slogdet", "trace", "vdot",
]
