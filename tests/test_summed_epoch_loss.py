"""A summed loss (``reduction="sum"``) on one scale in an epoch's record: the train loss and the
eval loss are both the set's total per row, as torch's examples print a summed loss (the sum
over the set / ``len(dataset)``), against torch over uneven batches (a partial last one)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.runtime import checkpoint as ckpt
from graphc.runtime.progress import TrainProgress
from graphc.runtime.trainer import SIGNAL_HOOK_ENV, TrainingInterrupted
from cli_util import run_cli

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
FEATURES, CLASSES, TRAIN, EVAL, BATCH, EVAL_BATCH = 5, 3, 10, 7, 4, 3  # batches of 4, 4, 2 and 3, 3, 1


def _data(kind: str, rows: int) -> dict[str, np.ndarray]:
    x = RNG.standard_normal((rows, FEATURES))
    if kind == "mse":
        return {"x": x, "y": RNG.standard_normal((rows, CLASSES))}
    y = RNG.integers(0, CLASSES, rows)
    y[1] = -100  # an ignored label: its row still counts in the rows a total is divided by
    return {"x": x, "y": y}


def _arts(kind: str, lr: float):
    model = gc.capture(nn.Linear(FEATURES, CLASSES, dtype="float64"), x=gc.spec("float64", ("N", FEATURES)))
    loss = getattr(gc.losses, kind)("output", label="y", reduction="sum")
    return gc.training.generate(model, loss, gc.optim.SGD(lr))


def _torch(params: dict[str, np.ndarray], kind: str, lr: float, train: dict, evaluation: dict) -> tuple[list, float]:
    """torch's step losses over ``train`` in batches of BATCH, then its summed loss on ``evaluation``."""
    linear = torch.nn.Linear(FEATURES, CLASSES, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(params["weight"]))
        linear.bias.copy_(torch.from_numpy(params["bias"]))
    criterion = torch.nn.MSELoss(reduction="sum") if kind == "mse" else torch.nn.CrossEntropyLoss(reduction="sum")
    optimizer = torch.optim.SGD(linear.parameters(), lr)
    steps = []
    for lo in range(0, TRAIN, BATCH):
        optimizer.zero_grad()
        batch = {k: torch.from_numpy(v[lo:lo + BATCH]) for k, v in train.items()}
        loss = criterion(linear(batch["x"]), batch["y"])
        loss.backward()
        optimizer.step()
        steps.append(loss.item())
    with torch.no_grad():
        total = criterion(linear(torch.from_numpy(evaluation["x"])), torch.from_numpy(evaluation["y"])).item()
    return steps, total


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind", ["cross_entropy", "mse"])
def test_fit_reports_a_summed_loss_per_row_for_train_and_eval(kind, backend, capsys):
    """The train loss was each batch's sum times its rows over the rows (a cross-entropy draw: 3.69
    for torch's 1.01 per row), the eval loss the eval set's total (7.56 for 1.08 per row): now both
    per row; ``evaluate_loader`` still gives the whole set as one batch, its total."""
    train, evaluation = _data(kind, TRAIN), _data(kind, EVAL)
    trainer = gc.Trainer(_arts(kind, 0.05), backend=backend)
    steps, total = _torch(trainer.params, kind, 0.05, train, evaluation)
    eval_loader = gc.data.DataLoader(evaluation, EVAL_BATCH, shuffle=False)
    history = trainer.fit(gc.data.DataLoader(train, BATCH, shuffle=False), 1, eval_loader=eval_loader, progress=False)
    record = history.epochs[0]
    np.testing.assert_allclose(history.step_losses, steps, rtol=1e-6)
    assert record.samples == TRAIN
    assert record.loss == pytest.approx(sum(steps) / TRAIN, rel=1e-6)
    assert record.eval["loss"] == pytest.approx(total / EVAL, rel=1e-6)
    assert f"  loss {record.loss:.4f}  " in capsys.readouterr().out
    assert trainer.evaluate_loader(eval_loader)["loss"] == pytest.approx(total, rel=1e-6)  # the whole set as one batch


def test_the_epoch_line_of_graphc_train_gives_a_summed_loss_per_row(tmp_path, capsys):
    """`graphc train`'s epoch line and its --log record, with lr 0 (the shuffled order changes no
    loss): the train and eval sets' totals per row, as torch's."""
    train, evaluation = _data("cross_entropy", TRAIN), _data("cross_entropy", EVAL)
    arts = _arts("cross_entropy", 0.0)
    arts.save(tmp_path / "arts")
    np.savez(tmp_path / "data.npz", x=train["x"], y=train["y"], x_val=evaluation["x"], y_val=evaluation["y"])
    params = gc.Trainer(arts, backend="numpy").params
    _, train_total = _torch(params, "cross_entropy", 0.0, train, train)
    _, eval_total = _torch(params, "cross_entropy", 0.0, train, evaluation)
    r = run_cli(capsys, "train", tmp_path / "arts", "--data", tmp_path / "data.npz", "--epochs", "1", "--batch-size",
                BATCH, "-b", "ort-cpu", "--no-progress", "--log", tmp_path / "log.jsonl")
    assert r.code == 0, r.err
    record = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert record["loss"] == pytest.approx(train_total / TRAIN, rel=1e-6)
    assert record["eval"]["loss"] == pytest.approx(eval_total / EVAL, rel=1e-6)
    assert f"  loss {train_total / TRAIN:.4f}  " in r.out and f"  eval loss {eval_total / EVAL:.4f}  " in r.out


def test_a_resumed_epoch_of_a_summed_loss_reports_as_one_run(tmp_path, monkeypatch):
    """Stopped mid-epoch (Ctrl-C after step 2 of 3), the checkpoint keeps the steps' summed losses
    as they are (format 5): the resumed epoch's loss is the uninterrupted one's, and so is its bar's
    first figure. A format 4 checkpoint's, weighted by batch size as a mean loss's, is read back as
    their plain sum."""
    train = _data("mse", TRAIN)
    loader = gc.data.DataLoader(train, BATCH, shuffle=False)
    whole = gc.Trainer(_arts("mse", 0.05), backend="numpy").fit(loader, 1, progress=False, quiet=True)
    steps = whole.step_losses
    assert whole.epochs[0].loss == pytest.approx(sum(steps) / TRAIN, rel=1e-12)
    monkeypatch.setenv(SIGNAL_HOOK_ENV, "INT:2")
    with pytest.raises(TrainingInterrupted):
        gc.Trainer(_arts("mse", 0.05), backend="numpy").fit(loader, 1, progress=False, quiet=True,
                                                             checkpoint=tmp_path / "ckpt")
    monkeypatch.delenv(SIGNAL_HOOK_ENV)
    meta = ckpt.read_meta(tmp_path / "ckpt")
    assert (meta.format, meta.batch_in_epoch, meta.progress.loss_sum) == ("graphc-checkpoint/5", 2, steps[0] + steps[1])
    starts = []  # the bar's figure as the resumed epoch starts: the running loss of its first 2 steps
    monkeypatch.setattr(TrainProgress, "start_epoch", lambda self, epoch, done, mean: starts.append(mean))
    resumed = gc.Trainer(tmp_path / "ckpt", backend="numpy").fit(loader, 1, progress=False, quiet=True)
    assert resumed.epochs[0].loss == pytest.approx(whole.epochs[0].loss, rel=1e-12)
    assert starts == [pytest.approx((steps[0] + steps[1]) / (2 * BATCH), rel=1e-12)]  # was the sum / the steps
    old = meta.model_copy(update={"format": "graphc-checkpoint/4", "progress": meta.progress.model_copy(
        update={"loss_sum": (steps[0] + steps[1]) * BATCH})})
    assert ckpt.batch_weighted(old, summed=True).loss_sum == pytest.approx(steps[0] + steps[1], rel=1e-15)
    assert ckpt.batch_weighted(old).loss_sum == (steps[0] + steps[1]) * BATCH  # a mean loss's: as it was
    plain = meta.model_copy(update={"format": "graphc-checkpoint/2"})  # formats 1 and 2: a plain sum
    assert ckpt.batch_weighted(plain, summed=True).loss_sum == steps[0] + steps[1]
