"""``F.interpolate(..., mode="nearest" / "nearest-exact")`` over static spatial dims: output ``i`` of a dim reads
input ``min(floor(i * scale), n - 1)`` (nearest) or ``min(floor((i + 0.5) * scale), n - 1)`` (nearest-exact), the
product rounded to float32 and ``scale`` torch's float32 ``1 / scale_factor`` when given, else ``n_in / n_out``;
computed here and gathered one dim at a time. ONNX's Resize divides by the float32 factor instead: 7 by 0.6 reads
input 4 at output 3 where torch reads 5; for half_pixel, at a tie such as 6 -> 10 by 1.7 it reads the neighbour.
torch 2.13's legacy nearest forward (both float dtypes) copies at equal and doubled sizes in 2-D only
(``7 -> 7`` by 1.05 reads ``0..6`` in 2-D, ``0..5, 5`` in 1-D/3-D); its backward copies in every rank, so in 1-D
and 3-D at such a factor torch's gradient is not that of its forward (the Gather's is)."""

from __future__ import annotations

import numpy as np

from graphc.dsl.ops import const_i64, emit
from graphc.dsl.tensor import Tensor


def exact_sources(n_in: int, n_out: int, factor: float | None, offset: float = 0.5) -> np.ndarray:
    """torch's source index of each of ``n_out`` outputs along a dim of ``n_in`` inputs (``offset`` 0.5:
    nearest-exact, 0: nearest)."""
    scale = np.float32(1.0 / factor) if factor is not None and factor > 0 else np.float32(n_in) / np.float32(n_out)
    products = ((np.arange(n_out) + offset) * np.float64(scale)).astype(np.float32)
    return np.minimum(np.floor(products).astype(np.int64), n_in - 1)


def legacy_sources(n_in: int, n_out: int, factor: float | None, rank: int) -> np.ndarray:
    """torch's source indices for legacy nearest over a ``rank``-D input (2-D copies equal and doubled sizes)."""
    if rank == 2 and n_out in (n_in, 2 * n_in):
        return np.arange(n_out) // (n_out // n_in)
    return exact_sources(n_in, n_out, factor, 0.0)


def resize_is_faster(mode: str, factors: list[float] | None) -> bool:
    """Whether ONNX's Resize (asymmetric, floor) reads torch's legacy nearest sources and runs faster than the
    Gathers: scale factors 2 and 3 (a 4x3x256x256 float32 ort-cpu step, forward and backward: the Gathers
    1.15x and 1.37x slower; at 0.5 0.88x, so it keeps them)."""
    return mode == "nearest" and factors is not None and all(f in (1.0, 2.0, 3.0) for f in factors)


def nearest_exact(x: Tensor, sizes: list[int], factors: list[float] | None, mode: str = "nearest-exact") -> Tensor:
    """``x`` resized to ``sizes`` (its spatial dims static) by torch's ``mode`` (nearest or nearest-exact)
    index rule; ``factors``: the scale factors given, or None."""
    for d, (n, o) in enumerate(zip(x.shape[2:], sizes)):
        factor = None if factors is None else factors[d]
        sources = (exact_sources(n, o, factor) if mode == "nearest-exact"
                   else legacy_sources(n, o, factor, x.ndim - 2))
        if not np.array_equal(sources, np.arange(n)):
            x = emit("Gather", [x, const_i64(sources)], {"axis": 2 + d})
    return x
