"""A small U-Net (Ronneberger et al.), as a PyTorch implementation writes it: double 3x3 conv
blocks with BatchNorm, max-pool down, transposed-conv up, skip connections by concatenation, a
1x1 conv head giving per-pixel class logits.

    graphc capture models/unet.py:UNet --input x:float32[N,1,32,32] -o unet.onnx
"""

from __future__ import annotations

import graphc as gc
from graphc import nn


class DoubleConv(nn.Sequential):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU())


class Down(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x):
        return self.conv(self.pool(x))


class Up(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, 2, stride=2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x, skip):
        return self.conv(gc.concat([skip, self.up(x)], axis=1))


class UNet(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 2, base: int = 8, depth: int = 2):
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]
        self.inc = DoubleConv(in_channels, widths[0])
        self.downs = nn.ModuleList([Down(widths[i], widths[i + 1]) for i in range(depth)])
        self.ups = nn.ModuleList([Up(widths[i + 1], widths[i]) for i in reversed(range(depth))])
        self.outc = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x):
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)  # [N, num_classes, H, W]


def example_inputs(batch: int | str = "N", size: int = 32) -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, 1, size, size), name="x")}
