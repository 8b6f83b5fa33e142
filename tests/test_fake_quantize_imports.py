"""An imported QuantizeLinear + DequantizeLinear pair (torch.onnx's export of
``torch.fake_quantize_per_tensor_affine``, either exporter) trains with torch's straight-through
gradient: ``dy`` where the rounded value is in range, else 0 (``torch_gradients.straight_through``).
Before, no gradient went through the pair and every param before it got zero, silently."""

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


def test_a_per_channel_pair_is_refused_by_name():
    scale, zero = helper.make_tensor("s", TensorProto.FLOAT, [3], [0.1, 0.2, 0.3]), \
        helper.make_tensor("z", TensorProto.INT8, [3], [0, 0, 0])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], RNG.standard_normal(6).tolist())
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant", axis=1),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], axis=1),
         helper.make_node("MatMul", ["d", "w"], ["out"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2])], [scale, zero, weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # a param before the pair: it needs the gradient through it
    model.graph.node.insert(0, helper.make_node("Mul", ["x0", "w0"], ["x"]))
    model.graph.input[0].name = "x0"
    model.graph.initializer.append(helper.make_tensor("w0", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]))
    onnx.checker.check_model(model, full_check=True)
    with pytest.raises(PassError, match=r"QuantizeLinear 'quant'.*per tensor.*scale 's' of shape \[3\]"):
        gc.training.generate(gc.load(model.SerializeToString()), gc.losses.mse("out", label="y"), gc.optim.SGD(0.1))
