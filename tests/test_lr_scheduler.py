"""``gc.optim.lr_scheduler`` against torch.optim.lr_scheduler 2.13: each scheduler's lr sequence
(the same arguments, 60 steps) equals torch's bit for bit; ``Trainer.fit`` with a scheduler
(per epoch and per step) gives a float64 torch loop's losses; a run cut mid-epoch and resumed from
its checkpoint gives the uninterrupted run's losses exactly; ``graphc train --schedule``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphc as gc
from graphc.runtime import checkpoint as ckpt
from graphc.runtime.trainer import TrainingInterrupted

torch = pytest.importorskip("torch")
S = gc.optim.lr_scheduler
TS = torch.optim.lr_scheduler
LR = 0.1
STEPS = 60


class _Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 1, dtype="float64")

    def forward(self, x):
        return self.fc(x)


def scheduler_artifacts(lr: float = LR, dtype: str = "float64", momentum: float = 0.0):
    net = _Net() if dtype == "float64" else _Net32()
    model = gc.capture(net, x=gc.spec(dtype, ("N", 3)))
    return gc.training.generate(model, gc.losses.mse(model.outputs[0].name, label="y"),
                                gc.optim.SGD(lr, momentum=momentum))


class _Net32(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 1)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def arts():
    return scheduler_artifacts()


def _torch_opt(lr: float = LR, momentum: float = 0.0, params=None):
    return torch.optim.SGD(params or [torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=lr,
                           momentum=momentum)


# name -> (ours, torch's), each a function of the trainer/optimizer; the same arguments
CASES = {
    "StepLR": lambda m, o: m.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda m, o: m.MultiStepLR(o, milestones=[5, 12, 12, 40], gamma=0.3),
    "ExponentialLR": lambda m, o: m.ExponentialLR(o, gamma=0.93),
    "CosineAnnealingLR": lambda m, o: m.CosineAnnealingLR(o, T_max=17, eta_min=0.001),
    "LinearLR": lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=23),
    "ConstantLR": lambda m, o: m.ConstantLR(o, factor=0.3, total_iters=9),
    "LambdaLR": lambda m, o: m.LambdaLR(o, lambda e: 1.0 / (1 + e) ** 0.5),
    "MultiplicativeLR": lambda m, o: m.MultiplicativeLR(o, lambda e: 0.97 if e % 3 else 1.01),
    "PolynomialLR": lambda m, o: m.PolynomialLR(o, total_iters=41, power=1.7),
    "OneCycleLR": lambda m, o: m.OneCycleLR(o, max_lr=0.4, total_steps=STEPS + 10, cycle_momentum=False),
    "OneCycleLR-3-linear": lambda m, o: m.OneCycleLR(o, max_lr=0.4, epochs=7, steps_per_epoch=10, pct_start=0.25,
                                                     anneal_strategy="linear", three_phase=True,
                                                     cycle_momentum=False),
    "CosineAnnealingWarmRestarts": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=0.002),
    "SequentialLR": lambda m, o: m.SequentialLR(o, [m.LinearLR(o, start_factor=0.01, total_iters=8),
                                                    m.CosineAnnealingLR(o, T_max=30),
                                                    m.StepLR(o, step_size=4, gamma=0.7)], milestones=[8, 30]),
    "ChainedScheduler": lambda m, o: m.ChainedScheduler([m.ExponentialLR(o, gamma=0.98),
                                                         m.MultiStepLR(o, milestones=[10, 25], gamma=0.5),
                                                         m.ConstantLR(o, factor=0.5, total_iters=6)]),
}


def _sequence(make, module, target, steps: int = STEPS):
    sched = make(module, target)
    out = [sched.get_last_lr()[0]]
    for _ in range(steps):
        sched.step()
        out.append(sched.get_last_lr()[0])
    return sched, out


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: scheduler.step() before optimizer.step()
@pytest.mark.parametrize("name", CASES)
def test_lr_sequence_is_torchs(arts, name):
    trainer = gc.Trainer(arts, backend="numpy")
    ours_sched, ours = _sequence(CASES[name], S, trainer)
    _, theirs = _sequence(CASES[name], TS, _torch_opt())
    assert ours == theirs  # bit-identical Python floats
    assert trainer.lr == max(ours[-1], 0.0)  # float64 graphs: the lr the next step uses
    again = CASES[name](S, gc.Trainer(arts, backend="numpy"))  # a resume: state through JSON, 10 steps on
    again.load_state_dict(json.loads(json.dumps(ours_sched.state_dict())))
    again.trainer.lr_group.update(json.loads(json.dumps(trainer.lr_group)))
    more = [(ours_sched.step(), again.step(), ours_sched.get_last_lr() == again.get_last_lr()) for _ in range(10)]
    assert all(same for *_, same in more)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_reduce_on_plateau_is_torchs(arts):
    metrics = [1.0, 0.9, 0.95, 0.95, 0.95, 0.8, 0.81, 0.82, 0.83, 0.84, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6] * 4
    for kw in ({}, {"mode": "max", "factor": 0.5, "patience": 1, "cooldown": 2},
               {"threshold_mode": "abs", "threshold": 0.05, "patience": 2, "min_lr": 0.004}):
        trainer = gc.Trainer(arts, backend="numpy")
        ours, theirs = S.ReduceLROnPlateau(trainer, **kw), TS.ReduceLROnPlateau(_torch_opt(), **kw)
        for m in metrics:
            ours.step(m)
            theirs.step(m)
            assert ours.get_last_lr() == theirs.get_last_lr()
        assert ours.get_last_lr()[0] < LR  # it did reduce
        assert trainer.lr == ours.get_last_lr()[0]


def test_float32_graphs_start_from_the_spec_lr_not_its_rounding():
    trainer = gc.Trainer(scheduler_artifacts(dtype="float32"), backend="numpy")
    assert trainer.lr != LR  # float32(0.1)
    ours = [S.ExponentialLR(trainer, gamma=0.9).get_last_lr()[0]]
    sched = TS.ExponentialLR(_torch_opt(), gamma=0.9)
    assert ours == sched.get_last_lr()


def test_bad_arguments_are_named(arts):
    trainer = gc.Trainer(arts, backend="numpy")
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        S.OneCycleLR(trainer, max_lr=1.0, total_steps=10)
    with pytest.raises(TypeError, match="takes a gc.Trainer"):
        S.StepLR(_torch_opt(), step_size=3)
    with pytest.raises(ValueError, match="start_factor"):
        S.LinearLR(trainer, start_factor=0.0)
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        S.SequentialLR(trainer, [S.ReduceLROnPlateau(trainer)], milestones=[])
    with pytest.raises(ValueError, match="interval must be 'epoch' or 'step'"):
        trainer.fit(gc.data.DataLoader({"x": np.zeros((4, 3)), "y": np.zeros((4, 1))}, batch_size=2), 1,
                    interval="batch", progress=False, quiet=True)
    other = gc.Trainer(arts, backend="numpy")
    with pytest.raises(ValueError, match="made on this Trainer"):
        trainer.scheduler = S.StepLR(other, step_size=2)


# --- fit against a torch loop --------------------------------------------------------------------

def regression_data(n: int = 22):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 3))
    return {"x": x, "y": x @ np.array([[0.5], [-1.0], [2.0]]) + 0.3 + 0.1 * rng.normal(size=(n, 1))}


def _torch_fit(params, make, data, epochs, batch, interval, eval_data=None, momentum=0.9):
    w = torch.nn.Parameter(torch.tensor(np.array(params["fc.weight"])))
    b = torch.nn.Parameter(torch.tensor(np.array(params["fc.bias"])))
    opt = torch.optim.SGD([w, b], lr=LR, momentum=momentum)
    sched = make(TS, opt)
    loader = gc.data.DataLoader(data, batch_size=batch, seed=0)
    losses = []
    for epoch in range(epochs):
        total = rows = 0.0
        for bt in loader.iter_epoch(epoch, 0):
            x, y = torch.tensor(bt["x"]), torch.tensor(bt["y"])
            loss = torch.nn.functional.mse_loss(x @ w.T + b, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            total, rows = total + loss.item() * len(x), rows + len(x)
            if interval == "step":
                sched.step(loss.item()) if isinstance(sched, TS.ReduceLROnPlateau) else sched.step()
        if interval == "epoch":
            if isinstance(sched, TS.ReduceLROnPlateau):
                with torch.no_grad():
                    ex, ey = torch.tensor(eval_data["x"]), torch.tensor(eval_data["y"])
                    sched.step(torch.nn.functional.mse_loss(ex @ w.T + b, ey).item() if eval_data else total / rows)
            else:
                sched.step()
    return losses


FIT_CASES = {
    "cosine-step": (lambda m, o: m.CosineAnnealingLR(o, T_max=20, eta_min=0.01), "step"),
    "warmup-then-cosine-step": (lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.1, total_iters=5), m.CosineAnnealingLR(o, T_max=20)], milestones=[5]),
        "step"),
    "onecycle-step": (lambda m, o: m.OneCycleLR(o, max_lr=0.3, total_steps=24, cycle_momentum=False), "step"),
    "step-epoch": (lambda m, o: m.StepLR(o, step_size=2, gamma=0.5), "epoch"),
    "plateau-epoch": (lambda m, o: m.ReduceLROnPlateau(o, factor=0.5, patience=0, threshold=0.5), "epoch"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", FIT_CASES)
def test_fit_with_a_scheduler_matches_a_torch_loop(name):
    make, interval = FIT_CASES[name]
    arts = scheduler_artifacts(momentum=0.9)
    trainer = gc.Trainer(arts, backend="numpy")
    eval_data = regression_data(8) if name == "plateau-epoch" else None
    history = trainer.fit(gc.data.DataLoader(regression_data(), batch_size=4, seed=0), 4, scheduler=make(S, trainer),
                          interval=interval, progress=False, quiet=True,
                          eval_loader=gc.data.DataLoader(eval_data, batch_size=8, shuffle=False) if eval_data else None)
    theirs = _torch_fit(arts.state, make, regression_data(), 4, 4, interval, eval_data)
    assert len(history.step_losses) == len(theirs) == 24
    np.testing.assert_allclose(history.step_losses, theirs, rtol=1e-12, atol=1e-14)
    assert len(set(np.round(np.diff(history.step_losses), 12))) > 3  # the schedule changed the steps


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["warmup-then-cosine-step", "onecycle-step", "plateau-epoch", "lambda-epoch"])
def test_resume_mid_epoch_gives_the_uninterrupted_losses(tmp_path, monkeypatch, name):
    make, interval = FIT_CASES.get(name, (lambda m, o: m.LambdaLR(o, lambda e: 0.8 ** e), "epoch"))
    arts = scheduler_artifacts(momentum=0.9)
    data = regression_data()

    def loader():
        return gc.data.DataLoader(data, batch_size=4, seed=0)

    whole = gc.Trainer(arts, backend="numpy")
    full = whole.fit(loader(), 4, scheduler=make(S, whole), interval=interval, progress=False, quiet=True)
    first = gc.Trainer(arts, backend="numpy")
    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:9")  # Ctrl-C after step 9: epoch 2, batch 3 of 6
    with pytest.raises(TrainingInterrupted):
        first.fit(loader(), 4, scheduler=make(S, first), interval=interval, checkpoint=tmp_path / "ck",
                  progress=False, quiet=True)
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    saved = json.loads(ckpt.read_meta(tmp_path / "ck").schedule)
    assert saved["kind"] == type(first.scheduler).__name__ and saved["interval"] == interval
    resumed = gc.Trainer(arts, backend="numpy")
    resumed.load_checkpoint(tmp_path / "ck")
    sched = make(S, resumed)  # constructing sets the initial lr; fit restores the saved state into it
    rest = resumed.fit(loader(), 4, scheduler=sched, progress=False, quiet=True)
    assert first.step_count == 9 and resumed.step_count == 24
    assert full.step_losses[9:] == rest.step_losses  # bit-identical
    assert resumed.lr == whole.lr and sched.get_last_lr() == whole.scheduler.get_last_lr()


# --- graphc train --schedule ---------------------------------------------------------------------

def _epoch_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_schedule_matches_python_and_resumes(tmp_path, capsys, monkeypatch):
    from cli_util import one_line_error, run_cli, workspace

    root = workspace(tmp_path)
    args = ["train", root / "arts", "--data", root / "data.npz", "--batch-size", "16", "--backend", "numpy",
            "--no-progress"]
    sched = ["--schedule", "cosine", "--schedule-interval", "step", "--warmup", "3", "--min-lr", "0.001"]
    r = run_cli(capsys, *args, "--epochs", "3", *sched, "--checkpoint", root / "whole", "--log", root / "whole.jsonl")
    assert r.code == 0, r.err
    whole = _epoch_log(root / "whole.jsonl")
    saved = json.loads(ckpt.read_meta(root / "whole").schedule)
    assert saved["kind"] == "SequentialLR" and saved["recipe"]["total"] == 12 and saved["interval"] == "step"

    trainer = gc.Trainer(root / "arts", backend="numpy")  # the same run in Python
    ramp = S.LinearLR(trainer, start_factor=0.25, total_iters=3)
    cosine = S.CosineAnnealingLR(trainer, T_max=9, eta_min=0.001)
    data = dict(np.load(root / "data.npz"))
    history = trainer.fit(gc.data.DataLoader(data, batch_size=16, seed=0), 3, interval="step", progress=False,
                          quiet=True, scheduler=S.SequentialLR(trainer, [ramp, cosine], milestones=[3]))
    assert [e.loss for e in history.epochs] == [e["loss"] for e in whole]
    assert [e.lr for e in history.epochs] == [e["lr"] for e in whole]
    assert len({e["lr"] for e in whole}) == 3

    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:6")  # Ctrl-C after step 6, mid-epoch 2
    r = run_cli(capsys, *args, "--epochs", "3", *sched, "--checkpoint", root / "cut", "--log", root / "cut.jsonl")
    assert r.code == 130 and "interrupted at step 6" in r.err, r.err
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    r = run_cli(capsys, *args, "--epochs", "3", "--checkpoint", root / "cut", "--resume", "--log", root / "cut.jsonl")
    assert r.code == 0, r.err
    untimed = [{k: v for k, v in e.items() if k not in ("seconds", "samples_per_s")} for e in whole]
    assert [{k: e[k] for k in untimed[0]} for e in _epoch_log(root / "cut.jsonl")] == untimed  # bit-identical
    err = one_line_error(run_cli(capsys, *args, "--epochs", "4", "--checkpoint", root / "cut", "--resume",
                                 "--schedule", "step", "--step-size", "2"))
    assert "recorded the lr schedule cosine" in err and "--schedule asks for step" in err
    err = one_line_error(run_cli(capsys, *args, "--epochs", "1", "--schedule", "step"))
    assert "--schedule step needs --step-size" in err
