"""How many windows a Conv or pool slides, and the floor-mode pads that give a ceil-mode pool's
windows. Shared by shape inference (``passes.infer``), the DSL's pools (``dsl.ops_nn``) and the
onnxruntime backend's rewrite of ceil-mode pools (``backends.pools``), which may import neither
of the others."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ceil_as_floor_pads", "windows"]


def windows(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int, ceil_mode: int) -> int:
    """How many windows a Conv or pool slides over ``size`` padded by ``begin`` and ``end``: with
    ``ceil_mode`` it rounds up, then drops a last window that would start in the end padding, as
    the ONNX spec's kernels, onnxruntime and PyTorch count."""
    span = size + begin + end - dilation * (kernel - 1) - 1
    count = (-(-span // stride) if ceil_mode else span // stride) + 1
    return count - 1 if ceil_mode and (count - 1) * stride >= size + begin else count


def ceil_as_floor_pads(dims: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                       dilations: Sequence[int], pads: Sequence[int]) -> list[int] | None:
    """The pads (begins, then ends) with which floor mode slides a ceil_mode pool's windows over
    the static ``dims``, where an axis drops a last window that would start in the end padding
    (the kernels drop it; onnx 1.23's shape formula counts it); None where no axis does, or where
    no window fits."""
    n, ends, dropped = len(dims), [], False
    for i, (d, k, s, dl) in enumerate(zip(dims, kernel, strides, dilations)):
        span = d + pads[i] + pads[n + i] - dl * (k - 1) - 1
        if span < 0:
            return None
        count = windows(d, k, s, dl, pads[i], pads[n + i], 1)
        dropped |= count != -(-span // s) + 1  # onnx's formula
        ends.append(pads[n + i] + max(0, (count - 1) * s - span))
    return [*pads[:n], *ends] if dropped else None
