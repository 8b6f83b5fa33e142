"""Differential audit of training: random small float64 DSL models, optimizers, lr schedules,
frozen params, weight-decay exclusions, clipping and loss specs, trained by ``gc.Trainer`` (step and
``fit`` over a ``gc.data.DataLoader`` with an uneven last batch) on the numpy backend and ort-cpu,
against the same steps in a hand-written float64 ``torch.optim`` loop. Every run is also cut at a
random step (mid-epoch in ``fit``) and resumed from its checkpoint by a fresh Trainer, of the same
artifacts and of re-generated ones saved to a folder: its losses and params must be bit-identical
to the uninterrupted run's. ``evaluate`` and ``export_inference`` are checked against torch's eval
mode after training."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import graphc as gc
from trainer_models import interrupt_at

torch = pytest.importorskip("torch")
F = torch.nn.functional

F64 = {"dtype": "float64"}
# float64 end to end: the graphs and torch differ only by summation order (~1e-16 relative); a few
# steps through BatchNorm over 2-6 rows (1/sqrt(var + 1e-5) of a near-zero variance) amplify that to
# ~1e-9 relative (seen: 1.1e-9), while a wrong formula moves losses and params by 1e-3 or more
RTOL, ATOL = 1e-7, 1e-9
CLASSES = 3
SETTINGS = settings(max_examples=6, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class _Net(gc.nn.Module):
    """``arch`` features (mlp: the input; cnn: Conv2d [+ BatchNorm2d], flattened; emb: Embedding,
    averaged over the sequence) -> Linear -> ``norm`` (LayerNorm, BatchNorm1d or none) -> ReLU ->
    Dropout(0) -> Linear head of ``out`` features."""

    def __init__(self, arch: str, norm: str, out: int):
        super().__init__()
        self.arch, self.norm_kind = arch, norm
        if arch == "cnn":
            self.conv = gc.nn.Conv2d(2, 3, 3, padding=1, **F64)
            self.bn2 = gc.nn.BatchNorm2d(3, **F64)
        if arch == "emb":
            self.emb = gc.nn.Embedding(7, 4, **F64)
        # no bias before a BatchNorm, as usual: its true gradient is 0, and Adam would step by the
        # rounding noise standing for it (noise / (|noise| + eps)), on each side differently
        self.fc = gc.nn.Linear(_FEATURES[arch], 6, bias=norm != "bn", **F64)
        if norm == "ln":
            self.norm = gc.nn.LayerNorm(6, **F64)
        if norm == "bn":
            self.norm = gc.nn.BatchNorm1d(6, **F64)
        self.drop = gc.nn.Dropout(0.0)
        self.head = gc.nn.Linear(6, out, **F64)

    def forward(self, x):
        return _forward(self, x, gc.relu)


_FEATURES = {"mlp": 5, "cnn": 3 * 4 * 4, "emb": 4}
_INPUTS = {"mlp": gc.spec("float64", ("N", 5)), "cnn": gc.spec("float64", ("N", 2, 4, 4)),
           "emb": gc.spec("int64", ("N", 3))}


def _forward(m, x, relu):
    """One forward for the DSL module and its torch twin (same attribute names)."""
    if m.arch == "cnn":
        x = relu(m.bn2(m.conv(x))).flatten(1)
    if m.arch == "emb":
        x = m.emb(x).mean(1)
    h = m.fc(x)
    if m.norm_kind != "none":
        h = m.norm(h)
    return m.head(m.drop(relu(h)))


class _Twin(torch.nn.Module):
    def __init__(self, arch: str, norm: str, out: int, state: dict):
        super().__init__()
        self.arch, self.norm_kind = arch, norm
        f64 = {"dtype": torch.float64}
        if arch == "cnn":
            self.conv = torch.nn.Conv2d(2, 3, 3, padding=1, **f64)
            self.bn2 = torch.nn.BatchNorm2d(3, **f64)
        if arch == "emb":
            self.emb = torch.nn.Embedding(7, 4, **f64)
        self.fc = torch.nn.Linear(_FEATURES[arch], 6, bias=norm != "bn", **f64)
        if norm == "ln":
            self.norm = torch.nn.LayerNorm(6, **f64)
        if norm == "bn":
            self.norm = torch.nn.BatchNorm1d(6, **f64)
        self.drop = torch.nn.Dropout(0.0)
        self.head = torch.nn.Linear(6, out, **f64)
        ours = {k: torch.from_numpy(np.array(v)) for k, v in state.items() if k in self.state_dict()}
        missing, _ = self.load_state_dict(ours, strict=False)
        assert all(k.endswith("num_batches_tracked") for k in missing), missing

    def forward(self, x):
        return _forward(self, x, torch.relu)


# --- losses: (spec, torch loss, label maker) ---------------------------------------------------

def _loss_case(draw):
    kind = draw(st.sampled_from(["cross_entropy", "mse", "l1", "huber", "bce_with_logits"]))
    reduction = draw(st.sampled_from(["mean", "sum"]))
    if kind == "cross_entropy":
        ignore = draw(st.sampled_from([-100, 1]))
        smoothing = draw(st.sampled_from([0.0, 0.2]))
        spec = gc.losses.cross_entropy("output", label="y", ignore_index=ignore, label_smoothing=smoothing,
                                       reduction=reduction)

        def torch_loss(out, y):
            return F.cross_entropy(out, y, ignore_index=ignore, label_smoothing=smoothing, reduction=reduction)

        def labels(rng, n):  # row 0 is never ignored: a step's batch always has a label a mean counts
            return np.concatenate([[0], rng.integers(0, CLASSES, n - 1)]).astype(np.int64)
        return spec, torch_loss, labels, CLASSES
    options = {"delta": draw(st.sampled_from([0.5, 1.0]))} if kind == "huber" else {}
    spec = getattr(gc.losses, kind)("output", label="y", reduction=reduction, **options)
    torch_fn = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.huber_loss,
                "bce_with_logits": F.binary_cross_entropy_with_logits}[kind]

    def torch_loss(out, y):
        return torch_fn(out, y, reduction=reduction, **options)

    def labels(rng, n):
        y = rng.standard_normal((n, 2))
        return 1 / (1 + np.exp(-2 * y)) if kind == "bce_with_logits" else y
    return spec, torch_loss, labels, 2


def _all_ignored(spec, y) -> bool:
    options = spec.resolved_options()
    return spec.kind == "cross_entropy" and options["reduction"] == "mean" and bool(np.all(y == options["ignore_index"]))


def _data(arch: str, labels, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    if arch == "emb":
        x = rng.integers(0, 7, (n, 3)).astype(np.int64)
    else:
        x = rng.standard_normal((n, 2, 4, 4) if arch == "cnn" else (n, 5)) * 1.5 + 0.3
    return {"x": x, "y": labels(rng, n)}


# --- optimizers ----------------------------------------------------------------------------------

@st.composite
def _optimizers(draw):
    kind = draw(st.sampled_from(["sgd", "adam", "adamw"]))
    common = {"weight_decay": draw(st.sampled_from([0.0, 0.05])),
              "no_decay": draw(st.sampled_from([(), ("*.bias",), ("*.weight",), ("head.*",)]))}
    clip = draw(st.sampled_from([{}, {"max_grad_norm": 0.3}, {"max_grad_norm": 0.5, "grad_norm_type": "inf"},
                                 {"max_grad_norm": 1.0, "grad_norm_type": 1.0}, {"clip_grad_value": 0.05},
                                 {"clip_grad_value": 0.1, "max_grad_norm": 0.2}]))
    if kind == "sgd":
        momentum = draw(st.sampled_from([0.0, 0.9]))
        nesterov = momentum > 0 and draw(st.booleans())
        return gc.optim.SGD(lr=0.1, momentum=momentum, nesterov=nesterov, **common, **clip)
    betas = draw(st.sampled_from([(0.9, 0.999), (0.5, 0.9)]))
    cls = gc.optim.Adam if kind == "adam" else gc.optim.AdamW
    return cls(lr=0.02, betas=betas, eps=draw(st.sampled_from([1e-8, 1e-3])), **common, **clip)


def _torch_optimizer(spec, named: dict):
    from fnmatch import fnmatch

    decay = [p for n, p in named.items() if not any(fnmatch(n, pat) for pat in spec.no_decay)]
    no_decay = [p for n, p in named.items() if any(fnmatch(n, pat) for pat in spec.no_decay)]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if spec.kind == "sgd":
        return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum, nesterov=spec.nesterov,
                               weight_decay=spec.weight_decay)
    cls = torch.optim.Adam if spec.kind == "adam" else torch.optim.AdamW
    return cls(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay)


def _schedule(kind: str, base: float, steps: int) -> list[float]:
    """Per-step learning rates as one sets ``trainer.lr`` (and torch's param groups) between steps."""
    if kind == "constant":
        return [base] * steps
    if kind == "step":
        return [base * 0.5 ** (i // 2) for i in range(steps)]
    if kind == "warmup":  # linear warmup from 0, as LambdaLR/LinearLR start
        return [base * min(i, 3) / 3 for i in range(steps)]
    return [base * 0.5 * (1 + math.cos(math.pi * i / steps)) for i in range(steps)]  # cosine


# --- the torch loop --------------------------------------------------------------------------------

class _TorchRun:
    def __init__(self, case, state: dict):
        self.case = case
        self.model = _Twin(case["arch"], case["norm"], case["out"], state)
        self.named = {n: p for n, p in self.model.named_parameters() if n not in case["frozen"]}
        for n, p in self.model.named_parameters():
            p.requires_grad_(n not in case["frozen"])
        self.opt = _torch_optimizer(case["spec"], self.named)

    def step(self, batch: dict, lr: float | None = None) -> float:
        spec, params = self.case["spec"], list(self.named.values())
        if lr is not None:
            for group in self.opt.param_groups:
                group["lr"] = lr
        self.model.train()
        self.opt.zero_grad()
        loss = self.case["torch_loss"](self.model(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
        loss.backward()
        if spec.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(params, spec.clip_grad_value)
        if spec.max_grad_norm is not None:
            norm_type = math.inf if spec.grad_norm_type == "inf" else spec.grad_norm_type
            torch.nn.utils.clip_grad_norm_(params, spec.max_grad_norm, norm_type)
        self.opt.step()
        return loss.item()

    def eval_loss(self, batch: dict) -> tuple[float, np.ndarray]:
        self.model.eval()
        with torch.no_grad():
            out = self.model(torch.from_numpy(batch["x"]))
            return self.case["torch_loss"](out, torch.from_numpy(batch["y"])).item(), out.numpy()

    def state(self) -> dict:
        """Params and buffers as the Trainer's state_dict names them (frozen params are constants there)."""
        return {k: v.detach().numpy() for k, v in self.model.state_dict().items()
                if "num_batches" not in k and k not in self.case["frozen"]}


@st.composite
def _cases(draw):
    arch = draw(st.sampled_from(["mlp", "cnn", "emb"]))
    norm = draw(st.sampled_from(["none", "ln", "bn"]))
    spec, torch_loss, labels, out = _loss_case(draw)
    frozen = draw(st.sampled_from([(), ("fc.weight",), ("head.weight",), ("head.bias",)]))
    return {"arch": arch, "norm": norm, "out": out, "loss": spec, "torch_loss": torch_loss, "labels": labels,
            "spec": draw(_optimizers()), "frozen": frozen, "backend": draw(st.sampled_from(["numpy", "ort-cpu"])),
            "seed": draw(st.integers(0, 2**16))}


def _artifacts(case, net):
    model = gc.capture(net, seed=case["seed"], x=_INPUTS[case["arch"]])
    return gc.training.generate(model, case["loss"], case["spec"], frozen=case["frozen"])


def _assert_state(trainer, expected: dict, exact: bool = False):
    got = trainer.state_dict()
    for name, want in expected.items():
        if exact:
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=name)


def _resumed(arts, case, checkpoint, at: int, run_rest):
    """A fresh Trainer of ``arts`` that loads ``checkpoint`` (taken after step ``at``) and runs the rest."""
    fresh = gc.Trainer(arts, backend=case["backend"])
    fresh.load_checkpoint(checkpoint)
    assert fresh.step_count == at
    return fresh, run_rest(fresh)


@SETTINGS
@given(case=_cases(), schedule=st.sampled_from(["constant", "step", "warmup", "cosine"]),
       steps=st.integers(3, 6), data=st.data())
def test_steps_with_a_schedule_match_torch_and_resume_exactly(tmp_path_factory, case, schedule, steps, data):
    tmp = tmp_path_factory.mktemp("steps")
    net = _Net(case["arch"], case["norm"], case["out"])
    arts = _artifacts(case, net)
    lrs = _schedule(schedule, case["spec"].lr, steps)
    sizes = [data.draw(st.integers(2, 6)) for _ in range(steps)]
    batches = [_data(case["arch"], case["labels"], n, case["seed"] + i) for i, n in enumerate(sizes)]
    oracle = _TorchRun(case, net.state_dict())
    trainer = gc.Trainer(arts, backend=case["backend"])

    def run(t, lo):
        out = []
        for lr, batch in zip(lrs[lo:], batches[lo:]):
            t.lr = lr
            out.append(t.step(batch))
        return out

    at = data.draw(st.integers(1, steps - 1))
    losses = []
    for i, (lr, batch) in enumerate(zip(lrs, batches)):
        trainer.lr = lr
        losses.append(trainer.step(batch))
        if i + 1 == at:
            trainer.save_checkpoint(tmp / "ck")
    expected = [oracle.step(b, lr) for lr, b in zip(lrs, batches)]
    np.testing.assert_allclose(losses, expected, rtol=RTOL, atol=ATOL)
    _assert_state(trainer, oracle.state())

    # resumed by a fresh Trainer of the same artifacts and of re-generated ones in a folder
    _artifacts(case, net).save(tmp / "arts")
    for source in (arts, gc.training.load(tmp / "arts")):
        fresh, rest = _resumed(source, case, tmp / "ck", at, lambda t: run(t, at))
        assert rest == losses[at:]
        _assert_state(fresh, trainer.state_dict(), exact=True)

    # eval-mode loss and the exported inference graph after training, against torch's eval mode
    held = _data(case["arch"], case["labels"], 5, case["seed"] + 99)
    torch_loss, torch_out = oracle.eval_loss(held)
    np.testing.assert_allclose(trainer.evaluate(held)["loss"], torch_loss, rtol=RTOL, atol=ATOL)
    trainer.export_inference(tmp / "inf.onnx")
    exported = gc.Session(tmp / "inf.onnx", backend=case["backend"]).run({"x": held["x"]})["output"]
    np.testing.assert_allclose(exported, torch_out, rtol=RTOL, atol=ATOL)


@SETTINGS
@given(case=_cases(), n=st.integers(9, 14), batch_size=st.integers(3, 5), data=st.data())
def test_fit_with_an_uneven_last_batch_matches_torch_and_resumes_mid_epoch(tmp_path_factory, case, n, batch_size, data):
    if case["norm"] == "bn" or case["arch"] == "cnn":  # BatchNorm in train mode: a last batch of >= 2 rows
        n += (n % batch_size == 1)
    tmp = tmp_path_factory.mktemp("fit")
    net = _Net(case["arch"], case["norm"], case["out"])
    _artifacts(case, net).save(tmp / "arts")
    epochs = 2
    make_loader = lambda: gc.data.DataLoader(_data(case["arch"], case["labels"], n, case["seed"]),  # noqa: E731
                                             batch_size=batch_size, shuffle=True, drop_last=False, seed=case["seed"])
    history = gc.Trainer(tmp / "arts", backend=case["backend"]).fit(make_loader(), epochs, progress=False, quiet=True)

    oracle, loader, expected = _TorchRun(case, net.state_dict()), make_loader(), []
    for epoch in range(epochs):
        for index in range(len(loader)):
            batch = loader.batch(epoch, index)
            if not _all_ignored(case["loss"], batch["y"]):  # fit skips those (documented), torch would step
                expected.append(oracle.step(batch))
    assert len(loader) == math.ceil(n / batch_size)
    np.testing.assert_allclose(history.step_losses, expected, rtol=RTOL, atol=ATOL)

    # killed mid-run (mid-epoch when ``at`` is not a multiple of the epoch's steps), resumed from the checkpoint
    at = data.draw(st.integers(1, len(expected) - 1))
    interrupted = gc.Trainer(tmp / "arts", backend=case["backend"])
    calls = interrupt_at(interrupted, at)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit(make_loader(), epochs, progress=False, quiet=True)
    interrupted.save_checkpoint(tmp / "ck")
    resumed = gc.Trainer(tmp / "ck", backend=case["backend"])
    rest = resumed.fit(make_loader(), epochs, progress=False, quiet=True).step_losses
    assert calls + rest == history.step_losses
    _assert_state(resumed, oracle.state())
