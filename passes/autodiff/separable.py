"""Gradients of separable linear ops (Resize, AveragePool): y = x contracted with one fixed
[out_a, in_a] matrix per axis, so dx = dy contracted with the same matrices.

Each matrix is read off the op itself: the compile-time evaluator (``graphc.passes.evaluate``:
graphc's numpy kernels, checked against onnx's node cases and onnxruntime) runs it once on the
in_a one-hot vectors, laid along a ``carrier`` axis that the op
leaves unchanged. Reading the op instead of re-deriving its arithmetic keeps every mode,
coordinate transform, padding and rounding rule exactly as the forward computes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder
from graphc.passes.evaluate import run_node

__all__ = ["axis_matrix", "contract"]


def axis_matrix(op_type: str, attrs: Mapping, rank: int, axis: int, carrier: int, size: int,
                extra: Sequence[np.ndarray | None], opset: int, ones: Mapping[int, int] | None = None) -> np.ndarray:
    """The float64 [out, in] matrix of ``op_type`` (with ``attrs`` and the constant inputs
    ``extra`` after x; None for an omitted one) along ``axis``, for an input of ``size`` there
    and 1 on every axis but ``carrier``, which the op must map to itself. ``ones``: other axes
    given a size (filled with ones; the output is read at index 0 there), for an op whose
    behaviour along ``axis`` depends on them (Resize's aspect-ratio policy)."""
    shape = [1] * rank
    shape[axis] = shape[carrier] = size
    for k, n in (ones or {}).items():
        shape[k] = n
    basis = np.moveaxis(np.eye(size).reshape([size, size] + [1] * (rank - 2)), [0, 1], [carrier, axis])
    basis = np.broadcast_to(basis, shape).copy()
    inputs = [basis, *(None if v is None else np.asarray(v) for v in extra)]
    while inputs[-1] is None:
        inputs.pop()
    (y,) = run_node(op_type, inputs, dict(attrs), opset)
    for k in ones or {}:
        y = np.take(y, [0], axis=k)
    return np.moveaxis(y, [carrier, axis], [0, 1]).reshape(size, y.shape[axis]).T


def contract(g: GradBuilder, dy: ir.Value, matrices: Mapping[int, np.ndarray | ir.Value], rank: int,
             dtype: ir.DataType | None = None) -> ir.Value:
    """``dy`` contracted with each [out, in] matrix along its axis (MatMul; a transpose pair for
    axes before the last two), the matrices in ``dtype`` (default: ``dy``'s); a matrix may be a
    Value computed at run time (``resize_runtime``)."""
    dtype = dtype or dy.dtype or ir.DataType.FLOAT

    def fixed(matrix, transposed: bool = False) -> ir.Value:
        if isinstance(matrix, ir.Value):
            return g.transpose(matrix, [1, 0]) if transposed else matrix
        return g.const(matrix.T if transposed else matrix, dtype, hint="axis_matrix")

    dx = dy
    for axis, matrix in matrices.items():
        if axis == rank - 1:
            dx = g.op("MatMul", dx, fixed(matrix))  # [..., out] @ [out, in]
        elif axis == rank - 2:
            dx = g.op("MatMul", fixed(matrix, transposed=True), dx)  # [in, out] @ [..., out, W]
        else:
            perm = [i for i in range(rank) if i != axis] + [axis]
            moved = g.op("MatMul", g.transpose(dx, perm), fixed(matrix))
            dx = g.transpose(moved, [perm.index(i) for i in range(rank)])
    return dx
