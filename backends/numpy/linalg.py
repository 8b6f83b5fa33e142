"""Linear algebra kernels: MatMul, Gemm, Einsum, Det."""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel, require_unidirectional


@kernel("MatMul", since=1)
def matmul(a, b):
    y = np.matmul(a, b)
    return (y if y.dtype == a.dtype else y.astype(a.dtype),)  # ml_dtypes' bfloat16 gives float32


@kernel("Gemm", since=1)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=1):  # noqa: N803
    y = (a.T if transA else a) @ (b.T if transB else b)
    if alpha != 1.0:
        y *= alpha
    if c is not None:
        require_unidirectional(c, y.shape, "C")
        y += c if beta == 1.0 else beta * c
    return (y.astype(a.dtype, copy=False),)


@kernel("Einsum", since=12)
def einsum(*xs, equation):
    if xs[0].dtype.kind not in "biufc":  # bfloat16 and friends: compute in float32
        out = np.einsum(equation.replace(" ", ""), *(x.astype(np.float32) for x in xs))
        return (out.astype(xs[0].dtype),)
    return (np.einsum(equation.replace(" ", ""), *xs, optimize=len(xs) > 2),)


@kernel("Det", since=11)
def det(x):
    return (np.linalg.det(x).astype(x.dtype, copy=False),)
