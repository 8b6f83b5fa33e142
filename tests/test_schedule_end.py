"""A schedule with an end (OneCycleLR past its total_steps raises, as torch's) is checked against
the run before its first step: ``steps_left`` counts the steps before the raise (torch's count for
OneCycleLR, ours inside SequentialLR and ChainedScheduler); ``Trainer.fit`` refuses a run longer
than that, fresh or resumed, with nothing trained or saved."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from test_lr_scheduler import _artifacts, _data

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
    ours = make(S, gc.Trainer(_artifacts(), backend="numpy"))
    left = ours.steps_left()
    counted = [(ours.step(), ours.steps_left())[1] for _ in range(2)]
    assert counted == [left - 1, left - 2]  # counted from where it is
    assert _steps_until_it_raises(ours) == left - 2
    if torchs:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=0.1)
        assert _steps_until_it_raises(make(TS, opt)) == left


def test_schedules_without_an_end_have_no_steps_left():
    trainer = gc.Trainer(_artifacts(), backend="numpy")
    never = S.SequentialLR(trainer, [S.OneCycleLR(trainer, max_lr=0.4, total_steps=8, cycle_momentum=False),
                                     S.StepLR(trainer, step_size=2)], milestones=[6])  # restarted before its end
    assert never.steps_left() is None and _steps_until_it_raises(never) is None
    assert S.CosineAnnealingLR(trainer, T_max=3).steps_left() is None
    assert S.ReduceLROnPlateau(trainer).steps_left() is None


def _files(folder):
    """Each file under ``folder``: its bytes and modification time."""
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _loader():
    return gc.data.DataLoader(_data(), batch_size=4, seed=0)  # 22 rows: 6 batches an epoch


def _onecycle(trainer, total: int):
    return S.OneCycleLR(trainer, max_lr=0.3, total_steps=total, cycle_momentum=False)


@pytest.mark.parametrize("interval, total, need, reach", [("step", 20, 24, 3), ("epoch", 3, 4, 3)])
def test_fit_refuses_a_onecycle_shorter_than_the_run_before_its_first_step(interval, total, need, reach):
    trainer = gc.Trainer(_artifacts(), backend="numpy")
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
    arts = _artifacts(momentum=0.9)
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
