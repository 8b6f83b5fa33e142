"""The inference export of a quantization-aware-trained model (models/qat_resnet.py, gc.nn.FakeQuantize): plain
QuantizeLinear/DequantizeLinear pairs with constant scales and zero points (int8 weights per channel, a
Linear's bias int32), which onnxruntime runs with int8 kernels (QLinearConv, QLinearAdd,
QLinearGlobalAveragePool, QGemm), within one quantization step of the Trainer's eval output; the Triton
deploy at opset 17 keeps them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
from graphc.models.qat_resnet import QATResNet, QConv, QLinear, act_quant

ort = pytest.importorskip("onnxruntime")


def _trained(net, tmp_path, shape=(3, 16, 16), steps=2):
    """A Trainer of ``net`` (input ``[N, *shape]``) after ``steps`` SGD steps (the observers have seen data)
    and its exported model."""
    model = gc.capture(net, training=True, x=gc.spec("float32", ("N", *shape)))
    trainer = gc.Trainer(gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.01)),
                         backend="ort-cpu")
    rng = np.random.default_rng(0)
    out = trainer.predict({"x": np.zeros((1, *shape), np.float32)})["output"]
    for _ in range(steps):
        trainer.step({"x": rng.standard_normal((4, *shape)).astype(np.float32),
                      "y": rng.standard_normal((4, *out.shape[1:])).astype(np.float32)})
    return trainer, trainer.export_inference(tmp_path / "qat.onnx")


def _session(path, level="ORT_ENABLE_ALL", optimized=None):
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if optimized:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_the_export_is_qdq_pairs_with_constant_qparams_and_int8_weights(tmp_path):
    net = QATResNet(widths=(4, 8))
    _, path = _trained(net, tmp_path)
    graph = onnx.load(path).graph
    ops = Counter(n.op_type for n in graph.node)
    consts = {i.name: i for i in graph.initializer}
    fakes = [m for m in net.modules() if isinstance(m, nn.FakeQuantize)]
    per_channel = sum(m.is_per_channel for m in fakes)
    assert ops["QuantizeLinear"] == len(fakes) - per_channel  # one per activation, weights are int8 constants
    assert ops["DequantizeLinear"] == len(fakes) + 1  # and the Linear's int32 bias
    assert not {"Round", "Where", "Sub", "Reciprocal", "Identity"} & set(ops), ops  # no straight-through path
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert node.input[1] in consts and node.input[2] in consts, node.name  # constant scale, zero point
            if node.input[0] in consts and consts[node.input[0]].data_type == onnx.TensorProto.INT32:
                assert node.output[0] == _gemm(graph).input[2]  # the bias, at the input times weight scales
                assert consts[node.input[2]].data_type == onnx.TensorProto.INT32
                continue
            if node.input[0] in consts:  # a weight: int8 per output channel, as the observer's
                assert consts[node.input[0]].data_type == onnx.TensorProto.INT8
                assert [a.i for a in node.attribute if a.name == "axis"] == [0]
                assert len(consts[node.input[1]].dims) == 1 and consts[node.input[1]].dims[0] > 1
            assert consts[node.input[2]].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    # the pooled activation is quantized before the Flatten: GlobalAveragePool -> QuantizeLinear
    pool = next(n for n in graph.node if n.op_type == "GlobalAveragePool")
    assert [n.op_type for n in graph.node if pool.output[0] in n.input] == ["QuantizeLinear"]


def _gemm(graph):
    return next(n for n in graph.node if n.op_type == "Gemm")


def test_onnxruntime_runs_it_with_int8_kernels_near_the_trainers_eval(tmp_path):
    net = QATResNet(widths=(4, 8))
    trainer, path = _trained(net, tmp_path)
    _session(path, optimized=tmp_path / "ort.onnx")
    kernels = Counter(n.op_type for n in onnx.load(tmp_path / "ort.onnx").graph.node)
    convs = sum(isinstance(m, nn.Conv2d) for m in net.modules())
    assert kernels["QLinearConv"] == convs and "Conv" not in kernels, kernels
    assert kernels["QLinearAdd"] == 2, kernels
    assert kernels["QLinearGlobalAveragePool"] == 1 and kernels["QGemm"] == 1, kernels
    assert not {"GlobalAveragePool", "Gemm", "MatMul", "DequantizeLinear"} & set(kernels), kernels
    x = np.random.default_rng(1).standard_normal((3, 3, 16, 16)).astype(np.float32)
    want = trainer.predict({"x": x})["output"]
    for got in (_session(path).run(None, {"x": x})[0], gc.Session(path, backend="numpy").run({"x": x})["output"]):
        # one-step flips inside propagate to the logits: a small fraction of their range
        assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_ALL"])
def test_one_quantized_conv_is_within_one_step_of_the_trainers_eval(tmp_path, level):
    """QuantizeLinear divides by the scale where torch multiplies by its float32 reciprocal, and the int8
    kernel adds an int32-rounded bias and requantizes with a float multiplier where the eval graph
    quantizes a float32 conv: each moves a value near a rounding tie to the next integer, no further."""
    net = nn.Sequential(act_quant(), QConv(3, 8))
    trainer, path = _trained(net, tmp_path)
    x = np.random.default_rng(2).standard_normal((4, 3, 16, 16)).astype(np.float32)
    want = trainer.predict({"x": x})["output"]
    got = _session(path, level).run(None, {"x": x})[0]
    step = float(trainer.state_dict()["1.aq.scale"][0])
    steps = np.abs(got.astype(np.float64) - want) / step
    assert steps.max() <= 1 + 1e-3, steps.max()
    assert (steps > 0.5).mean() < (1e-3 if level == "ORT_DISABLE_ALL" else 1e-2), (steps > 0.5).mean()


def test_the_triton_deploy_at_opset_17_keeps_the_per_channel_pairs(tmp_path):
    net = QATResNet(widths=(4, 8))
    _, path = _trained(net, tmp_path)
    folder = gc.deploy.triton(path, tmp_path / "repo", "qat", opset=17)
    deployed = folder / "1" / "model.onnx"
    model = onnx.load(deployed)
    onnx.checker.check_model(model, full_check=True)
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {17}
    axes = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute)]
    # the per-channel weights and the head's per-feature int32 bias
    assert len(axes) == sum(m.is_per_channel for m in net.modules() if isinstance(m, nn.FakeQuantize)) + 1
    x = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(_session(deployed).run(None, {"x": x})[0], _session(path).run(None, {"x": x})[0])


def _mlp(rank):
    """A QAT MLP: its input and hidden activation quantized per tensor, the first weight per output feature,
    the head's per tensor, the logits float; rank 3 input ``[N, 3, 12]`` goes through Reshapes around Gemms."""
    return nn.Sequential(act_quant(), QLinear(12, 16, relu=True), QLinear(16, 5, per_channel=False, out_quant=False)), \
        (12,) if rank == 2 else (3, 12)


@pytest.mark.parametrize("rank", [2, 3])
def test_a_qat_mlps_linear_layers_run_as_qgemm_near_the_trainers_eval(tmp_path, rank):
    net, shape = _mlp(rank)
    trainer, path = _trained(net, tmp_path, shape, steps=3)
    onnx.checker.check_model(str(path), full_check=True)
    _session(path, optimized=tmp_path / "ort.onnx")
    kernels = Counter(n.op_type for n in onnx.load(tmp_path / "ort.onnx").graph.node)
    assert kernels["QGemm"] == 2 and not {"Gemm", "MatMul", "DequantizeLinear"} & set(kernels), kernels
    x = np.random.default_rng(1).standard_normal((64, *shape)).astype(np.float32)
    want = trainer.predict({"x": x})["output"]
    hidden = float(trainer.state_dict()["1.aq.scale"][0])
    w2 = np.abs(trainer.state_dict()["2.fc.weight"]).sum(1).max()
    for got in (_session(path).run(None, {"x": x})[0], gc.Session(path, backend="numpy").run({"x": x})["output"]):
        # a hidden value one step off moves a logit by at most |w2 row| * step; a few are, near a tie
        assert np.abs(got - want).max() <= w2 * hidden, (np.abs(got - want).max(), w2 * hidden)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("out_quant", [True, False])
@pytest.mark.parametrize("backend", ["numpy", "ORT_DISABLE_ALL", "ORT_ENABLE_ALL"])
def test_one_quantized_linear_is_within_one_step_of_the_trainers_eval(tmp_path, per_channel, out_quant, backend):
    """Quantized output: QGemm's int32 bias and requantization move a value near a tie one step, no
    further. Float output: what differs is the bias rounded to the input scale times the weight's, at most
    half of it, and float32 sums."""
    net = nn.Sequential(act_quant(), QLinear(24, 8, per_channel=per_channel, out_quant=out_quant))
    trainer, path = _trained(net, tmp_path, (24,))
    _session(path, optimized=tmp_path / "ort.onnx")
    assert "QGemm" in {n.op_type for n in onnx.load(tmp_path / "ort.onnx").graph.node}
    x = np.random.default_rng(2).standard_normal((256, 24)).astype(np.float32)
    want = trainer.predict({"x": x})["output"].astype(np.float64)
    got = gc.Session(path, backend="numpy").run({"x": x})["output"] if backend == "numpy" \
        else _session(path, backend).run(None, {"x": x})[0]
    state = trainer.state_dict()
    if out_quant:
        steps = np.abs(got - want) / float(state["1.aq.scale"][0])
        assert steps.max() <= 1 + 1e-3, steps.max()
        assert (steps > 0.5).mean() < 1e-2, (steps > 0.5).mean()
    else:
        half = 0.5 * float(state["0.scale"][0]) * state["1.wq.scale"].max()
        assert np.abs(got - want).max() <= half + 1e-6 * np.abs(want).max(), (np.abs(got - want).max(), half)


@pytest.mark.parametrize("backend", ["numpy", "ORT_ENABLE_ALL"])
def test_a_quantized_global_average_pool_is_within_one_step(tmp_path, backend):
    """QLinearGlobalAveragePool (onnxruntime's fusion of DequantizeLinear -> GlobalAveragePool ->
    QuantizeLinear, the Flatten after) rounds the integer mean where the eval graph quantizes a float32 mean."""

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_q, self.conv = act_quant(), QConv(3, 16)
            self.pool, self.pool_q = nn.AdaptiveAvgPool2d(1), act_quant()

        def forward(self, x):
            return self.pool_q(gc.flatten(self.pool(self.conv(self.in_q(x))), 1))

    trainer, path = _trained(Pool(), tmp_path, (3, 7, 7))
    _session(path, optimized=tmp_path / "ort.onnx")
    assert "QLinearGlobalAveragePool" in {n.op_type for n in onnx.load(tmp_path / "ort.onnx").graph.node}
    x = np.random.default_rng(4).standard_normal((64, 3, 7, 7)).astype(np.float32)
    want = trainer.predict({"x": x})["output"]
    got = gc.Session(path, backend="numpy").run({"x": x})["output"] if backend == "numpy" \
        else _session(path, backend).run(None, {"x": x})[0]
    steps = np.abs(got.astype(np.float64) - want) / float(trainer.state_dict()["pool_q.scale"][0])
    assert steps.max() <= 1 + 1e-3, steps.max()
