"""Upsample and PixelShuffle with ``torch.nn``'s arguments."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_layers
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


class PixelShuffle(Module):
    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.pixel_shuffle(x, self.upscale_factor)
