"""1-D, 3-D and transposed convolutions with ``torch.nn``'s arguments, weight layouts and init."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl import ops_layers
from graphc.errors import CaptureError
from graphc.nn import init
from graphc.nn.module import Module, Parameter
from graphc.dsl.ops_layers import ints
from graphc.dsl.tensor import Tensor


class _ConvNd(Module):
    """Weight ``[out, in/groups, *k]`` (``[in, out/groups, *k]`` transposed), kaiming-uniform;
    bias U(+-1/sqrt(fan_in)) with PyTorch's fan_in of that weight."""

    nd = 0
    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, output_padding: Any = 0,
                 dtype: Any = "float32"):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise CaptureError(f"{type(self).__name__} channels ({in_channels}, {out_channels}) must divide by "
                             f"groups={groups}")
        k = tuple(ints(kernel_size, self.nd, "kernel_size"))
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding = output_padding
        io = (in_channels, out_channels // groups) if self.transposed else (out_channels, in_channels // groups)
        shape = io + k
        self.weight = Parameter(shape=shape, init=init.kaiming_uniform(), dtype=dtype)
        fan_in = shape[1] * math.prod(k)
        self.bias = Parameter(shape=(out_channels,), init=init.bias_uniform(fan_in), dtype=dtype) if bias else None

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"


class Conv1d(_ConvNd):
    """NCL convolution (padding an int, ``"same"`` or ``"valid"``)."""

    nd = 1

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv3d(_ConvNd):
    """NCDHW convolution."""

    nd = 3

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _ConvTransposeNd(_ConvNd):
    transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1,
                 dtype: Any = "float32"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         output_padding, dtype)


class ConvTranspose1d(_ConvTransposeNd):
    nd = 1

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                           self.output_padding, self.groups, self.dilation)


class ConvTranspose2d(_ConvTransposeNd):
    nd = 2

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                           self.output_padding, self.groups, self.dilation)
