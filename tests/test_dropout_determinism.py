"""Training-mode Dropout reads explicit noise inputs that gc.Trainer draws from its seeded numpy
Generator (saved in checkpoints): resuming replays the uninterrupted run's losses exactly, numpy
and onnxruntime agree step for step, and the gradient through the mask is exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import training_models
from graphc import nn
from graphc.models import EXAMPLES

BACKENDS = ("numpy", "ort-cpu")


class _DropNet(nn.Module):
    def __init__(self, relu: bool = True):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3)
        self.relu = relu

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(self.drop(gc.relu(h) if self.relu else h))


def _arts(loss="ce", optimizer=None):
    model = gc.capture(_DropNet(relu=loss == "ce"), x=gc.spec("float32", ["N", 6]))
    spec = gc.losses.cross_entropy("output", label="y") if loss == "ce" else gc.losses.mse("output", label="y")
    return gc.training.generate(model, spec, optimizer or gc.optim.SGD(0.1, momentum=0.9))


def _batches(count, n=10, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(n, 6)).astype(np.float32), "y": rng.integers(0, 3, n).astype(np.int64)}
            for _ in range(count)]


def test_dropout_becomes_noise_inputs_in_train_step_and_gradients_only():
    arts = _arts()
    for key in ("train_step", "gradients"):
        noise = [e for e in arts.manifest.graphs[key].inputs if e.role == "noise"]
        assert [(e.name, e.dtype, e.shape) for e in noise] == [("dropout_noise.0", "float32", ["N", 8])]
        assert "Dropout" not in {n.op_type for n in arts.graphs[key].proto.graph.node}
    for key in ("eval", "inference"):
        assert not [e for e in arts.manifest.graphs[key].inputs if e.role == "noise"]
    assert "dropout_noise.0" not in arts.state and "dropout_noise.0" not in arts.manifest.feeds.values()


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_reproduces_the_uninterrupted_losses_exactly(backend, tmp_path):
    arts = _arts(optimizer=gc.optim.Adam(0.01))
    batches = _batches(8)
    straight = gc.Trainer(arts, backend=backend, seed=3)
    expected = [straight.step(b) for b in batches]

    first = gc.Trainer(arts, backend=backend, seed=3)
    got = [first.step(b) for b in batches[:3]]
    first.save_checkpoint(tmp_path / "ckpt")
    first.step(batches[3])  # steps after the save must not leak into the resumed run
    resumed = gc.Trainer(arts, backend=backend, seed=99)  # the checkpoint's RNG state wins
    resumed.load_checkpoint(tmp_path / "ckpt")
    got += [resumed.step(b) for b in batches[3:]]
    assert got == expected
    # and the masks really differ from step to step: another seed gives other losses
    other = gc.Trainer(arts, backend=backend, seed=4)
    assert [other.step(b) for b in batches] != expected


def test_resume_from_a_checkpoint_directory_alone(tmp_path):
    """The Trainer built from the checkpoint directory (graphs beside it) replays too."""
    arts = _arts()
    batches = _batches(6)
    straight = gc.Trainer(arts, backend="numpy", seed=1)
    expected = [straight.step(b) for b in batches]
    first = gc.Trainer(arts, backend="numpy", seed=1)
    got = [first.step(b) for b in batches[:2]]
    first.save_checkpoint(tmp_path / "run")
    resumed = gc.Trainer(tmp_path / "run", backend="numpy")
    got += [resumed.step(b) for b in batches[2:]]
    assert got == expected


def test_numpy_and_onnxruntime_agree_with_dropout():
    arts = _arts(optimizer=gc.optim.Adam(0.01))
    batches = _batches(10)
    trainers = {be: gc.Trainer(arts, backend=be, seed=7) for be in BACKENDS}
    curves = {be: [t.step(b) for b in batches] for be, t in trainers.items()}
    np.testing.assert_allclose(curves["numpy"], curves["ort-cpu"], rtol=1e-5, atol=1e-6)


def test_imported_model_with_computed_dropout_shape_trains_deterministically(tmp_path):
    """awkward(): the Dropout input's batch dim comes out of a computed Reshape (no name the
    batch binds): the Trainer measures it, and both backends and a resume still agree."""
    arts = gc.training.generate(training_models.awkward(dropout=0.3), gc.losses.mse("out", label="y"),
                                gc.optim.SGD(0.05, momentum=0.9))
    rng = np.random.default_rng(0)
    batches = [{"x": rng.normal(size=(12, 6)).astype(np.float32), "y": rng.normal(size=(12, 8)).astype(np.float32)}
               for _ in range(5)]
    curves = {}
    for be in BACKENDS:
        t = gc.Trainer(arts, backend=be)
        curves[be] = [t.step(b) for b in batches]
    np.testing.assert_allclose(curves["numpy"], curves["ort-cpu"], rtol=1e-5, atol=1e-7)
    first = gc.Trainer(arts, backend="ort-cpu")
    got = [first.step(b) for b in batches[:2]]
    first.save_checkpoint(tmp_path / "c.safetensors")
    resumed = gc.Trainer(arts, backend="ort-cpu")
    resumed.load_checkpoint(tmp_path / "c.safetensors")
    assert got + [resumed.step(b) for b in batches[2:]] == curves["ort-cpu"]


def test_models_without_dropout_draw_nothing():
    arts = gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    assert not [e for g in arts.manifest.graphs.values() for e in g.inputs if e.role == "noise"]
    trainer = gc.Trainer(arts, backend="numpy")
    before = trainer.rng.bit_generator.state
    rng = np.random.default_rng(0)
    trainer.step({"x": rng.normal(size=(4, 8)).astype(np.float32), "y": rng.integers(0, 4, 4)})
    assert trainer.rng.bit_generator.state == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_gradient_matches_the_closed_form(backend):
    """Linear -> Dropout(0.5) -> Linear, MSE, with fixed noise: every gradient equals the float64
    formula (mask = noise >= 0.5, scale 2)."""
    arts = _arts(loss="mse")
    rng = np.random.default_rng(5)
    n = 7
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = rng.normal(size=(n, 3)).astype(np.float32)
    noise = rng.random((n, 8), dtype=np.float32)
    got = gc.Session(arts.gradients, backend=backend).run({"x": x, "y": y, "dropout_noise.0": noise})

    p = {k: v.astype(np.float64) for k, v in arts.state.items()}
    mask = (noise >= 0.5).astype(np.float64) * 2.0
    h = x @ p["fc1.weight"].T + p["fc1.bias"]
    d = h * mask
    o = d @ p["fc2.weight"].T + p["fc2.bias"]
    loss = np.mean((o - y) ** 2)
    do = 2.0 * (o - y) / o.size
    dh = (do @ p["fc2.weight"]) * mask
    expected = {"fc2.weight_grad": do.T @ d, "fc2.bias_grad": do.sum(0),
                "fc1.weight_grad": dh.T @ x, "fc1.bias_grad": dh.sum(0)}
    np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-6, err_msg=name)
    # a dropped unit passes no gradient back for that sample
    dropped = np.argwhere(noise < 0.5)
    assert len(dropped) and all(abs(dh[i, j]) == 0 for i, j in dropped)


@pytest.mark.parametrize("name", ["dropnet", "transformer"])
def test_artifact_graphs_stay_ai_onnx_and_pass_the_full_checker(name):
    if name == "dropnet":
        arts = _arts()
    else:
        factory, inputs = EXAMPLES["transformer"]
        model = gc.capture(factory(), **inputs())
        arts = gc.training.generate(model, gc.losses.cross_entropy(model.outputs[0].name, label="y"),
                                    gc.optim.AdamW(1e-3))
    for key, graph in arts.graphs.items():
        proto = graph.proto
        onnx.checker.check_model(proto, full_check=True)
        domains = {n.domain for n in proto.graph.node} | {o.domain for o in proto.opset_import}
        assert domains <= {"", "ai.onnx"}, (key, domains)
        if key in ("train_step", "gradients"):
            assert "Dropout" not in {n.op_type for n in proto.graph.node}, key


def test_transformer_example_trains_and_resumes_on_onnxruntime(tmp_path):
    factory, inputs = EXAMPLES["transformer"]
    model = gc.capture(factory(), **inputs())
    arts = gc.training.generate(model, gc.losses.cross_entropy(model.outputs[0].name, label="y"),
                                gc.optim.AdamW(1e-3))
    noise = [e for e in arts.manifest.graphs["train_step"].inputs if e.role == "noise"]
    assert noise, "the transformer example has Dropout"
    rng = np.random.default_rng(0)
    batch = {}
    for e in arts.manifest.graphs["inference"].inputs:
        shape = [4 if isinstance(d, str) else d for d in e.shape]
        batch[e.name] = rng.integers(0, 10, shape) if e.dtype == "int64" else rng.normal(size=shape).astype(np.float32)
    batch["y"] = rng.integers(0, 10, 4)
    trainer = gc.Trainer(arts, backend="ort-cpu")
    losses = [trainer.step(batch) for _ in range(3)]
    trainer.save_checkpoint(tmp_path / "t")
    losses += [trainer.step(batch) for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    resumed = gc.Trainer(arts, backend="ort-cpu")
    resumed.load_checkpoint(tmp_path / "t")
    assert [resumed.step(batch) for _ in range(3)] == losses[3:]
