"""The classic two-layer ReLU net: 784 -> hidden -> 10 (MNIST-sized)."""

from __future__ import annotations

import graphc as gc
from graphc import nn


class TwoLayerNet(nn.Module):
    def __init__(self, in_features: int = 784, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(gc.relu(self.fc1(x)))


def example_inputs(batch: int | str = "N", in_features: int = 784) -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, in_features), name="x")}
