"""``F.interpolate`` over static spatial dims, as torch computes it for float64: (bi/tri)linear and bicubic
as MatMuls by constant weight matrices built here in float64 (ONNX Resize takes float32 scales, 4e-7 off
torch's double source coordinates); nearest and nearest-exact as Gathers (``resize_nearest``, every dtype)."""

from __future__ import annotations

import math

import numpy as np

from graphc.dsl.resize_antialias import separable
from graphc.dsl.resize_nearest import nearest_exact
from graphc.dsl.tensor import Tensor

# the cubic convolution coefficient torch's bicubic uses (non-antialiased)
_CUBIC_A = -0.75


def _cubic_taps(t: float) -> list[float]:
    """The 4 weights of inputs ``floor - 1 .. floor + 2`` at fraction ``t``, Keys' kernel with ``a = -0.75``."""
    a = _CUBIC_A
    near = [((a + 2) * u - (a + 3)) * u * u + 1 for u in (t, 1 - t)]
    far = [((a * u - 5 * a) * u + 8 * a) * u - 4 * a for u in (t + 1, 2 - t)]
    return [far[0], near[0], near[1], far[1]]


def interp_weights(mode: str, n_in: int, n_out: int, factor: float | None, align_corners: bool) -> np.ndarray:
    """The ``[n_out, n_in]`` matrix of torch's (non-antialiased) linear or cubic resize along one dim, in
    double: source ``scale * i`` (align_corners, ``scale = (n_in - 1) / (n_out - 1)``) or
    ``scale * (i + 0.5) - 0.5`` (``scale = 1 / factor`` when given, else ``n_in / n_out``; linear clamps it at
    0), its integer part floored in float32 as torch's ``floorf``; cubic's taps clamped to the edges."""
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        scale = 1.0 / factor if factor is not None and factor > 0 else n_in / n_out
    weights = np.zeros((n_out, n_in))
    if mode == "linear" and n_in == n_out:  # torch copies at equal sizes
        return np.eye(n_in)
    for i in range(n_out):
        src = scale * i if align_corners else scale * (i + 0.5) - 0.5
        if mode == "linear":
            src = max(src, 0.0)
        lo = min(math.floor(np.float32(src)), n_in - 1)
        t = min(max(src - lo, 0.0), 1.0)
        taps = [1 - t, t] if mode == "linear" else _cubic_taps(t)
        first = lo if mode == "linear" else lo - 1
        for k, w in enumerate(taps):
            weights[i, min(max(first + k, 0), n_in - 1)] += w
    return weights


def exact_resize(x: Tensor, mode: str, sizes: list[int], factors: list[float] | None,
                 align_corners: bool | None) -> Tensor:
    """``x`` (static spatial dims) resized to ``sizes`` by torch's ``mode`` (``factors``: the scale factors
    given, or None): nearest(-exact) by torch's float32 source indices, the others by its doubles."""
    if mode in ("nearest", "nearest-exact"):
        return nearest_exact(x, sizes, factors, mode)
    kind = "cubic" if mode == "bicubic" else "linear"
    return separable(x, [interp_weights(kind, n, m, None if factors is None else factors[d], bool(align_corners))
                         for d, (n, m) in enumerate(zip(x.shape[2:], sizes))])


__all__ = ["exact_resize", "interp_weights"]
