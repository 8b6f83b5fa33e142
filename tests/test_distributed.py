"""Data-parallel training and batch inference on Ray (``graphc.runtime.distributed``), against
single-process ``gc.Trainer`` / ``gc.Session`` as the oracle.

One local Ray cluster, the one graphc starts itself, serves the whole module (the machine's
CPUs, loopback only, no dashboard, no usage reporting); the module runs on one xdist worker (``xdist_group``). Workers ask for half a CPU
each, every call is bounded by ``timeout_s``."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.errors import ArtifactsError
from graphc.models.cnn import LeNet
from graphc.models.two_layer_net import TwoLayerNet
from cli_util import one_line_error, run_cli
from ray_util import ray_cluster, unhandled_errors  # noqa: F401 - the module's fixture
from trainer_models import Contrastive, Prototypes, blobs, without_prediction

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

WORKER = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120, "backend": "ort-cpu"}
OPTIMIZERS = {"sgd-momentum": gc.optim.SGD(0.05, momentum=0.9), "adamw": gc.optim.AdamW(1e-2, weight_decay=0.1)}
RNG = np.random.default_rng(0)
IGNORED = 3  # the cross-entropy's ignore_index: a shard weighs by the labels it counts
# global batch per step: 4+4 rows, 4+3 (uneven), 1+0 (an empty shard), 4+4 with every label of
# the first shard ignored
SIZES = [8, 8, 8, 7, 8, 8, 1, 8, 8, 8]


def _arts(net: str, opt: str, seed: int = 0):
    module, spec = (TwoLayerNet(64, 32, 10), ("N", 64)) if net == "mlp" else (LeNet(), ("N", 1, 28, 28))
    model = gc.capture(module, seed=seed, x=gc.spec("float32", spec))
    return gc.training.generate(model, gc.losses.cross_entropy("output", label="y", ignore_index=IGNORED), OPTIMIZERS[opt])


def _data(net: str, n: int) -> dict[str, np.ndarray]:
    shape = (n, 64) if net == "mlp" else (n, 1, 28, 28)
    return {"x": RNG.standard_normal(shape, dtype=np.float32), "y": RNG.integers(0, 10, n).astype(np.int64)}


def _close(got: dict, want: dict, rtol=2e-5, atol=2e-6) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("net", ["mlp", "cnn"])
def test_two_workers_step_as_one_process_on_the_global_batch(ray_cluster, net, opt):
    arts = _arts(net, opt)
    data = _data(net, sum(SIZES))
    starts = np.cumsum([0, *SIZES])
    data["y"][starts[7]:starts[7] + 4] = IGNORED
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    for lo, hi in zip(starts[:-1], starts[1:]):
        batch = {k: v[lo:hi] for k, v in data.items()}
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=2e-5)
        first, second = dp.worker_states()
        for name in first:  # every worker applied the same update to the same averaged gradients
            np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    # Adam divides by sqrt(v): a gradient near 0 moves by ~lr whatever its rounding, so the
    # tolerance is a fraction of one step (lr 1e-2)
    atol = 2e-6 if opt == "sgd-momentum" else 5e-4
    _close(dp.params, single.params, atol=atol)
    assert dp.evaluate(data) == pytest.approx(single.evaluate(data), rel=1e-5)
    no_labels = {"x": data["x"]}  # predict needs the data inputs only
    _close(dp.predict(no_labels), single.predict(no_labels), atol=1e-5)
    with pytest.raises(gc.InputError, match="a train step needs at least one example"):
        dp.step({k: v[:0] for k, v in data.items()})
    out_of_range = {k: v[:4].copy() for k, v in data.items()}
    out_of_range["y"][3] = 10
    with pytest.raises(gc.InputError, match=r"label 'y' holds 10 at \(3,\)"):
        dp.step(out_of_range)
    assert dp.step_count == single.step_count


def test_two_workers_keep_a_float64_models_loss_in_float64(ray_cluster):
    # the workers' loss was cast to float32: 0.9790222644805908 for one process's 0.9790222393786381
    model = gc.capture(nn.Linear(4, 3, dtype="float64"), x=gc.spec("float64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.125))
    batch = {"x": RNG.standard_normal((6, 4)), "y": RNG.standard_normal((6, 3))}
    dp, single = gc.Trainer(arts, **{**WORKER, "backend": "numpy"}), gc.Trainer(arts, backend="numpy")
    assert dp.predict(batch)["loss"].dtype == np.float64
    assert dp.evaluate(batch)["loss"] == pytest.approx(single.evaluate(batch)["loss"], rel=1e-14)
    dp.shutdown()


@pytest.mark.parametrize("folder", ["float64_lr32/artifacts", None], ids=["saved-with-float32-lr", "today"])
def test_two_workers_train_float64_params_as_one_process_whatever_their_lr_dtype(ray_cluster, folder):
    """The replicas' update takes the lr as train_step declares it: float64 for float64 params
    today, float32 in artifacts saved before (``tests/data/float64_lr32``), set between steps too."""
    import float64_models

    arts = gc.training.load(Path(__file__).parent / "data" / folder) if folder else gc.training.generate(
        float64_models.mlp(), gc.losses.mse("out", label="y"), gc.optim.AdamW(0.01, weight_decay=0.1))
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")  # ort checks dtypes
    for i, batch in enumerate(float64_models.mlp_batches(4)):
        if i == 2:
            dp.lr = single.lr = 0.005
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-12)
    assert dp.state_dict()["lr"].dtype == np.dtype("float32" if folder else "float64")
    _close(dp.params, single.params, rtol=1e-12, atol=1e-14)
    dp.shutdown()


def test_two_workers_clip_the_averaged_gradients_as_one_process(ray_cluster):
    """max_grad_norm: the replicas' update graph clips the averaged gradients as train_step does."""
    model = gc.capture(nn.Linear(4, 3, dtype="float64"), x=gc.spec("float64", ("N", 4)))
    spec = gc.optim.SGD(0.125, momentum=0.5, max_grad_norm=0.5, clip_grad_value=0.25)
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), spec)
    unclipped = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.125, momentum=0.5))
    dp, single = gc.Trainer(arts, **{**WORKER, "backend": "numpy"}), gc.Trainer(arts, backend="numpy")
    plain = gc.Trainer(unclipped, backend="numpy")
    for scale in (0.05, 4.0, 0.1, 3.0):
        batch = {"x": RNG.standard_normal((6, 4)) * scale, "y": RNG.standard_normal((6, 3)) * scale}
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-12)
        plain.step(batch)
    _close(dp.params, single.params, rtol=1e-12, atol=1e-14)
    assert not np.allclose(plain.params["weight"], single.params["weight"])  # the clipping acted
    dp.shutdown()


def _clipped_linear64(momentum: float = 0.5):
    model = gc.capture(nn.Linear(4, 3, dtype="float64"), x=gc.spec("float64", ("N", 4)))
    spec = gc.optim.SGD(0.125, momentum=momentum, max_grad_norm=1.0)
    return gc.training.generate(model, gc.losses.mse("output", label="y"), spec)


def _torch_clipped_fit(params: dict, batches: list[dict]) -> tuple[list[float], dict[str, np.ndarray]]:
    """torch 2.13's loop: SGD(0.125, momentum=0.5) after clip_grad_norm_(1.0) each step; its
    returns (each step's norm before clipping) and the params after."""
    torch = pytest.importorskip("torch")
    twin = torch.nn.Linear(4, 3, dtype=torch.float64)
    twin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in params.items()})
    opt, norms = torch.optim.SGD(twin.parameters(), lr=0.125, momentum=0.5), []
    for batch in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"])).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)))
        opt.step()
    return norms, {k: v.detach().numpy() for k, v in twin.state_dict().items()}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_fit_with_clipping_records_each_steps_norm_as_one_process_and_torch(ray_cluster, tmp_path, backend):
    """fit with max_grad_norm (a TypeError before: the workers apply each update at the next
    step, so the driver held no norm): 2 epochs of 4 steps (6, 6, 6, 2 rows), the update of each
    applied at once; step_grad_norms, the last step's too, and the params equal one process's
    and torch's clip_grad_norm_ returns (1e-12), TensorBoard's train/grad_norm holds them."""
    pytest.importorskip("tensorboard", reason="tensorboard is a dev extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    arts, data = _clipped_linear64(), _regression(20, 4)
    loader = gc.data.DataLoader(data, batch_size=6, shuffle=False)
    single = gc.Trainer(arts, backend=backend)
    norms, params = _torch_clipped_fit(single.params, [{k: a[i:i + 6] for k, a in data.items()}
                                                       for _ in range(2) for i in range(0, 20, 6)])
    want = single.fit(loader, epochs=2, progress=False, quiet=True)
    dp = gc.Trainer(arts, **{**WORKER, "backend": backend}, tensorboard=tmp_path / "tb")
    try:
        got = dp.fit(loader, epochs=2, progress=False, quiet=True)
        assert len(got.step_grad_norms) == dp.step_count == 8 and max(norms) > 1.0 > min(norms)  # clipped or not
        np.testing.assert_allclose(got.step_grad_norms, norms, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        _close(dp.params, single.params, rtol=1e-12, atol=1e-14)
        _close(dp.params, params, rtol=1e-12, atol=1e-14)
        board = EventAccumulator(str(tmp_path / "tb"))
        board.Reload()
        logged = board.Scalars("train/grad_norm")
        assert [e.step for e in logged] == list(range(1, 9))
        np.testing.assert_allclose([e.value for e in logged], norms, rtol=1e-6)  # stored as float32
    finally:
        dp.shutdown()


def test_a_loss_scaled_clipped_fit_reads_each_steps_norm_and_metrics_as_one_process(ray_cluster):
    """Every per-step read of fit at once (norm, train metrics, skipped steps), with loss scaling:
    the 2 steps whose gradients overflow (inf labels) record an inf norm and are skipped, as one
    process's; the rest equal it to 1e-12."""
    model = gc.capture(nn.Linear(3, 2, dtype="float64"), x=gc.spec("float64", ("N", 3)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(1e-2, weight_decay=0.1, max_grad_norm=0.5),
                                loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2))
    data = {"x": RNG.standard_normal((36, 3)), "y": RNG.standard_normal((36, 2))}
    data["y"][11, 1] = data["y"][18, 0] = np.inf  # in rank 1's shard of step 2, rank 0's of step 4
    loader = gc.data.DataLoader(data, batch_size=6, shuffle=False)
    single, dp = gc.Trainer(arts, backend="numpy"), gc.Trainer(arts, **{**WORKER, "backend": "numpy"})
    try:
        want, got = (t.fit(loader, epochs=1, progress=False, quiet=True) for t in (single, dp))
        assert np.isinf(got.step_grad_norms).tolist() == [False, True, False, True, False, False]
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        assert got.epochs[0].skipped_steps == want.epochs[0].skipped_steps == 2
        assert got.epochs[0].metrics == pytest.approx(want.epochs[0].metrics, rel=1e-12)
        _close(dp.params, single.params, rtol=1e-12, atol=1e-14)
    finally:
        dp.shutdown()


def test_a_clipped_fit_restarted_after_a_killed_worker_keeps_every_steps_norm(ray_cluster):
    """A worker killed at step 7 (epoch 2): the restart from step 4 keeps the norms of steps
    1-4 and records the rest once, as one process's, under a per-step lr schedule (each step's lr
    set after its update, which the workers applied at once)."""
    make, interval = SCHEDULES["warmup-cosine-step"]
    arts, loader = _clipped_linear64(), gc.data.DataLoader(_regression(32, 1), batch_size=8, seed=0)
    single = gc.Trainer(arts, backend="numpy")
    want = single.fit(loader, epochs=3, scheduler=make(single), interval=interval, progress=False, quiet=True)
    dp = gc.Trainer(arts, **{**WORKER, "backend": "numpy"})
    try:
        pid = dp.worker_pids()[1]
        killed = _before_step(dp, 6, lambda: os.kill(pid, signal.SIGKILL))
        with pytest.warns(UserWarning, match="restarting the 2 workers from step 4"):
            got = dp.fit(loader, epochs=3, scheduler=make(dp), interval=interval, progress=False, quiet=True)
        assert killed == [6] and len(got.step_grad_norms) == 12
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        _close(dp.params, single.params, rtol=1e-12, atol=1e-14)
    finally:
        dp.shutdown()


def test_two_workers_average_float16_gradients_without_overflow(ray_cluster):
    """Each worker scaled its gradients by its shard's example count before the average: in
    float16 a weight gradient of ~300 times 512 labels is inf, where one process's mean is finite."""
    model = gc.capture(nn.Linear(8, 3, dtype="float16"), x=gc.spec("float16", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(1e-4))
    batch = {"x": ((RNG.standard_normal((1024, 8)) + 3) * 100).astype(np.float16), "y": np.zeros(1024, np.int64)}
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    assert dp.step(batch) == pytest.approx(single.step(batch), rel=2e-3)
    got, want = dp.params, single.params
    for name in want:  # a float16 rounding of the averaged gradient: at most 1e-3 of the param
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=2e-3,
                                   atol=1e-4, err_msg=name)
    dp.shutdown()


def _torch_autocast_sgd(torch, params: dict, batches: list[dict], shards: int) -> dict[str, np.ndarray]:
    """torch's bfloat16 autocast SGD loop over ``batches`` from ``params``, each step's gradients the
    mean of ``shards`` equal shards' (DDP's all-reduce average; 1: one process)."""
    twin = torch.nn.ModuleDict({"fc": torch.nn.Linear(16, 32), "out": torch.nn.Linear(32, 4)})
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    for batch in batches:
        grads = []
        for x, y in zip(np.split(batch["x"], shards), np.split(batch["y"], shards)):
            opt.zero_grad()
            with torch.autocast("cpu", torch.bfloat16):
                pred = twin["out"](torch.relu(twin["fc"](torch.from_numpy(x))))
            torch.nn.functional.mse_loss(pred.float(), torch.from_numpy(y)).backward()
            grads.append({k: p.grad.clone() for k, p in twin.named_parameters()})
        for k, p in twin.named_parameters():
            p.grad = sum(g[k] for g in grads) / shards
        opt.step()
    return {k: p.detach().numpy() for k, p in twin.named_parameters()}


def test_two_workers_under_bfloat16_autocast_differ_from_one_process_as_torch_ddp(ray_cluster):
    """bfloat16 autocast: a shard's weight and bias gradients are its bfloat16 MatMul's and
    ReduceSum's, rounded to bfloat16 before the float32 average (torch's autocast linear backward
    rounds there too), so 2 workers are not one process (3 SGD steps: params 8.9e-5 apart) by
    exactly torch DDP + autocast's difference from one torch process; each equals its torch twin
    to 1e-7 (measured 3e-8 and 7e-9)."""
    torch = pytest.importorskip("torch")
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model = gc.capture(net, x=gc.spec("float32", ("N", 16)))
    params = {k.replace("0.", "fc.").replace("2.", "out."): np.array(v) for k, v in net.state_dict().items()}
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1), autocast="bfloat16")
    batches = [{"x": RNG.standard_normal((16, 16)).astype(np.float32), "y": RNG.standard_normal((16, 4)).astype(np.float32)}
               for _ in range(3)]
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    for batch in batches:
        dp.step(batch), single.step(batch)
    got = {name: {k.replace("0.", "fc.").replace("2.", "out."): v for k, v in t.params.items()} for name, t in
           (("dp", dp), ("single", single))}
    want = {"dp": _torch_autocast_sgd(torch, params, batches, 2), "single": _torch_autocast_sgd(torch, params, batches, 1)}
    for name in ("dp", "single"):
        _close(got[name], want[name], rtol=0, atol=1e-7)
    apart = max(np.abs(got["dp"][k] - got["single"][k]).max() for k in params)
    torch_apart = max(np.abs(want["dp"][k] - want["single"][k]).max() for k in params)
    assert 1e-6 < apart and abs(apart - torch_apart) < 1e-7, (apart, torch_apart)
    dp.shutdown()


@pytest.mark.parametrize("dtype,init_scale", [("float64", 2.0 ** 10), ("float32", 2.0 ** 126)])
def test_two_workers_scale_the_loss_as_one_process(ray_cluster, dtype, init_scale):
    """Loss scaling: the workers' scaled gradients are averaged, then checked and unscaled once by
    the update graph; 6 steps with forced overflows (inf labels in rank 1's and rank 0's shard;
    float32: also scaled gradients past float32's range) skip and back off as one process: the
    scale sequence and skipped counts equal, params and AdamW's state to 1e-12 (float64) / 1e-6
    (float32); an epoch of fit over the same batches records the same scale and 2 skipped steps."""
    model = gc.capture(nn.Linear(3, 2, dtype=dtype), x=gc.spec(dtype, ("N", 3)))
    scaler = gc.amp.GradScaler(init_scale=init_scale, growth_interval=2)
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), OPTIMIZERS["adamw"], loss_scale=scaler)
    batches = [{"x": RNG.standard_normal((6, 3)).astype(dtype), "y": RNG.standard_normal((6, 2)).astype(dtype)}
               for _ in range(6)]
    batches[1]["y"][5, 1] = batches[3]["y"][0, 0] = np.inf  # in one worker's shard: the average is inf
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    scales, tol = [], 1e-12 if dtype == "float64" else 1e-6
    for batch in batches:
        dp.step(batch), single.step(batch)
        scales.append(single.loss_scale)
        assert (dp.loss_scale, dp.skipped_steps) == (single.loss_scale, single.skipped_steps)
    assert single.skipped_steps >= 2 and max(scales) > min(scales[1:])  # backed off, then grown
    _close(dp.state_dict(), single.state_dict(), rtol=tol, atol=tol)
    loader = gc.data.DataLoader({n: np.concatenate([b[n] for b in batches]) for n in ("x", "y")}, batch_size=6,
                                shuffle=False)
    records = [t.fit(loader, epochs=t.epoch + 1, progress=False, quiet=True).epochs[0] for t in (dp, single)]
    assert [(r.loss_scale, r.skipped_steps) for r in records] == [(single.loss_scale, 2)] * 2
    dp.shutdown()


def test_two_workers_train_weights_train_step_holds_in_another_order(ray_cluster, tmp_path):
    """Workers run the gradients and update graphs, in the model's order; the checkpoint they
    write resumes the one-process trainer, whose train_step holds the 3x3 weights taps outer."""
    import test_taps_params as held

    arts = held.generate(held.SPECS["adamw"])
    assert arts.manifest.orders == held.HELD
    dp, single = gc.Trainer(arts, **{**WORKER, "backend": "numpy"}), gc.Trainer(arts, backend="numpy")
    data = held.batches(4, size=6)
    for batch in data[:3]:
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-5)
    _close(dp.params, single.params, atol=1e-5)
    dp.save_checkpoint(tmp_path / "ckpt.safetensors")
    resumed = gc.Trainer(arts, backend="numpy")
    resumed.load_checkpoint(tmp_path / "ckpt.safetensors")
    assert resumed.step(data[3]) == pytest.approx(single.step(data[3]), rel=1e-5)
    dp.shutdown()


class _SummedLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x, t):
        p = self.fc(x)
        return {"pred": p, "loss_out": ((p - t) * (p - t)).sum()}


def test_a_scalar_output_loss_is_refused_as_its_shards_cannot_be_combined(ray_cluster):
    """A summed loss output averaged as a per-row mean trained with 1/N of its gradient."""
    model = gc.capture(_SummedLoss(), x=gc.spec("float32", ("N", 4)), t=gc.spec("float32", ("N", 1)))
    arts = gc.training.generate(model, "loss_out", gc.optim.SGD(0.01))
    with pytest.raises(gc.errors.ArtifactsError, match=r"scalar output 'loss_out'.*a mean\? a sum\?.*gc.losses spec"):
        gc.Trainer(arts, **WORKER)


class _Shared(nn.Module):
    """``s`` holds no rows (a per-feature scale); ``mean_logit`` and ``by_class`` are not by rows."""

    def __init__(self, summaries: bool = True):
        super().__init__()
        self.fc, self.summaries = nn.Linear(8, 3), summaries

    def forward(self, x, s):
        z = self.fc(x * s)
        return {"logits": z, "mean_logit": z.mean(), "by_class": z.T} if self.summaries else {"logits": z}


def _shared_model(summaries: bool = True):
    return gc.capture(_Shared(summaries), seed=0, x=gc.spec("float32", ("N", 8)), s=gc.spec("float32", (8,)))


def test_inputs_and_outputs_not_by_rows_are_not_split_or_joined(ray_cluster):
    """Every input was cut along axis 0 (``s`` too: a crash) and every output joined along it
    (a 0-d output was rank 0's, ``by_class`` stacked [6, 4] for [3, 8])."""
    arts = gc.training.generate(_shared_model(), gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    batch = {**blobs(8, seed=4), "s": np.linspace(0.5, 1.5, 8, dtype=np.float32)}
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-5)
    _close(dp.params, single.params)
    no_labels = {"x": batch["x"], "s": batch["s"]}
    _close(dp.predict(no_labels), single.predict(no_labels), atol=1e-5)
    assert dp.evaluate(batch) == pytest.approx(single.evaluate(batch), rel=1e-5)
    dp.shutdown()
    fixed = gc.capture(nn.Linear(8, 3), x=gc.spec("float32", (8, 8)))  # no symbolic batch dim to split
    arts = gc.training.generate(fixed, gc.losses.mse("output", label="t"), gc.optim.SGD(0.1))
    no_rows = r"no input .* starts with a symbolic batch dim \(x: float32\[8,8\]"
    with pytest.raises(gc.errors.ArtifactsError, match=no_rows):
        gc.Trainer(arts, **WORKER)


class _BNDropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.drop, self.fc2 = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.Linear(16, 3)

    def forward(self, x):
        return {"logits": self.fc2(self.drop(gc.relu(self.bn(self.fc1(x)))))}


def test_batchnorm_and_dropout_are_per_replica_as_in_ddp(ray_cluster, tmp_path):
    """Plain SGD is linear in the gradients, so a 2-worker step is the shard-size-weighted mean
    of single-process steps on each shard (each with its own batch statistics and noise); the
    running statistics are rank 0's."""
    model = gc.capture(_BNDropNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    batch = blobs(11, seed=5)
    noise_name = arts.manifest.graphs["train_step"].inputs[-1].name
    shards = [slice(0, 6), slice(6, 11)]

    def oracle(noises):
        steps = []
        for rows, noise in zip(shards, noises):
            one = gc.Trainer(arts, backend="ort-cpu")
            one.step({**{k: v[rows] for k, v in batch.items()}, noise_name: noise})
            steps.append(one.state_dict())
        params = {p: (6 * steps[0][p] + 5 * steps[1][p]) / 11 for p in arts.manifest.trainable}
        return params, {s: steps[0][s] for s in ("bn.running_mean", "bn.running_var")}

    dp = gc.Trainer(arts, seed=7, **WORKER)
    dp.save_checkpoint(tmp_path / "start")
    fed = RNG.random((11, 16), dtype=np.float32)
    dp.step({**batch, noise_name: fed})  # noise given in the batch: sharded with it
    params, stats = oracle([fed[rows] for rows in shards])
    got = dp.state_dict()
    _close({p: got[p] for p in params}, params)
    _close({s: got[s] for s in stats}, stats, rtol=1e-6)
    global_step = gc.Trainer(arts, backend="ort-cpu")
    global_step.step({**batch, noise_name: fed})
    assert not np.allclose(global_step.state_dict()["bn.running_mean"], stats["bn.running_mean"])
    first, second = dp.worker_states()
    np.testing.assert_array_equal(first["bn.running_var"], second["bn.running_var"])

    dp.load_checkpoint(tmp_path / "start")  # step 0 again; now each worker draws its noise
    dp.step(batch)
    drawn = [np.random.default_rng([7, 0, rank]).random((rows.stop - rows.start, 16), dtype=np.float32)
             for rank, rows in enumerate(shards)]
    params, stats = oracle(drawn)
    got = dp.state_dict()
    _close({p: got[p] for p in params}, params)
    _close({s: got[s] for s in stats}, stats, rtol=1e-6)


class _CumulativeBNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(8, 16), nn.BatchNorm1d(16, momentum=None), nn.Linear(16, 3)

    def forward(self, x):
        return {"logits": self.fc2(gc.relu(self.bn(self.fc1(x))))}


def test_cumulative_batchnorm_statistics_and_counter_are_rank_0s_as_in_ddp(ray_cluster, tmp_path):
    """BatchNorm(momentum=None) averages every batch statistic so far (factor 1/num_batches_tracked):
    after each data-parallel step the statistics and the counter are what one process makes from the
    same state on rank 0's shard (DDP's broadcast_buffers), the counter counts steps (not shards),
    and the params those of the 2-worker average."""
    model = gc.capture(_CumulativeBNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    dp = gc.Trainer(arts, **WORKER)
    buffers = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")
    for step in range(3):
        batch = blobs(11, seed=10 + step)
        dp.save_checkpoint(tmp_path / f"before{step}")
        one = gc.Trainer(arts, backend="ort-cpu")
        one.load_checkpoint(tmp_path / f"before{step}")
        one.step({k: v[:6] for k, v in batch.items()})  # rank 0's shard of 11 rows
        dp.step(batch)
        got, want = dp.state_dict(), one.state_dict()
        _close({b: got[b] for b in buffers}, {b: want[b] for b in buffers}, rtol=1e-6)
        assert int(got["bn.num_batches_tracked"]) == step + 1
        first, second = dp.worker_states()
        for name in buffers:
            np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    dp.shutdown()


def test_a_resumed_run_draws_the_noise_of_the_checkpoints_seed(ray_cluster, tmp_path):
    """The workers seed their Dropout noise with the trainer's seed: a resume without the
    original ``seed=`` drew other noise."""
    model = gc.capture(_BNDropNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    first, second = blobs(8, seed=1), blobs(8, seed=2)
    dp = gc.Trainer(arts, seed=7, **WORKER)
    dp.step(first)
    dp.save_checkpoint(tmp_path / "ckpt")
    want = dp.step(second)
    dp.shutdown()
    resumed = gc.Trainer(tmp_path / "ckpt", **WORKER)
    assert resumed.step(second) == pytest.approx(want, rel=1e-6)
    resumed.shutdown()
    assert gc.checkpoint.read_meta(tmp_path / "ckpt").seed == 7


def test_fit_records_each_epochs_learning_rate(ray_cluster):
    """The driver holds no state (the workers do): fit read no lr, History and logs said None."""
    arts = _arts("mlp", "sgd-momentum")
    dp = gc.Trainer(arts, **WORKER)
    dp.lr = 0.02
    history = dp.fit(gc.data.DataLoader(_data("mlp", 16), batch_size=8), epochs=2, progress=False, quiet=True)
    assert [e.lr for e in history.epochs] == pytest.approx([0.02, 0.02])
    dp.shutdown()


def _linear64(momentum: float = 0.5):
    model = gc.capture(nn.Linear(4, 3, dtype="float64"), x=gc.spec("float64", ("N", 4)))
    return gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.125, momentum=momentum))


def _regression(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 4)), "y": rng.standard_normal((n, 3))}


SCHEDULES = {  # (make it on a trainer, interval)
    "warmup-cosine-step": (lambda t: gc.optim.lr_scheduler.SequentialLR(
        t, [gc.optim.lr_scheduler.LinearLR(t, start_factor=0.1, total_iters=3),
            gc.optim.lr_scheduler.CosineAnnealingLR(t, T_max=9)], milestones=[3]), "step"),
    "plateau-epoch": (lambda t: gc.optim.lr_scheduler.ReduceLROnPlateau(t, factor=0.5, patience=0, threshold=0.5),
                      "epoch"),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_fit_steps_a_scheduler_on_the_workers_as_one_process(ray_cluster, name):
    """``fit(scheduler=...)`` on workers (ignored before: fit took no scheduler) gives one process's
    losses and lrs, each step's update at the lr it was computed with; a worker killed mid-epoch
    restarts the scheduler from the epoch's start with the params (it ran on, at later lrs)."""
    make, interval = SCHEDULES[name]
    arts, evaluation = _linear64(), gc.data.DataLoader(_regression(8, 2), batch_size=8)
    loader = gc.data.DataLoader(_regression(32, 1), batch_size=8, seed=0)
    runs = []
    for trainer in (gc.Trainer(arts, backend="numpy"), gc.Trainer(arts, **{**WORKER, "backend": "numpy"})):
        killed = []
        if isinstance(trainer, gc.distributed.DistributedTrainer):
            pid = trainer.worker_pids()[1]
            killed = _before_step(trainer, 6, lambda: os.kill(pid, signal.SIGKILL))  # epoch 2, batch 3
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*restarting the 2 workers from step 4")
            history = trainer.fit(loader, epochs=3, scheduler=make(trainer), interval=interval, eval_loader=evaluation,
                                  progress=False, quiet=True)
        runs.append((history, trainer))
        assert killed in ([], [6])
    (want, single), (got, dp) = runs
    np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
    assert [e.lr for e in got.epochs] == [e.lr for e in want.epochs]
    assert len({e.lr for e in want.epochs}) > 1  # the schedule moved the lr
    assert dp.lr_group == single.lr_group and dp.scheduler.last_epoch == single.scheduler.last_epoch
    _close(dp.params, single.params, rtol=1e-12, atol=1e-14)
    dp.shutdown()


def test_a_scheduled_run_resumes_mid_epoch_on_workers_with_the_uninterrupted_losses(ray_cluster, tmp_path):
    make, interval = SCHEDULES["warmup-cosine-step"]
    loader = gc.data.DataLoader(_regression(32, 1), batch_size=8, seed=0)
    whole = gc.Trainer(_linear64(), backend="numpy")
    want = whole.fit(loader, epochs=3, scheduler=make(whole), interval=interval, progress=False, quiet=True)
    stopped = gc.Trainer(_linear64(), **{**WORKER, "backend": "numpy"})
    _before_step(stopped, 6, _stop)
    with pytest.raises(RuntimeError, match="stopped"):
        stopped.fit(loader, epochs=3, scheduler=make(stopped), interval=interval, progress=False,
                    checkpoint=tmp_path / "ckpt", checkpoint_every=3)
    stopped.shutdown()
    assert json.loads(gc.checkpoint.read_meta(tmp_path / "ckpt").schedule)["interval"] == "step"
    resumed = gc.Trainer(tmp_path / "ckpt", **{**WORKER, "backend": "numpy"})
    got = resumed.fit(loader, epochs=3, scheduler=make(resumed), progress=False, quiet=True)
    np.testing.assert_allclose(got.step_losses, want.step_losses[6:], rtol=1e-12)
    assert resumed.lr == whole.lr and resumed.scheduler.get_last_lr() == whole.scheduler.get_last_lr()
    resumed.shutdown()


@pytest.mark.parametrize("dtype,backend,rtol", [("float64", "numpy", 1e-12), ("float32", "ort-cpu", 1e-6)])
def test_class_weighted_cross_entropy_trains_and_evaluates_as_one_process(ray_cluster, dtype, backend, rtol):
    """``cross_entropy(weight=w)``'s mean divides by the batch's ``sum(w[y])``: each shard weighs
    by its own sum (a shard of weight-0 labels only counts for nothing), so steps, ``fit`` with
    its eval loader and ``evaluate`` equal one process's, ignored labels too; with label smoothing a
    shard of weight-0 labels adds its smoothing term to the batch's sum, which the shard's own mean
    divides by 0: it was dropped (a loss of 2.316 for 2.613), and is now joined to a neighbour."""
    model = gc.capture(nn.Linear(6, 4, dtype=dtype), seed=0, x=gc.spec(dtype, ("N", 6)))
    loss = gc.losses.cross_entropy("output", label="y", weight=[0.5, 2.0, 0.0, 1.25], ignore_index=IGNORED,
                                   label_smoothing=0.1)
    arts = gc.training.generate(model, loss, gc.optim.SGD(0.25, momentum=0.5))
    rng = np.random.default_rng(4)
    data = {"x": rng.standard_normal((40, 6)).astype(dtype), "y": rng.integers(0, 4, 40)}
    data["y"][:4] = data["y"][19:23] = 2  # the first and third steps' rank 0 and rank 1 shards: weight 0 only
    data["y"][8:11] = IGNORED
    dp, single = gc.Trainer(arts, **{**WORKER, "backend": backend}), gc.Trainer(arts, backend=backend)
    for lo, hi in ((0, 8), (8, 15), (15, 23)):
        batch = {k: v[lo:hi] for k, v in data.items()}
        assert dp.evaluate(batch)["loss"] == pytest.approx(single.evaluate(batch)["loss"], rel=rtol)
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=rtol)
    atol = rtol / 10  # a param near 0 after 12 float32 steps: 3.5e-8 off at 0.0198
    _close(dp.params, single.params, rtol=rtol, atol=atol)
    loader = gc.data.DataLoader(data, batch_size=10, seed=1)
    evaluation = gc.data.DataLoader({k: v[15:] for k, v in data.items()}, batch_size=7, shuffle=False)
    got, want = (t.fit(loader, epochs=2, eval_loader=evaluation, progress=False, quiet=True) for t in (dp, single))
    np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=rtol)
    for g, w in zip(got.epochs, want.epochs, strict=True):
        assert g.loss == pytest.approx(w.loss, rel=rtol) and g.eval["loss"] == pytest.approx(w.eval["loss"], rel=rtol)
    _close(dp.params, single.params, rtol=rtol, atol=atol)
    assert dp.evaluate(data)["loss"] == pytest.approx(single.evaluate(data)["loss"], rel=rtol)
    batches = [{k: v[lo:hi] for k, v in data.items()} for lo, hi in ((15, 19), (19, 23), (23, 30))]  # 2nd: weight 0
    whole = {k: v[15:30] for k, v in data.items()}
    assert dp.evaluate_loader(batches)["loss"] == pytest.approx(single.evaluate(whole)["loss"], rel=rtol)
    with pytest.raises(gc.InputError, match="a train step: the class weights of the labels in 'y' .* sum to 0"):
        dp.step(batches[1])
    dp.shutdown()


@pytest.mark.parametrize("classes,labels", [([1.0, -0.5, 2.0], [0, 2, 0, 2, 1, 1, 1, 1]),
                                             ([1.0, -1.0, 2.0], [0, 2, 2, 2, 0, 1, 0, 1])])
def test_class_weights_of_any_sign_weigh_each_shard_as_torch_on_the_whole_batch(ray_cluster, classes, labels):
    """torch takes class weights of any sign: rank 1's shard (rows 4:8) weighs -2 in the first
    case, 0 in the second, where its labels' weights cancel but its weighted losses do not. The
    first was left out of the gradients' average (params 0.20 off torch's after a step), the
    second of the loss and gradients (loss 1.669 for torch's 1.537, params 0.18 off); now the
    first weighs -2 and the second is joined to rank 0's shard, as one batch."""
    torch = pytest.importorskip("torch")
    model = gc.capture(nn.Linear(6, 3, dtype="float64"), seed=0, x=gc.spec("float64", ("N", 6)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y", weight=classes),
                                gc.optim.SGD(0.5))
    batch = {"x": np.random.default_rng(0).standard_normal((8, 6)), "y": np.array(labels)}
    dp = gc.Trainer(arts, **{**WORKER, "backend": "numpy"})
    twin = torch.nn.Linear(6, 3).double()
    twin.load_state_dict({k: torch.tensor(v) for k, v in dp.params.items()})
    descent = torch.optim.SGD(twin.parameters(), lr=0.5)
    for _ in range(2):
        descent.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(torch.tensor(batch["x"])), torch.tensor(batch["y"]),
                                                 weight=torch.tensor(classes, dtype=torch.float64))
        assert dp.evaluate(batch)["loss"] == pytest.approx(loss.item(), rel=1e-12)
        assert dp.step(batch) == pytest.approx(loss.item(), rel=1e-12)
        loss.backward()
        descent.step()
    _close(dp.params, {k: v.detach().numpy() for k, v in twin.state_dict().items()}, rtol=1e-12, atol=1e-15)
    dp.shutdown()


def test_a_summed_loss_fits_to_one_processs_epoch_losses(ray_cluster):
    """With ``reduction="sum"`` each worker's shard sum adds up to the batch's; the epoch's train
    and eval losses are the totals per row (``averaging.epoch_weight``), one process's numbers:
    batches of 8, 8, 4 (shards of 4 + 4, 2 + 2) and eval batches of 6, 6, 3."""
    model = gc.capture(nn.Linear(6, 4, dtype="float64"), seed=0, x=gc.spec("float64", ("N", 6)))
    loss = gc.losses.cross_entropy("output", label="y", reduction="sum", ignore_index=IGNORED)
    arts = gc.training.generate(model, loss, gc.optim.SGD(0.05))
    data = {"x": RNG.standard_normal((35, 6)), "y": RNG.integers(0, 4, 35)}
    data["y"][:3] = IGNORED
    dp, single = gc.Trainer(arts, **{**WORKER, "backend": "numpy"}), gc.Trainer(arts, backend="numpy")
    loader = gc.data.DataLoader({k: v[:20] for k, v in data.items()}, batch_size=8, shuffle=False)
    evaluation = gc.data.DataLoader({k: v[20:] for k, v in data.items()}, batch_size=6, shuffle=False)
    got, want = (t.fit(loader, epochs=2, eval_loader=evaluation, progress=False, quiet=True) for t in (dp, single))
    np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
    for g, w, steps in zip(got.epochs, want.epochs, (want.step_losses[:3], want.step_losses[3:]), strict=True):
        assert g.loss == pytest.approx(w.loss, rel=1e-12) and g.eval["loss"] == pytest.approx(w.eval["loss"], rel=1e-12)
        assert g.loss == pytest.approx(sum(steps) / 20, rel=1e-12)
    assert got.epochs[-1].eval["loss"] == pytest.approx(dp.evaluate_loader(evaluation)["loss"] / 15, rel=1e-12)
    dp.shutdown()


class _BN1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.head = nn.Linear(4, 3, dtype="float64"), nn.BatchNorm1d(3, dtype="float64"), \
            nn.Linear(3, 2, dtype="float64")

    def forward(self, x):
        return self.head(gc.relu(self.bn(self.fc(x))))


def test_batchnorm1d_gets_no_shard_of_one_row_and_a_batch_of_one_is_refused(ray_cluster):
    """BatchNorm1d on [N, C] has one value per channel per row: a 3-row batch went out as shards of
    2 + 1 rows (the 1-row shard's BatchNorm output is its bias whatever the input), a 1-row batch to
    rank 0 alone, whose running variance became NaN (n/(n-1)) with a finite loss. Now no shard has
    1 row (3 rows all go to rank 0: one process's step), and a 1-row batch is refused as by one process."""
    model = gc.capture(_BN1dNet(), seed=0, x=gc.spec("float64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.125, momentum=0.5))
    assert arts.manifest.one_row_batchnorms == {"bn": ("x", 0)}
    dp, single = gc.Trainer(arts, **{**WORKER, "backend": "numpy"}), gc.Trainer(arts, backend="numpy")
    for seed in range(2):
        batch = {k: v[:, :2] if k == "y" else v for k, v in _regression(3, seed).items()}
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-12)
        _close(dp.state_dict(), single.state_dict(), rtol=1e-12, atol=1e-14)
    before = dp.state_dict()
    for trainer in (single, dp):
        with pytest.raises(gc.InputError, match=r"more than 1 value per channel in BatchNorm 'bn'.*'x' has 1 row"):
            trainer.step({k: v[:, :2] if k == "y" else v for k, v in _regression(1, 9).items()})
    assert dp.step_count == 2
    assert all(np.array_equal(value, before[name]) for name, value in dp.state_dict().items())
    dp.shutdown()


def test_frozen_batchnorm_trains_as_one_process(ray_cluster):
    """batchnorm="frozen" statistics are never updated, so the gradients graph rightly leaves
    them out: they were refused as artifacts from an older graphc."""
    model = gc.capture(_BNDropNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1),
                                batchnorm="frozen")
    batch = blobs(8, seed=3)
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    noise = {arts.manifest.graphs["train_step"].inputs[-1].name: RNG.random((8, 16), dtype=np.float32)}
    assert dp.step({**batch, **noise}) == pytest.approx(single.step({**batch, **noise}), rel=1e-5)
    _close(dp.state_dict(), single.state_dict())
    dp.shutdown()


def test_fit_on_a_loader_with_ignore_index_0_trains_as_one_process(ray_cluster):
    """The driver checked a loader batch's labels on its stand-ins, all 0: every batch looked
    as if every label were ignored."""
    model = gc.capture(TwoLayerNet(64, 32, 10), seed=0, x=gc.spec("float32", ("N", 64)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y", ignore_index=0), gc.optim.SGD(0.1))
    data = _data("mlp", 16)
    data["y"][:3] = 0
    loader = gc.data.DataLoader(data, batch_size=8, shuffle=False)
    want = gc.Trainer(arts, backend="ort-cpu").fit(loader, epochs=1, progress=False, quiet=True)
    dp = gc.Trainer(arts, **WORKER)
    got = dp.fit(loader, epochs=1, progress=False, quiet=True)
    np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=2e-5)
    dp.shutdown()


def test_fit_skips_a_batch_of_ignored_labels_and_weighs_a_shard_of_them_as_one_process(ray_cluster):
    """A batch whose every label is ignore_index is skipped with a warning, as by one process
    (the workers' fit raised "no sample of the batch counts"); a batch whose first shard holds only
    ignored labels steps as one process does on the whole batch (torch's mean over the labels kept)."""
    arts = _arts("mlp", "sgd-momentum")
    data = _data("mlp", 32)
    data["y"][8:12] = IGNORED   # batch 2: its first worker's shard counts nothing
    data["y"][16:24] = IGNORED  # batch 3: nothing counts
    loader = gc.data.DataLoader(data, batch_size=8, shuffle=False)
    runs = []
    for trainer in (gc.Trainer(arts, backend="ort-cpu"), gc.Trainer(arts, **WORKER)):
        with pytest.warns(UserWarning, match=r"epoch 1, batch 3 of 4: every label in 'y' is the ignore index 3; skip"):
            history = trainer.fit(loader, epochs=1, progress=False, quiet=True)
        runs.append((history, trainer.params, trainer.step_count))
    (want, want_params, want_steps), (got, got_params, got_steps) = runs
    assert got_steps == want_steps == 3
    np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=2e-5)
    assert got.epochs[0].samples == want.epochs[0].samples == 24
    _close(got_params, want_params)


def test_labels_past_a_class_count_the_model_computes_are_refused_as_by_one_process(ray_cluster):
    """Logits [N, 2K] of K prototypes, a class count the model computes: the workers' driver
    bounded the labels only below and stepped on a label >= C (a loss of 0 for it) where one
    process refuses. Logits [N, N] (contrastive) have C = each worker's rows, not the batch's:
    the shards' losses (a label >= 4 counted 0 on 4 rows) differ from one process's."""
    model = gc.capture(Prototypes(twice=True), seed=0, x=gc.spec("float32", ("N", 4)),
                       protos=gc.spec("float32", ("K", 4)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    batch = {"x": RNG.standard_normal((8, 4)).astype(np.float32), "protos": RNG.standard_normal((3, 4)).astype(np.float32),
             "y": np.array([5, 0, 6, 1, 2, 4, 3, 5])}
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    for trainer in (single, dp):
        for call in (trainer.step, trainer.evaluate):
            with pytest.raises(gc.InputError, match=r"label 'y' holds 6 at \(2,\); cross-entropy labels are class "
                                                    r"indices in \[0, 6\) or the ignore index -100"):
                call(batch)
        assert trainer.step_count == 0
    batch["y"][2] = 4
    assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-6)
    _close(dp.state_dict(), single.state_dict())
    dp.shutdown()
    model = gc.capture(Contrastive(), seed=0, x=gc.spec("float32", ("N", 4)))
    dp = gc.Trainer(gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1)),
                    **WORKER)
    for call in (dp.step, dp.evaluate):
        with pytest.raises(ArtifactsError, match=r"logits 'logits' have 8 classes for the batch's 8 rows but 4 for the "
                                                 r"4 rows of worker rank 0: the class dim follows the rows"):
            call({"x": batch["x"], "y": np.arange(8)})
    assert dp.step_count == 0
    dp.shutdown()


def _max_logit(pred: np.ndarray, target: np.ndarray) -> float:
    """A metric that is no mean over examples: the workers send their prediction rows for it."""
    return float(pred.max())


@pytest.mark.parametrize("dtype,backend,metrics,rtol", [
    ("float64", "numpy", None, 1e-12),
    ("float32", "ort-cpu", ["accuracy", gc.metrics.top_k_accuracy(3), _max_logit], 1e-6),
], ids=["float64-numpy-defaults", "float32-ort-cpu-chosen"])
def test_fit_reports_the_train_metrics_of_one_process(ray_cluster, tmp_path, dtype, backend, metrics, rtol):
    """fit on 2 workers reported no train metrics (``{}``): each worker now sums its shard's
    metrics over its examples (its labels not ignored, whatever their class weight) and the
    driver adds them up, or joins the shards' predictions for a metric that is no mean, so the
    epochs' metrics, in History and the log, are one process's on the same batches: an uneven
    last batch (3 rows: 2 + 1), a shard of ignored labels only, a shard of class-weight-0 labels
    only (no weight in the loss, 5 examples in the accuracy)."""
    model = gc.capture(nn.Linear(6, 7, dtype=dtype), seed=0, x=gc.spec(dtype, ("N", 6)))
    loss = gc.losses.cross_entropy("output", label="y", weight=[0.5, 2.0, 0.0, 1.25, 1.0, 1.0, 3.0],
                                   ignore_index=IGNORED)
    arts = gc.training.generate(model, loss, gc.optim.SGD(0.25, momentum=0.5))
    rng = np.random.default_rng(5)
    data = {"x": rng.standard_normal((43, 6)).astype(dtype), "y": rng.integers(0, 7, 43)}
    data["y"][10:15] = IGNORED  # batch 2: rank 0's shard counts no example
    data["y"][25:30] = 2  # batch 3: rank 1's shard has class weight 0 (counted in the metrics)
    loader = gc.data.DataLoader(data, batch_size=10, shuffle=False)
    runs = []
    for name, options in (("one", {"backend": backend}), ("dp", {**WORKER, "backend": backend})):
        trainer = gc.Trainer(arts, metrics=metrics, **options)
        history = trainer.fit(loader, epochs=2, progress=False, quiet=True, log=tmp_path / f"{name}.jsonl")
        logged = [json.loads(line)["metrics"] for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        assert logged == [e.metrics for e in history.epochs]
        runs.append(history)
    trainer.shutdown()
    want, got = runs
    names = ["accuracy", "top5_accuracy"] if metrics is None else ["accuracy", "top3_accuracy", "_max_logit"]
    np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=rtol)
    for g, w in zip(got.epochs, want.epochs, strict=True):
        assert list(g.metrics) == list(w.metrics) == names
        for key in ("accuracy", names[1]):  # counts of hits over the epoch's 38 examples: exact
            assert g.metrics[key] == pytest.approx(w.metrics[key], rel=1e-12, abs=1e-12), key
        if metrics is not None:
            assert g.metrics["_max_logit"] == pytest.approx(w.metrics["_max_logit"], rel=rtol)


def test_fit_on_artifacts_whose_gradients_graph_has_no_prediction_says_so(ray_cluster, tmp_path):
    """Artifacts saved before the gradients graph output the prediction train on workers
    without train metrics, saying why once (as one process does for format 2's train_step)."""
    _arts("mlp", "sgd-momentum").save(tmp_path / "old")
    without_prediction(tmp_path / "old", "gradients", "graphc.training/5")
    dp = gc.Trainer(tmp_path / "old", **WORKER)
    with pytest.warns(UserWarning, match=r"have no gradients prediction output, so fit reports no train metrics"):
        history = dp.fit(gc.data.DataLoader(_data("mlp", 16), batch_size=8), epochs=1, progress=False, quiet=True)
    assert history.epochs[0].metrics == {} and history.epochs[0].eval == {}
    dp.shutdown()


class _Tagger(nn.Module):
    """An RNN tagger: logits [N, C, L] batch-first, [L, C, N] time-major, labels [N, L] / [L, N]."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.rnn, self.fc = nn.RNN(4, 6, batch_first=batch_first), nn.Linear(6, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return {"logits": self.fc(out).transpose(1, 2)}


def test_a_time_major_rnn_is_refused_and_its_batch_first_twin_steps_as_one_process(ray_cluster):
    """Time-major inputs [L, N, ...] start with the sequence dim, which the workers split: each
    ran a piece of every sequence from a zero state, a step unlike one process's (silently)."""
    def arts(batch_first):
        shape = ("N", "L", 4) if batch_first else ("L", "N", 4)
        model = gc.capture(_Tagger(batch_first), seed=0, x=gc.spec("float32", shape))
        return model, gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))

    model, time_major = arts(False)
    with pytest.raises(ArtifactsError, match=r"gc.Trainer\(workers=2\): RNN node .* runs over the inputs' first "
                                                r"dim 'L' .*time-major.*batch_first=True"):
        gc.Trainer(time_major, **WORKER)
    x = RNG.standard_normal((5, 4, 4), dtype=np.float32)  # [L, N, 4]
    with pytest.raises(gc.GraphError, match="map_batches: RNN node .*time-major"):
        gc.distributed.map_batches(model, {"x": x}, backend="ort-cpu", batch_size=2, workers=2, num_cpus=0.5)
    _, batch_first = arts(True)
    batch = {"x": x.transpose(1, 0, 2).copy(), "y": RNG.integers(0, 3, (4, 5))}
    dp, single = gc.Trainer(batch_first, **WORKER), gc.Trainer(batch_first, backend="ort-cpu")
    assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-5)
    _close(dp.params, single.params, atol=1e-6)
    dp.shutdown()


def test_a_0_row_predict_is_empty_and_a_shut_down_trainer_says_so(ray_cluster):
    """Both raised IndexError: no worker returned a shard, or there was no worker."""
    arts = _arts("mlp", "sgd-momentum")
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    empty = {"x": np.zeros((0, 64), np.float32)}
    _close(dp.predict(empty), single.predict(empty))
    dp.shutdown()
    for call in (lambda: dp.step(_data("mlp", 4)), lambda: dp.predict(empty), dp.state_dict):
        with pytest.raises(gc.GraphcError, match=r"this trainer was shut down \(shutdown\(\)\)"):
            call()


def _before_step(trainer, at: int, action) -> list:
    """Make ``trainer`` call ``action()`` just before its step ``at``, once (``fit`` calls
    ``trainer.step``); the returned list holds the calls made."""
    step, done = trainer.step, []

    def wrapped(batch):
        if trainer.step_count == at:
            del trainer.step  # the trainer's own again (and no reference cycle keeps its workers)
            done.append(at)
            action()
        return step(batch)

    trainer.step = wrapped
    return done


def test_a_killed_worker_restarts_from_the_last_checkpoint(ray_cluster, tmp_path):
    arts = _arts("mlp", "sgd-momentum")
    data = _data("mlp", 48)
    single = gc.Trainer(arts, backend="ort-cpu")
    evaluation = gc.data.DataLoader(_data("mlp", 20), batch_size=10, shuffle=False)
    want = single.fit(gc.data.DataLoader(data, batch_size=8, seed=3), epochs=3, progress=False, eval_loader=evaluation)
    dp = gc.Trainer(arts, **WORKER)
    loader = gc.data.DataLoader(data, batch_size=8, seed=3)
    pid = dp.worker_pids()[1]
    killed = _before_step(dp, 8, lambda: os.kill(pid, signal.SIGKILL))  # epoch 2, batch 3
    with pytest.warns(UserWarning, match="restarting the 2 workers from step 6"):
        history = dp.fit(loader, epochs=3, progress=False, checkpoint=tmp_path / "ckpt", eval_loader=evaluation)
    assert killed and dp.step_count == 18 and [e.epoch for e in history.epochs] == [1, 2, 3]
    np.testing.assert_allclose(history.step_losses, want.step_losses, rtol=2e-5)
    for got_epoch, want_epoch in zip(history.epochs, want.epochs, strict=True):  # evaluated after each epoch's last update
        assert got_epoch.eval == pytest.approx(want_epoch.eval, rel=2e-5)
    _close(dp.params, single.params)
    assert gc.Trainer(tmp_path / "ckpt").step_count == 18

    dp.max_restarts = 0  # and a run that may not restart stops with the reason
    pid = dp.worker_pids()[0]
    _before_step(dp, 19, lambda: os.kill(pid, signal.SIGKILL))
    with pytest.raises(gc.runtime.trainer.TrainingFailed, match=r"died[^;]*[^.]; gave up after 0 restart"):
        dp.fit(loader, epochs=4, progress=False)


def test_a_loader_subclass_reading_its_own_way_is_read_on_the_driver_as_one_process(ray_cluster):
    """The workers read a gc.data.DataLoader's shards through its ``batch``, one process's iteration does
    not: a subclass doubling ``x`` there trained the workers on other data (params 0.04 apart after an
    epoch of 5 steps); such a loader is now iterated on the driver, as one process iterates it."""
    class Doubled(gc.data.DataLoader):
        def batch(self, epoch, index, rows=slice(None)):
            out = super().batch(epoch, index, rows)
            return {**out, "x": out["x"] * 2}

    arts = _arts("mlp", "sgd-momentum")
    data = _data("mlp", 40)
    dp, single = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="ort-cpu")
    got, want = (t.fit(Doubled(data, batch_size=8, seed=2), epochs=1, progress=False, quiet=True) for t in (dp, single))
    np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=2e-5)
    _close(dp.params, single.params)
    dp.shutdown()


class _Pairs(nn.Module):
    """Reads its rows in pairs: a shard with an odd number of rows fails on its worker."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        pairs = self.fc(x).reshape(-1, 2, 3)
        return {"logits": (pairs - pairs.mean(axis=1, keepdims=True) * 0.5).reshape(-1, 3)}


def test_a_failed_or_timed_out_step_applies_the_last_update_once(ray_cluster, tmp_path):
    """The workers apply the previous update at the start of a step's call; a call that fails
    on a worker, or that the driver stops waiting for, must not make them apply it again."""
    model = gc.capture(_Pairs(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.5))
    data = blobs(16, seed=2)
    first, second = ({k: v[lo:lo + 8] for k, v in data.items()} for lo in (0, 8))
    single, dp = gc.Trainer(arts, backend="ort-cpu"), gc.Trainer(arts, **WORKER)
    for trainer in (single, dp):
        trainer.step(first)
    # 7 rows: rank 1's 3 rows fail, rank 0's 4 do not; the error said only "ort-cpu failed while running node
    # 'Reshape' ... Input shape:{3,3}" (a shape the batch does not have), and Ray logged it again as unhandled
    pids = dp.worker_pids()
    with unhandled_errors() as unhandled:
        with pytest.raises(gc.errors.BackendError) as failed:
            dp.step({k: v[:7] for k, v in data.items()})
        assert str(failed.value).startswith(f"worker rank 1 (pid {pids[1]}) on rows 4:7 of the batch failed during "
                                            "training step 2: ort-cpu failed while running node 'Reshape'")
        del failed  # its traceback holds the step's refs: they go now
    assert unhandled == []
    # a step the driver stops waiting for: rank 1 held (SIGSTOP) past the time-out, so it cannot answer in time
    # however the machine schedules the driver (timeout_s = 0 alone lost that race under load: the workers could
    # finish before the driver asked), then let go: the workers run it all the same
    dp.timeout_s, held = 0.5, dp.worker_pids()[1]
    os.kill(held, signal.SIGSTOP)
    try:
        with pytest.raises(gc.GraphcError, match="training step 2 took more than 0.5 s"):
            dp.step(second)
    finally:
        os.kill(held, signal.SIGCONT)
    dp.timeout_s = WORKER["timeout_s"]
    assert dp.step_count == 1
    assert dp.step(second) == pytest.approx(single.step(second), rel=1e-5)
    _close(dp.params, single.params)

    dp.step(first)  # its update is pending
    pid = dp.worker_pids()[1]
    os.kill(pid, signal.SIGKILL)
    lost = rf"^worker rank 1 \(pid {pid}\) on rows 4:8 of the batch died during training step 4"
    with pytest.raises(gc.distributed.WorkerLost, match=lost):
        dp.step(second)  # rank 0 applied the update, rank 1 is gone: no consistent state to save
    for _ in range(2):
        with pytest.raises(gc.distributed.WorkerLost):
            dp.save_checkpoint(tmp_path / "ckpt.safetensors")
    assert not (tmp_path / "ckpt.safetensors").exists()
    dp.shutdown()


def _gone(pid: int, within_s: float = 20.0) -> bool:
    """Whether process ``pid`` ends within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_a_stopped_worker_times_out_naming_it_and_shutdown_ends_it(ray_cluster):
    """A worker that hangs (SIGSTOP) fails the step after timeout_s; the error said only
    "a training step took more than 3 s", not which worker had not answered, nor which step."""
    dp = gc.Trainer(_arts("mlp", "sgd-momentum"), **WORKER)
    batch = _data("mlp", 8)
    dp.step(batch)
    pids = dp.worker_pids()
    dp.timeout_s = 3
    os.kill(pids[0], signal.SIGSTOP)
    try:
        start = time.monotonic()
        late = rf"training step 2 took more than 3 s \(worker rank 0 \(pid {pids[0]}\) on rows 0:4 of the batch not done\)"
        with pytest.raises(gc.GraphcError, match=late):
            dp.step(batch)
        assert time.monotonic() - start < 3 + 5 and dp.step_count == 1
        dp.shutdown()
        assert all(_gone(pid) for pid in pids)  # the stopped one too: no orphan holds its CPU
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGCONT)


def test_a_nan_in_one_workers_shard_names_the_input_its_data_row_and_the_worker(ray_cluster):
    """The driver holds only stand-ins for a loader's batch (the workers read their rows), so the
    error said "lower the learning rate or check the data" where one process names the NaN's
    input and data row."""
    arts = _arts("mlp", "sgd-momentum")
    data = _data("mlp", 16)
    data["x"][13, 5] = np.nan  # batch 2, row 5: rank 1's shard (rows 4:8)
    single, dp = gc.Trainer(arts, backend="ort-cpu"), gc.Trainer(arts, **WORKER)
    errors = []
    for trainer in (single, dp):
        with pytest.raises(gc.runtime.trainer.TrainingFailed) as failed:
            trainer.fit(gc.data.DataLoader(data, batch_size=8, shuffle=False), epochs=1, progress=False)
        errors.append(str(failed.value))
    one = ("the loss became nan at step 2 (epoch 1, batch 2); the batch's 'x' holds nan at (5, 5) (row 13 of the "
           "loader's data")
    then = "), which the step carried into the loss and the params"
    assert errors[0].startswith(one + then)
    assert errors[1].startswith(f"{one}; in the shard of worker rank 1 (pid {dp.worker_pids()[1]}), rows 4:8 of the "
                                f"batch{then}")
    dp.shutdown()


def test_an_address_other_than_the_joined_clusters_is_refused_and_its_own_is_taken(ray_cluster):
    """Ray keeps one connection per process: a ray_address naming another cluster was ignored,
    and the workers ran on the cluster joined first without a word."""
    arts = _arts("mlp", "sgd-momentum")
    joined = ray_cluster.get_runtime_context().gcs_address
    other = r"ray_address='127.0.0.1:1', but this process is already connected to the Ray cluster at " + \
        rf"'{joined}' \(ray.init\(\) was called.*call ray.shutdown\(\) first"
    with pytest.raises(gc.GraphcError, match=other):
        gc.Trainer(arts, **WORKER, ray_address="127.0.0.1:1")
    with pytest.raises(gc.GraphcError, match="already connected"):
        gc.distributed.map_batches(arts.inference, {"x": np.zeros((4, 64), np.float32)}, workers=1,
                                   ray_address="ray://127.0.0.1:10001")
    for address in (joined.replace("127.0.0.1", "localhost"), "auto"):
        trainer = gc.Trainer(arts, **WORKER, ray_address=address)
        assert np.isfinite(trainer.step(_data("mlp", 4)))
        trainer.shutdown()


def test_a_trainer_passed_to_a_ray_task_or_copied_is_refused_saying_why(ray_cluster):
    """A Ray task got a copy of the trainer that stepped its workers: the task's step returned a
    loss, but its update went with the copy, and the trainer's params never moved."""
    import copy
    import pickle

    import ray

    dp, batch = gc.Trainer(_arts("mlp", "sgd-momentum"), **WORKER), _data("mlp", 8)
    before = dp.params
    why = "a data-parallel gc.Trainer cannot be pickled (passed to a Ray task or actor, copied)"
    with pytest.raises(TypeError, match=re.escape(why)):
        ray.get(ray.remote(lambda trainer, batch: trainer.step(batch)).options(num_cpus=0.25).remote(dp, batch))
    for call in (lambda: ray.put(dp), lambda: copy.deepcopy(dp), lambda: pickle.dumps(dp)):
        with pytest.raises(TypeError, match=re.escape(why)):
            call()
    _close(dp.params, before)
    assert np.isfinite(dp.step(batch)) and dp.step_count == 1
    dp.shutdown()


def test_a_trainer_whose_ray_was_shut_down_says_so_at_once(ray_cluster, tmp_path):
    """After ray.shutdown() (and a ray.init() again) a step retried for seconds, then raised Ray's
    bare "Exception: Failed to submit task to actor ... Can't find actor"; shutdown() raised too. A
    driver of its own joins the module's cluster, which ray.shutdown() here would stop."""
    script = tmp_path / "driver.py"
    script.write_text(
        "import sys, time, numpy as np, ray, graphc as gc\n"
        "from graphc.models.two_layer_net import TwoLayerNet\n"
        "model = gc.capture(TwoLayerNet(8, 4, 3), x=gc.spec('float32', ('N', 8)))\n"
        "arts = gc.training.generate(model, gc.losses.cross_entropy('output', label='y'), gc.optim.SGD(0.1))\n"
        "batch = {'x': np.ones((4, 8), np.float32), 'y': np.zeros(4, np.int64)}\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "trainer = gc.Trainer(arts, workers=2, num_cpus=0.25, backend='numpy', timeout_s=60)\n"
        "trainer.step(batch)\n"
        "ray.shutdown()\n"
        "for again in (False, True):\n"
        "    if again:\n"
        "        ray.init(address=sys.argv[1], log_to_driver=False)  # the same cluster, another job\n"
        "    start = time.monotonic()\n"
        "    try:\n"
        "        trainer.step(batch)\n"
        "    except gc.GraphcError as exc:\n"
        "        print(f'{time.monotonic() - start:.1f}', exc)\n"
        "trainer.shutdown()\n"
        "print('shut down')\n")
    done = subprocess.run([sys.executable, str(script), ray_cluster.get_runtime_context().gcs_address],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[2] == "shut down", (done.stdout, done.stderr[-3000:])
    for line in lines[:2]:
        seconds, message = line.split(" ", 1)
        assert float(seconds) < 1 and message == ("Ray was shut down (ray.shutdown()) since this trainer started its "
                                                  "workers, and they went with it; make a new gc.Trainer, from a "
                                                  "checkpoint to go on")


def _stop():
    raise RuntimeError("stopped")


def _driver_gathers(*args):
    raise AssertionError("the driver gathered a batch: the workers read their shards themselves")


@pytest.mark.parametrize("first,then,shuffle", [(2, 1, True), (1, 2, False)], ids=["2-then-1", "1-then-2-unshuffled"])
def test_a_mid_epoch_checkpoint_resumes_with_another_number_of_workers(ray_cluster, tmp_path, monkeypatch,
                                                                       first, then, shuffle):
    arts = _arts("mlp", "adamw")
    loader = gc.data.DataLoader(_data("mlp", 40), batch_size=10, seed=1, shuffle=shuffle)

    def fit(trainer, **kwargs):
        with monkeypatch.context() as patch:
            if isinstance(trainer, gc.distributed.DistributedTrainer):  # no batch passes through the driver
                patch.setattr(gc.data.DataLoader, "_gather", _driver_gathers)
            return trainer.fit(loader, epochs=2, progress=False, **kwargs)

    def trainer(source, workers):
        return gc.Trainer(source, **({**WORKER, "workers": workers} if workers > 1 else {"backend": "ort-cpu"}))

    want = fit(trainer(arts, 1))
    stopped = trainer(arts, first)
    _before_step(stopped, 6, _stop)  # killed after step 6, saved every 3: epoch 2, batch 3 is next
    with pytest.raises(RuntimeError, match="stopped"):
        fit(stopped, checkpoint=tmp_path / "ckpt", checkpoint_every=3)
    resumed = trainer(tmp_path / "ckpt", then)
    assert (resumed.epoch, resumed.batch_in_epoch) == (1, 2)
    got = fit(resumed)
    np.testing.assert_allclose(got.step_losses, want.step_losses[6:], rtol=2e-5)


def test_map_batches_on_a_dataset_equals_one_session(ray_cluster):
    model = gc.capture(TwoLayerNet(64, 32, 10), seed=2, x=gc.spec("float32", ("N", 64)))
    x = RNG.standard_normal((100, 64), dtype=np.float32)
    want = gc.Session(model, backend="ort-cpu").run({"x": x})["output"]
    ctx = ray_cluster.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ds = ray_cluster.data.from_items([{"x": row} for row in x])
    out = gc.distributed.map_batches(model, ds, backend="ort-cpu", batch_size=32, workers=1, num_cpus=0.5)
    rows = out.take_all()
    np.testing.assert_allclose(np.stack([r["output"] for r in rows]), want, rtol=1e-5, atol=1e-6)


def test_cli_runs_batches_and_trains_on_workers(ray_cluster, tmp_path, capsys):
    """``graphc run --workers`` (map_batches over a dict of arrays) equals one Session; ``graphc train --workers``
    trains with a schedule, its workers placed by ``--placement spread``."""
    model = gc.capture(TwoLayerNet(64, 32, 10), seed=2, x=gc.spec("float32", ("N", 64)))
    model.save(tmp_path / "m.onnx")
    x = RNG.standard_normal((250, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    result = run_cli(capsys, "run", tmp_path / "m.onnx", "--backend", "ort-cpu", "--input", f"x={tmp_path / 'x.npy'}",
                     "--workers", "2", "--batch-size", "100", "-o", tmp_path / "out.npz")
    assert result.code == 0, result.err
    want = gc.Session(model, backend="ort-cpu").run({"x": x})["output"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["output"], want, rtol=1e-5, atol=1e-6)

    _arts("mlp", "sgd-momentum").save(tmp_path / "arts")
    np.savez(tmp_path / "d.npz", **_data("mlp", 32))
    result = run_cli(capsys, "train", tmp_path / "arts", "--data", tmp_path / "d.npz", "--epochs", "1", "--batch-size", "8",
                     "--backend", "ort-cpu", "--workers", "2", "--placement", "spread", "--no-progress", "--checkpoint",
                     tmp_path / "ckpt", "--schedule", "exponential", "--gamma", "0.5")  # refused before: "take no lr schedule yet"
    assert result.code == 0, result.err
    trained = gc.Trainer(tmp_path / "ckpt")
    assert trained.step_count == 4 and trained.lr == pytest.approx(0.025)
    assert json.loads(gc.checkpoint.read_meta(tmp_path / "ckpt").schedule)["kind"] == "ExponentialLR"


def test_map_batches_splits_only_inputs_by_rows_and_refuses_outputs_it_cannot_join(ray_cluster, tmp_path, capsys):
    """``s`` (no rows) was cut into batches too, and a 0-d output crashed the join."""
    data = {"x": RNG.standard_normal((10, 8), dtype=np.float32), "s": np.linspace(0.5, 1.5, 8, dtype=np.float32)}
    model = _shared_model(summaries=False)
    out = gc.distributed.map_batches(model, data, backend="ort-cpu", batch_size=4, workers=2, num_cpus=0.5)
    _close(out, gc.Session(model, backend="ort-cpu").run(data), atol=1e-6)
    refused = r"output\(s\) mean_logit: float32\[\]; by_class: float32\[3,N\] do not start with the batch dim 'N'"
    with pytest.raises(gc.GraphError, match=refused):
        gc.distributed.map_batches(_shared_model(), data, backend="ort-cpu", workers=1, num_cpus=0.5)
    _shared_model().save(tmp_path / "m.onnx")
    for name, array in data.items():
        np.save(tmp_path / f"{name}.npy", array)
    result = run_cli(capsys, "run", tmp_path / "m.onnx", "--backend", "ort-cpu", "--input", f"x={tmp_path / 'x.npy'}",
                     "--input", f"s={tmp_path / 's.npy'}", "--workers", "2")
    assert result.code == 2 and "mean_logit: float32[]" in one_line_error(result)


def _free_cpus_back(ray, want: float, within_s: float = 20.0) -> bool:
    """Whether the cluster's free CPUs are back to ``want`` within ``within_s``."""
    deadline = time.monotonic() + within_s
    while ray.available_resources().get("CPU", 0.0) < want - 1e-6:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_map_batches_checks_the_data_before_any_worker_and_stops_its_sessions(ray_cluster, monkeypatch):
    """A wrong dtype or shape failed on the workers (all batches sent first), a misspelt input
    said "needs the same number of rows; got {}", 0 rows raised where gc.Session returns 0 rows,
    and a batch failing on a worker left the sessions alive, holding their CPUs."""
    from graphc.runtime.distributed import inference

    model = gc.capture(TwoLayerNet(64, 32, 10), seed=2, x=gc.spec("float32", ("N", 64)))
    x = RNG.standard_normal((7, 64), dtype=np.float32)
    run = {"backend": "ort-cpu", "workers": 2, "num_cpus": 0.5, "timeout_s": 120}
    session = gc.Session(model, backend="ort-cpu")
    _close(gc.distributed.map_batches(model, {"x": x}, batch_size=1, **run), session.run({"x": x}), atol=1e-6)
    _close(gc.distributed.map_batches(model, {"x": x[:0]}, **run), session.run({"x": x[:0]}))
    with monkeypatch.context() as patch:
        patch.setattr(inference, "connect", _driver_gathers)  # refused before Ray is reached
        for data, error in [({"x": x.astype(np.float64)}, r"input 'x': expected x: float32\[N,64\], got float64\[7,64\]"),
                            ({"x": x[:, :5]}, r"input 'x': .*got float32\[7,5\] \(axis 1 has size 5"),
                            ({"X": x}, r"unknown input 'X'; the model's inputs are: x: float32\[N,64\]")]:
            with pytest.raises(gc.InputError, match=error):
                gc.distributed.map_batches(model, data, **run)
    lookup = gc.capture(nn.Embedding(10, 3), seed=0, idx=gc.spec("int64", ("N",)))
    free = ray_cluster.available_resources()["CPU"]
    with pytest.raises(gc.GraphcError, match="Gather.*idx=12"):  # an index out of range: only a worker sees it
        gc.distributed.map_batches(lookup, {"idx": np.array([1, 2, 3, 12])}, batch_size=2, **run)
    assert _free_cpus_back(ray_cluster, free)


def test_workers_whose_cpus_others_hold_fail_with_the_reason(ray_cluster):
    """They waited for them until timeout_s, then said to raise it."""
    arts = _arts("mlp", "sgd-momentum")
    first = gc.Trainer(arts, **{**WORKER, "num_cpus": ray_cluster.cluster_resources()["CPU"] / 2})
    held = r"the Ray cluster has [\d.]+, but others .* have held all but 0 for 1 s"
    with pytest.raises(gc.BackendUnavailable, match=held):
        gc.Trainer(arts, **{**WORKER, "timeout_s": 1})
    first.shutdown()


def test_gpu_requests_fail_with_the_reason(ray_cluster):
    arts = _arts("mlp", "adamw")
    with pytest.raises(gc.BackendUnavailable, match="GPU"):
        gc.Trainer(arts, **WORKER, num_gpus=1)
    with pytest.raises(gc.BackendUnavailable, match="GPU"):
        gc.distributed.map_batches(arts.inference, {"x": np.zeros((4, 64), np.float32)}, workers=1, num_gpus=1)
    if any(b.name == "ort-cuda" and b.available for b in gc.backends()):
        pytest.skip("ort-cuda runs here; its refusal is checked where it cannot")
    with pytest.raises(gc.BackendUnavailable, match="ort-cuda"):
        gc.Trainer(arts, **{**WORKER, "backend": "ort-cuda", "workers": 1}, ray_address="auto")


def test_an_address_where_no_cluster_listens_fails_at_once_naming_it(tmp_path):
    """ray.init retried such an address for minutes (past any timeout_s)."""
    gc.capture(nn.Linear(4, 2), x=gc.spec("float32", ("N", 4))).save(tmp_path / "m.onnx")
    code = ("import graphc as gc, numpy as np\n"
            "try:\n"
            "    gc.distributed.map_batches('m.onnx', {'x': np.zeros((2, 4), np.float32)}, ray_address='127.0.0.1:1')\n"
            "except gc.GraphcError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=tmp_path).stdout
    assert "cannot reach the Ray cluster at '127.0.0.1:1': nothing accepts a connection" in out


def test_the_cluster_listens_on_loopback_only_without_dashboard_or_usage_reports(ray_cluster):
    import psutil

    from ray._common.usage import usage_lib
    from ray._private import ray_constants, worker

    assert not ray_constants.ENABLE_RAY_CLUSTER
    assert not usage_lib.usage_stats_enabled()
    assert worker._global_node.webui_url == ""  # Ray's head process serves its APIs, not the dashboard
    processes = psutil.Process().children(recursive=True)
    names = {p.name() for p in processes}
    assert {"gcs_server", "raylet"} <= names, names
    listening = set()
    for process in processes:
        try:
            listening |= {c.laddr.ip for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            continue
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, listening


def test_without_ray_a_clear_error_says_what_to_install(monkeypatch, capsys, tmp_path):
    code = "import sys, graphc as gc, graphc.runtime.distributed, graphc.runtime.trainer; gc.Trainer; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    with pytest.raises(gc.MissingDependency, match=r'pip install "graphc\[ray\]"'):
        gc.Trainer(_arts("mlp", "adamw"), workers=2)
    model = gc.capture(TwoLayerNet(64, 32, 10), x=gc.spec("float32", ("N", 64)))
    model.save(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.zeros((3, 64), np.float32))
    err = one_line_error(run_cli(capsys, "run", tmp_path / "m.onnx", "--input", f"x={tmp_path / 'x.npy'}", "--workers", "2"))
    assert "MissingDependency" in err and "graphc[ray]" in err


def _max_norm_batches(outputs: int) -> list[dict]:
    """Batches of 4 x 4 lookups over rows 0..5 of ``test_embedding_max_norm``'s 8 (rows 6, 7, over
    max_norm, never looked up: weight decay and momentum step them unrenormalised): 2 workers' shards
    read overlapping rows, at step 1 rows the other does not (0-2 and 3-5), at step 4 2 rows and 1."""
    rng = np.random.default_rng(2)
    out = []
    for step in range(6):
        i = rng.integers(0, 6, (4, 4))
        if step == 1:
            i[:2], i[2:] = rng.integers(0, 3, (2, 4)), rng.integers(3, 6, (2, 4))
        out.append({"i": i[:3] if step == 4 else i, "y": rng.normal(size=(3 if step == 4 else 4, outputs))})
    return out


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("tied, padding_idx, kind", [(True, None, "adamw"), (False, 2, "sgd"), (True, 2, "adamw")])
def test_workers_train_an_embeddings_max_norm_weight_as_torch_on_the_whole_batch(ray_cluster, backend, tied,
                                                                                padding_idx, kind):
    """Each worker renormalises the rows every shard looks up (their union, gathered before the forward),
    so a tied output layer reads the weight one process holds, and the update steps the weight with
    those rows renormalised: 2 workers match torch on the whole batch to 1e-12 in float64."""
    pytest.importorskip("torch")
    from test_embedding_max_norm import OPTIMIZERS as STEPPERS, ROWS, _Net, _Twin, _assert_weights, _torch_steps

    net = _Net(tied=tied, padding_idx=padding_idx)
    twin = _Twin(net, 2.0, tied)
    model = gc.capture(net, i=gc.spec("int64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), STEPPERS[kind][0]())
    batches = _max_norm_batches(ROWS if tied else 2)
    trainer = gc.Trainer(arts, **{**WORKER, "backend": backend})
    losses = [trainer.step(b) for b in batches]
    np.testing.assert_allclose(losses, _torch_steps(twin, STEPPERS[kind][1], batches), rtol=1e-12, atol=1e-15)
    _assert_weights(trainer, twin)
    first, second = trainer.worker_states()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    trainer.shutdown()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_workers_evaluate_an_embeddings_max_norm_weight_as_one_process(ray_cluster, backend):
    """evaluate and predict renormalise the union of the shards' rows too: a tied output layer reads
    every row the whole batch looks up renormalised (the 2 shards look up rows 0-2 and 3-5, all over
    max_norm: each shard's own only was off by 0.34, 25%, in the loss)."""
    from test_embedding_max_norm import ROWS, START, _Net

    model = gc.capture(_Net(tied=True), i=gc.spec("int64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1))
    batch = {"i": np.array([[0, 1, 2, 2], [1, 0, 0, 2], [3, 4, 5, 5], [4, 3, 3, 5]]), "y": np.ones((4, ROWS))}
    assert (np.linalg.norm(START[:6], axis=1) > 1).all()
    one, workers = gc.Trainer(arts, backend=backend), gc.Trainer(arts, **{**WORKER, "backend": backend})
    np.testing.assert_allclose(workers.evaluate(batch)["loss"], one.evaluate(batch)["loss"], rtol=1e-14)
    np.testing.assert_allclose(workers.predict({"i": batch["i"]})["output"], one.predict({"i": batch["i"]})["output"],
                               rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(workers.state_dict()["emb.weight"], START)  # evaluation does not write it
    workers.shutdown()


def test_a_forward_that_mixes_rows_warns_and_a_row_wise_one_does_not(ray_cluster):
    """``Contrastive``'s logits ``fc(x) @ x.T`` pair the shard's rows only: the Trainer warns, naming
    the MatMul and its line, and still starts; the MLP gets no warning."""
    arts = gc.training.generate(gc.capture(Contrastive(), seed=0, x=gc.spec("float32", ("N", 4))),
                                gc.losses.mse("logits", label="t"), gc.optim.SGD(0.1))
    with pytest.warns(gc.DataParallelWarning, match=r"node 'MatMul' \(MatMul, tests/trainer_models.py:\d+\): it "
                                                    r"multiplies rows with rows"):
        dp = gc.Trainer(arts, **WORKER)
    dp.shutdown()
    with warnings.catch_warnings():
        warnings.simplefilter("error", gc.DataParallelWarning)
        gc.Trainer(_arts("mlp", "adamw"), **WORKER).shutdown()


class _Centred(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return {"out": self.fc(x - x.mean(axis=0, keepdims=True))}


def test_map_batches_warns_where_the_forward_mixes_a_batchs_rows(ray_cluster):
    """A forward centring the batch (``x - x.mean(0)``) run in batches of 4 gave outputs 0.63 off one
    Session's on all 10 rows, without a word; map_batches now warns, naming the node and its line,
    where the data makes more than one batch (one batch is one Session's run: no warning), and a
    row-wise MLP runs silent."""
    model = gc.capture(_Centred(), seed=0, x=gc.spec("float32", ("N", 4)))
    x = RNG.standard_normal((10, 4), dtype=np.float32)
    run = functools.partial(gc.distributed.map_batches, backend="numpy", workers=2, num_cpus=0.5)
    with pytest.warns(gc.DataParallelWarning, match=r"map_batches: .*node 'ReduceMean' \(ReduceMean, "
                                                    r"tests/test_distributed.py:\d+\): it reduces the batch axis 0"):
        run(model, {"x": x}, batch_size=4)
    mlp = gc.capture(TwoLayerNet(4, 8, 3), seed=0, x=gc.spec("float32", ("N", 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", gc.DataParallelWarning)
        whole = run(model, {"x": x}, batch_size=10)
        run(mlp, {"x": x}, batch_size=4)
    np.testing.assert_allclose(whole["out"], gc.Session(model, backend="numpy").run({"x": x})["out"], rtol=1e-6)
