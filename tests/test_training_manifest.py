"""The artifacts carry what a Trainer needs (issue 13, item 3): output roles and feeds set where
the outputs are made, the default metrics, and a ``noise_shapes`` graph where Dropout noise
cannot be sized from the batch; format-1 folders still load, or ask to be regenerated."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import graphc as gc
from graphc import nn

try:
    import training_models
except ImportError:  # tests/ collected as a package
    from tests import training_models


def _awkward_batch(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 6)).astype(np.float32), "y": rng.normal(size=(n, 8)).astype(np.float32)}


def _awkward_arts():
    return gc.training.generate(training_models.awkward(dropout=0.3), gc.losses.mse("out", label="y"),
                                gc.optim.SGD(0.05, momentum=0.9))


def test_every_train_step_output_feeds_an_input_of_its_own_role():
    arts = gc.training.generate(training_models.batchnorm(), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.AdamW(0.01), fused=False)
    step = arts.manifest.graphs["train_step"]
    inputs = {e.name: e for e in step.inputs}
    outputs = {e.name: e for e in step.outputs}
    assert set(arts.manifest.feeds) == set(outputs) - {"loss", "logits"} and outputs["loss"].role == "loss"
    assert outputs["logits"].role == "prediction"  # the loss's input, for the train metrics
    evaluated = {e.name: e for e in arts.manifest.graphs["eval"].outputs}["logits"]
    assert (outputs["logits"].dtype, outputs["logits"].shape) == (evaluated.dtype, evaluated.shape)
    for out, fed in arts.manifest.feeds.items():
        assert outputs[out].role == inputs[fed].role, (out, fed)
        assert (outputs[out].dtype, outputs[out].shape) == (inputs[fed].dtype, inputs[fed].shape)
    grads = arts.manifest.graphs["gradients"].outputs
    assert {e.name: e.role for e in grads if e.role == "grad"} == {f"{p}_grad": "grad" for p in arts.manifest.trainable}


@pytest.mark.parametrize(("loss", "classes", "expected"), [
    ("cross_entropy", 10, ["accuracy", "top5_accuracy"]), ("cross_entropy", 4, ["accuracy"]), ("mse", 3, ["mse", "mae"]),
])
def test_the_manifest_records_the_metrics_evaluate_reports(loss, classes, expected):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, classes)

        def forward(self, x):
            return self.fc(x)

    spec = getattr(gc.losses, loss)("output", label="y")
    arts = gc.training.generate(gc.capture(Net(), x=gc.spec("float32", ("N", 5))), spec, gc.optim.SGD(0.1))
    assert arts.manifest.metrics == expected
    rng = np.random.default_rng(0)
    y = rng.integers(0, classes, 6) if loss == "cross_entropy" else rng.normal(size=(6, classes)).astype(np.float32)
    report = gc.Trainer(arts, backend="numpy").evaluate({"x": rng.normal(size=(6, 5)).astype(np.float32), "y": y})
    assert sorted(report) == sorted(["loss", *expected])


def test_noise_the_batch_cannot_size_comes_with_a_noise_shapes_graph_without_weights():
    arts = _awkward_arts()
    entry = arts.manifest.graphs["noise_shapes"]
    assert [(e.name, e.role) for e in entry.outputs] == [("dropout_noise.0.shape", "noise_shape")]
    assert [e.name for e in entry.inputs] == ["x"]
    shapes = gc.Session(arts.noise_shapes, backend="numpy").run({"x": _awkward_batch(12)["x"]})
    assert shapes["dropout_noise.0.shape"].tolist() == [12, 8]  # awkward(): Dropout's input is [B, 8]
    weights = [a for a in arts.noise_shapes.params.values() if a.size > 1]
    assert weights == []
    captured = gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"),
                                    gc.optim.SGD(0.1))
    assert "noise_shapes" not in captured.manifest.graphs and captured.noise_shapes is None


def test_noise_shapes_graph_saves_loads_and_drives_the_trainer(tmp_path):
    arts = _awkward_arts()
    arts.save(tmp_path / "arts")
    assert (tmp_path / "arts" / "noise_shapes.onnx").is_file()
    loaded = gc.training.load(tmp_path / "arts")
    batches = [_awkward_batch(12, seed=s) for s in range(3)]
    in_memory = [gc.Trainer(arts, backend="numpy", seed=2).step(b) for b in batches[:1]]
    trainer = gc.Trainer(loaded, backend="numpy", seed=2)
    assert [trainer.step(b) for b in batches[:1]] == in_memory
    # the noise drawn is the one the graph sized: the same draw fed by hand gives the same loss
    noise = np.random.default_rng(2).random((12, 8), dtype=np.float32)
    fed = gc.Trainer(loaded, backend="numpy", seed=99).step({**batches[0], "dropout_noise.0": noise})
    assert fed == in_memory[0]


def _as_format_1(directory):
    """Turn a saved artifact folder into what graphc wrote before format 2."""
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["format"] = "graphc.training/1"
    manifest.pop("metrics")
    if manifest["graphs"].pop("noise_shapes", None):
        (directory / "noise_shapes.onnx").unlink()
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_format_1_folders_load_and_train(tmp_path):
    arts = gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(0.1, momentum=0.9))
    arts.save(tmp_path / "new")
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    _as_format_1(tmp_path / "old")
    old = gc.training.load(tmp_path / "old")
    assert old.manifest.format == "graphc.training/1" and old.manifest.metrics == []
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(6, 8)).astype(np.float32), "y": rng.integers(0, 4, 6)}
    losses = {key: [gc.Trainer(tmp_path / key, backend="numpy").step(batch) for _ in range(1)] for key in ("new", "old")}
    assert losses["old"] == losses["new"]
    assert sorted(gc.Trainer(tmp_path / "old", backend="numpy").evaluate(batch)) == ["accuracy", "loss"]


def test_format_1_folder_whose_noise_needs_the_graph_asks_to_regenerate(tmp_path):
    _awkward_arts().save(tmp_path / "old")
    _as_format_1(tmp_path / "old")
    trainer = gc.Trainer(tmp_path / "old", backend="numpy")
    with pytest.raises(gc.training.ArtifactsError, match=r"'dropout_noise.0'.*graphc.training/1.*regenerate"):
        trainer.step(_awkward_batch())
    noise = np.random.default_rng(0).random((12, 8), dtype=np.float32)
    assert np.isfinite(trainer.step({**_awkward_batch(), "dropout_noise.0": noise}))  # fed by hand: fine
