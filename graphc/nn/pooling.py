"""1-D pooling and 1-D adaptive average pooling (the 2-D ones are in ``layers``; the 1-D ones take
the same arguments, so they share their constructors)."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_layers
from graphc.dsl.tensor import Tensor
from graphc.nn.layers import AvgPool2d, MaxPool2d
from graphc.nn.module import Module


class MaxPool1d(MaxPool2d):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class AvgPool1d(AvgPool2d):
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
