"""An imported QuantizeLinear + DequantizeLinear pair (torch.onnx's export of
``torch.fake_quantize_per_tensor_affine`` and ``_per_channel_affine``, either exporter, and of torch.ao's
QAT modules) trains with torch's straight-through gradient: ``dy`` where the rounded value is in range,
else 0 (``torch_gradients.straight_through``). Before, no gradient went through a per-tensor pair and
every param before it got zero, silently; a per-channel pair was refused."""

from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.errors import PassError

torch = pytest.importorskip("torch")
nn = torch.nn
RNG = np.random.default_rng(0)


class _Quantized(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.h = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):  # scale 0.02: |x| > 2.55 saturates, some values here do
        return self.h(torch.fake_quantize_per_tensor_affine(self.fc(x) * 4, 0.02, 3, -128, 127))


def _exported(net, x, exporter):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return gc.load(torch.onnx.export(copy.deepcopy(net), (x,), dynamo=True, optimize=False, verbose=False,
                                             input_names=["x"], output_names=["out"]).model_proto)
        buffer = io.BytesIO()
        torch.onnx.export(copy.deepcopy(net), (x,), buffer, dynamo=False, input_names=["x"], output_names=["out"],
                          dynamic_axes={"x": {0: "N"}})
        return gc.load(buffer.getvalue())


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_an_imported_fake_quantization_trains_as_torch(exporter, backend):
    """Before: fc's gradient was zero, the second loss 1.5e-2 off torch's."""
    torch.manual_seed(0)
    net = _Quantized()
    xs = [torch.tensor(RNG.standard_normal((8, 4)), dtype=torch.float32) for _ in range(3)]
    with torch.no_grad():
        assert (torch.abs(net.fc(xs[0]) * 4) > 2.6).any()  # the mask matters
    arts = gc.training.generate(_exported(net, xs[0], exporter), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
    trainer, opt = gc.Trainer(arts, backend=backend), torch.optim.SGD(net.parameters(), lr=0.1)
    for x in xs:
        y = torch.tensor(RNG.standard_normal((8, 3)), dtype=torch.float32)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        assert trainer.step({"x": x.numpy(), "y": y.numpy()}) == pytest.approx(loss.item(), rel=1e-5)
    for name, value in net.named_parameters():
        np.testing.assert_allclose(trainer.state_dict()[name], value.detach().numpy(), rtol=0, atol=1e-6, err_msg=name)


class _PerChannel(nn.Module):
    """Per-channel fake quantization as QAT writes it: a Conv's and a Linear's weights along their output
    channels (axis 0, int8), the Conv's output along its channels (axis 1, uint8); the scales put some
    of each outside the range, so the mask matters."""

    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv1d(2, 4, 3), nn.Linear(24, 3)
        self.register_buffer("cs", torch.tensor([0.001, 0.002, 0.0015, 0.003]))
        self.register_buffer("cz", torch.tensor([0, 5, -7, 2], dtype=torch.int32))
        self.register_buffer("fs", torch.tensor([0.0005, 0.001, 0.0008]))
        self.register_buffer("fz", torch.tensor([3, 0, -10], dtype=torch.int32))
        self.register_buffer("as_", torch.tensor([0.004, 0.006, 0.003, 0.005]))
        self.register_buffer("az", torch.tensor([10, 0, 60, 128], dtype=torch.int32))

    def weights(self):
        return (torch.fake_quantize_per_channel_affine(self.c.weight, self.cs, self.cz, 0, -128, 127),
                torch.fake_quantize_per_channel_affine(self.fc.weight, self.fs, self.fz, 0, -128, 127))

    def forward(self, x):
        cw, fw = self.weights()
        h = nn.functional.conv1d(x, cw, self.c.bias)
        h = torch.fake_quantize_per_channel_affine(h, self.as_, self.az, 1, 0, 255)
        return nn.functional.linear(h.flatten(1), fw, self.fc.bias)


def _steps_as_torch(net, model, opt, make_opt, backend, shape, steps=3):
    """``steps`` steps of ``opt`` on ``model`` against ``make_opt``'s on ``net`` (torch): each loss to 1e-5
    relative, then every param to 1e-6; returns the trainer."""
    arts = gc.training.generate(model, gc.losses.mse("out", label="y"), opt)
    assert arts.manifest.trainable == [n for n, _ in net.named_parameters()]  # no scale trains
    trainer, torch_opt = gc.Trainer(arts, backend=backend), make_opt(net.parameters())
    for _ in range(steps):
        x = torch.tensor(RNG.standard_normal(shape), dtype=torch.float32)
        y = torch.tensor(RNG.standard_normal((shape[0], 3)), dtype=torch.float32)
        torch_opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        torch_opt.step()
        assert trainer.step({"x": x.numpy(), "y": y.numpy()}) == pytest.approx(loss.item(), rel=1e-5)
    for name, value in net.named_parameters():
        np.testing.assert_allclose(trainer.state_dict()[name], value.detach().numpy(), rtol=0, atol=1e-6, err_msg=name)
    return trainer


OPTIMIZERS = {"sgd": (gc.optim.SGD(0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
              "adamw": (gc.optim.AdamW(0.01), lambda p: torch.optim.AdamW(p, lr=0.01))}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_per_channel_fake_quantization_trains_as_torch(exporter, backend, optimizer):
    """Before: refused ("needs one scale for the whole tensor")."""
    torch.manual_seed(0)
    net = _PerChannel()
    x = torch.tensor(RNG.standard_normal((5, 2, 8)), dtype=torch.float32)
    with torch.no_grad():
        cw, _ = net.weights()
        h = nn.functional.conv1d(x, cw, net.c.bias)
        for w, s, z in ((net.c.weight, net.cs, net.cz), (net.fc.weight, net.fs, net.fz), (h, net.as_, net.az)):
            s, z = (v.reshape(-1, *[1] * (w.dim() - 1 - (w is h))) for v in (s, z))
            r = torch.round(w * (1 / s)) + z
            assert ((r < (0 if w is h else -128)) | (r > (255 if w is h else 127))).any()  # the mask matters
    model = _exported(net, x, exporter)
    _steps_as_torch(net, model, OPTIMIZERS[optimizer][0], OPTIMIZERS[optimizer][1], backend, (5, 2, 8))


class _Qat(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.dq = torch.ao.quantization.QuantStub(), torch.ao.quantization.DeQuantStub()
        self.fc, self.r, self.h = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)

    def forward(self, x):
        return self.dq(self.h(self.r(self.fc(self.q(x)))))


WEIGHT_OBSERVERS = {"per_channel": (torch.ao.quantization.MovingAveragePerChannelMinMaxObserver, torch.per_channel_symmetric),
                    "per_tensor": (torch.ao.quantization.MovingAverageMinMaxObserver, torch.per_tensor_symmetric)}


@pytest.mark.parametrize("weights", sorted(WEIGHT_OBSERVERS))
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_qat_model_trains_as_torch(backend, weights):
    """torch.ao's QAT: symmetric int8 weight observers, reduce-range (0, 127) activations (TorchScript
    writes a Clip between the pair), observers frozen after calibration (torch.onnx cannot export running
    ones), exported in training mode. Before: refused, per-channel weights by their scale's shape, both
    for the scale buffers TorchScript writes as initializers ("no gradient rule for DequantizeLinear")."""
    tq = torch.ao.quantization
    observer, scheme = WEIGHT_OBSERVERS[weights]
    torch.manual_seed(0)
    net = _Qat().train()
    net.qconfig = tq.QConfig(
        activation=tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=127),
        weight=tq.FakeQuantize.with_args(observer=observer, quant_min=-128, quant_max=127, dtype=torch.qint8,
                                         qscheme=scheme))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = tq.prepare_qat(net)
    x = torch.tensor(RNG.standard_normal((8, 4)), dtype=torch.float32)
    net(x)
    net.apply(tq.disable_observer)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(copy.deepcopy(net), (x,), buffer, dynamo=False, input_names=["x"], output_names=["out"],
                          dynamic_axes={"x": {0: "N"}}, training=torch.onnx.TrainingMode.TRAINING)
    model = gc.load(buffer.getvalue())
    assert "Clip" in {n.op_type for n in model.ir.graph}
    _steps_as_torch(net, model, *OPTIMIZERS["adamw"], backend, (8, 4))


def test_a_blocked_pair_is_refused_by_name():
    """Blocked quantization (opset 21's block_size) is no torch fake quantization: refused, named."""
    scale, zero = helper.make_tensor("s", TensorProto.FLOAT, [3, 1], [0.1, 0.2, 0.3]), \
        helper.make_tensor("z", TensorProto.INT8, [3, 1], [0, 0, 0])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], RNG.standard_normal(6).tolist())
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["w", "s", "z"], ["q"], name="quant", axis=1, block_size=2),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], axis=1, block_size=2),
         helper.make_node("MatMul", ["x", "d"], ["out"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2])], [scale, zero, weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    with pytest.raises(PassError, match=r"QuantizeLinear 'quant'.*per channel.*scale 's' of shape \[3, 1\], axis 1.*"
                                        r"block_size 2"):
        gc.training.generate(gc.load(model.SerializeToString()), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
