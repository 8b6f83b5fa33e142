"""Padding layers with ``torch.nn``'s names and arguments: zero, constant, reflection, replication
and circular padding of the last 1, 2 or 3 dims, each ``F.pad`` in its mode."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops
from graphc.dsl.batching import batch_rank
from graphc.dsl.ops_array import pad
from graphc.dsl.ops_nn import ints
from graphc.dsl.tensor import Tensor
from graphc.nn.module import Module

_LAYOUTS = {1: "C, W", 2: "C, H, W", 3: "C, D, H, W"}  # after the batch dim


class _PadNd(Module):
    """``padding``: an int for every side, or ``2 * nd`` ints (left, right, top, bottom, front,
    back), as torch; negative ones crop. Inputs of any rank from ``nd`` for constant padding;
    batched or unbatched ones (``nd + 2`` or ``nd + 1`` dims) for the other modes, as torch."""

    nd = 0
    mode = "constant"
    value: float | None = None

    def __init__(self, padding: Any):
        super().__init__()
        self.padding = tuple(ints(padding, 2 * self.nd, "padding"))

    def forward(self, x: Tensor) -> Tensor:
        x = ops.lift(x)
        if self.mode != "constant":
            batch_rank(type(self).__name__, x, _LAYOUTS[self.nd])
        return pad(x, self.padding, self.mode, self.value)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding: Any, value: float):
        super().__init__(padding)
        self.value = value

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    nd = 1


class ConstantPad2d(_ConstantPadNd):
    nd = 2


class ConstantPad3d(_ConstantPadNd):
    nd = 3


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding: Any):
        super().__init__(padding, 0.0)

    extra_repr = _PadNd.extra_repr


class ZeroPad1d(_ZeroPadNd):
    nd = 1


class ZeroPad2d(_ZeroPadNd):
    nd = 2


class ZeroPad3d(_ZeroPadNd):
    nd = 3


class ReflectionPad1d(_PadNd):
    nd, mode = 1, "reflect"


class ReflectionPad2d(_PadNd):
    nd, mode = 2, "reflect"


class ReflectionPad3d(_PadNd):
    nd, mode = 3, "reflect"


class ReplicationPad1d(_PadNd):
    nd, mode = 1, "replicate"


class ReplicationPad2d(_PadNd):
    nd, mode = 2, "replicate"


class ReplicationPad3d(_PadNd):
    nd, mode = 3, "replicate"


class CircularPad1d(_PadNd):
    nd, mode = 1, "circular"


class CircularPad2d(_PadNd):
    nd, mode = 2, "circular"


class CircularPad3d(_PadNd):
    nd, mode = 3, "circular"
