"""Differential audit of how ``gc.training.generate``'s options combine: loss scaling (a dynamic
``gc.amp.GradScaler`` or a static scale), ``scheduled=("momentum",)`` under OneCycleLR with
``cycle_momentum=True``, ``autocast`` (bfloat16, float16 beside a scaler), ``fused``,
``recompute``, ``batchnorm="frozen"``, frozen params, weight decay with ``no_decay``, gradient
clipping by value and norm, and an Embedding with ``max_norm`` (renormalised rows), drawn together
on an MLP, a Conv+BatchNorm net and an Embedding net. Each draw trains a few steps on numpy or
ort-cpu against the torch 2.13 loop that does the same (``torch.autocast(cpu)``,
``torch.amp.GradScaler`` with ``unscale_`` before ``clip_grad_value_``/``clip_grad_norm_``,
``OneCycleLR(cycle_momentum=True)``, ``bn.eval()``), float32 on both sides; is checkpointed
mid-run and resumed from the checkpoint's folder bit for bit; and exports its inference model,
float32 and float16, checked against the Trainer's eval-mode prediction."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_util import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from test_trainer_torch_differential import SETTINGS

import graphc as gc

torch = pytest.importorskip("torch")
F = torch.nn.functional

STEPS = 5
CLASSES = 3
SHAPES = {"mlp": (5,), "cnn": (2, 4, 4), "emb": (3,)}
# float32 on both sides: summation order alone moves losses and params ~1e-7 relative a step,
# bfloat16 MatMul inputs (rounded alike on both sides, then summed in float32) about as much;
# float16 ones round the small gradients' entries differently (more bits kept, nearer the
# noise), which Adam's division scales up (seen: 2.6e-5 absolute after 5 steps); a missed
# unscale, clip, momentum or renormalisation moves them 1e-2 or more; torch's float16 Conv weight gradient,
# rounded once per sample, can flip a ReLU of a CNN draw a step later: 2.7e-3 seen on random draws
# (test_autocast_conv_rounding.py)
TOLERANCE = {None: (2e-4, 2e-5), "bfloat16": (2e-4, 2e-5), "float16": (2e-3, 2e-4)}


# --- the nets, one forward for the DSL module and its torch twin ------------------------------------

def _layers(lib, arch: str, **f32) -> dict:
    nn = lib.nn
    if arch == "mlp":
        return {"fc": nn.Linear(5, 6, **f32), "head": nn.Linear(6, CLASSES, **f32)}
    if arch == "cnn":  # no conv bias before BatchNorm: its true gradient is 0, rounding noise each side
        return {"conv": nn.Conv2d(2, 3, 3, padding=1, bias=False, **f32), "bn": nn.BatchNorm2d(3, **f32),
                "head": nn.Linear(48, CLASSES, **f32)}
    return {"emb": nn.Embedding(7, 4, max_norm=1.0, **f32), "head": nn.Linear(4, CLASSES, **f32)}


def _forward(m, x, relu):
    if m.arch == "mlp":
        return m.head(relu(m.fc(x)))
    if m.arch == "cnn":
        return m.head(relu(m.bn(m.conv(x))).flatten(1))
    return m.head(m.emb(x).mean(1))


class _Net(gc.nn.Module):
    def __init__(self, arch: str):
        super().__init__()
        self.arch = arch
        for name, layer in _layers(gc, arch, dtype="float32").items():
            setattr(self, name, layer)

    def forward(self, x):
        return _forward(self, x, gc.relu)


class _Twin(torch.nn.Module):
    def __init__(self, arch: str, state: dict):
        super().__init__()
        self.arch = arch
        for name, layer in _layers(torch, arch, dtype=torch.float32).items():
            setattr(self, name, layer)
        ours = {k: torch.from_numpy(np.array(v)) for k, v in state.items() if k in self.state_dict()}
        missing, _ = self.load_state_dict(ours, strict=False)
        assert all(k.endswith("num_batches_tracked") for k in missing), missing

    def forward(self, x):
        return _forward(self, x, torch.relu)


def _batch(arch: str, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    if arch == "emb":
        x = rng.integers(0, 7, (n, 3)).astype(np.int64)
    else:
        x = (rng.standard_normal((n, *SHAPES[arch])) * 1.5 + 0.3).astype(np.float32)
    return {"x": x, "y": rng.integers(0, CLASSES, n).astype(np.int64)}


# --- the options, drawn together ------------------------------------------------------------------

@st.composite
def _cases(draw):
    arch = draw(st.sampled_from(sorted(SHAPES)))
    kind = draw(st.sampled_from(["sgd", "adam", "adamw"]))
    options = {"no_decay": draw(st.sampled_from([(), ("head.*",)])),
               **draw(st.sampled_from([{}, {"max_grad_norm": 0.3}, {"clip_grad_value": 0.05, "max_grad_norm": 0.5},
                                       {"max_grad_norm": 0.5, "grad_norm_type": "inf"}]))}
    if kind == "sgd":
        spec = gc.optim.SGD(lr=0.1, momentum=0.9, nesterov=draw(st.booleans()),
                            weight_decay=draw(st.sampled_from([0.0, 0.01])), **options)
    else:
        spec = getattr(gc.optim, {"adam": "Adam", "adamw": "AdamW"}[kind])(
            lr=0.02, weight_decay=draw(st.sampled_from([0.0, 0.05])), **options)
    autocast = draw(st.sampled_from([None, "bfloat16", "float16"]))
    scale = draw(st.sampled_from([None, "dynamic", 256.0] if autocast != "float16" else ["dynamic", 256.0]))
    batchnorm = draw(st.sampled_from(["train", "frozen"])) if arch == "cnn" else "train"
    return {"arch": arch, "spec": spec, "autocast": autocast, "scale": scale, "batchnorm": batchnorm,
            "scheduled": draw(st.sampled_from([(), ("momentum",)])),
            "frozen": draw(st.sampled_from([(), ("head.bias",)])),
            "fused": draw(st.booleans()), "recompute": draw(st.booleans()),
            "backend": draw(st.sampled_from(["numpy", "ort-cpu"])), "seed": draw(st.integers(0, 2**16))}


def _scaler_args(case) -> dict | None:
    """torch.amp.GradScaler's arguments for the case's loss scale (a static one never changes:
    no step of these batches overflows, and growth waits longer than the run)."""
    if case["scale"] is None:
        return None
    if case["scale"] == "dynamic":
        return {"init_scale": 2.0 ** 12, "growth_interval": 2}
    return {"init_scale": case["scale"], "growth_interval": 10 ** 9}


def _artifacts(case, net):
    model = gc.capture(net, seed=case["seed"], x=gc.spec("int64" if case["arch"] == "emb" else "float32",
                                                         ("N", *SHAPES[case["arch"]])))
    args = _scaler_args(case)
    scale = None if args is None else gc.amp.GradScaler(**args) if case["scale"] == "dynamic" else case["scale"]
    return gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), case["spec"],
                                frozen=case["frozen"], fused=case["fused"], recompute=case["recompute"],
                                batchnorm=case["batchnorm"], loss_scale=scale, scheduled=case["scheduled"],
                                autocast=case["autocast"])


def _schedule(lib, owner, case):
    """OneCycleLR cycling the momentum with scheduled momentum, else none (the spec's lr)."""
    if not case["scheduled"]:
        return None
    return lib.OneCycleLR(owner, max_lr=case["spec"].lr * 3, total_steps=STEPS + 1, cycle_momentum=True,
                          base_momentum=0.8, max_momentum=0.95)


class _TorchRun:
    """The same steps in torch: autocast, GradScaler (unscale_ before clipping), the optimizer
    of the spec with its no_decay group, OneCycleLR, frozen params and BatchNorm."""

    def __init__(self, case, state: dict):
        spec, self.case = case["spec"], case
        self.model = _Twin(case["arch"], state)
        named = {n: p for n, p in self.model.named_parameters() if n not in case["frozen"]}
        for n, p in self.model.named_parameters():
            p.requires_grad_(n in named)
        self.params = list(named.values())
        from fnmatch import fnmatch

        excluded = {n for n in named if any(fnmatch(n, pat) for pat in spec.no_decay)}
        groups = [{"params": [p for n, p in named.items() if n not in excluded]},
                  {"params": [p for n, p in named.items() if n in excluded], "weight_decay": 0.0}]
        kwargs = {k: v for k, v in spec.model_dump().items() if k in ("momentum", "nesterov", "weight_decay")}
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.kind]
        self.opt = cls([g for g in groups if g["params"]], lr=spec.lr, foreach=False, **kwargs)
        args = _scaler_args(case)
        self.scaler = None if args is None else torch.amp.GradScaler("cpu", **args)
        self.sched = _schedule(torch.optim.lr_scheduler, self.opt, case)

    def step(self, batch: dict) -> float:
        spec, case = self.case["spec"], self.case
        self.model.train()
        if case["batchnorm"] == "frozen":
            self.model.bn.eval()
        self.opt.zero_grad()
        dtype = getattr(torch, case["autocast"] or "float32")
        with torch.autocast("cpu", dtype=dtype, enabled=case["autocast"] is not None):
            loss = F.cross_entropy(self.model(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        if spec.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(self.params, spec.clip_grad_value)
        if spec.max_grad_norm is not None:
            norm_type = math.inf if spec.grad_norm_type == "inf" else spec.grad_norm_type
            torch.nn.utils.clip_grad_norm_(self.params, spec.max_grad_norm, norm_type)
        if self.scaler is None:
            self.opt.step()
        else:
            self.scaler.step(self.opt)
            self.scaler.update()
        if self.sched is not None:
            self.sched.step()
        return loss.item()

    def state(self) -> dict:
        return {k: v.detach().numpy() for k, v in self.model.state_dict().items()
                if "num_batches" not in k and k not in self.case["frozen"]}


def _train(trainer, batches) -> list[float]:
    losses = []
    for batch in batches:
        losses.append(trainer.step(batch))
        if trainer.scheduler is not None:
            trainer.scheduler.step()
    return losses


@settings(SETTINGS, max_examples=12)  # derandomized as the base audit; 45 random draws passed too
@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: the scheduler stepped after a skipped step
@given(case=_cases(), data=st.data())
def test_option_combinations_match_torch_resume_exactly_and_export(tmp_path_factory, case, data):
    tmp = tmp_path_factory.mktemp("combo")
    net = _Net(case["arch"])
    _artifacts(case, net).save(tmp / "arts")
    batches = [_batch(case["arch"], data.draw(st.integers(3, 6)), case["seed"] + i) for i in range(STEPS)]

    trainer = gc.Trainer(tmp / "arts", backend=case["backend"])
    trainer.scheduler = _schedule(gc.optim.lr_scheduler, trainer, case)
    oracle = _TorchRun(case, net.state_dict())
    at = data.draw(st.integers(1, STEPS - 1))
    losses = _train(trainer, batches[:at])
    trainer.save_checkpoint(tmp / "ck")
    losses += _train(trainer, batches[at:])
    expected = [oracle.step(b) for b in batches]
    rtol, atol = TOLERANCE[case["autocast"]]
    np.testing.assert_allclose(losses, expected, rtol=rtol, atol=atol)
    ours = trainer.state_dict()
    for name, want in oracle.state().items():
        np.testing.assert_allclose(ours[name], want, rtol=rtol, atol=atol, err_msg=name)
    if oracle.scaler is not None:
        assert trainer.loss_scale == oracle.scaler.get_scale()
    if case["scheduled"]:
        group = oracle.opt.param_groups[0]
        assert trainer.momentum == group.get("momentum", group.get("betas", (None,))[0])
        assert trainer.lr_group["lr"] == group["lr"]  # the scheduler's float64 lr (the graph's is float32)

    # a fresh Trainer of the checkpoint's folder, its schedule recreated as a script would
    resumed = gc.Trainer(tmp / "ck", backend=case["backend"])
    resumed.scheduler = _schedule(gc.optim.lr_scheduler, resumed, case)
    assert _train(resumed, batches[at:]) == losses[at:]
    for name, value in resumed.state_dict().items():
        np.testing.assert_array_equal(value, ours[name], err_msg=name)

    # the exported inference model against the Trainer's eval mode, float32 and float16
    held = _batch(case["arch"], 5, case["seed"] + 99)
    want = trainer.predict({"x": held["x"]})["output"]
    for dtype, tol in ((None, 1e-5), ("float16", 2e-2)):
        path = trainer.export_inference(tmp / f"inference-{dtype}.onnx", dtype=dtype)
        x = held["x"] if dtype is None or case["arch"] == "emb" else held["x"].astype(dtype)
        got = gc.Session(path, backend=case["backend"]).run({"x": x})["output"]
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=str(dtype))


def test_frozen_batchnorm_artifacts_load_from_their_folder(tmp_path):
    """batchnorm="frozen" statistics are train_step state that no output feeds (read, never
    updated): a saved folder of such artifacts loads, where a state another option leaves
    unfed is still refused."""
    arts = gc.training.generate(gc.capture(_Net("cnn"), seed=0, x=gc.spec("float32", ("N", 2, 4, 4))),
                                gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.1), batchnorm="frozen")
    arts.save(tmp_path / "arts")
    loaded = gc.training.load(tmp_path / "arts")
    assert {"bn.running_mean", "bn.running_var"} <= set(loaded.state) - set(loaded.manifest.feeds.values())
    manifest = json.loads((tmp_path / "arts" / "manifest.json").read_text())
    del manifest["feeds"]["step.next"]
    (tmp_path / "arts" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(gc.errors.ArtifactsError, match="feeds gives the train_step state 'step' 0 next values, not 1"):
        gc.training.load(tmp_path / "arts")


def test_cli_takes_the_options_together(tmp_path, capsys):
    """graphc grad with every option of this audit at once, graphc train --schedule onecycle
    (cycling the momentum) stopped mid-epoch and resumed, graphc export float32 and float16:
    the resumed run's params equal an uninterrupted run's bit for bit."""
    gc.capture(_Net("cnn"), seed=0, x=gc.spec("float32", ("N", 2, 4, 4))).save(tmp_path / "cnn.onnx")
    train = _batch("cnn", 24, 0)
    np.savez(tmp_path / "d.npz", x=train["x"], y=train["y"])
    done = run_cli(capsys, "grad", tmp_path / "cnn.onnx", "--loss", "cross_entropy:output:y", "--optimizer", "adamw",
                   "--lr", "0.01", "--loss-scale", "dynamic", "--scheduled", "momentum", "--autocast", "bfloat16",
                   "--max-grad-norm", "1", "--clip-grad-value", "0.5", "--batchnorm", "frozen", "--recompute",
                   "--freeze", "head.bias", "--weight-decay", "0.05", "-o", tmp_path / "arts")
    assert done.code == 0, done.err
    assert "BatchNorm frozen; loss scale dynamic from 65536; autocast bfloat16" in done.out
    train_args = ["train", tmp_path / "arts", "--data", tmp_path / "d.npz", "--epochs", "2", "--batch-size", "8",
                  "--schedule", "onecycle", "-q", "-b", "ort-cpu"]
    assert run_cli(capsys, *train_args, "--checkpoint", tmp_path / "straight").code == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gc.Trainer, "step", _interrupt_at(4, gc.Trainer.step))
        assert run_cli(capsys, *train_args, "--checkpoint", tmp_path / "ck").code == 130
    assert run_cli(capsys, *train_args, "--checkpoint", tmp_path / "ck", "--resume").code == 0
    straight, resumed = gc.Trainer(tmp_path / "straight"), gc.Trainer(tmp_path / "ck")
    assert resumed.step_count == straight.step_count == 6 and resumed.momentum == straight.momentum != 0.9
    for name, value in straight.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)
    want = straight.predict({"x": train["x"]})["output"]
    for dtype, tol in (("", 1e-5), ("float16", 2e-2)):
        out = tmp_path / f"m{dtype}.onnx"
        assert run_cli(capsys, "export", tmp_path / "ck", "-o", out, *(["--dtype", dtype] if dtype else [])).code == 0
        got = gc.Session(out, backend="ort-cpu").run({"x": train["x"].astype(dtype or "float32")})["output"]
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol * np.abs(want).max())


def _interrupt_at(step: int, real):
    """``Trainer.step`` that raises KeyboardInterrupt (Ctrl-C) before the step numbered ``step``."""
    def step_or_stop(self, batch):
        if self.step_count == step:
            raise KeyboardInterrupt
        return real(self, batch)
    return step_or_stop
