"""``F.interpolate(..., mode="nearest-exact")`` over static spatial dims: output ``i`` of a dim reads input
``min(floor((i + 0.5) * scale), n - 1)`` with torch's float32 ``scale`` (``1 / scale_factor`` when given, else
``n_in / n_out``), computed here and gathered one dim at a time. ONNX's Resize (half_pixel, rounded up)
is the same rule in other float32 steps: at a tie such as 6 -> 10 by 1.7 it reads the neighbour."""

from __future__ import annotations

import numpy as np

from graphc.dsl.ops import const_i64, emit
from graphc.dsl.tensor import Tensor


def exact_sources(n_in: int, n_out: int, factor: float | None) -> np.ndarray:
    """torch's source index of each of ``n_out`` outputs along a dim of ``n_in`` inputs."""
    scale = np.float32(1.0 / factor) if factor is not None and factor > 0 else np.float32(n_in) / np.float32(n_out)
    products = ((np.arange(n_out) + 0.5) * np.float64(scale)).astype(np.float32)
    return np.minimum(np.floor(products).astype(np.int64), n_in - 1)


def nearest_exact(x: Tensor, sizes: list[int], factors: list[float] | None) -> Tensor:
    """``x`` resized to ``sizes`` (its spatial dims static) by torch's nearest-exact rule; ``factors``: the
    scale factors given, or None."""
    for d, (n, o) in enumerate(zip(x.shape[2:], sizes)):
        sources = exact_sources(n, o, None if factors is None else factors[d])
        if not np.array_equal(sources, np.arange(n)):
            x = emit("Gather", [x, const_i64(sources)], {"axis": 2 + d})
    return x
