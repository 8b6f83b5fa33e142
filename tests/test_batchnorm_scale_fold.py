"""A training BatchNorm's dx = k * z (k = scale / sqrt(var + eps) per channel) handed to the Conv
that made its input: that Conv's gradient reads z, with the weight times k for its dx and k times
its weight and bias gradients (``rules_norm.scaled_by_channel``), so dy * k is never written; a
BatchNorm after anything else keeps the multiply. Oracle: torch float64 autograd, numpy and
onnxruntime backends."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import graphc as gc
from graphc.passes.autodiff.rules_norm import CHANNEL_SCALE_KEY

torch = pytest.importorskip("torch")
nn = torch.nn

RNG = np.random.default_rng(0)


class Net(nn.Module):
    """Dense strided (with bias), depthwise, 1x1 and grouped strided Convs, each before a
    BatchNorm; a fifth BatchNorm after a MaxPool."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)
        self.c3, self.b3 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.c4, self.b4 = nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=4), nn.BatchNorm2d(16)
        self.b5 = nn.BatchNorm2d(16)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        h = torch.relu(self.b2(self.c2(h)))
        h = torch.relu(self.b3(self.c3(h)))
        h = torch.tanh(self.b4(self.c4(h)))
        return torch.sigmoid(self.b5(nn.functional.max_pool2d(h, 2))).mean((2, 3))


def artifacts(net: Net, x: np.ndarray):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(x),), buf, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["out"], do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    return gc.training.generate(gc.load(buf.getvalue()), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    net = Net().double().train()
    feeds = {"x": RNG.normal(0.5, 2.0, (4, 3, 32, 32)), "y": RNG.normal(size=(4, 16))}
    arts = artifacts(net, feeds["x"])
    loss = nn.functional.mse_loss(net(torch.from_numpy(feeds["x"])), torch.from_numpy(feeds["y"]))
    loss.backward()
    return arts, feeds, {"loss": loss.item(), **{f"{name}_grad": p.grad.numpy() for name, p in net.named_parameters()}}


def test_only_the_batchnorm_after_the_pool_keeps_its_multiply(case):
    graph = case[0].gradients.proto.graph
    kept = [n.name for n in graph.node if any(p.key == CHANNEL_SCALE_KEY for p in n.metadata_props)]
    assert len(kept) == 1 and "b5" in kept[0], kept


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_the_gradients_are_torchs(case, backend):
    """Within 1e-7 (the first BatchNorm's scale gradient 2.5e-8 off, as before the fold; the
    Convs' biases before a BatchNorm have gradient 0, ~1e-17 here)."""
    arts, feeds, want = case
    got = gc.Session(arts.gradients, backend=backend).run(feeds)
    assert len(want) == 17
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-7, atol=1e-12, err_msg=name)
