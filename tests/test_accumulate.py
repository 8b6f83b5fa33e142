"""Gradient accumulation (``gc.Trainer(..., accumulate=k)``) against a torch 2.13 loop in float64:
``(loss * rows / step_rows).backward()`` per micro-batch, ``clip_grad_norm_`` and
``optimizer.step()`` once per k micro-batches (the epoch's last step on what is left), a per-step lr
schedule, BatchNorm's running statistics updated by every micro-batch; on numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}
RNG = np.random.default_rng(0)
ROWS, BATCH = 22, 4  # 6 loader batches an epoch, the last of 2 rows


class _Net(gc.nn.Module):
    def __init__(self, batchnorm: bool = True):
        super().__init__()
        self.fc = gc.nn.Linear(4, 6, bias=not batchnorm, **F64)  # BatchNorm zeroes a bias's gradient: Adam
        # would amplify its rounding noise
        self.bn = gc.nn.BatchNorm1d(6, **F64) if batchnorm else gc.nn.Identity()
        self.out = gc.nn.Linear(6, 3, **F64)

    def forward(self, x):
        return self.out(gc.relu(self.bn(self.fc(x))))


def _twin(net: _Net):
    f64 = {"dtype": torch.float64}
    twin = torch.nn.Sequential()
    batchnorm = isinstance(net.bn, gc.nn.BatchNorm1d)
    twin.add_module("fc", torch.nn.Linear(4, 6, bias=not batchnorm, **f64))
    twin.add_module("bn", torch.nn.BatchNorm1d(6, **f64) if batchnorm else torch.nn.Identity())
    twin.add_module("relu", torch.nn.ReLU())
    twin.add_module("out", torch.nn.Linear(6, 3, **f64))
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return twin


def _data(rows: int = ROWS):
    return {"x": RNG.standard_normal((rows, 4)) * 2 + 0.5, "y": RNG.integers(0, 3, rows)}


def _optimizers(kind: str, clip: bool):
    extra = {"max_grad_norm": 0.05} if clip else {}  # small enough to clip every step
    if kind == "sgd":
        return (gc.optim.SGD(0.1, momentum=0.9, weight_decay=0.01, **extra),
                lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01))
    return (gc.optim.AdamW(0.01, weight_decay=0.1, **extra),
            lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1))


def _artifacts(net: _Net, optimizer):
    return gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 4))),
                                gc.losses.cross_entropy("output", label="y"), optimizer)


def _torch_fit(twin, make_opt, data, k: int, epochs: int, clip: bool, gamma: float = None, norms: list = None):
    """The torch loop: each group of k loader batches (in order) one optimizer step; ``norms``
    gets each step's clip_grad_norm_ return."""
    opt = make_opt(twin.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma) if gamma else None
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    starts = list(range(0, len(x), BATCH))
    for _ in range(epochs):
        for g in range(0, len(starts), k):
            group = [slice(s, s + BATCH) for s in starts[g:g + k]]
            total = sum(len(x[s]) for s in group)
            opt.zero_grad()
            for s in group:
                loss = torch.nn.functional.cross_entropy(twin(x[s]), y[s]) * (len(x[s]) / total)
                loss.backward()
            if clip:
                norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05)
                if norms is not None:
                    norms.append(float(norm))
            opt.step()
            if sched:
                sched.step()
    return {k2: v.detach().numpy() for k2, v in twin.state_dict().items()}


def _assert_state(trainer, expected: dict, rtol=1e-12, atol=1e-12):
    state = trainer.state_dict()
    for name, want in expected.items():
        if name.endswith("num_batches_tracked"):  # not carried with the default momentum
            continue
        np.testing.assert_allclose(state[name], want, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind,k,clip,gamma", [("sgd", 1, False, None), ("sgd", 2, True, None),
                                               ("sgd", 3, False, 0.7), ("adamw", 3, True, 0.7),
                                               ("adamw", 4, False, None)])
def test_fit_matches_torch_accumulation_loop(backend, kind, k, clip, gamma):
    net, data = _Net(), _data()
    optimizer, make_opt = _optimizers(kind, clip)
    arts = _artifacts(net, optimizer)
    want = _torch_fit(_twin(net), make_opt, data, k, 2, clip, gamma)
    trainer = gc.Trainer(arts, backend=backend, accumulate=k)
    assert trainer.accumulate == k
    scheduler = gc.optim.lr_scheduler.StepLR(trainer, step_size=1, gamma=gamma) if gamma else None
    history = trainer.fit(gc.data.DataLoader(data, batch_size=BATCH, shuffle=False), epochs=2, progress=False,
                          quiet=True, scheduler=scheduler, interval="step")
    steps = 2 * -(-6 // k)
    assert trainer.step_count == steps and len(history.step_losses) == steps
    assert [r.samples for r in history.epochs] == [ROWS, ROWS]
    _assert_state(trainer, want)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_micro_batches_equal_one_big_batch(backend):
    """Without BatchNorm, k micro-batches of b rows step as one batch of k * b rows does (and a
    step(batch) splits the batch into k by rows: 10 rows as 4, 3, 3)."""
    net, data = _Net(batchnorm=False), _data(10)
    arts = _artifacts(net, _optimizers("adamw", True)[0])
    whole, split = gc.Trainer(arts, backend=backend), gc.Trainer(arts, backend=backend, accumulate=3)
    for _ in range(3):
        assert split.step(data) == pytest.approx(whole.step(data), rel=1e-12)
    _assert_state(split, whole.state_dict())


def test_resume_mid_epoch_is_exact(tmp_path, monkeypatch):
    """Ctrl-C after optimizer step 4 (epoch 2, 2 of its 6 batches done) saves at that step's end;
    the resumed run (on another backend) ends where the run that never stopped does."""
    net, data = _Net(), _data()
    arts = _artifacts(net, _optimizers("sgd", True)[0])
    loader = lambda: gc.data.DataLoader(data, batch_size=BATCH, shuffle=True, seed=3)  # noqa: E731
    straight = gc.Trainer(arts, backend="numpy", accumulate=2)
    straight.fit(loader(), epochs=3, progress=False, quiet=True)
    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:4")
    stopped = gc.Trainer(arts, backend="numpy", accumulate=2)
    with pytest.raises(gc.runtime.trainer.TrainingInterrupted):
        stopped.fit(loader(), epochs=3, progress=False, quiet=True, checkpoint=tmp_path / "ck")
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    assert (stopped.epoch, stopped.batch_in_epoch, stopped.step_count) == (1, 2, 4)
    resumed = gc.Trainer(tmp_path / "ck", backend="ort-cpu", accumulate=2)
    resumed.fit(loader(), epochs=3, progress=False, quiet=True)
    assert resumed.step_count == straight.step_count == 9
    _assert_state(resumed, straight.state_dict())


def test_refusals():
    arts = _artifacts(_Net(), _optimizers("sgd", False)[0])
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="accumulate must be an int >= 1"):
            gc.Trainer(arts, backend="numpy", accumulate=bad)
    with pytest.raises(ValueError, match="cuda_graph"):
        gc.Trainer(arts, backend="numpy", accumulate=2, cuda_graph=True)


def test_cli_train_accumulate(tmp_path):
    """``graphc train --accumulate 3`` trains as ``gc.Trainer(accumulate=3).fit`` does (the same
    shuffled loader): 2 epochs of 6 batches, 4 optimizer steps."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    data = _data()
    arts = _artifacts(_Net(), _optimizers("adamw", True)[0])
    arts.save(tmp_path / "arts")
    np.savez(tmp_path / "data.npz", **data)
    graphc = str(Path(sys.executable).parent / "graphc")
    r = subprocess.run([graphc, "train", str(tmp_path / "arts"), "--data", str(tmp_path / "data.npz"), "--epochs", "2",
                        "--batch-size", str(BATCH), "--accumulate", "3", "--backend", "ort-cpu", "--no-progress",
                        "--checkpoint", str(tmp_path / "ck")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    trained = gc.Trainer(tmp_path / "ck", backend="numpy", accumulate=3)  # the checkpoint's k (it refuses another)
    assert trained.step_count == 4
    here = gc.Trainer(arts, backend="numpy", accumulate=3)
    here.fit(gc.data.DataLoader(data, batch_size=BATCH, seed=0), epochs=2, progress=False, quiet=True)
    _assert_state(trained, here.state_dict())


@pytest.mark.parametrize("schedule", [["onecycle"], ["cosine", "--schedule-interval", "step"]])
def test_cli_schedule_spans_optimizer_steps(tmp_path, capsys, schedule):
    """``graphc train --accumulate 3 --schedule onecycle`` (or cosine per step) spans the run's
    optimizer steps, 2 an epoch of 6 batches, as ``OneCycleLR(total_steps=4)`` in Python: the
    schedule ends with the run (was 12 total steps, the loader's batches: the lr stopped mid-cycle)."""
    from cli_util import run_cli

    from graphc.runtime import lr_scheduler as S

    data = _data()
    arts = _artifacts(_Net(batchnorm=False), _optimizers("adamw", False)[0])
    arts.save(tmp_path / "arts")
    np.savez(tmp_path / "data.npz", **data)
    r = run_cli(capsys, "train", tmp_path / "arts", "--data", tmp_path / "data.npz", "--epochs", "2", "--batch-size",
                BATCH, "--accumulate", "3", "--backend", "numpy", "--no-progress", "--checkpoint", tmp_path / "ck",
                "--schedule", *schedule)
    assert r.code == 0, r.err
    trained = gc.Trainer(tmp_path / "ck", backend="numpy", accumulate=3)
    here = gc.Trainer(arts, backend="numpy", accumulate=3)
    sched = S.OneCycleLR(here, max_lr=0.01, total_steps=4, cycle_momentum=False) if schedule[0] == "onecycle" \
        else S.CosineAnnealingLR(here, T_max=4)
    here.fit(gc.data.DataLoader(data, batch_size=BATCH, seed=0), epochs=2, progress=False, quiet=True,
             scheduler=sched, interval="step")
    assert trained.step_count == here.step_count == 4
    _assert_state(trained, here.state_dict())
