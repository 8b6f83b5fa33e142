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
                 align_corners: bool | None = None, recompute_scale_factor: bool | None = None):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                                      self.recompute_scale_factor)

    def extra_repr(self) -> str:
        """torch's: the scale factor (as floats, as torch keeps it) or else the size, then the mode."""
        factor = self.scale_factor
        if factor is None:
            return f"size={self.size!r}, mode={self.mode!r}"
        factor = tuple(map(float, factor)) if isinstance(factor, (tuple, list)) else float(factor)
        return f"scale_factor={factor!r}, mode={self.mode!r}"


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
        return ops_spatial.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops_spatial.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class ChannelShuffle(Module):
    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, x: Tensor) -> Tensor:
        return ops_spatial.channel_shuffle(x, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"
