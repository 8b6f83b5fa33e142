"""Artifacts and a checkpoint graphc wrote at format 3 (``tests/data/format3_adamw``, by commit
2f57861: ``training_models.mlp()``, ``AdamW(0.01, betas=(0.8, 0.99), weight_decay=0.1)``, a
checkpoint after three steps on the numpy backend), whose Adam first moment is PyTorch's average
``exp_avg`` where today's graphs keep the sum ``exp_sum``: they still train, their update rebuilt
from the manifest (data-parallel training's) is their own train_step's, and the checkpoint
resumes on today's graphs of the same model, which do not write theirs beside the old graphs."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import graphc as gc
import training_models
from graphc.compile.training import update_model
from graphc.runtime import checkpoint as ckpt
from graphc.runtime.checkpoint import CheckpointError

FIXTURE = Path(__file__).parent / "data" / "format3_adamw"
SPEC = gc.optim.AdamW(0.01, betas=(0.8, 0.99), weight_decay=0.1)


def batches(n=6):
    """The checkpoint's three batches, then three more."""
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(6, 8)).astype(np.float32), "y": rng.integers(0, 4, 6)} for _ in range(n)]


def test_the_checkpoint_resumes_on_its_own_graphs_and_on_todays():
    old = gc.Trainer(FIXTURE, backend="numpy")  # the artifacts saved beside it
    assert old.manifest.format == "graphc.training/3" and old.step_count == 3
    assert "fc1.weight.exp_avg" in old.state_dict()
    data = batches()
    want = [old.step(b) for b in data[3:]]
    today = gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"), SPEC)
    resumed = gc.Trainer(today, backend="numpy")
    resumed.load_checkpoint(FIXTURE)
    assert resumed.step_count == 3 and "fc1.weight.exp_sum" in resumed.state_dict()
    straight = gc.Trainer(today, backend="numpy")
    losses = [straight.step(b) for b in data]
    np.testing.assert_allclose([resumed.step(b) for b in data[3:]], want, rtol=1e-6)
    np.testing.assert_allclose(losses[3:], want, rtol=1e-6)


def test_its_update_rebuilt_from_the_manifest_is_its_train_step():
    arts = gc.training.load(FIXTURE / "artifacts")
    state = arts.manifest.pack(ckpt.load(FIXTURE)[0])
    feeds = {**batches()[3], **state}
    take = lambda model: {n: feeds[n] for n in (s.name for s in model.inputs) if n in feeds}
    want = gc.Session(arts.train_step, backend="numpy").run(take(arts.train_step))
    feeds.update(gc.Session(arts.gradients, backend="numpy").run(take(arts.gradients)))
    update = update_model(arts.manifest)
    assert any(s.name.endswith(".exp_avg") for s in update.inputs)
    got = gc.Session(update, backend="numpy").run(take(update))
    assert got.keys() == {n for n in want if n not in ("loss", "logits")}
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_todays_checkpoint_is_not_written_beside_format_3_graphs(tmp_path):
    """The folder would hold a checkpoint its own graphs cannot read: refused, nothing changed,
    the folder still resumes on its own graphs."""
    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    today = gc.Trainer(gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"),
                                            SPEC), backend="numpy")
    today.load_checkpoint(folder)
    with pytest.raises(CheckpointError, match=r"format 3 .*first moment as an average.*resume with those graphs"):
        today.save_checkpoint(folder)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert gc.Trainer(folder, backend="numpy").step_count == 3
