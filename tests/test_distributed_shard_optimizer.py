"""``gc.Trainer(workers=2, shard_optimizer=True)`` (ZeRO-1, ``optimizer_shards``) against the unsharded
data-parallel run and one process, float64 on the numpy backend, on the loopback Ray cluster the
data-parallel modules share: SGD with momentum and AdamW with clipping (losses, step_grad_norms,
state to 1e-12), the fused layout and one update per param, loss scaling's skipped steps,
accumulate=2, checkpoints resumed sharded <-> unsharded, a killed worker; and the partition itself."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading

import numpy as np
import pytest

import graphc as gc
from graphc.runtime.distributed.optimizer_shards import ShardPlan
from ray_util import ray_cluster, unhandled_errors  # noqa: F401 - the module's fixture

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
WORKERS = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120, "backend": "numpy"}
F64 = {"dtype": "float64"}
OPTIMIZERS = {"sgd-momentum": lambda clip: gc.optim.SGD(0.05, momentum=0.9, weight_decay=0.01, **clip),
              "adam": lambda clip: gc.optim.Adam(0.01, weight_decay=0.01, **clip),
              "adamw": lambda clip: gc.optim.AdamW(0.01, weight_decay=0.1, **clip)}
CLIP = {"max_grad_norm": 0.05}  # small enough to clip every step


class _Net(gc.nn.Module):
    """A middle weight of 67,200 entries, a flat buffer of its own (``flat.ALONE_ELEMENTS``), and one
    buffer of the other 3,963 params: 2 workers split the large one (31,766 entries and the small
    buffer to rank 0, 35,434 to rank 1). ``width`` 24: 3,267 params, one buffer of them all (LeNet's
    61,706 are one buffer too)."""

    def __init__(self, dtype="float64", width=700):
        super().__init__()
        self.a = gc.nn.Linear(8, 96, dtype=dtype)
        self.b = gc.nn.Linear(96, width, dtype=dtype)
        self.c = gc.nn.Linear(width, 3, dtype=dtype)

    def forward(self, x):
        return self.c(gc.relu(self.b(gc.relu(self.a(x)))))


def _arts(optimizer, dtype="float64", width=700, **options):
    return gc.training.generate(gc.capture(_Net(dtype, width), x=gc.spec(dtype, ("N", 8))),
                                gc.losses.cross_entropy("output", label="y"), optimizer, **options)


def _data(rows: int, dtype="float64"):
    return {"x": RNG.standard_normal((rows, 8)).astype(dtype), "y": RNG.integers(0, 3, rows)}


def _loader(data):
    return gc.data.DataLoader(data, batch_size=6, shuffle=True, seed=3)  # 4 batches of 6, one of 2


def _same_state(got: dict, want: dict, rtol=1e-12, atol=1e-15) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-param"])
@pytest.mark.parametrize("opt", ["sgd-momentum", "adamw"])
def test_fit_equals_unsharded_and_one_process(ray_cluster, opt, fused):
    """2 epochs with clipping: step losses, step_grad_norms and the state as one process's and the
    unsharded workers' to 1e-12; each worker holds its own shard's optimizer state alone, the shards
    together all of it, once."""
    arts, data = _arts(OPTIMIZERS[opt](CLIP), fused=fused), _data(26)
    one = gc.Trainer(arts, backend="numpy")
    want = one.fit(_loader(data), epochs=2, progress=False, quiet=True)
    plain = gc.Trainer(arts, **WORKERS)
    sharded = gc.Trainer(arts, shard_optimizer=True, **WORKERS)
    try:
        unsharded = plain.fit(_loader(data), epochs=2, progress=False, quiet=True)
        got = sharded.fit(_loader(data), epochs=2, progress=False, quiet=True)
        for history in (got, unsharded):
            np.testing.assert_allclose(history.step_losses, want.step_losses, rtol=1e-12)
            np.testing.assert_allclose(history.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        assert len(got.step_grad_norms) == 10 and min(got.step_grad_norms) > CLIP["max_grad_norm"]  # clipped
        _same_state(sharded.state_dict(), one.state_dict())
        _same_state(sharded.state_dict(), plain.state_dict())
        _held_once(sharded, arts, even=fused)
    finally:
        plain.shutdown()
        sharded.shutdown()


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_one_buffer_split_between_workers_equals_one_process(ray_cluster, opt):
    """A model whose params all fit one flat buffer (unsplit, rank 0 stepped it all and rank 1 nothing):
    each worker steps half of it; 2 clipped epochs equal one process (losses, norms, state to 1e-12)."""
    arts, data = _arts(OPTIMIZERS[opt](CLIP), width=24), _data(26)
    one = gc.Trainer(arts, backend="numpy")
    want = one.fit(_loader(data), epochs=2, progress=False, quiet=True)
    sharded = gc.Trainer(arts, shard_optimizer=True, **WORKERS)
    try:
        got = sharded.fit(_loader(data), epochs=2, progress=False, quiet=True)
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        _same_state(sharded.state_dict(), one.state_dict())
        assert [p["params.float64"] for p in sharded._plan.pieces] == [(0, 1634), (1634, 3267)]
        _held_once(sharded, arts)
    finally:
        sharded.shutdown()


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2), (2, 3)], ids=["2-to-1", "1-to-2", "2-to-3"])
def test_checkpoints_resume_on_other_worker_counts(ray_cluster, tmp_path, before, after):
    """3 steps on ``before`` workers (1: one process, more: sharded), a checkpoint, 3 more on ``after``:
    the end as one process that never stopped (1e-12), the checkpoint named per param as one process's."""
    arts = _arts(OPTIMIZERS["adamw"](CLIP), width=24)
    batches = [_data(8) for _ in range(6)]
    one = gc.Trainer(arts, backend="numpy")
    want = [one.step(b) for b in batches]
    losses = []
    for workers, part in ((before, batches[:3]), (after, batches[3:])):
        trainer = (gc.Trainer(arts, backend="numpy") if workers == 1 else
                   gc.Trainer(arts, shard_optimizer=True, **{**WORKERS, "workers": workers}))
        try:
            if losses:
                trainer.load_checkpoint(tmp_path / "ckpt.safetensors")
            losses += [trainer.step(b) for b in part]
            state = trainer.state_dict()
            if len(losses) == 3:
                trainer.save_checkpoint(tmp_path / "ckpt.safetensors")
                assert set(state) == set(arts.state)
        finally:
            if workers > 1:
                trainer.shutdown()
    np.testing.assert_allclose(losses, want, rtol=1e-12)
    _same_state(state, one.state_dict())


def _held_once(trainer, arts, even: bool = True) -> None:
    """Each worker holds its shard's optimizer state alone: a buffer split between workers as
    slices, which together cover it once, the other state by its one owner; with ``even`` (a fused
    layout) the shards' bytes within an element of each other."""
    plan, step = trainer._plan, arts.manifest.in_model_order().graphs["train_step"]
    held = trainer.worker_states()
    whole = {e.name: e.shape for e in step.inputs if e.role == "state" and e.name != "step"}
    split = {t for pieces in plan.pieces for buf in pieces for t, _ in plan.buffers[buf].tensors()}
    for name, shape in whole.items():
        holders = [rank for rank in range(plan.workers) if name in plan.owned[rank]]
        assert all(name in held[rank] for rank in holders) and not any(
            name in held[rank] for rank in range(plan.workers) if rank not in holders), name
        assert len(holders) > 1 if name in split else len(holders) == 1, name
        assert sum(held[rank][name].size for rank in holders) == np.prod(shape), name
    assert all(plan.bytes) and (not even or max(plan.bytes) - min(plan.bytes) <= 8)  # one float64 element


def test_loss_scaling_skips_a_step_on_every_shard(ray_cluster):
    """Dynamic loss scaling from 2**122 on float32 inputs of 1000 times unit scale: the first 3 steps'
    gradients overflow, and every worker skips them (the skip decided over all shards): the state,
    skipped-step count and scale as the unsharded workers', bit for bit. (Not one process's: a shard's
    scaled gradient can overflow where the whole batch's mean does not, sharded or not.)"""
    arts = _arts(gc.optim.AdamW(0.01, weight_decay=0.1), "float32", loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 122))
    batches = [{k: v * (1000 if k == "x" else 1) for k, v in _data(8, "float32").items()} for _ in range(8)]
    plain = gc.Trainer(arts, **WORKERS)
    sharded = gc.Trainer(arts, shard_optimizer=True, **WORKERS)
    try:
        for batch in batches:
            assert sharded.step(batch) == plain.step(batch)
        got, want = sharded.state_dict(), plain.state_dict()
        assert 0 < int(got["loss_scale.skipped_steps"]) < 8 and int(got["step"]) == 8 - int(got["loss_scale.skipped_steps"])
        _same_state(got, want, rtol=0, atol=0)
    finally:
        plain.shutdown()
        sharded.shutdown()


def test_accumulate_2_equals_one_process(ray_cluster):
    """accumulate=2 with clipping: each optimizer step the owners combine their shard's summed
    gradients once; losses, norms and state as one process's accumulate=2."""
    arts, data = _arts(OPTIMIZERS["adamw"](CLIP)), _data(26)
    one = gc.Trainer(arts, backend="numpy", accumulate=2)
    want = one.fit(_loader(data), epochs=2, progress=False, quiet=True)
    dp = gc.Trainer(arts, accumulate=2, shard_optimizer=True, **WORKERS)
    try:
        got = dp.fit(_loader(data), epochs=2, progress=False, quiet=True)
        assert dp.step_count == dp.combines == 6
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        _same_state(dp.state_dict(), one.state_dict())
    finally:
        dp.shutdown()


@pytest.mark.parametrize("first", [True, False], ids=["sharded-then-unsharded", "unsharded-then-sharded"])
def test_checkpoints_resume_across_sharding(ray_cluster, tmp_path, first):
    """3 steps, a checkpoint, 3 more steps in a trainer sharded the other way: the end as one process
    that never stopped (1e-12), and the checkpoint's tensors named and shaped as the other way's."""
    arts = _arts(OPTIMIZERS["adamw"](CLIP))
    batches = [_data(8) for _ in range(6)]
    one = gc.Trainer(arts, backend="numpy")
    want = [one.step(b) for b in batches]
    before = gc.Trainer(arts, shard_optimizer=first, **WORKERS)
    try:
        losses = [before.step(b) for b in batches[:3]]
        before.save_checkpoint(tmp_path / "ckpt.safetensors")
        saved = before.state_dict()
    finally:
        before.shutdown()
    after = gc.Trainer(arts, shard_optimizer=not first, **WORKERS)
    try:
        after.load_checkpoint(tmp_path / "ckpt.safetensors")
        other = after.state_dict()
        assert {n: a.shape for n, a in other.items()} == {n: a.shape for n, a in saved.items()}
        losses += [after.step(b) for b in batches[3:]]
        np.testing.assert_allclose(losses, want, rtol=1e-12)
        _same_state(after.state_dict(), one.state_dict())
    finally:
        after.shutdown()


@pytest.mark.parametrize("mid", [False, True], ids=["before-the-step", "mid-step"])
def test_a_killed_worker_restarts_from_the_epochs_start(ray_cluster, mid):
    """Rank 1 (owner of a shard) killed before step 7 (epoch 2's second), or stopped as it starts and
    killed while rank 0 waits on its share of the update: the workers restart from the epoch's start,
    each loading its shard's state again, and the run ends as one process's."""
    arts, data = _arts(OPTIMIZERS["sgd-momentum"](CLIP)), _data(26)
    one = gc.Trainer(arts, backend="numpy")
    want = one.fit(_loader(data), epochs=2, progress=False, quiet=True)
    dp = gc.Trainer(arts, shard_optimizer=True, **WORKERS)
    step, killed = dp.step, []

    def kill_before_step_7(batch):
        if dp.step_count == 6 and not killed:
            killed.append(dp.worker_pids()[1])
            _kill_held(killed[0]) if mid else os.kill(killed[0], signal.SIGKILL)
        return step(batch)

    dp.step = kill_before_step_7
    try:
        with pytest.warns(UserWarning, match="restarting the 2 workers from step 5"), unhandled_errors() as unhandled:
            got = dp.fit(_loader(data), epochs=2, progress=False, quiet=True)
        assert unhandled == []
        assert killed and dp.step_count == 10
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        _same_state(dp.state_dict(), one.state_dict())
    finally:
        del dp.step
        dp.shutdown()


def _kill_held(pid: int, after_s: float = 1.0) -> threading.Timer:
    """Stop worker ``pid`` now and kill it ``after_s`` later, while the others wait on its share of a step."""
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(after_s, os.kill, (pid, signal.SIGKILL))
    timer.start()
    return timer


def test_a_worker_killed_mid_step_fails_the_step_naming_it(ray_cluster, tmp_path):
    """Rank 1 stopped as step 3 starts and killed while rank 0, its gradients done, waits on rank 1's
    share of the clipped update: the step fails naming rank 1 alone, no error Ray would log as never read
    (the exchanged shares settled), the step count stays 2, and the state cannot be read or saved, as no
    worker holds rank 1's optimizer state (WorkerLost; no file)."""
    arts = _arts(OPTIMIZERS["adamw"](CLIP), width=24)
    dp = gc.Trainer(arts, shard_optimizer=True, **WORKERS)
    try:
        for _ in range(2):
            dp.step(_data(8))
        pids = dp.worker_pids()
        with unhandled_errors() as unhandled:
            timer = _kill_held(pids[1])
            with pytest.raises(gc.distributed.WorkerLost,
                               match=rf"^worker rank 1 \(pid {pids[1]}\) on rows 4:8 of the batch died during "
                                     "training step 3"):
                dp.step(_data(8))
            timer.join()
        assert unhandled == [] and dp.step_count == 2
        with pytest.raises(gc.distributed.WorkerLost):
            dp.save_checkpoint(tmp_path / "ckpt.safetensors")
        assert not (tmp_path / "ckpt.safetensors").exists()
    finally:
        dp.shutdown()


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_plan_balances_bytes_within_an_element(workers):
    """A 4-layer MLP of 1024-wide layers, AdamW: its four 4 MiB weights (a buffer each) and the buffer
    of its biases cut into shards of equal bytes to the float32 element, the buffers split where they
    must; the slices cover every buffer once, end to end in rank order."""
    layers = [gc.nn.Linear(1024, 1024) for _ in range(4)]
    model = gc.capture(gc.nn.Sequential(*layers), x=gc.spec("float32", ("N", 1024)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(1e-3))
    plan = ShardPlan(arts.manifest, workers)
    total = 4 * (1024 * 1024 + 1024) * 4
    assert sum(plan.bytes) == total and max(plan.bytes) - min(plan.bytes) <= 4
    assert abs(plan.bytes[0] - total / workers) <= 4
    whole = sum(plan.params, [])
    assert len(whole) == len(set(whole))
    for buf in arts.manifest.layout:
        sliced = [pieces[buf.name] for pieces in plan.pieces if buf.name in pieces]
        size = sum(np.prod(s) for s in buf.shapes)
        if sliced:
            assert not set(buf.params) & set(whole) and len(sliced) > 1
            assert [lo for lo, _ in sliced] == [0, *(hi for _, hi in sliced[:-1])] and sliced[-1][1] == size
        else:
            assert set(buf.params) <= set(whole)


def test_plan_of_one_buffer_splits_it():
    """A small model (3,267 float64 params, one flat buffer) on 2 and 3 workers: each takes a slice of
    equal bytes to the element; with ``fused=False`` (one update per param) the params go whole."""
    arts = _arts(OPTIMIZERS["adamw"]({}), width=24)
    assert len(arts.manifest.layout) == 1
    for workers in (2, 3):
        plan = ShardPlan(arts.manifest, workers)
        assert plan.params == [[]] * workers and max(plan.bytes) - min(plan.bytes) <= 8
        assert [pieces["params.float64"] for pieces in plan.pieces] == [
            (round(r * 3267 / workers), round((r + 1) * 3267 / workers)) for r in range(workers)]
    plan = ShardPlan(_arts(OPTIMIZERS["adamw"]({}), width=24, fused=False).manifest, 2)
    assert plan.pieces == [{}, {}] and sum(plan.bytes) == 3267 * 8 and all(plan.params)


def test_refused_without_workers():
    with pytest.raises(ValueError, match=r"shard_optimizer=True .* needs workers > 1"):
        gc.Trainer(_arts(OPTIMIZERS["adamw"]({})), shard_optimizer=True)
