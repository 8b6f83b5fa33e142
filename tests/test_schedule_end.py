"""A schedule with an end (OneCycleLR past its total_steps raises, as torch's) is checked against
the run before its first step: ``steps_left`` counts the steps before the raise (torch's count for
OneCycleLR, ours inside SequentialLR and ChainedScheduler); ``Trainer.fit`` refuses a run longer
than that, fresh or resumed, with nothing trained or saved; ``graphc train --resume`` refuses
``--epochs`` past the recorded run of a schedule that spans it (onecycle, cosine), leaving the
checkpoint as it was, and resumes one with the run's ``--epochs`` bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphc as gc
from cli_util import one_line_error, run_cli, workspace
from test_lr_scheduler import regression_data, scheduler_artifacts

torch = pytest.importorskip("torch")
S = gc.optim.lr_scheduler
TS = torch.optim.lr_scheduler

# name -> a scheduler on a Trainer, and whether torch's raises the same way (the composites: ours only)
ENDS = {
    "OneCycleLR": (lambda m, t: m.OneCycleLR(t, max_lr=0.4, total_steps=7, cycle_momentum=False), True),
    "OneCycleLR-epochs": (lambda m, t: m.OneCycleLR(t, max_lr=0.4, epochs=3, steps_per_epoch=2, three_phase=True,
                                                    cycle_momentum=False), True),
    "warmup-then-OneCycleLR": (lambda m, t: m.SequentialLR(t, [m.LinearLR(t, total_iters=3),
                                                               m.OneCycleLR(t, max_lr=0.4, total_steps=5,
                                                                            cycle_momentum=False)],
                                                           milestones=[3]), False),
    "OneCycleLR-ending-before-its-milestone": (lambda m, t: m.SequentialLR(
        t, [m.OneCycleLR(t, max_lr=0.4, total_steps=4, cycle_momentum=False), m.StepLR(t, step_size=2)],
        milestones=[6]), False),
    "chained": (lambda m, t: m.ChainedScheduler([m.ExponentialLR(t, gamma=0.9),
                                                 m.OneCycleLR(t, max_lr=0.4, total_steps=6, cycle_momentum=False)]),
                False),
}


def _steps_until_it_raises(scheduler, most: int = 100):
    for taken in range(most):
        try:
            scheduler.step()
        except ValueError:
            return taken
    return None


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: scheduler.step() before optimizer.step()
@pytest.mark.parametrize("name", ENDS)
def test_steps_left_counts_the_steps_before_the_schedule_raises(name):
    make, torchs = ENDS[name]
    ours = make(S, gc.Trainer(scheduler_artifacts(), backend="numpy"))
    left = ours.steps_left()
    counted = [(ours.step(), ours.steps_left())[1] for _ in range(2)]
    assert counted == [left - 1, left - 2]  # counted from where it is
    assert _steps_until_it_raises(ours) == left - 2
    if torchs:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=0.1)
        assert _steps_until_it_raises(make(TS, opt)) == left


def test_schedules_without_an_end_have_no_steps_left():
    trainer = gc.Trainer(scheduler_artifacts(), backend="numpy")
    never = S.SequentialLR(trainer, [S.OneCycleLR(trainer, max_lr=0.4, total_steps=8, cycle_momentum=False),
                                     S.StepLR(trainer, step_size=2)], milestones=[6])  # restarted before its end
    assert never.steps_left() is None and _steps_until_it_raises(never) is None
    assert S.CosineAnnealingLR(trainer, T_max=3).steps_left() is None
    assert S.ReduceLROnPlateau(trainer).steps_left() is None


def _files(folder):
    """Each file under ``folder``: its bytes and modification time."""
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _loader():
    return gc.data.DataLoader(regression_data(), batch_size=4, seed=0)  # 22 rows: 6 batches an epoch


def _onecycle(trainer, total: int):
    return S.OneCycleLR(trainer, max_lr=0.3, total_steps=total, cycle_momentum=False)


@pytest.mark.parametrize("interval, total, need, reach", [("step", 20, 24, 3), ("epoch", 3, 4, 3)])
def test_fit_refuses_a_onecycle_shorter_than_the_run_before_its_first_step(interval, total, need, reach):
    trainer = gc.Trainer(scheduler_artifacts(), backend="numpy")
    before = {k: np.array(v) for k, v in trainer.params.items()}
    with pytest.raises(ValueError) as info:
        trainer.fit(_loader(), 4, scheduler=_onecycle(trainer, total), interval=interval, progress=False, quiet=True)
    message = str(info.value)
    assert f"fit(epochs=4) would step the scheduler OneCycleLR {need} more times" in message, message
    assert f"ends after {total} more" in message and f"fit to epoch {reach} at most" in message, message
    assert f"a schedule {need - total} step" in message, message
    assert trainer.step_count == 0 and trainer.epoch == 0
    assert all(np.array_equal(before[k], v) for k, v in trainer.params.items())


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_resumed_trainer_whose_onecycle_is_spent_is_refused_and_its_checkpoint_kept(tmp_path):
    arts = scheduler_artifacts(momentum=0.9)
    first = gc.Trainer(arts, backend="numpy")
    first.fit(_loader(), 2, scheduler=_onecycle(first, 12), interval="step", checkpoint=tmp_path / "ck",
              progress=False, quiet=True)
    saved = _files(tmp_path / "ck")
    resumed = gc.Trainer(arts, backend="numpy")
    resumed.load_checkpoint(tmp_path / "ck")
    with pytest.raises(ValueError, match=r"6 more times \(after each train step: 6 batches an epoch, from epoch 3 "
                       r"batch 1\), but its schedule ends after 0 more .* it cannot finish epoch 3"):
        # the checkpoint's state (total_steps 12, 12 taken) replaces a longer schedule given now
        resumed.fit(_loader(), 3, scheduler=_onecycle(resumed, 18), checkpoint=tmp_path / "ck", progress=False,
                    quiet=True)
    assert resumed.step_count == 12 and resumed.scheduler.steps_left() == 0
    assert _files(tmp_path / "ck") == saved
    resumed.fit(_loader(), 2, progress=False, quiet=True)  # the run's own epochs: nothing to do, no error


# --- graphc train --resume -----------------------------------------------------------------------

def _log(path):
    return [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "samples_per_s")}
            for line in path.read_text().splitlines()]


@pytest.mark.parametrize("schedule", [["--schedule", "onecycle"],
                                      ["--schedule", "cosine", "--schedule-interval", "step", "--min-lr", "0.001"]])
def test_cli_resume_past_the_schedules_end_is_refused_before_any_step(tmp_path, capsys, schedule):
    root = workspace(tmp_path)  # 64 samples, batch 32: 2 steps an epoch
    args = ["train", root / "arts", "--data", root / "data.npz", "--batch-size", "32", "--backend", "numpy",
            "--no-progress", "--checkpoint", root / "ck"]
    assert run_cli(capsys, *args, "--epochs", "3", *schedule).code == 0
    saved = _files(root / "ck")
    err = one_line_error(run_cli(capsys, *args, "--epochs", "4", "--resume", "--log", root / "more.jsonl"))
    assert f"resuming {root / 'ck'}: --epochs 4, but the checkpoint's run was --epochs 3 and its --schedule " \
           f"{schedule[1]} ends there" in err, err
    assert "pass --epochs 3 to finish the run as recorded, or start a new run with --epochs 4" in err, err
    assert _files(root / "ck") == saved and not (root / "more.jsonl").exists()
    r = run_cli(capsys, *args, "--epochs", "3", "--resume")
    assert r.code == 0 and "nothing to train" in r.out, r.err


def test_cli_onecycle_resumed_with_the_runs_epochs_is_bit_identical(tmp_path, capsys, monkeypatch):
    root = workspace(tmp_path)
    args = ["train", root / "arts", "--data", root / "data.npz", "--batch-size", "16", "--backend", "numpy",
            "--no-progress", "--epochs", "3"]  # 4 steps an epoch, 12 in all
    assert run_cli(capsys, *args, "--schedule", "onecycle", "--log", root / "whole.jsonl").code == 0
    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:6")  # Ctrl-C mid-epoch 2
    r = run_cli(capsys, *args, "--schedule", "onecycle", "--checkpoint", root / "ck", "--log", root / "cut.jsonl")
    assert r.code == 130, r.err
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    r = run_cli(capsys, *args[:-1], "2", "--checkpoint", root / "ck", "--resume", "--log", root / "cut.jsonl")
    assert r.code == 0, r.err  # fewer epochs than the schedule spans: a part of the run, allowed
    r = run_cli(capsys, *args, "--checkpoint", root / "ck", "--resume", "--log", root / "cut.jsonl")
    assert r.code == 0, r.err
    whole = _log(root / "whole.jsonl")
    assert len({e["lr"] for e in whole}) == 3 and _log(root / "cut.jsonl") == whole  # bit-identical
