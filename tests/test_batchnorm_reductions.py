"""A training BatchNorm's per-channel reductions (the forward's batch mean and variance, the
backward's two sums: ``rules_norm.channel_reduce``) run over the map's axes, then over the batch;
the gradients and running statistics stay torch's (float64, numpy and onnxruntime)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import graphc as gc

torch = pytest.importorskip("torch")
nn = torch.nn

RNG = np.random.default_rng(0)


class Net(nn.Module):
    """A BatchNorm1d over [N, C, L] and a BatchNorm3d over [N, C, D, H, W], after convs without
    biases (whose gradients would be sums over (N, *S) too)."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv1d(3, 4, 3, padding=1, bias=False), nn.BatchNorm1d(4)
        self.c3, self.b3 = nn.Conv3d(2, 4, 3, padding=1, bias=False), nn.BatchNorm3d(4, momentum=0.3)

    def forward(self, x, v):
        return torch.relu(self.b1(self.c1(x))).mean(2) + torch.tanh(self.b3(self.c3(v))).mean((2, 3, 4))


def batch() -> dict[str, np.ndarray]:
    return {"x": RNG.normal(1.0, 2.0, (5, 3, 7)), "v": RNG.normal(-0.5, 1.5, (5, 2, 3, 4, 5)),
            "y": RNG.normal(size=(5, 4))}


def artifacts(net: Net, feeds: dict[str, np.ndarray]):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["v"])), buf, dynamo=False,
                          opset_version=17, input_names=["x", "v"], output_names=["out"], do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING)
    return gc.training.generate(gc.load(buf.getvalue()), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))


def reduced_axes(graph: onnx.GraphProto) -> list[list[int]]:
    """The axes of each ReduceMean and ReduceSum of ``graph`` (an attribute, or a constant input;
    None for all)."""
    consts = {o: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant" for o in n.output}
    consts.update({t.name: numpy_helper.to_array(t) for t in graph.initializer})
    found = []
    for node in graph.node:
        if node.op_type in ("ReduceMean", "ReduceSum"):
            attrs = {a.name: list(a.ints) for a in node.attribute if a.name == "axes"}
            given = node.input[1] if len(node.input) > 1 and node.input[1] else None
            found.append(attrs.get("axes") or (consts[given].tolist() if given else None))
    return found


def test_the_statistics_and_sums_reduce_the_map_then_the_batch():
    torch.manual_seed(0)
    axes = reduced_axes(artifacts(Net().double().train(), batch()).gradients.proto.graph)
    assert [0, 2] not in axes and [0, 2, 3, 4] not in axes
    # b3: the forward's mean and variance, the backward's two sums, each over (2, 3, 4) then 0
    assert axes.count([2, 3, 4]) >= 4 and axes.count([0]) >= 8


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_the_gradients_and_running_statistics_are_torchs(backend):
    torch.manual_seed(0)
    net, feeds = Net().double().train(), batch()
    arts = artifacts(net, feeds)
    loss = torch.nn.functional.mse_loss(net(torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["v"])),
                                        torch.from_numpy(feeds["y"]))
    loss.backward()
    got = gc.Session(arts.gradients, backend=backend).run(feeds)
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-12)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(got[f"{name}_grad"], p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    for name, stat in net.named_buffers():  # ONNX's momentum is a float32 attribute: 0.9 to 3e-8
        if "running" in name:
            np.testing.assert_allclose(got[f"{name}.next"], stat.numpy(), rtol=1e-6, err_msg=name)


class LargeMean(nn.Module):
    """A BatchNorm2d, a Relu (the Conv affine path on onnxruntime's CPU: 16x16 maps) and a 1x1 Conv."""

    def __init__(self):
        super().__init__()
        self.bn, self.conv = nn.BatchNorm2d(3), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.conv(torch.relu(self.bn(x))).mean((2, 3))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_float32_statistics_of_a_large_mean_are_torchs(backend):
    """float32 BatchNorm input 1000 + N(0, 1): the variance of the centred input (two passes) keeps
    the gradients and running statistics within 2e-4 of their largest from torch's float64
    (measured 7e-5 at most; torch's float32 7e-5); the variance as E[x^2] - E[x]^2 in one pass
    was 1e-2 to 1e-1 off."""
    torch.manual_seed(0)
    net = LargeMean().train()
    x = (1000 + RNG.normal(size=(8, 3, 16, 16)) + RNG.normal(size=(1, 3, 1, 1))).astype(np.float32)
    feeds = {"x": x, "y": RNG.normal(size=(8, 4)).astype(np.float32)}
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(x),), buf, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["out"], do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    arts = gc.training.generate(gc.load(buf.getvalue()), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    got = gc.Session(arts.gradients, backend=backend).run(feeds)
    ref = LargeMean().double().train()
    ref.load_state_dict(net.state_dict())
    loss = torch.nn.functional.mse_loss(ref(torch.from_numpy(x).double()), torch.from_numpy(feeds["y"]).double())
    loss.backward()
    want = {f"{n}_grad": p.grad.numpy() for n, p in ref.named_parameters()}
    want.update({f"{n}.next": b.numpy() for n, b in ref.named_buffers() if "running" in n})
    assert len(want) == 6
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=2e-4 * np.max(np.abs(value)), err_msg=name)
