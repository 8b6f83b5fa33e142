"""A small ResNet (CIFAR-style, 3x32x32): BasicBlocks with BatchNorm and residual adds."""

from __future__ import annotations

import graphc as gc
from graphc import nn


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(channels))
        else:
            self.downsample = None

    def forward(self, x):
        out = gc.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return gc.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, in_channels: int = 3, classes: int = 10, widths: tuple[int, ...] = (16, 32, 64),
                 blocks_per_stage: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages, channels = [], widths[0]
        for i, width in enumerate(widths):
            for j in range(blocks_per_stage):
                stride = 2 if i > 0 and j == 0 else 1
                stages.append(BasicBlock(channels, width, stride))
                channels = width
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        x = gc.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        return self.fc(self.flatten(self.pool(x)))


def example_inputs(batch: int | str = "N", size: int = 32) -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, 3, size, size), name="x")}
