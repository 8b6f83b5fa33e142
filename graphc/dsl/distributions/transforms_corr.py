"""torch's ``CorrCholeskyTransform``: reals ``(..., n (n - 1) / 2)`` onto ``(..., n, n)`` Cholesky factors of
correlation matrices (lower triangular, positive diagonal, rows of unit length) by ``tanh`` and stick breaking
on the squares, with torch's formulas; and the helpers between a strict lower triangle and its vector (row by
row, as torch's ``vec_to_tril_matrix``/``tril_matrix_to_vec``)."""

from __future__ import annotations

import math

import numpy as np

from graphc.dsl.distributions import constraints
from graphc.dsl.distributions.base import fail, finfo
from graphc.dsl.distributions.transforms_vector import Structured
from graphc.dsl.ops import clip, constant, emit, flatten, log, sqrt, tanh
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import cumsum, pad
from graphc.dsl.ops_elementwise import log1p
from graphc.dsl.ops_layers import softplus
from graphc.dsl.ops_linalg import cumprod
from graphc.dsl.ops_views import narrow
from graphc.dsl.tensor import Tensor


def tril_size(fn: str, count: int) -> int:
    """``n`` with ``n (n - 1) / 2 == count`` (torch's ``forward_shape``), else a CaptureError naming ``fn``."""
    n = round((0.25 + 2 * count) ** 0.5 + 0.5)
    if n * (n - 1) // 2 != count:
        raise fail(fn, [], f"the last dim {count} is not a flattened strict lower triangle (n (n - 1) / 2)")
    return n


def vec_to_tril(x: Tensor, n: int) -> Tensor:
    """``(..., n (n - 1) / 2)`` into the strict lower triangle of ``(..., n, n)`` zeros."""
    rows, cols = np.tril_indices(n, -1)
    index = np.full((n, n), len(rows), np.int64)  # the pad's zero
    index[rows, cols] = np.arange(len(rows))
    return emit("Gather", [pad(x, [0, 1]), constant(index)], {"axis": x.ndim - 1})


def tril_to_vec(m: Tensor, n: int, offset: int = -1) -> Tensor:
    """The entries of ``(..., n, n)`` below diagonal ``offset`` (< 0), row by row."""
    rows, cols = np.tril_indices(n, offset)
    return emit("Gather", [flatten(m, -2, -1), constant((rows * n + cols).astype(np.int64))], {"axis": m.ndim - 2})


class CorrCholeskyTransform(Structured):
    """``x`` (reals, ``(..., n (n - 1) / 2)``) onto ``L`` with ``L @ L^T`` a correlation matrix: ``r = tanh(x)``
    (clamped to ``1 - eps`` in magnitude) filled into the strict lower triangle row by row, each row scaled by
    the running ``sqrt(1 - r^2)`` products, ones on the diagonal."""

    bijective = True
    domain, codomain = constraints.real_vector, constraints.corr_cholesky

    def _call(self, x: Tensor) -> Tensor:
        n = tril_size(type(self).__name__, self._last(x, "x"))
        eps = float(finfo(x).eps)
        r = vec_to_tril(clip(tanh(x), -1 + eps, 1 - eps), n)
        stick = cumprod(sqrt(1.0 - r * r), -1)
        eye = constant(np.eye(n, dtype=finfo(x).dtype))
        return (r + eye) * pad(narrow(stick, -1, 0, n - 1), [1, 0], value=1.0)

    def _inverse(self, y: Tensor) -> Tensor:
        self._last(y, "y", 2)
        n = self._square(y, "y")
        rest = 1.0 - cumsum(y * y, -1)
        shifted = pad(narrow(rest, -1, 0, n - 1), [1, 0], value=1.0)
        t = tril_to_vec(y, n) / sqrt(tril_to_vec(shifted, n))
        return (log1p(t) - log1p(-t)) / 2.0

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        """torch's: of ``x`` and ``y``'s flattened strict lower triangle."""
        n = self._square(y, "y")
        rest = 1.0 - cumsum(y * y, -1)
        stick = 0.5 * sum_(log(tril_to_vec(rest, n, -2)), axis=-1)
        return stick - 2.0 * sum_(x + softplus(-2.0 * x) - math.log(2.0), axis=-1)

    def _square(self, y: Tensor, name: str) -> int:
        n = self._last(y, name, 2)
        if y.shape[-2] != n:
            raise fail(type(self).__name__, [y], f"{name} must be square matrices, got {y.type_str()}")
        return n

    def forward_shape(self, shape: tuple) -> tuple:
        if len(shape) < 1:
            raise fail(type(self).__name__, [], f"shape {tuple(shape)} has too few dims")
        n = tril_size(type(self).__name__, shape[-1])
        return tuple(shape[:-1]) + (n, n)

    def inverse_shape(self, shape: tuple) -> tuple:
        if len(shape) < 2 or shape[-2] != shape[-1]:
            raise fail(type(self).__name__, [], f"shape {tuple(shape)} is not of square matrices")
        return tuple(shape[:-2]) + (shape[-1] * (shape[-1] - 1) // 2,)


__all__ = ["CorrCholeskyTransform", "tril_size", "tril_to_vec", "vec_to_tril"]
