"""Train metrics on the epoch lines (issue 15, item 3): computed, as Keras does, from the
training steps' own predictions (the train_step ``prediction`` output), checked against a numpy
recomputation over the epoch's batches with the params each batch saw (lr set to 0 keeps them)."""

from __future__ import annotations

import csv
import json
import warnings

import numpy as np
import pytest

import graphc as gc
from graphc.runtime.history import EpochRecord
from graphc.runtime.progress import TrainProgress

import training_models
from trainer_models import blobs, without_prediction


def _forward(state, x):
    """The mlp of ``training_models.mlp`` in float64 numpy."""
    h = np.maximum(x @ state["fc1.weight"].T.astype(np.float64) + state["fc1.bias"], 0)
    return h @ state["fc2.weight"].T.astype(np.float64) + state["fc2.bias"]


def _epoch_batches(loader, epoch):
    return list(loader.iter_epoch(epoch))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_classifier_train_metrics_equal_numpy_over_the_epochs_batches(backend):
    arts = gc.training.generate(training_models.mlp(classes=7), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(0.1))
    assert {e.name: e.role for e in arts.manifest.graphs["train_step"].outputs}["logits"] == "prediction"
    data = blobs(50, classes=7)
    loader = gc.data.DataLoader(data, batch_size=16, seed=2)  # 4 batches, the last of 2
    trainer = gc.Trainer(arts, backend=backend)
    trainer.lr = 0.0  # params stay at arts.state
    history = trainer.fit(loader, 2, progress=False)
    for epoch, record in enumerate(history.epochs):
        hits = top5 = rows = 0
        for batch in _epoch_batches(loader, epoch):
            logits = _forward(arts.state, batch["x"])
            hits += int((logits.argmax(1) == batch["y"]).sum())
            top5 += int((np.argsort(-logits, 1)[:, :5] == batch["y"][:, None]).any(1).sum())
            rows += len(batch["y"])
        assert sorted(record.metrics) == ["accuracy", "top5_accuracy"]
        assert record.metrics["accuracy"] == pytest.approx(hits / rows, abs=1e-12)
        assert record.metrics["top5_accuracy"] == pytest.approx(top5 / rows, abs=1e-12)


def test_train_metrics_count_only_the_labels_the_loss_counts():
    """With ignored labels a batch's accuracy is a mean over its other labels; the epoch's was
    weighted by rows (0.575 for 0.346 here, most of the first batch ignored)."""
    arts = gc.training.generate(training_models.mlp(classes=7), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(0.1))
    data = blobs(40, classes=7)
    data["y"][:14] = -100  # the first batch (no shuffle) mostly ignored
    loader = gc.data.DataLoader(data, batch_size=16, shuffle=False)
    trainer = gc.Trainer(arts, backend="numpy")
    trainer.lr = 0.0
    record = trainer.fit(loader, 1, progress=False).epochs[0]
    kept = data["y"] != -100
    logits = _forward(arts.state, data["x"][kept])
    assert record.metrics["accuracy"] == pytest.approx(float((logits.argmax(1) == data["y"][kept]).mean()), abs=1e-12)


def test_regression_train_metrics_equal_numpy_and_reach_history_and_the_log(tmp_path):
    arts = gc.training.generate(training_models.mlp(classes=2), gc.losses.mse("logits", label="t"), gc.optim.SGD(0.1))
    rng = np.random.default_rng(3)
    data = {"x": rng.normal(size=(30, 8)).astype(np.float32), "t": rng.normal(size=(30, 2)).astype(np.float32)}
    loader = gc.data.DataLoader(data, batch_size=8, seed=0)
    log = tmp_path / "history.jsonl"
    trainer = gc.Trainer(arts, backend="numpy")
    trainer.lr = 0.0
    history = trainer.fit(loader, 1, progress=False, log=log)
    err = np.concatenate([_forward(arts.state, b["x"]) - b["t"] for b in _epoch_batches(loader, 0)])
    # per-batch means weighted by batch size: the mean over all elements (every row has 2)
    assert history.epochs[0].metrics["mse"] == pytest.approx(np.mean(err ** 2), rel=1e-6)
    assert history.epochs[0].metrics["mae"] == pytest.approx(np.mean(np.abs(err)), rel=1e-6)
    # the epoch's loss too (batches of 8, 8, 8 and 6): it was the plain mean of the four steps'
    assert history.epochs[0].loss == pytest.approx(np.mean(err ** 2), rel=1e-6)
    assert json.loads(log.read_text())["metrics"] == history.epochs[0].metrics


def test_train_metrics_follow_the_params_each_step_saw_and_reach_csv_and_the_line(tmp_path, capsys):
    """With a real learning rate each step's metric uses the params before its update: the
    prediction the step computed its loss from."""
    arts = gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(0.5))
    data = blobs(40, classes=4)
    loader = gc.data.DataLoader(data, batch_size=10, seed=1)
    trainer = gc.Trainer(arts, backend="numpy", metrics=["accuracy"])
    hits = 0
    for batch in _epoch_batches(loader, 0):  # the oracle: params read before each step
        hits += int((_forward(trainer.params, batch["x"]).argmax(1) == batch["y"]).sum())
        trainer.step(batch)
    again = gc.Trainer(arts, backend="numpy", metrics=["accuracy"])
    history = again.fit(loader, 1, progress=False, log=tmp_path / "h.csv")
    assert history.epochs[0].metrics == {"accuracy": pytest.approx(hits / 40, abs=1e-12)}
    row = next(csv.DictReader((tmp_path / "h.csv").open()))
    assert float(row["train_accuracy"]) == history.epochs[0].metrics["accuracy"]
    assert f"loss {history.epochs[0].loss:.4f}  accuracy {hits / 40:.4f}  " in capsys.readouterr().out


def test_epoch_line_shows_train_metrics_before_eval_ones():
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    record = EpochRecord(epoch=1, loss=0.5, steps=2, samples=8, seconds=1.0, samples_per_s=8.0,
                                    metrics={"accuracy": 0.25}, eval={"loss": 0.75, "accuracy": 0.5})
    TrainProgress(3, 2, bar=False, console=Console(file=out, width=200)).epoch_done(record)
    assert out.getvalue().startswith("epoch 1/3  loss 0.5000  accuracy 0.2500  eval loss 0.7500  eval accuracy 0.5000")


def test_folders_without_the_prediction_output_train_without_train_metrics_said_once(tmp_path):
    arts = gc.training.generate(training_models.mlp(), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(0.1))
    arts.save(tmp_path / "old")
    without_prediction(tmp_path / "old", "train_step", "graphc.training/2")
    loader = gc.data.DataLoader(blobs(20, classes=4), batch_size=10, seed=0)
    trainer = gc.Trainer(tmp_path / "old", backend="numpy")
    with pytest.warns(UserWarning, match=r"format graphc.training/2\) have no train_step prediction output"):
        first = trainer.fit(loader, 1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        second = trainer.fit(loader, 2, progress=False)
    assert first.epochs[0].metrics == {} and second.epochs[0].metrics == {}
    fresh = gc.Trainer(arts, backend="numpy").fit(loader, 2, progress=False)
    assert [e.loss for e in first.epochs + second.epochs] == [e.loss for e in fresh.epochs]  # trains the same
