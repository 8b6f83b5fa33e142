"""What training prints and logs: a bar per epoch that shows the epoch's running mean loss (never
``nan``), one line per epoch for every epoch (a resume prints the epochs it trains), quiet
modes, and the per-epoch JSON-lines / CSV log (``fit(log=...)``, ``graphc train --log``) that a
killed run leaves valid and a resumed run continues."""

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import graphc as gc
import graphc.runtime.progress
from graphc.runtime.history import EpochRecord
from graphc.runtime.trainer import SIGNAL_HOOK_ENV
from cli_util import one_line_error, run_cli
from trainer_models import blobs, drop_bn_workdir

GRAPHC = str(Path(sys.executable).parent / "graphc")
BATCH, SAMPLES = 16, 48  # 3 steps an epoch
EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+)  loss (\S+)", re.M)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return drop_bn_workdir(tmp_path_factory.mktemp("progress"), SAMPLES, 32)


def loader():
    return gc.data.DataLoader(blobs(SAMPLES), batch_size=BATCH, seed=3)


def evals():
    return gc.data.DataLoader(blobs(32, seed=1), 64, shuffle=False)


def epoch_lines(text):
    return [(int(m.group(1)), int(m.group(2)), m.group(3)) for m in EPOCH_LINE.finditer(text)]


def test_bar_is_per_epoch_and_shows_the_running_mean(workdir, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(graphc.runtime.progress.rich, "get_console",
                        lambda: Console(file=screen, force_terminal=True, width=160))
    monkeypatch.setattr(graphc.runtime.progress, "_REFRESH_S", 0.0)
    history = gc.Trainer(workdir / "arts", backend="numpy").fit(loader(), 2, eval_loader=evals())
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue()).replace("\r", "\n")
    assert "nan" not in text.lower()
    bars = re.findall(r"(epoch \d/2) \S+ (\d)/3 running mean loss (\S+)", text)
    assert {label for label, _, _ in bars} <= {"epoch 1/2", "epoch 2/2"} and bars
    assert all(int(done) <= 3 for _, done, _ in bars)  # steps of the epoch, not of the run
    # the last figure shown is the mean over the epoch's steps: the epoch line's loss
    label, done, figure = bars[-1]
    assert (label, done) == ("epoch 2/2", "3")
    steps = history.step_losses[3:]
    assert figure == f"{np.mean(steps):.4f}" == f"{history.epochs[1].loss:.4f}"
    assert [(e, n) for e, n, _ in epoch_lines(text)] == [(1, 2), (2, 2)]


def test_every_epoch_has_a_line_and_quiet_modes(workdir, tmp_path, capsys):
    trainer = gc.Trainer(workdir / "arts", backend="numpy")
    capsys.readouterr()
    trainer.fit(loader(), 10, eval_loader=evals(), progress=False, checkpoint=tmp_path / "ck")
    out = capsys.readouterr().out
    assert [e for e, _, _ in epoch_lines(out)] == list(range(1, 11))
    assert re.search(r"^epoch 10/10  loss \S+  accuracy \S+  eval loss \S+  eval accuracy \S+  \S+ samples/s", out, re.M)
    resumed = gc.Trainer(tmp_path / "ck", backend="numpy")
    resumed.fit(loader(), 12, progress=False)
    assert [(e, n) for e, n, _ in epoch_lines(capsys.readouterr().out)] == [(11, 12), (12, 12)]
    resumed.fit(loader(), 13, quiet=True)
    assert capsys.readouterr().out == ""


def test_fit_log_jsonl_and_csv_hold_the_history(workdir, tmp_path):
    for name in ("h.jsonl", "h.csv"):
        history = gc.Trainer(workdir / "arts", backend="numpy").fit(loader(), 2, eval_loader=evals(), quiet=True,
                                                                      log=tmp_path / name)
        if name.endswith(".jsonl"):
            got = [EpochRecord.model_validate_json(line) for line in (tmp_path / name).read_text().splitlines()]
        else:
            rows = list(csv.DictReader((tmp_path / name).open()))
            assert list(rows[0]) == ["epoch", "loss", "steps", "samples", "seconds", "samples_per_s", "lr",
                                     "train_accuracy", "eval_loss", "eval_accuracy"]
            got = [EpochRecord(**{k: v for k, v in row.items() if not k.startswith(("eval_", "train_"))},
                               metrics={k[6:]: float(v) for k, v in row.items() if k.startswith("train_")},
                               eval={k[5:]: float(v) for k, v in row.items() if k.startswith("eval_")}) for row in rows]
        assert got == history.epochs
        assert got[0].lr == 0.01 and got[1].eval["loss"] < got[0].eval["loss"]  # as given, not float32's 0.0099999998
    with pytest.raises(ValueError, match=r"must end in \.jsonl, \.ndjson, \.csv"):
        gc.Trainer(workdir / "arts", backend="numpy").fit(loader(), 1, log=tmp_path / "h.txt")


def test_cli_quiet_modes_plural_and_a_bad_log_name(workdir, tmp_path, capsys):
    args = ("train", workdir / "arts", "--data", workdir / "data.npz", "--batch-size", BATCH, "--backend", "numpy")
    r = run_cli(capsys, *args, "--epochs", 1, "--no-progress")
    assert r.code == 0, r.err
    assert "48 samples, batch 16, 1 epoch\n" in r.out and [e for e, _, _ in epoch_lines(r.out)] == [1]
    r = run_cli(capsys, *args, "--epochs", 2, "-q")
    assert r.code == 0 and not epoch_lines(r.out) and "done: loss" in r.out
    r = run_cli(capsys, *args, "--epochs", 1, "--log", tmp_path / "h.json")
    assert "cannot log epochs to" in one_line_error(r) and not (tmp_path / "h.json").exists()


def test_killed_run_leaves_valid_lines_and_resume_continues_the_log(workdir, tmp_path, capsys):
    log, ck = tmp_path / "h.jsonl", tmp_path / "ck"
    args = ["train", workdir / "arts", "--data", workdir / "data.npz", "--epochs", 4, "--batch-size", BATCH,
            "--backend", "numpy", "--checkpoint", ck, "--log", log]
    env = {**os.environ, SIGNAL_HOOK_ENV: "KILL:8"}  # killed in epoch 3, after 2 epochs logged and saved
    r = subprocess.run([GRAPHC, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == -9, r.stderr
    assert [json.loads(line)["epoch"] for line in log.read_text().splitlines()] == [1, 2]
    with log.open("a") as f:  # as if killed after epoch 3's line, before its checkpoint, then mid-write
        f.write(json.dumps({"epoch": 3, "loss": 9.0}) + "\n" + '{"epoch": 4, "lo')
    r = run_cli(capsys, *args, "--resume", "--no-progress")
    assert r.code == 0, r.err
    assert [e for e, _, _ in epoch_lines(r.out)] == [3, 4]
    records = [EpochRecord.model_validate_json(line) for line in log.read_text().splitlines()]
    assert [e.epoch for e in records] == [1, 2, 3, 4] and records[2].loss != 9.0
    printed = {e: loss for e, _, loss in epoch_lines(r.out)}
    assert {e.epoch: f"{e.loss:.4f}" for e in records[2:]} == printed
    r = run_cli(capsys, *args[:-4], "--log", log, "--epochs", 1, "-q")  # a new run starts the log afresh
    assert r.code == 0, r.err
    assert [json.loads(line)["epoch"] for line in log.read_text().splitlines()] == [1]
