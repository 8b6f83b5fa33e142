"""The example models against hand-written PyTorch twins with the same attribute names: the
captured weights load into torch by name (strict) and both compute the same outputs."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.models import EXAMPLES

try:
    from dsl_util import rng, run_ort
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import rng, run_ort

torch = pytest.importorskip("torch")
nn = torch.nn


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.pool1 = nn.Conv2d(1, 6, 5, padding=2), nn.MaxPool2d(2)
        self.conv2, self.pool2 = nn.Conv2d(6, 16, 5), nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool1(torch.relu(self.conv1(x)))
        x = self.flatten(self.pool2(torch.relu(self.conv2(x))))
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, cin, c, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c))
                           if stride != 1 or cin != c else None)

    def forward(self, x):
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.pool, self.flatten, self.fc = nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)

    def forward(self, x):
        x = self.layers(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(self.flatten(self.pool(x)))


class EncoderBlock(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), nn.MultiheadAttention(dim, heads, batch_first=True)
        self.drop1, self.norm2 = nn.Dropout(0.1), nn.LayerNorm(dim)
        self.fc1, self.act, self.fc2, self.drop2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), \
            nn.Dropout(0.1)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.drop1(self.attn(h, h, h, need_weights=False)[0])
        return x + self.drop2(self.fc2(self.act(self.fc1(self.norm2(x)))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(1000, 64), nn.Embedding(64, 64)
        self.blocks = nn.Sequential(EncoderBlock(), EncoderBlock())
        self.norm, self.head = nn.LayerNorm(64), nn.Linear(64, 10)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        return self.head(self.norm(self.blocks(x)).mean(1))


TWINS = {"cnn": LeNet, "resnet": ResNet, "transformer": Transformer}


@pytest.mark.parametrize("name", ["cnn", "resnet", "transformer"])
def test_example_matches_its_pytorch_twin(name):
    factory, inputs = EXAMPLES[name]
    module = factory()
    if name == "resnet":  # non-trivial running statistics
        r = rng(9)
        for pname, p in module.named_parameters():
            if pname.endswith("running_mean"):
                p.data = r.standard_normal(p.shape) * 0.1
            elif pname.endswith("running_var"):
                p.data = r.random(p.shape) + 0.5
    model = gc.capture(module, seed=4, **inputs())
    twin = TWINS[name]()
    state = {k: torch.from_numpy(np.asarray(v)) for k, v in model.params.items()}
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    twin.eval()
    if name == "transformer":
        x = rng(1).integers(0, 1000, (3, 16)).astype(np.int64)
    else:
        shape = [3 if isinstance(d, str) else d for d in model.inputs[0].shape]
        x = rng(1).standard_normal(shape).astype(np.float32)
    feed = model.inputs[0].name
    with torch.no_grad():
        expected = twin(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run_ort(model, {feed: x})["output"], expected, rtol=1e-4, atol=2e-5)
