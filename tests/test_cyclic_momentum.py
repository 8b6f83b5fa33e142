"""OneCycleLR and CyclicLR cycling the momentum (``cycle_momentum=True``, torch's default) on
training graphs generated with ``scheduled=["momentum"]``: the lr and momentum (``betas``)
sequences equal torch 2.13's bit for bit; 20 float64 steps of an MLP match torch's loop within
1e-12 on numpy and ort-cpu; a checkpoint mid-run resumes bit for bit; graphs that hold the
momentum constant are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import float64_models
import graphc as gc
from graphc.runtime import checkpoint as ckpt
from test_float64_lr import torch_optimizer

torch = pytest.importorskip("torch")
S = gc.optim.lr_scheduler
TS = torch.optim.lr_scheduler
STEPS = 20
SPECS = {"sgd": gc.optim.SGD(0.05, momentum=0.9), "nesterov": gc.optim.SGD(0.05, momentum=0.9, nesterov=True),
         "adam": gc.optim.Adam(0.01), "adamw": gc.optim.AdamW(0.01, weight_decay=0.1)}
SCHEDULES = {
    "onecycle-cos": lambda m, o: m.OneCycleLR(o, max_lr=0.3, total_steps=40),
    "onecycle-linear-3": lambda m, o: m.OneCycleLR(o, max_lr=0.3, epochs=5, steps_per_epoch=8, pct_start=0.25,
                                                   anneal_strategy="linear", three_phase=True,
                                                   base_momentum=0.8, max_momentum=0.97),
    "cyclic-triangular": lambda m, o: m.CyclicLR(o, 0.01, 0.2, step_size_up=4, step_size_down=7),
    "cyclic-triangular2": lambda m, o: m.CyclicLR(o, 0.01, 0.2, step_size_up=3, mode="triangular2"),
    "cyclic-exp_range": lambda m, o: m.CyclicLR(o, 0.01, 0.2, step_size_up=5, mode="exp_range", gamma=0.97),
    "cyclic-scale_fn": lambda m, o: m.CyclicLR(o, 0.01, 0.2, step_size_up=3, scale_fn=lambda x: 0.9 ** x),
    "cyclic-scale_fn-iterations": lambda m, o: m.CyclicLR(o, 0.01, 0.2, step_size_up=3, scale_fn=lambda x: 1 / (1 + x),
                                                          scale_mode="iterations"),
    "cyclic-no-momentum": lambda m, o: m.CyclicLR(o, 0.01, 0.2, step_size_up=6, cycle_momentum=False),
}


def _artifacts(spec, scheduled=("momentum",)):
    return gc.training.generate(float64_models.mlp(), gc.losses.mse("out", label="y"), spec, scheduled=scheduled)


@pytest.fixture(scope="module")
def arts():
    return {k: _artifacts(spec) for k, spec in SPECS.items()}


def _torch_twin(spec, state):
    params = {n: torch.nn.Parameter(torch.from_numpy(np.array(state[n]))) for n in ("fc1.weight", "fc1.bias",
                                                                                 "fc2.weight", "fc2.bias")}
    return params, torch_optimizer(torch, spec, params)


def _momentum(group: dict) -> float:
    return group["betas"][0] if "betas" in group else group["momentum"]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: scheduler.step() before optimizer.step()
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kind", SPECS)
def test_lr_and_momentum_sequences_are_torchs(arts, kind, schedule):
    trainer = gc.Trainer(arts[kind], backend="numpy")
    ours = SCHEDULES[schedule](S, trainer)
    _, opt = _torch_twin(SPECS[kind], arts[kind].state)
    theirs = SCHEDULES[schedule](TS, opt)
    keys = ("lr", "betas") if "betas" in opt.param_groups[0] else ("lr", "momentum")
    for _ in range(40):
        group = opt.param_groups[0]
        assert {k: trainer.lr_group[k] for k in keys} == {k: group[k] for k in keys}  # bit for bit
        assert trainer.momentum == _momentum(group) and trainer.lr == group["lr"]
        ours.step()
        theirs.step()
    state = json.loads(json.dumps(ours.state_dict()))  # JSON, as checkpoints save it
    assert "_scale_fn_custom" not in state  # a function, left out as torch leaves it out


def _train(trainer, scheduler, batches, params=None, opt=None, torch_sched=None):
    for batch in batches:
        trainer.step(batch)
        scheduler.step()
        if opt is not None:
            h = torch.tanh(torch.from_numpy(batch["x"]) @ params["fc1.weight"].T + params["fc1.bias"])
            loss = torch.mean((h @ params["fc2.weight"].T + params["fc2.bias"] - torch.from_numpy(batch["y"])) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch_sched.step()


RUNS = {"sgd-nesterov-onecycle": ("nesterov", lambda m, o: m.OneCycleLR(o, max_lr=0.3, total_steps=STEPS)),
        "sgd-onecycle-3": ("sgd", lambda m, o: m.OneCycleLR(o, max_lr=0.3, total_steps=STEPS, three_phase=True)),
        "adamw-cyclic": ("adamw", lambda m, o: m.CyclicLR(o, 0.001, 0.05, step_size_up=4, mode="triangular2")),
        "adam-onecycle": ("adam", lambda m, o: m.OneCycleLR(o, max_lr=0.05, total_steps=STEPS))}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("run", RUNS)
def test_training_matches_torch_and_resumes_exactly(arts, tmp_path, run, backend):
    kind, make = RUNS[run]
    batches = float64_models.mlp_batches(STEPS)
    straight = gc.Trainer(arts[kind], backend=backend)
    params, opt = _torch_twin(SPECS[kind], arts[kind].state)
    torch_sched = make(TS, opt)
    _train(straight, make(S, straight), batches, params, opt, torch_sched)
    ours = straight.state_dict()
    for name, p in params.items():
        assert np.max(np.abs(ours[name] - p.detach().numpy())) <= 1e-12, name
    assert straight.lr_group["lr"] == opt.param_groups[0]["lr"]
    assert straight.momentum == _momentum(opt.param_groups[0])

    first = gc.Trainer(arts[kind], backend=backend)
    first.scheduler = make(S, first)
    _train(first, first.scheduler, batches[:STEPS // 2])
    first.save_checkpoint(tmp_path / "ck.safetensors")
    resumed = gc.Trainer(arts[kind], backend=backend)
    resumed.load_checkpoint(tmp_path / "ck.safetensors")
    resumed.scheduler = make(S, resumed)
    assert resumed.momentum == first.momentum and resumed.lr_group == first.lr_group
    _train(resumed, resumed.scheduler, batches[STEPS // 2:])
    again = resumed.state_dict()
    assert all(np.array_equal(again[n], ours[n]) for n in ours)  # bit for bit
    assert resumed.lr_group == straight.lr_group


def test_graphs_without_the_option_hold_momentum_and_say_what_to_pass():
    trainer = gc.Trainer(_artifacts(SPECS["adamw"], scheduled=()), backend="numpy")
    assert "momentum" not in trainer.state_dict() and trainer.momentum == 0.9
    for make in (lambda: S.OneCycleLR(trainer, max_lr=0.1, total_steps=10),
                 lambda: S.CyclicLR(trainer, 0.01, 0.1)):
        with pytest.raises(ValueError, match=r"AdamW's beta1 as the constant 0\.9.*scheduled=\['momentum'\]"):
            make()
    with pytest.raises(ValueError, match="scheduled=\\['momentum'\\]"):
        trainer.momentum = 0.8
    S.OneCycleLR(trainer, max_lr=0.1, total_steps=10, cycle_momentum=False)  # the lr alone still cycles


def test_bad_schedules_and_values_are_refused():
    with pytest.raises(ValueError, match="adagrad has no momentum or beta1"):
        _artifacts(gc.optim.Adagrad(0.1))
    with pytest.raises(ValueError, match="NAdam's beta1"):
        _artifacts(gc.optim.NAdam(0.01))
    with pytest.raises(ValueError, match=r"\['lr'\] cannot be set between steps"):
        _artifacts(SPECS["sgd"], scheduled=["lr"])
    trainer = gc.Trainer(_artifacts(SPECS["adam"]), backend="numpy")
    with pytest.raises(ValueError, match="Adam's beta1 must be a finite number >= 0 and < 1, got 1.0"):
        trainer.momentum = 1.0
    with pytest.raises(ValueError, match=r"CyclicLR\(cycle_momentum=True\): Adam's beta1 .* got -0.1"):
        S.CyclicLR(trainer, 0.01, 0.1, base_momentum=-0.1)
    with pytest.raises(ValueError, match="mode must be 'triangular', 'triangular2' or 'exp_range'"):
        S.CyclicLR(trainer, 0.01, 0.1, mode="sawtooth")


def test_sgd_without_momentum_gets_a_buffer_when_scheduled():
    """torch's SGD(momentum=0) under OneCycleLR steps with the cycled momentum from the start."""
    arts = _artifacts(gc.optim.SGD(0.05))
    assert "fc1.weight.momentum_buffer" in arts.state and float(arts.state["momentum"]) == 0.0
    trainer = gc.Trainer(arts, backend="numpy")
    params, opt = _torch_twin(gc.optim.SGD(0.05), arts.state)
    make = RUNS["sgd-nesterov-onecycle"][1]
    _train(trainer, make(S, trainer), float64_models.mlp_batches(STEPS), params, opt, make(TS, opt))
    for name, p in params.items():
        assert np.max(np.abs(trainer.state_dict()[name] - p.detach().numpy())) <= 1e-12, name


# --- graphc grad --scheduled momentum, graphc train --schedule onecycle / cyclic -------------------

@pytest.mark.parametrize("schedule", [["onecycle"], ["cyclic", "--min-lr", "0.001", "--step-size", "3"]],
                         ids=["onecycle", "cyclic"])
def test_cli_cycles_the_momentum_where_the_artifacts_take_it(tmp_path, capsys, schedule):
    from cli_util import run_cli, workspace

    root = workspace(tmp_path)
    r = run_cli(capsys, "grad", root / "mlp.onnx", "--loss", "cross_entropy:logits:y", "--optimizer", "sgd",
                "--lr", "0.05", "--momentum", "0.9", "--scheduled", "momentum", "-o", root / "cycled")
    assert r.code == 0, r.err
    args = ["--data", root / "data.npz", "--batch-size", "16", "--epochs", "2", "--backend", "numpy", "--no-progress",
            "--schedule", *schedule]
    r = run_cli(capsys, "train", root / "cycled", *args, "--checkpoint", root / "ck")
    assert r.code == 0 and "note:" not in r.out, r.err
    trainer = gc.Trainer(root / "cycled", backend="numpy")  # the same run in Python, torch's defaults
    make = (lambda: S.OneCycleLR(trainer, max_lr=0.05, total_steps=8)) if schedule[0] == "onecycle" else (
        lambda: S.CyclicLR(trainer, 0.001, 0.05, step_size_up=3))
    trainer.fit(gc.data.DataLoader(dict(np.load(root / "data.npz")), batch_size=16, seed=0), 2, interval="step",
                progress=False, quiet=True, scheduler=make())
    saved = gc.Trainer(root / "ck", backend="numpy")
    assert saved.momentum == trainer.momentum != 0.9
    assert json.loads(ckpt.read_meta(root / "ck").schedule)["group"] == trainer.lr_group  # SGD's: no tuples
    assert all(np.array_equal(a, trainer.state_dict()[n]) for n, a in saved.state_dict().items())

    r = run_cli(capsys, "train", root / "arts", *args)  # Adam with a constant beta1: the lr alone, said
    assert r.code == 0, r.err
    assert "cycles the lr only: these artifacts hold Adam's beta1 constant" in r.out
    assert "graphc grad --scheduled momentum" in r.out
