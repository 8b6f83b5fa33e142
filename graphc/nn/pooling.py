"""Pooling layers beyond the 2-D ones in ``layers``: 1-D and 3-D max and average pooling (the same
arguments as the 2-D ones, so they share their constructors), adaptive pooling, ``MaxUnpool``,
power-average pooling and ``LocalResponseNorm``."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_layers, ops_pool
from graphc.dsl.tensor import Tensor
from graphc.nn.layers import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d, pool_repr
from graphc.nn.module import Module


class MaxPool1d(MaxPool2d):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                                     self.return_indices)


class AvgPool1d(AvgPool2d):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                     self.count_include_pad)

    def extra_repr(self) -> str:
        return pool_repr(self, 1)


class AdaptiveAvgPool1d(Module):
    """Output size 1, or a static length the output size divides."""

    def __init__(self, output_size: Any):
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.adaptive_avg_pool1d(x, self.output_size)

    extra_repr = AdaptiveAvgPool2d.extra_repr


class MaxPool3d(MaxPool2d):
    def forward(self, x: Tensor) -> Tensor:
        return ops_pool.max_pool3d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                                   self.return_indices)


class AvgPool3d(AvgPool2d):
    def forward(self, x: Tensor) -> Tensor:
        return ops_pool.avg_pool3d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                   self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool3d(AdaptiveAvgPool1d):
    def forward(self, x: Tensor) -> Tensor:
        return ops_pool.adaptive_avg_pool3d(x, self.output_size)


class _AdaptiveMaxPoolNd(Module):
    """Output size 1, or static sizes the output size divides; ``return_indices`` as ``MaxPool2d``."""

    nd = 0

    def __init__(self, output_size: Any, return_indices: bool = False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, x: Tensor) -> Any:
        return ops_pool.adaptive_max_pool(x, self.output_size, self.nd, self.return_indices)

    extra_repr = AdaptiveAvgPool2d.extra_repr


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    nd = 1


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    nd = 2


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    nd = 3


class _MaxUnpoolNd(Module):
    """``forward(x, indices, output_size=None)``: ``indices`` as ``MaxPoolNd(return_indices=True)``
    gives them."""

    nd = 0

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: Tensor, indices: Tensor, output_size: Any = None) -> Tensor:
        return ops_pool.max_unpool(x, indices, self.nd, self.kernel_size, self.stride, self.padding, output_size)

    def extra_repr(self) -> str:
        return pool_repr(self, self.nd)


class MaxUnpool1d(_MaxUnpoolNd):
    nd = 1


class MaxUnpool2d(_MaxUnpoolNd):
    nd = 2


class MaxUnpool3d(_MaxUnpoolNd):
    nd = 3


class _LPPoolNd(Module):
    """``(sum of x^p over the window)^(1/p)`` (torch's formula, ``ops_pool.lp_pool``)."""

    nd = 0

    def __init__(self, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False):
        super().__init__()
        self.norm_type, self.kernel_size, self.stride, self.ceil_mode = norm_type, kernel_size, stride, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return ops_pool.lp_pool(x, self.norm_type, self.nd, self.kernel_size, self.stride, self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"ceil_mode={self.ceil_mode}")


class LPPool1d(_LPPoolNd):
    nd = 1


class LPPool2d(_LPPoolNd):
    nd = 2


class LPPool3d(_LPPoolNd):
    nd = 3


class LocalResponseNorm(Module):
    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x: Tensor) -> Tensor:
        return ops_pool.local_response_norm(x, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
