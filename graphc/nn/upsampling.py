"""Upsample, its fixed-mode forms, PixelShuffle / PixelUnshuffle and ChannelShuffle with
``torch.nn``'s arguments."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_layers, ops_spatial
from graphc.nn.module import Module
from graphc.dsl.tensor import Tensor


class Upsample(Module):
    """``interpolate`` by ``size`` or ``scale_factor``; modes nearest, (bi/tri)linear, bicubic."""

    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: bool | None = None):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)


class UpsamplingNearest2d(Upsample):
    def __init__(self, size: Any = None, scale_factor: Any = None):
        super().__init__(size, scale_factor, "nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear with ``align_corners=True``, as torch's."""

    def __init__(self, size: Any = None, scale_factor: Any = None):
        super().__init__(size, scale_factor, "bilinear", align_corners=True)


class PixelShuffle(Module):
    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.pixel_shuffle(x, self.upscale_factor)


class PixelUnshuffle(Module):
    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops_spatial.pixel_unshuffle(x, self.downscale_factor)


class ChannelShuffle(Module):
    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        return ops_spatial.channel_shuffle(x, self.groups)
