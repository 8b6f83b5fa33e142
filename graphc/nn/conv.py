"""Convolutions with ``torch.nn``'s arguments, weight layouts and init: 1-D, 2-D and 3-D, and
transposed, with ``padding_mode`` as in torch."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl import ops_layers, ops_nn
from graphc.dsl.builder import user_source
from graphc.dsl.ops_array import pad
from graphc.dsl.ops_nn import conv_pads, ints
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn import draws
from graphc.nn.module import Module, Parameter
from graphc.nn.signatures import takes_device

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


@takes_device
class _ConvNd(Module):
    """Weight ``[out, in/groups, *k]`` (``[in, out/groups, *k]`` transposed), kaiming-uniform;
    bias U(+-1/sqrt(fan_in)) with PyTorch's fan_in of that weight. A ``padding_mode`` other than
    ``"zeros"`` pads the input in that mode (``F.pad``) and runs the conv unpadded, as torch."""

    nd = 0
    transposed = False
    conv = None  # the functional form (x, weight, bias, stride, padding, dilation, groups)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 dtype: Any = "float32", *, output_padding: Any = 0):
        super().__init__()
        name = type(self).__name__
        if padding_mode not in PADDING_MODES:
            raise CaptureError(f"{name} padding_mode={padding_mode!r}; expected one of {list(PADDING_MODES)} "
                               f"(at {user_source()})")
        if self.transposed and padding_mode != "zeros":
            raise CaptureError(f"{name} supports padding_mode='zeros' only, as in PyTorch; got {padding_mode!r} "
                               f"(at {user_source()})")
        if in_channels % groups or out_channels % groups:
            raise CaptureError(f"{name} channels ({in_channels}, {out_channels}) must divide by groups={groups}")
        k = tuple(ints(kernel_size, self.nd, "kernel_size"))
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding, self.padding_mode = output_padding, padding_mode
        io = (in_channels, out_channels // groups) if self.transposed else (out_channels, in_channels // groups)
        shape = io + k
        self.weight = Parameter(shape=shape, init=draws.kaiming_uniform(), dtype=dtype)
        fan_in = shape[1] * math.prod(k)
        self.bias = Parameter(shape=(out_channels,), init=draws.bias_uniform(fan_in), dtype=dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        padding = self.padding
        if self.padding_mode != "zeros":
            nd = self.nd
            pads = conv_pads(padding, list(self.kernel_size), ints(self.stride, nd, "stride"),
                             ints(self.dilation, nd, "dilation"))
            x = pad(x, [p for i in reversed(range(nd)) for p in (pads[i], pads[nd + i])], self.padding_mode)
            padding = 0
        return self.conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        """torch's: the kernel and stride, then what is not the default (padding, dilation, ...)."""
        nd = self.nd

        def shown(value: Any, name: str) -> Any:
            return value if isinstance(value, str) else tuple(ints(value, nd, name))

        parts = [f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}",
                 f"stride={shown(self.stride, 'stride')}"]
        for name, default in (("padding", 0), ("dilation", 1), ("output_padding", 0)):
            value = shown(getattr(self, name), name)
            if value != (default,) * nd:
                parts.append(f"{name}={value}")
        parts += [f"groups={self.groups}"] * (self.groups != 1) + ["bias=False"] * (self.bias is None)
        parts += [f"padding_mode={self.padding_mode}"] * (self.padding_mode != "zeros")
        return ", ".join(parts)


class Conv1d(_ConvNd):
    """NCL convolution (padding an int, ``"same"`` or ``"valid"``)."""

    nd = 1
    conv = staticmethod(ops_layers.conv1d)


class Conv2d(_ConvNd):
    """NCHW convolution; ``weight`` is ``[out, in/groups, kh, kw]``."""

    nd = 2
    conv = staticmethod(ops_nn.conv2d)


class Conv3d(_ConvNd):
    """NCDHW convolution."""

    nd = 3
    conv = staticmethod(ops_layers.conv3d)


@takes_device
class _ConvTransposeNd(_ConvNd):
    transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1,
                 padding_mode: str = "zeros", dtype: Any = "float32"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, dtype, output_padding=output_padding)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                         self.groups, self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    nd = 1
    conv = staticmethod(ops_layers.conv_transpose1d)


class ConvTranspose2d(_ConvTransposeNd):
    nd = 2
    conv = staticmethod(ops_layers.conv_transpose2d)


class ConvTranspose3d(_ConvTransposeNd):
    nd = 3
    conv = staticmethod(ops_layers.conv_transpose3d)
