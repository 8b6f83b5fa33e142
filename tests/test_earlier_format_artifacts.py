"""Artifacts and a checkpoint graphc wrote at earlier formats, whose Adam moments are PyTorch's
averages where today's graphs keep sums: ``tests/data/format3_adamw`` (by commit 2f57861:
``training_models.mlp()``, ``AdamW(0.01, betas=(0.8, 0.99), weight_decay=0.1)``, a checkpoint
after three steps on the numpy backend; ``exp_avg`` and ``exp_avg_sq``) and
``tests/data/format5_adamw_amsgrad`` (by commit cd95fc3, the same with ``amsgrad=True``;
``exp_sum``, ``exp_avg_sq`` and ``max_exp_avg_sq``). They still train, their update rebuilt from
the manifest (data-parallel training's) is their own train_step's, and the checkpoint resumes on
today's graphs of the same model (its averages turned into sums), which do not write theirs
beside the old graphs."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import graphc as gc
import training_models
from graphc.compile.training import update_model
from graphc.runtime import checkpoint as ckpt
from graphc.runtime.checkpoint import CheckpointError

DATA = Path(__file__).parent / "data"
# fixture folder -> (its format, its spec, {slot it holds: today's slot, and the beta of the factor between})
FIXTURES = {
    "format3_adamw": ("graphc.training/3", gc.optim.AdamW(0.01, betas=(0.8, 0.99), weight_decay=0.1),
                      {"exp_avg": ("exp_sum", 0.8), "exp_avg_sq": ("exp_sum_sq", 0.99)}),
    "format5_adamw_amsgrad": ("graphc.training/5",
                              gc.optim.AdamW(0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True),
                              {"exp_avg_sq": ("exp_sum_sq", 0.99), "max_exp_avg_sq": ("max_exp_sum_sq", 0.99)}),
}
each = pytest.mark.parametrize("name", list(FIXTURES))


def batches(n=6):
    """The checkpoint's three batches, then three more."""
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(6, 8)).astype(np.float32), "y": rng.integers(0, 4, 6)} for _ in range(n)]


def today(spec):
    return gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"), spec)


@each
def test_the_checkpoint_resumes_on_its_own_graphs_and_on_todays(name):
    fmt, spec, renamed = FIXTURES[name]
    old = gc.Trainer(DATA / name, backend="numpy")  # the artifacts saved beside it
    assert old.manifest.format == fmt and old.step_count == 3
    assert {f"fc1.weight.{slot}" for slot in renamed} <= set(old.state_dict())
    data = batches()
    want = [old.step(b) for b in data[3:]]
    resumed = gc.Trainer(today(spec), backend="numpy")
    resumed.load_checkpoint(DATA / name)
    assert resumed.step_count == 3 and {f"fc1.weight.{s}" for s, _ in renamed.values()} <= set(resumed.state_dict())
    straight = gc.Trainer(today(spec), backend="numpy")
    losses = [straight.step(b) for b in data]
    np.testing.assert_allclose([resumed.step(b) for b in data[3:]], want, rtol=1e-6)
    np.testing.assert_allclose(losses[3:], want, rtol=1e-6)
    state = resumed.state_dict()
    for key, value in old.state_dict().items():  # each average went on as the sum over 1 - beta
        param, _, slot = key.rpartition(".")
        now, beta = renamed.get(slot, (None, None))
        got = state[key] if now is None else state[f"{param}.{now}"] * np.float32(1 - beta)
        np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-8, err_msg=key)


@each
def test_its_update_rebuilt_from_the_manifest_is_its_train_step(name):
    arts = gc.training.load(DATA / name / "artifacts")
    state = arts.manifest.pack(ckpt.load(DATA / name)[0])
    feeds = {**batches()[3], **state}
    take = lambda model: {n: feeds[n] for n in (s.name for s in model.inputs) if n in feeds}
    want = gc.Session(arts.train_step, backend="numpy").run(take(arts.train_step))
    feeds.update(gc.Session(arts.gradients, backend="numpy").run(take(arts.gradients)))
    update = update_model(arts.manifest)
    assert {s.name.rpartition(".")[2] for s in update.inputs} >= set(FIXTURES[name][2])
    got = gc.Session(update, backend="numpy").run(take(update))
    assert got.keys() == {n for n in want if n not in ("loss", "logits")}
    for key, value in got.items():
        np.testing.assert_allclose(value, want[key], rtol=1e-6, atol=1e-7, err_msg=key)


@each
def test_todays_checkpoint_is_not_written_beside_earlier_graphs(tmp_path, name):
    """The folder would hold a checkpoint its own graphs cannot read: refused, nothing changed,
    the folder still resumes on its own graphs."""
    folder = tmp_path / "run"
    shutil.copytree(DATA / name, folder)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    trainer = gc.Trainer(today(FIXTURES[name][1]), backend="numpy")
    trainer.load_checkpoint(folder)
    with pytest.raises(CheckpointError, match=r"earlier format .*moments as averages.*resume with those graphs"):
        trainer.save_checkpoint(folder)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert gc.Trainer(folder, backend="numpy").step_count == 3
