"""``F.interpolate(..., antialias=True)``: torch's antialiased bilinear and bicubic resize of a 4-D input, as
two MatMuls by constant weight matrices (one per spatial dim, torch's separable filter weights computed here
in float64), so both backends run it in the input's dtype and the MatMul gradient rule differentiates it.
onnxruntime's own ``Resize(antialias=1)`` has no float64 kernel (1.31) and the numpy backend none at all."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import const_i64, constant, emit, matmul
from graphc.dsl.tensor import Tensor

# mode -> (the filter's support at scale 1, the filter)
_FILTERS = {
    "bilinear": (1.0, lambda t: np.maximum(1.0 - np.abs(t), 0.0)),
    "bicubic": (2.0, lambda t: _cubic(np.abs(t), -0.5)),
}


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with ``a`` (torch's antialias uses -0.5) at ``t >= 0``."""
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = (((t - 5) * t + 8) * t - 4) * a
    return np.where(t < 1, near, np.where(t < 2, far, 0.0))


def antialias_weights(mode: str, n_in: int, n_out: int, scale: float | None, align_corners: bool) -> np.ndarray:
    """The ``[n_out, n_in]`` float64 matrix of torch's antialiased resize along one dim: output ``i`` averages
    the inputs within the filter's support (widened by the scale when downsampling) around
    ``scale * (i + 0.5)``, the weights normalized to sum 1. ``scale``: torch's (``1 / scale_factor`` when
    given, else ``n_in / n_out``; ``align_corners``: ``(n_in - 1) / (n_out - 1)``)."""
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    elif scale is None or scale <= 0:
        scale = n_in / n_out
    half, kernel = _FILTERS[mode]
    support = half * scale if scale >= 1.0 else half
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    weights = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(math.trunc(center - support + 0.5), 0)
        hi = min(math.trunc(center + support + 0.5), n_in)
        w = kernel((np.arange(lo, hi) - center + 0.5) * inv)
        weights[i, lo:hi] = w / w.sum() if w.sum() != 0 else w
    return weights


def floor_sizes(x: Tensor, factors: Any) -> list[int] | None:
    """torch's output sizes for scale ``factors``: ``floor(n * factor)``, in double, for each spatial dim ``n`` of
    ``x``; None where one is symbolic."""
    dims = x.shape[2:]
    if not all(isinstance(n, int) for n in dims):
        return None
    return [math.floor(n * f) for n, f in zip(dims, factors)]


def antialiased(x: Tensor, mode: str, sizes: list[int] | None, factors: list[float] | None,
                align_corners: bool | None) -> Tensor:
    """``x`` ``(N, C, H, W)`` resized to ``sizes``, or by the scale ``factors`` (torch's ``floor(n * factor)``
    sizes, its scales ``1 / factor``), by torch's antialiased ``mode``."""
    if mode not in _FILTERS or x.ndim != 4 or x.dtype not in ("float16", "float32", "float64"):
        raise op_error("Resize", [x], f"antialias=True takes mode 'bilinear' or 'bicubic' and a 4-D float16/32/64 "
                       f"input, as torch's, got mode={mode!r}, rank {x.ndim}, {x.dtype}", user_source())
    dims = x.shape[2:]
    if not all(isinstance(n, int) for n in dims):
        raise op_error("Resize", [x], "antialias=True needs static spatial dims (its weights are constants)",
                       user_source())
    scales: list[Any] = [None, None] if factors is None else [1.0 / f for f in factors]
    if sizes is None:
        sizes = floor_sizes(x, factors or ())
    return separable(x, [antialias_weights(mode, n, m, s, bool(align_corners))
                         for n, m, s in zip(dims, sizes, scales)])


def separable(x: Tensor, matrices: list[np.ndarray]) -> Tensor:
    """``x`` ``(N, C, *spatial)`` with the ``[m, n]`` float64 matrix ``matrices[d]`` applied along spatial dim
    ``d``, each a MatMul by a constant in ``x``'s dtype (a dim before the last two flattened with those after)."""
    for d, w in enumerate(matrices):
        axis = d - len(matrices)
        if axis == -1:
            x = matmul(x, constant(np.ascontiguousarray(w.T).astype(x.dtype)))  # [..., W] @ [W, Wo]
            continue
        tail = x.shape[axis + 1:]
        flat = x if axis == -2 else emit("Reshape", [x, const_i64([0] * (x.ndim + axis) + [-1, math.prod(tail)])])
        x = matmul(constant(w.astype(x.dtype)), flat)  # [Ho, H] @ [..., H, rest]
        if axis != -2:
            x = emit("Reshape", [x, const_i64([0] * (x.ndim - 2) + [w.shape[0], *tail])])
    return x


__all__ = ["antialias_weights", "antialiased", "separable"]
