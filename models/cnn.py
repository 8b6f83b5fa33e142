"""LeNet-style CNN for 1x28x28 images: two conv/pool stages, then three Linear layers."""

from __future__ import annotations

import graphc as gc
from graphc import nn


class LeNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)   # 6x28x28
        self.pool1 = nn.MaxPool2d(2)                              # 6x14x14
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)              # 16x10x10
        self.pool2 = nn.MaxPool2d(2)                              # 16x5x5
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = self.pool1(gc.relu(self.conv1(x)))
        x = self.pool2(gc.relu(self.conv2(x)))
        x = self.flatten(x)
        x = gc.relu(self.fc1(x))
        x = gc.relu(self.fc2(x))
        return self.fc3(x)


def example_inputs(batch: int | str = "N") -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, 1, 28, 28), name="x")}
