"""Training-mode Dropout on onnxruntime: its graph optimizer's EliminateDropout removed a Dropout
that feeds another op whatever its ``training_mode`` (``backends/dropout.py``). Each layer drops
on ort-cpu as on numpy and as torch does: the dropped fraction near ``p``, kept and dropped values
torch's; a fed ``training_mode`` is honoured; eval-mode sessions keep the optimization."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import graphc as gc
from graphc import nn

torch = pytest.importorskip("torch")

P = 0.3
# (gc layer or function, torch function, input shape, how many leading dims one draw covers)
CASES = {
    "Dropout": (lambda: nn.Dropout(P), lambda t: torch.nn.functional.dropout(t, P, True), (64, 256), 2),
    "F.dropout": (lambda: lambda x: gc.nn.functional.dropout(x, P, training=True),
                  lambda t: torch.nn.functional.dropout(t, P, True), (64, 256), 2),
    "Dropout1d": (lambda: nn.Dropout1d(P), torch.nn.Dropout1d(P), (32, 64, 5), 2),
    "Dropout2d": (lambda: nn.Dropout2d(P), torch.nn.Dropout2d(P), (32, 64, 3, 2), 2),
    "Dropout3d": (lambda: nn.Dropout3d(P), torch.nn.Dropout3d(P), (32, 64, 2, 2, 2), 2),
    "AlphaDropout": (lambda: nn.AlphaDropout(P), lambda t: torch.nn.functional.alpha_dropout(t, P, True),
                     (64, 256), 2),
}


class _AfterRelu(nn.Module):
    """``2 * layer(relu(x))``: the Dropout reads a computed value and feeds another op."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(gc.relu(x)) * 2.0


def _torch_branches(fn, x: np.ndarray) -> tuple[float, float, float]:
    """(slope, offset) of torch's kept values ``slope * x + offset`` and its dropped value: two runs
    with one seed draw one mask, and each output is affine in ``x`` for a fixed mask."""
    outs = []
    for scale in (1.0, 2.0):
        torch.manual_seed(0)
        outs.append((2.0 * fn(torch.relu(torch.from_numpy(x * scale)))).numpy().astype(np.float64))
    slope = (outs[1] - outs[0]) / x
    kept = np.abs(slope) > 1e-3
    assert 0 < kept.mean() < 1
    return slope[kept].mean(), (outs[0] - slope * x)[kept].mean(), outs[0][~kept].mean()


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
@pytest.mark.parametrize("case", list(CASES))
def test_training_mode_dropout_drops_p_and_scales_the_rest_as_torch(case, backend):
    make, torch_fn, shape, lead = CASES[case]
    x = np.random.default_rng(3).uniform(0.5, 2.0, shape).astype(np.float32)
    layer = make()
    if isinstance(layer, nn.Module):
        layer.train()
    model = gc.capture(_AfterRelu(layer), x=gc.spec("float32", list(shape)))
    onnx.checker.check_model(model.proto, full_check=True)
    y = gc.Session(model, backend=backend).run({"x": x})["output"].astype(np.float64)
    slope, offset, dropped_value = _torch_branches(torch_fn, x)
    kept = np.isclose(y, slope * x + offset, rtol=1e-5, atol=1e-5)
    dropped = np.isclose(y, dropped_value, rtol=1e-5, atol=1e-5)
    assert np.all(kept ^ dropped), "every value is torch's kept or dropped value, never both"
    per_draw = dropped.reshape(*shape[:lead], -1)
    assert np.all(per_draw == per_draw[..., :1]), "one draw per channel"
    assert abs(dropped.mean() - P) < 0.05


def _fed_mode_model() -> gc.Model:
    """``-Dropout(relu(x), 0.3, training_mode)`` with ``training_mode`` a graph input."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Dropout", ["r", "ratio", "train"], ["d"]),
             helper.make_node("Neg", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "fed", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [64, 256]),
                                             helper.make_tensor_value_info("train", onnx.TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, 256])],
                              [numpy_helper.from_array(np.array(P, np.float32), "ratio")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def test_a_fed_training_mode_is_honoured_on_ort_cpu():
    x = np.random.default_rng(4).uniform(0.5, 2.0, (64, 256)).astype(np.float32)
    session = gc.Session(_fed_mode_model(), backend="ort-cpu")
    np.testing.assert_array_equal(session.run({"x": x, "train": np.array(False)})["y"], -x)
    y = session.run({"x": x, "train": np.array(True)})["y"]
    dropped = y == 0
    np.testing.assert_allclose(y[~dropped], -x[~dropped] / (1 - P), rtol=1e-6)
    assert abs(dropped.mean() - P) < 0.05


@pytest.mark.parametrize("training", [False, True])
def test_only_a_dropout_that_may_train_turns_the_optimization_off(training):
    """onnxruntime's optimized graph (``Session.placement``) has no Dropout left in eval mode, as
    before: inference sessions keep EliminateDropout; a training-mode one keeps its node."""
    net = _AfterRelu(nn.Dropout(P))
    net.train(training)
    model = gc.capture(net, x=gc.spec("float32", ["N", 8]))
    (name,) = [node.name for node in model.proto.graph.node if node.op_type == "Dropout"]
    assert (name in gc.Session(model, backend="ort-cpu").placement) == training
