"""1-D pooling and 1-D adaptive average pooling (the 2-D ones are in ``layers``)."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_layers
from graphc.nn.module import Module
from graphc.dsl.tensor import Tensor


class MaxPool1d(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class AvgPool1d(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                     self.count_include_pad)


class AdaptiveAvgPool1d(Module):
    """Output size 1, or a static length the output size divides."""

    def __init__(self, output_size: Any):
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.adaptive_avg_pool1d(x, self.output_size)
