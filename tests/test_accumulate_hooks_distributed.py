"""Backward hooks and ``gc.autograd.Function``s on data-parallel workers with ``accumulate=k``
(``gc.Trainer(workers=2, accumulate=2)``) see the worker's local weighted gradient, as torch 2.13's under DDP's
``no_sync`` loop: rank r runs ``(loss * shard_rows / its_step_rows).backward()`` per micro-batch, its hooks fire on
that local gradient, and the ranks' accumulated gradients are averaged once. The torch side simulates the two ranks
in one process; float64, 1e-12, loopback Ray."""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest

import graphc as gc
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from test_accumulate_hooks import _net, _torch_step

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
WORKERS = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120}
K = 2


def _counted(labels, weight=None):
    """What a shard's mean loss averages over: its rows, its class labels that are not -100, or their class weights."""
    if labels.dtype.kind == "f":
        return len(labels)
    kept = labels[labels != -100]
    return int(kept.size) if weight is None else float(np.sum(weight[kept]))


def _ddp_step(net, params, x, y, loss, reduction="mean", after=False, scale=1.0, weight=None):
    """torch's DDP ``no_sync`` loop on 2 ranks, one SGD(0.5) step: each rank's hooked local gradients of its shards
    of the K micro-batches (``np.array_split``, as graphc cuts them), each seeded by what it counts over the rank's
    step total (1 for a summed loss; a shard counting nothing left out), then combined once: averaged (DDP's
    all-reduce, for equal totals), weighted by the ranks' totals, or added for a summed loss (graphc's sum over every
    row). ``after``: each shard's own gradient weighted after its backward instead (graphc's workers before).
    ``scale``: a static loss scale, as ``GradScaler``'s (``scaler.scale(loss).backward()``, unscaled before the
    step); ``weight``: a cross-entropy's class weights, which its mean and the shares count."""
    if weight is not None:
        loss = functools.partial(loss, weight=torch.tensor(weight))
    grads, totals = [], []
    for rank in range(2):
        twin = net(torch)().double()
        twin.load_state_dict({n: torch.tensor(v) for n, v in params.items()})
        shards = [(np.array_split(xs, 2)[rank], np.array_split(ys, 2)[rank])
                  for xs, ys in zip(np.array_split(x, K), np.array_split(y, K))]
        total = sum(_counted(ys, weight) for _, ys in shards)
        summed = {n: 0.0 for n in params}
        for xs, ys in (shard for shard in shards if _counted(shard[1], weight)):
            share = _counted(ys, weight) / total if reduction == "mean" else 1.0
            twin.zero_grad()
            value = loss(twin(torch.tensor(xs)), torch.tensor(ys), reduction=reduction)
            (value * scale * (1.0 if after else share)).backward()
            for n, p in twin.named_parameters():
                summed[n] = summed[n] + p.grad.numpy() / scale * (share if after else 1.0)
        grads.append(summed)
        totals.append(total if reduction == "mean" else 1.0)
    whole = sum(totals) if reduction == "mean" else 1.0
    return {n: params[n] - 0.5 * sum(g[n] * t for g, t in zip(grads, totals)) / whole for n in params}


def _clamped(lib):
    """A 3-4-3 classifier whose hidden gradient a Tensor hook clamps."""
    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = lib.nn.Linear(3, 4), lib.nn.Linear(4, 3)

        def forward(self, x):
            h = self.fc1(x)
            h.register_hook(lambda g: lib.clamp(g, -0.02, 0.02))
            return self.fc2(lib.tanh(h))

    return Net


def _assert_params(trainer, want):
    for name, value in want.items():
        np.testing.assert_allclose(trainer.params[name], value, rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("backend, loader, reduction", [("numpy", False, "mean"), ("ort-cpu", False, "mean"),
                                                         ("numpy", True, "mean"), ("ort-cpu", True, "mean"),
                                                         ("numpy", False, "sum")])
def test_worker_hooks_see_their_local_weighted_gradient(ray_cluster, backend, loader, reduction):
    """8 rows, K=2 micro-batches of 4 (step(batch), or fit over a loader of 4-row batches the workers read), each
    cut 2/2: a clamp hook, a clamping Function and a full hook clipping a norm step as torch's DDP loop."""
    model = gc.capture(_net(gc)().double(), x=gc.spec("float64", ("N", 3)))
    x, y = RNG.normal(size=(8, 3)) * 2, RNG.normal(size=(8, 1)) * 3
    artifacts = gc.training.generate(model, gc.losses.mse("output", label="y", reduction=reduction),
                                     gc.optim.SGD(0.5))
    trainer = gc.Trainer(artifacts, accumulate=K, backend=backend, **WORKERS)
    try:
        if loader:
            data = gc.data.DataLoader({"x": x, "y": y}, batch_size=4, shuffle=False)
            trainer.fit(data, epochs=1, progress=False, quiet=True)
        else:
            trainer.step({"x": x, "y": y})
        assert trainer.combines == 1
        want = _ddp_step(_net, model.params, x, y, torch.nn.functional.mse_loss, reduction)
        _assert_params(trainer, want)
    finally:
        trainer.shutdown()
    # the clamps and the clip bite: each shard's own gradient weighted after steps elsewhere (a summed loss's shards
    # weigh 1 either way: its case checks the sums' scaling)
    after = _ddp_step(_net, model.params, x, y, torch.nn.functional.mse_loss, reduction, after=True)
    assert reduction == "sum" or np.abs(after["fc1.weight"] - want["fc1.weight"]).max() > 1e-3


def test_ignored_labels_weigh_the_seed_as_they_weigh_the_loss(ray_cluster):
    """A cross-entropy with ignored labels (-100): each shard's backward is seeded with its counted labels over its
    worker's (rank 0: 2 and 1 of 3, rank 1: 1 of 1, its second shard counting nothing), as torch's DDP loop; the
    workers' sums combine weighted by those totals (3 and 1), as without hooks."""
    model = gc.capture(_clamped(gc)().double(), x=gc.spec("float64", ("N", 3)))
    x, y = RNG.normal(size=(8, 3)) * 2, np.array([0, 1, -100, 2, 1, -100, -100, -100])
    artifacts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.5))
    trainer = gc.Trainer(artifacts, accumulate=K, backend="numpy", **WORKERS)
    try:
        trainer.step({"x": x, "y": y})
        want = _ddp_step(_clamped, model.params, x, y, torch.nn.functional.cross_entropy)
        _assert_params(trainer, want)
    finally:
        trainer.shutdown()
    after = _ddp_step(_clamped, model.params, x, y, torch.nn.functional.cross_entropy, after=True)
    assert np.abs(after["fc1.weight"] - want["fc1.weight"]).max() > 1e-3


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_loss_scaled_worker_hooks_see_the_scaled_local_weighted_gradient(ray_cluster, backend):
    """``loss_scale=1024`` with 2 workers and k=2: the scaled gradients graph keeps ``accumulate.weight``, and the
    hooks see 1024 times the local weighted gradient, as torch's ``scaler.scale(loss * share).backward()`` per shard
    under ``no_sync``, unscaled before the step."""
    model = gc.capture(_net(gc)().double(), x=gc.spec("float64", ("N", 3)))
    x, y = RNG.normal(size=(8, 3)) * 2, RNG.normal(size=(8, 1)) * 3
    artifacts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.5), loss_scale=1024.0)
    inputs = {e.name: e.role for e in artifacts.manifest.graphs["gradients"].inputs}
    assert inputs["accumulate.weight"] == "weight" and "loss_scale" in inputs
    trainer = gc.Trainer(artifacts, accumulate=K, backend=backend, **WORKERS)
    try:
        trainer.step({"x": x, "y": y})
        want = _ddp_step(_net, model.params, x, y, torch.nn.functional.mse_loss, scale=1024.0)
        _assert_params(trainer, want)
    finally:
        trainer.shutdown()
    # the scale reaches the hooks: at scale 1 the clamps bite elsewhere
    unscaled = _ddp_step(_net, model.params, x, y, torch.nn.functional.mse_loss)
    assert np.abs(unscaled["fc1.weight"] - want["fc1.weight"]).max() > 1e-3


def test_class_weighted_cross_entropy_shares_count_class_weights(ray_cluster):
    """A class-weighted cross-entropy with hooks on 2 workers, k=2: each shard's seed is its labels' class weights
    over its worker's (rank 0: 0.5+3 and 1+3 of 7.5, rank 1: 0.5+0.5 and 3+1 of 5), the workers' sums combined by
    those totals, as torch's DDP ``no_sync`` loop with ``F.cross_entropy(weight=...)``."""
    model = gc.capture(_clamped(gc)().double(), x=gc.spec("float64", ("N", 3)))
    x, y, weight = RNG.normal(size=(8, 3)) * 2, np.array([0, 2, 0, 0, 1, 2, 2, 1]), np.array([0.5, 1.0, 3.0])
    artifacts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y", weight=weight),
                                     gc.optim.SGD(0.5))
    trainer = gc.Trainer(artifacts, accumulate=K, backend="numpy", **WORKERS)
    try:
        trainer.step({"x": x, "y": y})
        want = _ddp_step(_clamped, model.params, x, y, torch.nn.functional.cross_entropy, weight=weight)
        _assert_params(trainer, want)
    finally:
        trainer.shutdown()
    counted = _ddp_step(_clamped, model.params, x, y, torch.nn.functional.cross_entropy)  # shares by label counts
    assert np.abs(counted["fc1.weight"] - want["fc1.weight"]).max() > 1e-3


def test_a_model_without_functions_steps_as_before(ray_cluster):
    """A plain MLP's gradients graph takes no seed weight: 2 workers with K=2 step as one process's K=2 (1e-12)."""
    model = gc.capture(gc.nn.Sequential(gc.nn.Linear(3, 4), gc.nn.Tanh(), gc.nn.Linear(4, 1)).double(),
                       x=gc.spec("float64", ("N", 3)))
    artifacts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.5))
    assert "accumulate.weight" not in {e.name for e in artifacts.manifest.graphs["gradients"].inputs}
    batch = {"x": RNG.normal(size=(8, 3)), "y": RNG.normal(size=(8, 1))}
    single = gc.Trainer(artifacts, accumulate=K, backend="numpy")
    dp = gc.Trainer(artifacts, accumulate=K, backend="numpy", **WORKERS)
    try:
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-12)
        _assert_params(dp, single.params)
    finally:
        dp.shutdown()
