"""Differential audit of the optimizers' options and of ``fit`` with lr schedulers: every
``gc.optim`` kind with every option torch allows (dampening, nesterov, amsgrad, maximize,
RMSprop's centered and momentum, Adagrad's lr_decay and initial accumulator, Adamax), frozen
params, no_decay, clipping, cross-entropy with class weights, ignore_index and label smoothing,
trained by ``Trainer.fit`` with every ``gc.optim.lr_scheduler`` scheduler stepped per epoch or per
step (ReduceLROnPlateau on the epoch's or step's loss), on numpy and ort-cpu, against a float64
torch loop with the same ``torch.optim`` optimizer and ``torch.optim.lr_scheduler`` scheduler.
The scheduler's lr must equal torch's bit for bit. Each run is also killed at a random step
(mid-epoch) and resumed from its checkpoint by a fresh Trainer (of the checkpoint's folder, or of
re-generated artifacts): losses, params and lr bit-identical to the uninterrupted run's. (Which
hyper-parameters ``gc.optim`` refuses, exactly torch.optim's: ``tests/test_optim_torch_checks.py``.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_trainer_torch_differential import (ATOL, CLASSES, RTOL, SETTINGS, _all_ignored, _assert_state, _data,
                                             _loss_case, _Net, _TorchRun)
from trainer_models import interrupt_at

import graphc as gc

torch = pytest.importorskip("torch")
F = torch.nn.functional

KINDS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad",
         "adamax": "Adamax"}


# --- optimizers: every kind and option ----------------------------------------------------------

@st.composite
def _optimizers(draw):
    kind = draw(st.sampled_from(sorted(KINDS)))
    options = {"weight_decay": draw(st.sampled_from([0.0, 0.05])), "maximize": draw(st.booleans()),
               "no_decay": draw(st.sampled_from([(), ("*.bias",), ("head.*",)]))}
    options.update(draw(st.sampled_from([{}, {"max_grad_norm": 0.3}, {"max_grad_norm": 0.5, "grad_norm_type": "inf"},
                                         {"clip_grad_value": 0.1, "max_grad_norm": 1.0, "grad_norm_type": 1.0}])))
    if kind == "sgd":
        momentum = draw(st.sampled_from([0.0, 0.9]))
        dampening = draw(st.sampled_from([0.0, 0.3]))
        nesterov = momentum > 0 and not dampening and draw(st.booleans())
        options.update(lr=0.1, momentum=momentum, dampening=dampening, nesterov=nesterov)
    elif kind in ("adam", "adamw"):
        options.update(lr=0.02, betas=draw(st.sampled_from([(0.9, 0.999), (0.5, 0.9)])),
                       eps=draw(st.sampled_from([1e-8, 1e-3])), amsgrad=draw(st.booleans()))
    elif kind == "rmsprop":  # alpha 0.3: torch's lerp takes its other branch (weight >= 0.5)
        options.update(lr=0.01, alpha=draw(st.sampled_from([0.99, 0.3])), eps=draw(st.sampled_from([1e-8, 1e-2])),
                       momentum=draw(st.sampled_from([0.0, 0.8])), centered=draw(st.booleans()))
    elif kind == "adagrad":
        options.update(lr=0.05, lr_decay=draw(st.sampled_from([0.0, 0.1])), eps=draw(st.sampled_from([1e-10, 1e-3])),
                       initial_accumulator_value=draw(st.sampled_from([0.0, 0.2])))
    else:
        options.update(lr=0.02, betas=draw(st.sampled_from([(0.9, 0.999), (0.5, 0.9)])),
                       eps=draw(st.sampled_from([1e-8, 1e-3])))
    return getattr(gc.optim, KINDS[kind])(**options)


def _torch_optimizer(spec, named: dict):
    """The same optimizer in ``torch.optim``: the spec's fields are torch's keyword arguments."""
    from fnmatch import fnmatch

    excluded = {n for n in named if any(fnmatch(n, pat) for pat in spec.no_decay)}
    groups = [{"params": [p for n, p in named.items() if n not in excluded]},
              {"params": [p for n, p in named.items() if n in excluded], "weight_decay": 0.0}]
    options = {k: v for k, v in spec.model_dump().items()
               if k not in ("kind", "no_decay", "max_grad_norm", "grad_norm_type", "clip_grad_value")}
    return getattr(torch.optim, KINDS[spec.kind])([g for g in groups if g["params"]], foreach=False, **options)


class _Run(_TorchRun):
    """The torch loop of ``test_trainer_torch_differential`` with any ``torch.optim`` optimizer."""

    def __init__(self, case, state: dict):
        spec, case["spec"] = case["spec"], gc.optim.SGD(lr=1.0)  # the base class builds an SGD: replaced
        super().__init__(case, state)
        case["spec"] = spec
        self.opt = _torch_optimizer(spec, self.named)


# --- losses: cross-entropy with class weights, or the base audit's ----------------------------------

def _weighted_cross_entropy(draw):
    weight = draw(st.sampled_from([[0.5, 2.0, 1.25], [3.0, 0.25, 1.0]]))
    ignore, smoothing = draw(st.sampled_from([-100, 1])), draw(st.sampled_from([0.0, 0.2]))
    reduction = draw(st.sampled_from(["mean", "sum"]))
    spec = gc.losses.cross_entropy("output", label="y", weight=weight, ignore_index=ignore,
                                   label_smoothing=smoothing, reduction=reduction)

    def torch_loss(out, y):
        return F.cross_entropy(out, y, weight=torch.tensor(weight, dtype=torch.float64), ignore_index=ignore,
                               label_smoothing=smoothing, reduction=reduction)

    def labels(rng, n):  # row 0 is never ignored, as in the base audit
        return np.concatenate([[0], rng.integers(0, CLASSES, n - 1)]).astype(np.int64)
    return spec, torch_loss, labels, CLASSES


# --- schedulers: the same constructor in gc.optim.lr_scheduler and torch.optim.lr_scheduler ----------

SCHEDULERS = ["StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR",
              "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "LambdaLR", "MultiplicativeLR",
              "SequentialLR", "ChainedScheduler", "ReduceLROnPlateau"]


def _scheduler(lib, owner, kind: str, calls: int, lr: float, variant: int):
    """``kind`` from ``lib`` (torch's or graphc's lr_scheduler module) on ``owner`` (the torch
    optimizer or the Trainer); ``calls``: the steps fit gives it; ``variant`` picks options."""
    make = {
        "StepLR": lambda: lib.StepLR(owner, step_size=1 + variant, gamma=0.5),
        "MultiStepLR": lambda: lib.MultiStepLR(owner, milestones=[1, 3, 3], gamma=0.5),
        "ConstantLR": lambda: lib.ConstantLR(owner, factor=0.5, total_iters=2 + variant),
        "LinearLR": lambda: lib.LinearLR(owner, start_factor=0.25, end_factor=1.0 - 0.5 * variant, total_iters=3),
        "ExponentialLR": lambda: lib.ExponentialLR(owner, gamma=0.8),
        "PolynomialLR": lambda: lib.PolynomialLR(owner, total_iters=4, power=1.0 + variant),
        "CosineAnnealingLR": lambda: lib.CosineAnnealingLR(owner, T_max=2 + variant, eta_min=lr / 10 * variant),
        "CosineAnnealingWarmRestarts": lambda: lib.CosineAnnealingWarmRestarts(owner, T_0=2, T_mult=1 + variant,
                                                                               eta_min=lr / 20),
        "OneCycleLR": lambda: lib.OneCycleLR(owner, max_lr=lr * 3, total_steps=calls, cycle_momentum=False,
                                             anneal_strategy=("cos", "linear")[variant], three_phase=bool(variant)),
        "LambdaLR": lambda: lib.LambdaLR(owner, lambda e: 1 / (1 + e)),
        "MultiplicativeLR": lambda: lib.MultiplicativeLR(owner, lambda e: 0.9 if e % 2 else 1.0),
        "SequentialLR": lambda: lib.SequentialLR(owner, [lib.LinearLR(owner, start_factor=0.5, total_iters=2),
                                                         lib.ExponentialLR(owner, gamma=0.7)], milestones=[2]),
        "ChainedScheduler": lambda: lib.ChainedScheduler([lib.ConstantLR(owner, factor=0.5, total_iters=2),
                                                          lib.ExponentialLR(owner, gamma=0.9)]),
        "ReduceLROnPlateau": lambda: lib.ReduceLROnPlateau(owner, factor=0.5, patience=variant, cooldown=1 - variant,
                                                           threshold=0.05),
    }
    return make[kind]()


def _step(scheduler, loss: float) -> None:
    if type(scheduler).__name__ == "ReduceLROnPlateau":
        scheduler.step(loss)
    else:
        scheduler.step()


@st.composite
def _cases(draw):
    arch = draw(st.sampled_from(["mlp", "cnn", "emb"]))
    norm = draw(st.sampled_from(["none", "ln", "bn"]))
    spec, torch_loss, labels, out = (_weighted_cross_entropy(draw) if draw(st.booleans()) else _loss_case(draw))
    frozen = draw(st.sampled_from([(), ("fc.weight",), ("head.bias",)]))
    if arch == "cnn":  # its conv's bias meets BatchNorm2d: a true gradient of 0, which Adagrad (eps 1e-10)
        frozen += ("conv.bias",)  # steps by rounding noise / (|noise| + eps), each side its own (seen: 6e-7)
    return {"arch": arch, "norm": norm, "out": out, "loss": spec, "torch_loss": torch_loss, "labels": labels,
            "spec": draw(_optimizers()), "frozen": frozen, "backend": draw(st.sampled_from(["numpy", "ort-cpu"])),
            "seed": draw(st.integers(0, 2**16))}


def _artifacts(case, net):
    model = gc.capture(net, seed=case["seed"], x={"mlp": gc.spec("float64", ("N", 5)),
                                                  "cnn": gc.spec("float64", ("N", 2, 4, 4)),
                                                  "emb": gc.spec("int64", ("N", 3))}[case["arch"]])
    return gc.training.generate(model, case["loss"], case["spec"], frozen=case["frozen"])


@SETTINGS
@given(case=_cases(), kind=st.sampled_from(SCHEDULERS), interval=st.sampled_from(["epoch", "step"]),
       variant=st.integers(0, 1), n=st.integers(9, 13), batch_size=st.integers(3, 5), data=st.data())
def test_fit_with_any_optimizer_and_scheduler_matches_torch_and_resumes_exactly(tmp_path_factory, case, kind,
                                                                                interval, variant, n, batch_size,
                                                                                data):
    if case["norm"] == "bn" or case["arch"] == "cnn":  # BatchNorm in train mode: a last batch of >= 2 rows
        n += (n % batch_size == 1)
    if case["norm"] == "bn":  # BatchNorm1d over 2 rows outputs +-1 whatever its input: the gradient
        n += (n % batch_size == 2)  # behind it is rounding noise, which Adam scales up (seen: 7e-7 relative)
    tmp = tmp_path_factory.mktemp("fit2")
    net = _Net(case["arch"], case["norm"], case["out"])
    _artifacts(case, net).save(tmp / "arts")
    epochs, lr = 3, case["spec"].lr
    make_loader = lambda: gc.data.DataLoader(_data(case["arch"], case["labels"], n, case["seed"]),  # noqa: E731
                                             batch_size=batch_size, shuffle=True, drop_last=False, seed=case["seed"])

    # the torch loop: its steps, the scheduler stepped as fit documents, the lr of each epoch's end
    oracle, loader, expected, epoch_lrs = _Run(case, net.state_dict()), make_loader(), [], []
    batches = [[loader.batch(e, i) for i in range(len(loader))] for e in range(epochs)]
    batches = [[b for b in epoch if not _all_ignored(case["loss"], b["y"])] for epoch in batches]  # fit skips those
    calls = sum(map(len, batches)) if interval == "step" else epochs
    torch_sched = _scheduler(torch.optim.lr_scheduler, oracle.opt, kind, calls, lr, variant)
    for epoch in batches:
        total = rows = 0
        for batch in epoch:
            loss = oracle.step(batch)
            expected.append(loss)
            total, rows = total + loss * len(batch["y"]), rows + len(batch["y"])
            if interval == "step":
                _step(torch_sched, loss)
        # the graph's lr: OneCycleLR's linear anneal ends just below 0 after the last step (torch's
        # group too), which graphc's graph holds as 0 (lr_scheduler's _set_lr)
        epoch_lrs.append(max(oracle.opt.param_groups[0]["lr"], 0.0))
        if interval == "epoch":
            _step(torch_sched, total / rows)  # the epoch's train loss, weighted by rows
    final_lr = oracle.opt.param_groups[0]["lr"]

    def fit(trainer, scheduler=True):
        made = _scheduler(gc.optim.lr_scheduler, trainer, kind, calls, lr, variant) if scheduler else None
        return trainer.fit(make_loader(), epochs, progress=False, quiet=True, scheduler=made, interval=interval)

    straight = gc.Trainer(tmp / "arts", backend=case["backend"])
    history = fit(straight)
    # ascending (maximize) through BatchNorm over 2-4 rows grows the forward's rounding (1e-12
    # relative at the first step) about 10x a step (seen: 1.4e-7 after 9 RMSprop steps); a wrong
    # sign or formula is off by 1e-3 or more
    rtol = 1e-5 if case["spec"].maximize else RTOL
    np.testing.assert_allclose(history.step_losses, expected, rtol=rtol, atol=ATOL)
    ours = straight.state_dict()
    for name, want in oracle.state().items():
        np.testing.assert_allclose(ours[name], want, rtol=rtol, atol=ATOL, err_msg=name)
    assert straight.lr_group["lr"] == final_lr  # the scheduler's lr, as torch's, bit for bit
    np.testing.assert_allclose([e.lr for e in history.epochs], epoch_lrs, rtol=1e-15)

    # killed at step ``at`` (mid-epoch unless it falls on an epoch's end), resumed from the checkpoint
    at = data.draw(st.integers(1, len(expected) - 1))
    interrupted = gc.Trainer(tmp / "arts", backend=case["backend"])
    done = interrupt_at(interrupted, at)
    with pytest.raises(KeyboardInterrupt):
        fit(interrupted)
    interrupted.save_checkpoint(tmp / "ck")
    _artifacts(case, net).save(tmp / "again")
    regenerated = gc.Trainer(tmp / "again", backend=case["backend"])
    regenerated.load_checkpoint(tmp / "ck")
    for resumed in (gc.Trainer(tmp / "ck", backend=case["backend"]), regenerated):
        rest = fit(resumed).step_losses
        assert done + rest == history.step_losses
        _assert_state(resumed, straight.state_dict(), exact=True)
        assert resumed.lr_group["lr"] == final_lr and resumed.lr == straight.lr

