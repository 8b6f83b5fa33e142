"""float64 BatchNorm keeps ``eps`` a double, as torch: ONNX BatchNormalization's ``epsilon`` attribute is
float32 (1e-5 -> 9.99999974e-6), which put eval outputs and gradients 7e-10 relative off torch float64 and
training-mode ones 3e-10 (std-0.02 inputs) to 1e-8 (std 1e-3). Captures in both modes, SGD Trainer steps
(running statistics included), SyncBatchNorm's written-out gradients graph, InstanceNorm with running
statistics and an exported file run by onnxruntime itself: within 1e-13 of torch on numpy and ort-cpu. The
float32 momentum attribute (0.9 -> 0.899999976) moved a saved capture's running statistics 2.4e-7; it is kept too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
from graphc.passes.values import EPSILON_KEY
from graphc.runtime.staged import StagedRun
from test_norm_double_eps import _Weighted

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
TOL = 1e-13

LAYERS = {  # name: (graphc layer, torch layer's name and args, input shape)
    "BatchNorm1d-2d-input": (lambda: nn.BatchNorm1d(6, dtype="float64"), ("BatchNorm1d", 6), (8, 6)),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(3, dtype="float64"), ("BatchNorm1d", 3), (4, 3, 5)),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3, dtype="float64"), ("BatchNorm2d", 3), (4, 3, 5, 5)),
    "BatchNorm1d-cumulative": (lambda: nn.BatchNorm1d(3, momentum=None, dtype="float64"),
                               ("BatchNorm1d", 3, 1e-5, None), (4, 3, 5)),
    "InstanceNorm1d-tracked": (lambda: nn.InstanceNorm1d(3, affine=True, track_running_stats=True, dtype="float64"),
                               ("InstanceNorm1d", 3, 1e-5, 0.1, True, True), (4, 3, 7)),
}


def _pair(name: str, train: bool):
    """The graphc and torch layers of ``LAYERS[name]`` with the same random float64 parameters and
    statistics (running variances near eps), in mode ``train``."""
    torch = pytest.importorskip("torch")
    make, (torch_name, *args), shape = LAYERS[name]
    layer, twin = make(), getattr(torch.nn, torch_name)(*args).double()
    state = {}
    for key, value in layer.state_dict().items():
        value = np.asarray(value)
        if value.dtype == np.float64:
            value = RNG.uniform(1e-4, 1e-3, value.shape) if "running_var" in key else \
                RNG.normal(1.0 if key.endswith("weight") else 0.0, 0.1, value.shape)
        state[key] = value
    layer.load_state_dict(state)
    twin.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    return layer.train(train), twin.train(train), shape


def _error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("std", [0.02, 1e-3])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_capture_values_and_gradients_match_torch(name, train, std):
    """y and the x, weight and bias gradients of a capture in either mode (``gc.grad``)."""
    torch = pytest.importorskip("torch")
    layer, twin, shape = _pair(name, train)
    x, g = RNG.normal(0.0, std, shape), RNG.normal(size=shape)
    model = gc.capture(_Weighted(layer, g), x=gc.TensorSpec(shape=list(shape), dtype="float64"))
    grads = gc.grad(model, "loss", wrt=["x", "layer.weight", "layer.bias"])
    xt = torch.tensor(x, requires_grad=True)
    yt = twin(xt)
    (yt * torch.tensor(g)).sum().backward()
    want = {"y": yt.detach().numpy(), "x_grad": xt.grad.numpy(), "layer.weight_grad": twin.weight.grad.numpy(),
            "layer.bias_grad": twin.bias.grad.numpy()}
    for backend in BACKENDS:
        got = gc.Session(grads, backend=backend).run({"x": x})
        for key, value in want.items():
            assert _error(got[key], value) < TOL, f"{backend} {key}: {_error(got[key], value):.2g} off torch float64"


class _Net(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return {"output": self.layer(x)}


@pytest.mark.parametrize("std", [0.02, 1e-3])
@pytest.mark.parametrize("captured", ["eval", "train", "saved"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_trainer_steps_and_export_match_torch(tmp_path, name, captured, std):
    """Three SGD steps on each backend (captured in eval or training mode, or in training mode and
    saved: its float32 epsilon and momentum attributes rounded): loss, weight, bias and
    running statistics after each as torch's; then the exported inference file, run by onnxruntime
    directly, and the Trainer's eval graph (its mse against torch's values) are torch's eval()."""
    torch = pytest.importorskip("torch")
    _, _, shape = LAYERS[name]
    batches = [{"x": RNG.normal(0.5, std, shape), "y": RNG.normal(size=shape)} for _ in range(3)]
    x = RNG.normal(0.5, std, shape)
    for backend in BACKENDS:
        layer, twin, _ = _pair(name, captured != "eval")
        twin.train()
        model = gc.capture(_Net(layer), x=gc.TensorSpec(shape=list(shape), dtype="float64"))
        if captured == "saved":
            model = gc.load(model.save(tmp_path / "captured.onnx"))
        trainer = gc.Trainer(gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.5)),
                             backend=backend)
        opt = torch.optim.SGD(twin.parameters(), lr=0.5)
        for step, batch in enumerate(batches):
            loss = trainer.step(batch)
            opt.zero_grad()
            want = torch.nn.functional.mse_loss(twin(torch.tensor(batch["x"])), torch.tensor(batch["y"]))
            want.backward()
            opt.step()
            assert abs(loss - want.item()) <= TOL * abs(want.item()), f"{backend} step {step} loss"
            state = trainer.state_dict()
            kept = [k for k in twin.state_dict() if f"layer.{k}" in state]  # num_batches_tracked with momentum=None
            assert {"weight", "bias", "running_mean", "running_var"} <= set(kept)
            for key in kept:  # the params against 1 (steps of lr * an O(1) gradient), the statistics relative
                got, value = state[f"layer.{key}"], twin.state_dict()[key].numpy()
                error = _error(got, value) * min(1.0, float(np.max(np.abs(value)))) if "running" not in key else \
                    _error(got, value)
                assert error < TOL, f"{backend} step {step} {key}: {error:.2g} off torch float64"
        twin.eval()
        with torch.no_grad():
            want = twin(torch.tensor(x)).numpy()
        path = trainer.export_inference(tmp_path / f"{backend}.onnx")
        onnx.checker.check_model(str(path), full_check=True)
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert _error(session.run(None, {"x": x})[0], want) < TOL, f"{backend}: the exported file in onnxruntime"
        got = trainer.evaluate({"x": x, "y": want})
        rms = float(np.sqrt(got["loss"] / np.mean(want ** 2)))  # its mse against torch's values, relative
        assert rms < 10 * TOL, f"{backend}: the eval graph's output {rms:.2g} (rms) off torch float64"


def test_exported_capture_is_exact_in_onnxruntime(tmp_path):
    """An eval capture saved as a file: its BatchNormalization adds the double eps to the variance
    input (epsilon=0, the double kept in metadata), so onnxruntime alone gives torch's values."""
    torch = pytest.importorskip("torch")
    import onnxruntime

    layer, twin, shape = _pair("BatchNorm2d", False)
    path = tmp_path / "bn.onnx"
    gc.capture(layer, x=gc.TensorSpec(shape=list(shape), dtype="float64")).save(path)
    onnx.checker.check_model(str(path), full_check=True)
    (node,) = [n for n in onnx.load(path).graph.node if n.op_type == "BatchNormalization"]
    assert onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "epsilon")) == 0.0
    assert {e.key: e.value for e in node.metadata_props}[EPSILON_KEY] == "1e-05"
    x = RNG.normal(0.0, 1e-3, shape)
    got = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with torch.no_grad():
        assert _error(got, twin(torch.tensor(x)).numpy()) < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_batchnorm_gradients_graph_matches_torch(tmp_path, backend):
    """SyncBatchNorm's gradients graph (the batch statistics written out around the exchanges), one
    process, from a saved capture (its epsilon attribute rounded): loss, gradients and running
    statistics as torch's BatchNorm on the batch."""
    torch = pytest.importorskip("torch")
    shape = (6, 3, 4)
    layer, twin = nn.SyncBatchNorm(3, dtype="float64"), torch.nn.BatchNorm1d(3).double()
    gc.capture(_Net(layer.train()), x=gc.TensorSpec(shape=list(shape), dtype="float64")).save(tmp_path / "m.onnx")
    arts = gc.training.generate(gc.load(tmp_path / "m.onnx"), gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    batch = {"x": RNG.normal(0.0, 1e-3, shape), "y": RNG.normal(size=shape)}
    got = StagedRun(arts.gradients, backend).run([{**batch, **arts.state}], [1.0])[0]
    loss = torch.nn.functional.mse_loss(twin(torch.tensor(batch["x"])), torch.tensor(batch["y"]))
    loss.backward()
    assert abs(got["loss"] - loss.item()) <= TOL * loss.item()
    for key, param in twin.named_parameters():
        assert _error(got[f"layer.{key}_grad"], param.grad.numpy()) < TOL, key
    for key in ("running_mean", "running_var"):
        assert _error(got[f"layer.{key}.next"], getattr(twin, key).numpy()) < TOL, key


@pytest.mark.parametrize("dtype, eps, exact", [("float32", 1e-5, False), ("float16", 1e-5, False),
                                               ("float64", 2.0 ** -10, False), ("float64", 1e-5, True)])
def test_plain_node_where_the_attribute_holds_eps(dtype, eps, exact):
    """Only a float64 BatchNorm whose eps float32 cannot hold records it and, in eval mode, adds it
    to the variance input; the others keep the one node with its attribute."""
    for train in (False, True):
        layer = nn.BatchNorm1d(4, eps=eps, dtype=dtype).train(train)
        model = gc.capture(layer, x=gc.TensorSpec(shape=[3, 4], dtype=dtype))
        (node,) = [n for n in model.ir.graph if n.op_type == "BatchNormalization"]
        assert (EPSILON_KEY in node.metadata_props) == exact
        assert node.attributes.get_float("epsilon") == (0.0 if exact and not train else eps)
        added = node.inputs[4].producer() is not None and node.inputs[4].producer().op_type == "Add"
        assert added == (exact and not train)
