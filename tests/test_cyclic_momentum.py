"""OneCycleLR and CyclicLR cycling the momentum (``cycle_momentum=True``, torch's default) on
training graphs generated with ``scheduled=["momentum"]``: the lr and momentum (``betas``)
sequences equal torch 2.13's bit for bit; 20 float64 steps of an MLP match torch's loop within
1e-12 on numpy and ort-cpu for every kind with a momentum or beta1 (NAdam's ``mu_product`` a
state, as torch's), a momentum of exactly 0 included (torch's SGD and RMSprop then leave the
buffer alone); a checkpoint mid-run resumes bit for bit; graphs that hold the momentum
constant are refused by name. torch runs with float64 as its default dtype (``torch_float64``:
its NAdam's ``mu_product`` float64)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import float64_models
import graphc as gc
from graphc.runtime import checkpoint as ckpt
from test_optim import TORCH_OPTIM, torch_kwargs

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
    return params, getattr(torch.optim, TORCH_OPTIM[spec.kind])(list(params.values()), foreach=False,
                                                                 **torch_kwargs(spec))


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
    if schedule.startswith("cyclic"):  # a function: its attributes left out, as torch leaves them out
        assert state["_scale_fn_custom"] is None == theirs.state_dict()["_scale_fn_custom"]


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
        "adam-onecycle": ("adam", lambda m, o: m.OneCycleLR(o, max_lr=0.05, total_steps=STEPS)),
        "nadam-cyclic": ("nadam", lambda m, o: m.CyclicLR(o, 0.001, 0.05, step_size_up=4, mode="triangular2"))}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("run", RUNS)
def test_training_matches_torch_and_resumes_exactly(arts, tmp_path, run, backend, torch_float64):
    kind, make = RUNS[run]
    if kind not in arts:
        arts = {kind: _artifacts(KINDS[kind])}
    batches = float64_models.mlp_batches(STEPS)
    straight = gc.Trainer(arts[kind], backend=backend)
    params, opt = _torch_twin(KINDS[kind], arts[kind].state)
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


KINDS = {"nadam": gc.optim.NAdam(0.01),
         "nadam-decoupled": gc.optim.NAdam(0.01, weight_decay=0.1, decoupled_weight_decay=True, momentum_decay=0.01),
         "rmsprop": gc.optim.RMSprop(0.01, momentum=0.5), "rmsprop-centered": gc.optim.RMSprop(0.01, centered=True),
         "adamax": gc.optim.Adamax(0.01), "radam": gc.optim.RAdam(0.01, weight_decay=0.05),
         "sgd-dampened": gc.optim.SGD(0.05, momentum=0.9, dampening=0.3), **SPECS}
CYCLES = {"onecycle": lambda m, o: m.OneCycleLR(o, max_lr=0.05, total_steps=STEPS),
          "cyclic": lambda m, o: m.CyclicLR(o, 0.001, 0.05, step_size_up=4, mode="triangular2"),
          # the momentum 0 at steps 4, 10, 16 (SGD and RMSprop: the buffer skipped), and from 0 up:
          # torch's SGD creates the buffer at step 2, undamped (torch's RMSprop fails then: KeyError)
          "cyclic-to-zero": lambda m, o: m.CyclicLR(o, 0.001, 0.05, step_size_up=3, base_momentum=0.0),
          "onecycle-from-zero": lambda m, o: m.OneCycleLR(o, max_lr=0.05, total_steps=STEPS, base_momentum=0.9,
                                                          max_momentum=0.0)}


def _assert_trains_as_torch(spec, make, backend, torch_float64):
    arts = _artifacts(spec)
    trainer = gc.Trainer(arts, backend=backend)
    params, opt = _torch_twin(spec, arts.state)
    _train(trainer, make(S, trainer), float64_models.mlp_batches(STEPS), params, opt, make(TS, opt))
    ours = trainer.state_dict()
    for name, p in params.items():
        assert np.max(np.abs(ours[name] - p.detach().numpy())) <= 1e-12, name
        for slot, value in opt.state[p].items():
            if f"{name}.{slot}" in ours:
                assert np.max(np.abs(ours[f"{name}.{slot}"] - value.numpy())) <= 1e-12, (name, slot)
    if spec.kind == "nadam":  # one product for all params, as torch's (each param steps each step)
        assert abs(float(ours["mu_product"]) - float(opt.state[params["fc1.bias"]]["mu_product"])) <= 1e-15


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("cycle", ["onecycle", "cyclic"])
@pytest.mark.parametrize("kind", ["nadam", "nadam-decoupled", "rmsprop", "rmsprop-centered", "adamax", "radam"])
def test_every_kind_with_a_beta1_or_momentum_cycles_as_torch(kind, cycle, backend, torch_float64):
    _assert_trains_as_torch(KINDS[kind], CYCLES[cycle], backend, torch_float64)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind,cycle", [(k, "cyclic-to-zero") for k in ("sgd", "nesterov", "sgd-dampened", "rmsprop",
                                                                         "rmsprop-centered", "nadam")]
                         + [(k, "onecycle-from-zero") for k in ("sgd", "sgd-dampened", "adamax")])
def test_a_momentum_of_zero_skips_the_buffer_as_torch(kind, cycle, backend, torch_float64):
    _assert_trains_as_torch(KINDS[kind], CYCLES[cycle], backend, torch_float64)


def test_nadam_keeps_mu_product_only_when_beta1_is_scheduled():
    plain, cycled = (_artifacts(gc.optim.NAdam(0.01), scheduled=s) for s in ((), ("momentum",)))
    assert "mu_product" not in plain.state and float(cycled.state["mu_product"]) == 1.0
    graph = cycled.train_step.ir.graph
    assert "mu_product" in [v.name for v in graph.inputs] and "mu_product.next" in [v.name for v in graph.outputs]
    assert "momentum_steps" in _artifacts(KINDS["sgd-dampened"]).state  # torch's buffer created, or not yet


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


# --- CyclicLR's scale_fn objects and --gamma; a linear OneCycleLR stepped past its last step --------

class _Halving:
    """A scale_fn object with state of its own (torch's state_dict keeps its ``__dict__``)."""

    def __init__(self, base: float) -> None:
        self.base, self.calls = base, 0

    def __call__(self, x: float) -> float:
        self.calls += 1
        return self.base ** x


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_scale_fn_objects_attributes_are_saved_and_restored_as_torchs(arts):
    trainer = gc.Trainer(arts["sgd"], backend="numpy")
    _, opt = _torch_twin(SPECS["sgd"], arts["sgd"].state)
    ours, theirs = (m.CyclicLR(o, 0.01, 0.2, step_size_up=3, scale_fn=_Halving(0.7)) for m, o in ((S, trainer), (TS, opt)))
    for _ in range(5):
        ours.step()
        theirs.step()
    state = json.loads(json.dumps(ours.state_dict()))
    assert state["_scale_fn_custom"] == theirs.state_dict()["_scale_fn_custom"] == {"base": 0.7, "calls": 12}
    fresh = S.CyclicLR(gc.Trainer(arts["sgd"], backend="numpy"), 0.01, 0.2, step_size_up=3, scale_fn=_Halving(0.5))
    fresh.load_state_dict(state)
    assert fresh._scale_fn_custom.__dict__ == {"base": 0.7, "calls": 12} and fresh.get_last_lr() == ours.get_last_lr()
    assert S.CyclicLR(trainer, 0.01, 0.2, scale_fn=lambda x: 1.0).state_dict()["_scale_fn_custom"] is None  # as torch
    with pytest.raises(ValueError, match=r"scale_fn object's attributes \(\['base', 'calls'\]\); give the scheduler"):
        S.CyclicLR(gc.Trainer(arts["sgd"], backend="numpy"), 0.01, 0.2).load_state_dict(state)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_linear_onecycle_past_its_end_takes_beta1_past_1_as_torch(arts):
    """torch writes beta1 1.165 at the scheduler step after the last (and its Adam carries on);
    so does graphc, into the group and the graph."""
    trainer = gc.Trainer(arts["adam"], backend="numpy")
    _, opt = _torch_twin(SPECS["adam"], arts["adam"].state)
    ours, theirs = (m.OneCycleLR(o, max_lr=0.1, total_steps=4, anneal_strategy="linear", base_momentum=0.5,
                                 max_momentum=0.99) for m, o in ((S, trainer), (TS, opt)))
    for _ in range(4):
        ours.step()
        theirs.step()
        assert trainer.momentum == opt.param_groups[0]["betas"][0]
    assert trainer.momentum == trainer.lr_group["betas"][0] > 1.0
    with pytest.raises(ValueError, match="Adam's beta1 must be a finite number >= 0 and < 1, got 1.1"):
        trainer.momentum = 1.1  # set by hand: still refused


@pytest.mark.parametrize("gamma", ["0.9", None])
def test_cli_cyclic_takes_gamma_as_exp_range(tmp_path, capsys, gamma):
    from cli_util import run_cli, workspace

    root = workspace(tmp_path)
    args = ["--data", root / "data.npz", "--batch-size", "16", "--epochs", "1", "--backend", "numpy", "--no-progress",
            "--schedule", "cyclic", "--min-lr", "0.001", "--step-size", "3", *(["--gamma", gamma] if gamma else []),
            "--checkpoint", root / "ck"]
    r = run_cli(capsys, "train", root / "arts", *args)
    assert r.code == 0, r.err
    state = json.loads(ckpt.read_meta(root / "ck").schedule)["state"]
    assert (state["mode"], state["gamma"]) == (("exp_range", 0.9) if gamma else ("triangular", 1.0))
    for schedule in ("onecycle", "cosine"):
        r = run_cli(capsys, "train", root / "arts", *args[:9], "--schedule", schedule, "--gamma", "0.9")
        assert r.code != 0 and f"--gamma: --schedule {schedule} takes no decay factor" in r.out + r.err
