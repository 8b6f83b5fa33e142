"""Export a few small PyTorch models to ONNX for graphc's "imported model" tests.

Run once by hand with torch installed (``.venv/bin/python scripts/export_torch_models.py [--zoo]``); the
results are committed under ``tests/data/`` so the tests never need torch:

- ``torch_mlp.onnx``        Linear-ReLU-Linear, dynamic batch
- ``torch_cnn_bn.onnx``     Conv-BatchNorm-ReLU-MaxPool-Linear (eval mode), dynamic batch
- ``torch_attention.onnx``  LayerNorm + MultiheadAttention + GELU MLP with residuals
- ``<name>.npz``            an input batch (``input_*``) and torch's outputs (``output_*``)
- ``zoo/``                  the test-scale architectures of ``tests/torch_zoo.py`` through both
                            exporters, float32 and float64, with each module's state (``--zoo``)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "data"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class Attention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def export(name: str, model: nn.Module, example: torch.Tensor, opset: int = 17) -> None:
    model.eval()
    if name == "torch_cnn_bn":  # non-trivial running statistics
        with torch.no_grad():
            model.bn.running_mean.uniform_(-0.5, 0.5)
            model.bn.running_var.uniform_(0.5, 1.5)
    path = OUT / f"{name}.onnx"
    torch.onnx.export(model, (example,), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, opset_version=opset, dynamo=False,
                      # keep BatchNormalization a node (folding would merge it into the Conv)
                      do_constant_folding=name != "torch_cnn_bn")
    with torch.no_grad():
        y = model(example).numpy()
    np.savez(OUT / f"{name}.npz", input_x=example.numpy(), output_y=y)
    print(f"{path.relative_to(OUT.parent.parent)}: {path.stat().st_size:,} bytes")


def main() -> int:
    if "--zoo" in sys.argv[1:]:
        sys.path.insert(0, str(OUT.parent))
        import torch_zoo

        for name in torch_zoo.ZOO:
            for path in torch_zoo.save(name):
                print(f"{path.relative_to(OUT.parent.parent)}: {path.stat().st_size:,} bytes")
        return 0
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    export("torch_mlp", MLP(), torch.randn(3, 20))
    export("torch_cnn_bn", CNN(), torch.randn(2, 1, 12, 12))
    export("torch_attention", Attention(), torch.randn(2, 5, 16))
    return 0


if __name__ == "__main__":
    sys.exit(main())
