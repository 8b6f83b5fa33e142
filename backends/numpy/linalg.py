"""Linear algebra kernels: MatMul, Gemm, Einsum, Det."""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel, require_shape, require_unidirectional


def check_matmul(a, b, names=("A", "B")) -> None:
    """Refuse operands numpy's matmul would: a scalar, inner dims that differ, batch dims that
    do not broadcast."""
    if not a.ndim or not b.ndim:
        raise ValueError(f"{names[0]} has shape {list(a.shape)} and {names[1]} {list(b.shape)}: a matrix product "
                         "needs at least one dim on each")
    k_b = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if a.shape[-1] != k_b:
        raise ValueError(f"{names[0]} has shape {list(a.shape)} and {names[1]} {list(b.shape)}: the inner dims "
                         f"differ ({names[0]}'s last is {a.shape[-1]}, {names[1]}'s "
                         f"{'second to last' if b.ndim > 1 else 'only one'} is {k_b})")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"{names[0]} has shape {list(a.shape)} and {names[1]} {list(b.shape)}: the batch dims "
                         f"{list(a.shape[:-2])} and {list(b.shape[:-2])} do not broadcast") from None


@kernel("MatMul", since=1)
def matmul(a, b):
    check_matmul(a, b)
    y = np.matmul(a, b)
    return (y if y.dtype == a.dtype else y.astype(a.dtype),)  # ml_dtypes' bfloat16 gives float32


def _gemm(a, b, c, alpha, beta, trans_a, trans_b, full_c):
    """alpha * A' @ B' + beta * C; ``full_c``: C must have the result's shape (opset < 7,
    broadcast 0), else it broadcasts to it unidirectionally. float16 in float32, rounded once (as
    torch's addmm; ml_dtypes' bfloat16 products are float32 already)."""
    dtype = a.dtype
    if dtype == np.float16:
        a, b, c = (None if v is None else v.astype(np.float32) for v in (a, b, c))
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"A has shape {list(a.shape)} and B {list(b.shape)}, expected two matrices")
    a, b = (a.T if trans_a else a), (b.T if trans_b else b)
    check_matmul(a, b, ("A" + "'" * bool(trans_a), "B" + "'" * bool(trans_b)))
    y = a @ b
    if alpha != 1.0:
        y *= alpha
    if c is not None:
        if full_c:
            require_shape(c, y.shape, "C", "broadcast 0: C has A' @ B''s shape")
        else:
            require_unidirectional(c, y.shape, "C")
        y += c if beta == 1.0 else beta * c
    return (y.astype(dtype, copy=False),)


@kernel("Gemm", since=1)
def gemm_v1(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):  # noqa: N803
    """Before opset 7 C broadcasts only with ``broadcast`` 1."""
    return _gemm(a, b, c, alpha, beta, transA, transB, not broadcast)


@kernel("Gemm", since=7)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803
    return _gemm(a, b, c, alpha, beta, transA, transB, False)


@kernel("Einsum", since=12)
def einsum(*xs, equation):
    if xs[0].dtype.kind not in "biufc":  # bfloat16 and friends: compute in float32
        out = np.einsum(equation.replace(" ", ""), *(x.astype(np.float32) for x in xs))
        return (out.astype(xs[0].dtype),)
    return (np.einsum(equation.replace(" ", ""), *xs, optimize=len(xs) > 2),)


@kernel("Det", since=11)
def det(x):
    return (np.linalg.det(x).astype(x.dtype, copy=False),)
