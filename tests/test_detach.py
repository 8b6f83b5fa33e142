"""``gc.detach`` / ``Tensor.detach()``: the value passes, no gradient flows back, against
torch.autograd and torch.optim (float64); the stop-gradient mark survives save/load and
``gc.optimize`` below level 3."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.passes.values import STOP_GRADIENT_KEY

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}


class _Quantized(gc.nn.Module):
    """A straight-through estimator (``h + (round(h) - h).detach()``) regressed onto a target
    network's detached output, as DQN's target or BYOL's teacher."""

    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(4, 3, **F64)
        self.target = gc.nn.Linear(4, 3, **F64)

    def forward(self, x):
        h = self.fc(x) * 2.0
        ste = h + (h.round() - h).detach()
        return ((ste - gc.detach(self.target(x))) ** 2).mean() + (h * h).mean() * 0.25


def _torch_loss(state: dict, x: np.ndarray):
    """The same loss in torch, its parameters leaves that require grad."""
    p = {k: torch.tensor(v, requires_grad=True) for k, v in state.items()}
    x = torch.from_numpy(x)
    h = (x @ p["fc.weight"].T + p["fc.bias"]) * 2.0
    ste = h + (h.round() - h).detach()
    target = x @ p["target.weight"].T + p["target.bias"]
    return ((ste - target.detach()) ** 2).mean() + (h * h).mean() * 0.25, p


def _net_and_batch(seed: int = 3):
    return _Quantized(), np.random.default_rng(seed).standard_normal((6, 4)) * 2


def _check_grads(model: gc.Model, state: dict, x: np.ndarray) -> None:
    want, leaves = _torch_loss(state, x)
    want.backward()
    got = gc.Session(gc.grad(model, "output", wrt=list(state)), backend="numpy").run({"x": x})
    np.testing.assert_allclose(got["output"], want.item(), rtol=1e-12)
    for name, leaf in leaves.items():
        expected = np.zeros_like(state[name]) if leaf.grad is None else leaf.grad.numpy()
        np.testing.assert_allclose(got[f"{name}_grad"], expected, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("level", [None, 1, 2])
def test_gradients_stop_at_detach_like_torch(level):
    """capture (-> optimize) -> grad: the STE's gradient is the identity's, the target network
    gets none (zeros, where torch leaves ``.grad`` None)."""
    net, x = _net_and_batch()
    model = gc.capture(net, x=gc.spec("float64", ("N", 4)))
    if level is not None:
        model = gc.optimize(model, level=level)
        assert sum(n.metadata_props.get(STOP_GRADIENT_KEY) == "true" for n in model.ir.graph) == 2
    _check_grads(model, net.state_dict(), x)


def test_mark_survives_save_and_load(tmp_path):
    net, x = _net_and_batch(seed=5)
    path = tmp_path / "m.onnx"
    gc.capture(net, x=x).save(path)
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    marked = [n for n in proto.graph.node if any(p.key == STOP_GRADIENT_KEY for p in n.metadata_props)]
    assert [n.op_type for n in marked] == ["Identity", "Identity"]
    _check_grads(gc.load(path), net.state_dict(), x)


def test_inference_level_drops_the_marks_not_the_values():
    net, x = _net_and_batch()
    model = gc.capture(net, x=gc.spec("float64", ("N", 4)))
    optimized = gc.optimize(model, level=3)
    assert "Identity" not in [n.op_type for n in optimized.ir.graph]
    np.testing.assert_allclose(gc.Session(optimized, backend="ort-cpu").run({"x": x})["output"],
                               _torch_loss(net.state_dict(), x)[0].item(), rtol=1e-12)


def test_training_steps_match_torch_and_detached_params_stay_put():
    """Three Adam steps with weight decay: torch.optim skips the target network (its grads are
    None), so graphc does not train it either (manifest.frozen), and the STE branch trains."""
    net, _ = _net_and_batch(seed=7)
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 4))), "output",
                                gc.optim.Adam(0.0625, weight_decay=0.125))  # exact in float32
    state = net.state_dict()
    assert arts.manifest.trainable == ["fc.weight", "fc.bias"]
    assert arts.manifest.frozen == ["target.weight", "target.bias"]
    trainer = gc.Trainer(arts, backend="ort-cpu")
    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in state.items()}
    opt = torch.optim.Adam(leaves.values(), lr=0.0625, weight_decay=0.125)
    rng = np.random.default_rng(11)
    for step in range(3):
        x = rng.standard_normal((6, 4)) * 2
        loss = trainer.step({"x": x})
        opt.zero_grad()
        want, fresh = _torch_loss({k: v.detach().numpy() for k, v in leaves.items()}, x)
        want.backward()
        for name, leaf in leaves.items():
            leaf.grad = fresh[name].grad
        opt.step()
        np.testing.assert_allclose(loss, want.item(), rtol=1e-10, err_msg=f"step {step}")
        params = trainer.params
        for name, leaf in leaves.items():
            np.testing.assert_allclose(params.get(name, state[name]), leaf.detach().numpy(), rtol=1e-9, atol=1e-12,
                                       err_msg=f"step {step} {name}")
    np.testing.assert_array_equal(leaves["target.weight"].detach().numpy(), state["target.weight"])


def test_cse_keeps_a_detach_apart_from_a_plain_identity_of_the_same_value():
    """An imported graph's own Identity and a marked one read the same value: merging them
    would lose (or add) the stop-gradient. d/dw sum(x*w + detach(x*w)**2) = x."""
    h = onnx.helper
    marked = h.make_node("Identity", ["h"], ["s"])
    marked.metadata_props.add(key=STOP_GRADIENT_KEY, value="true")
    graph = h.make_graph(
        [h.make_node("Mul", ["x", "w"], ["h"]), h.make_node("Identity", ["h"], ["p"]), marked,
         h.make_node("Mul", ["s", "s"], ["s2"]), h.make_node("Add", ["p", "s2"], ["t"]),
         h.make_node("ReduceSum", ["t"], ["loss"], keepdims=0)], "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [3])],
        [h.make_tensor_value_info("loss", onnx.TensorProto.DOUBLE, [])],
        [onnx.numpy_helper.from_array(np.array([0.5, -1.5, 2.0]), "w")])
    model = gc.optimize(gc.load(h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])), level=1)
    x = np.array([1.0, 2.0, -3.0])
    got = gc.Session(gc.grad(model, "loss", wrt=["w"]), backend="numpy").run({"x": x})
    np.testing.assert_allclose(got["w_grad"], x, rtol=1e-12)
