"""A training BatchNorm's dx = k * z (k = scale / sqrt(var + eps) per channel) handed to the Conv
that made its input: that Conv's gradient reads z, with the weight times k for its dx and k times
its weight and bias gradients (``channel_scale.scaled_by_channel``), so dy * k is never written;
so too the per-channel products a small-map depthwise Conv becomes (``dense_conv``), through the
Reshape and Transpose back to channel-major, where k times their matrices is fewer values than dy;
a BatchNorm after anything else keeps the multiply. Oracle: torch float64 autograd, numpy and
onnxruntime backends."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import graphc as gc
from graphc.passes.autodiff.channel_scale import CHANNEL_SCALE_KEY

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


class DepthwiseNet(nn.Module):
    """Depthwise 3x3 convs at batch 16, which ``dense_conv`` makes one product per channel (a MatMul
    batched over the channels, the BatchNorm reading it channel-major): on a 4x4 map their [16, 16,
    16] matrices (times two) outweigh dy [16, 16, 16], the multiply stays; on 2x2, [16, 4, 4]
    against [16, 16, 4], folded."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        return torch.tanh(self.b2(self.c2(nn.functional.max_pool2d(h, 2)))).mean((2, 3))


def artifacts(net: nn.Module, x: np.ndarray):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(x),), buf, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["out"], do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    return gc.training.generate(gc.load(buf.getvalue()), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))


def build(net_class, x_shape: tuple, classes: int):
    """(artifacts, feeds, torch float64's loss and parameter gradients) of ``net_class``."""
    torch.manual_seed(0)
    net = net_class().double().train()
    feeds = {"x": RNG.normal(0.5, 2.0, x_shape), "y": RNG.normal(size=(x_shape[0], classes))}
    arts = artifacts(net, feeds["x"])
    loss = nn.functional.mse_loss(net(torch.from_numpy(feeds["x"])), torch.from_numpy(feeds["y"]))
    loss.backward()
    return arts, feeds, {"loss": loss.item(), **{f"{name}_grad": p.grad.numpy() for name, p in net.named_parameters()}}


@pytest.fixture(scope="module")
def case():
    return build(Net, (4, 3, 32, 32), 16)


@pytest.fixture(scope="module")
def depthwise_case():
    return build(DepthwiseNet, (16, 16, 4, 4), 16)


def kept_multiplies(arts) -> list[str]:
    graph = arts.gradients.proto.graph
    return [n.name for n in graph.node if any(p.key == CHANNEL_SCALE_KEY for p in n.metadata_props)]


def test_only_the_batchnorm_after_the_pool_keeps_its_multiply(case):
    kept = kept_multiplies(case[0])
    assert len(kept) == 1 and "b5" in kept[0], kept


def test_depthwise_products_take_the_factor_where_their_matrices_are_smaller(depthwise_case):
    graph = depthwise_case[0].gradients.proto.graph
    assert sum(n.op_type == "Conv" for n in graph.node) == 0  # both are products
    kept = kept_multiplies(depthwise_case[0])
    assert len(kept) == 1 and "b1" in kept[0], kept


def assert_torchs(arts, feeds, want, backend: str, count: int) -> None:
    """Within 1e-7 (the first BatchNorm's scale gradient 2.5e-8 off, as before the fold; the
    Convs' biases before a BatchNorm have gradient 0, ~1e-17 here)."""
    got = gc.Session(arts.gradients, backend=backend).run(feeds)
    assert len(want) == count
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-7, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_the_gradients_are_torchs(case, backend):
    assert_torchs(*case, backend, 17)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_the_depthwise_products_gradients_are_torchs(depthwise_case, backend):
    assert_torchs(*depthwise_case, backend, 7)
