"""``FractionalMaxPool2d`` and ``FractionalMaxPool3d``: torch's modules over
``graphc.dsl.ops_fractional``; the regions are drawn anew in each run of the graph unless
``_random_samples`` fixes them."""

from __future__ import annotations

from typing import Any

from graphc.dsl.ops_fractional import fractional_max_pool
from graphc.errors import CaptureError
from graphc.nn.module import Module


class _FractionalMaxPoolNd(Module):
    nd = 0

    def __init__(self, kernel_size: Any, output_size: Any = None, output_ratio: Any = None,
                 return_indices: bool = False, _random_samples: Any = None):
        super().__init__()
        name = type(self).__name__
        if (output_size is None) == (output_ratio is None):
            raise CaptureError(f"{name} requires exactly one of output_size and output_ratio, got output_size="
                               f"{output_size!r}, output_ratio={output_ratio!r}")
        ratios = [output_ratio] * self.nd if isinstance(output_ratio, (int, float)) else output_ratio or []
        if not all(0 < r < 1 for r in ratios):
            raise CaptureError(f"{name} output_ratio must be between 0 and 1, got {output_ratio!r}")
        self.kernel_size, self.output_size, self.output_ratio = kernel_size, output_size, output_ratio
        self.return_indices, self._random_samples = return_indices, _random_samples

    def forward(self, input: Any) -> Any:
        out = fractional_max_pool(f"{type(self).__name__}", input, self.nd, self.kernel_size, self.output_size,
                                  self.output_ratio, self._random_samples)
        return out if self.return_indices else out[0]


class FractionalMaxPool2d(_FractionalMaxPoolNd):
    """``torch.nn.FractionalMaxPool2d(kernel_size, output_size=None, output_ratio=None, return_indices=False,
    _random_samples=None)`` over ``(N, C, H, W)`` or ``(C, H, W)``."""

    nd = 2


class FractionalMaxPool3d(_FractionalMaxPoolNd):
    """``torch.nn.FractionalMaxPool3d``: as ``FractionalMaxPool2d`` over ``(N, C, T, H, W)`` or ``(C, T, H, W)``."""

    nd = 3


__all__ = ["FractionalMaxPool2d", "FractionalMaxPool3d"]
