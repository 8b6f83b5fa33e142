"""``gc.Trainer(workers=2, shard_optimizer=True)`` with a flat buffer split between the workers
(``flat_pieces``) in the combinations ``test_distributed_shard_optimizer.py`` leaves out, float64 against
one process (or the unsharded workers) at every step, on the loopback Ray cluster the data-parallel modules
share: the ort-cpu backend (clipping, loss scaling), an embedding with ``max_norm`` whose weight the split
cuts, a param read only under ``gc.cond`` that rank 0 steps beside one element of the buffer, weight
averaging with a skipped loss-scaled step, and a worker lost between steps."""

from __future__ import annotations

import importlib.util
import os
import signal
import time

import numpy as np
import pytest

import graphc as gc
from ray_util import ray_cluster, unhandled_errors  # noqa: F401 - the module's fixture
from test_distributed_shard_optimizer import CLIP, OPTIMIZERS, _arts, _data, _loader, _same_state

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
WORKERS = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120}
F64 = {"dtype": "float64"}


@pytest.mark.parametrize("scaled", [False, True], ids=["clipped", "clipped-loss-scaled"])
def test_ort_cpu_split_buffer_equals_one_process(ray_cluster, scaled):
    """One 3,267-element buffer split 1,634 / 1,633 on ort-cpu, AdamW clipped every step (and loss
    scaling): 2 epochs equal one numpy process to 1e-12 (losses, norms, state). Before, the exchanged
    inputs (total norm, found_inf) had initializers, which onnxruntime's IOBinding refuses to bind ('Failed
    to find NodeArg'), and unclipped, each owner's new slice was read from a freed handle from step 2 on."""
    options = {"loss_scale": gc.amp.GradScaler(init_scale=2.0 ** 8)} if scaled else {}
    arts, data = _arts(OPTIMIZERS["adamw"](CLIP), width=24, **options), _data(26)
    one = gc.Trainer(arts, backend="numpy")
    want = one.fit(_loader(data), epochs=2, progress=False, quiet=True)
    sharded = gc.Trainer(arts, shard_optimizer=True, backend="ort-cpu", **WORKERS)
    try:
        got = sharded.fit(_loader(data), epochs=2, progress=False, quiet=True)
        assert [p["params.float64"] for p in sharded._plan.pieces] == [(0, 1634), (1634, 3267)]
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        _same_state(sharded.state_dict(), one.state_dict())
    finally:
        sharded.shutdown()


def test_ort_cpu_split_buffer_unclipped_every_step(ray_cluster):
    """AdamW unclipped (``update_shard``) on ort-cpu: every worker's params as one process's after every
    step (before, 0.13 off from step 2: an owner's new slice was read from a handle already freed)."""
    arts = _arts(OPTIMIZERS["adamw"]({}), width=24)
    one = gc.Trainer(arts, backend="numpy")
    sharded = gc.Trainer(arts, shard_optimizer=True, backend="ort-cpu", **WORKERS)
    try:
        for _ in range(4):
            batch = _data(8)
            assert sharded.step(batch) == pytest.approx(one.step(batch), rel=1e-12)
            want = one.state_dict()
            for held in sharded.worker_states():
                for name in ("a.weight", "b.weight", "c.bias"):
                    np.testing.assert_allclose(held[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)
    finally:
        sharded.shutdown()


class _Lookup(gc.nn.Module):
    """Embedding(20, 3, max_norm=1) then a Linear: one buffer of 68 elements, split 34 / 34, so the
    embedding's 60 entries lie in both workers' slices."""

    def __init__(self):
        super().__init__()
        self.emb = gc.nn.Embedding(20, 3, max_norm=1.0, **F64)
        self.emb.weight = gc.nn.Parameter(RNG.normal(size=(20, 3)) * 1.5, **F64)  # most rows over max_norm
        self.fc = gc.nn.Linear(3, 2, **F64)

    def forward(self, i):
        return self.fc(self.emb(i).mean(1))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_max_norm_embedding_cut_by_the_split_equals_one_process(ray_cluster, backend):
    """The rows each step renormalises, then steps from their renormalised values, on both slices of the
    weight: after each of 5 clipped AdamW steps every worker's weight and the joined state as one
    process's (1e-12)."""
    arts = gc.training.generate(gc.capture(_Lookup(), i=gc.spec("int64", ("N", 4))), gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(0.05, weight_decay=0.1, max_grad_norm=0.5))
    one = gc.Trainer(arts, backend="numpy")
    sharded = gc.Trainer(arts, shard_optimizer=True, backend=backend, **WORKERS)
    try:
        assert sharded._plan.pieces == [{"params.float64": (0, 34)}, {"params.float64": (34, 68)}]
        for _ in range(5):
            batch = {"i": RNG.integers(0, 20, (6, 4)), "y": RNG.normal(size=(6, 2))}
            assert sharded.step(batch) == pytest.approx(one.step(batch), rel=1e-12)
            want = one.state_dict()
            _same_state(sharded.state_dict(), want)
            for held in sharded.worker_states():
                np.testing.assert_allclose(held["emb.weight"], want["emb.weight"], rtol=1e-12, atol=1e-15)
        assert (np.linalg.norm(want["emb.weight"], axis=1) > 1.0).any()  # rows never looked up stay over
    finally:
        sharded.shutdown()


class _Gated(gc.nn.Module):
    """``a`` (9 entries, no bias) read only where the shard's x sums above 0, stepped whole and only then
    (its own ``a.weight.step``); ``b`` one buffer of 8."""

    def __init__(self):
        super().__init__()
        self.a = gc.nn.Linear(3, 3, bias=False, **F64)
        self.b = gc.nn.Linear(3, 2, **F64)

    def forward(self, x):
        return self.b(gc.cond(x.sum() > 0.0, lambda: self.a(x), lambda: x * 2.0))


def test_a_param_stepped_on_some_steps_beside_one_element(ray_cluster):
    """Rank 0 holds the gated ``a`` (72 bytes, more than the buffer's 64) and, as every rank 0 must,
    one element of the buffer, so its ``step`` (the one ``state_dict`` joins) advances every step; 5
    AdamW steps of which a is read on 3 (by one shard, both, the other): state as the unsharded
    workers' after every step, bit for bit, step 1..5 and a.weight.step 0, 1, 1, 2, 3."""
    arts = gc.training.generate(gc.capture(_Gated(), seed=3, x=gc.spec("float64", ("N", 3))),
                                gc.losses.mse("output", label="y"), gc.optim.AdamW(0.01, weight_decay=0.1))
    reads = [(False, False), (True, False), (False, False), (True, True), (False, True)]
    with pytest.warns(gc.DataParallelWarning, match="ReduceSum"):  # the gate is each shard's own, as DDP's
        sharded = gc.Trainer(arts, shard_optimizer=True, backend="numpy", **WORKERS)
        plain = gc.Trainer(arts, backend="numpy", **WORKERS)
    try:
        assert sharded._plan.params == [["a.weight"], []]
        assert sharded._plan.pieces == [{"params.float64": (0, 1)}, {"params.float64": (1, 8)}]
        for step, shards in enumerate(reads, 1):
            x = np.concatenate([np.abs(RNG.normal(size=(4, 3))) * (1 if read else -1) for read in shards])
            batch = {"x": x, "y": RNG.normal(size=(8, 2))}
            assert sharded.step(batch) == plain.step(batch)
            got = sharded.state_dict()
            _same_state(got, plain.state_dict(), rtol=0, atol=0)
            assert int(got["step"]) == step and int(got["a.weight.step"]) == sum(any(r) for r in reads[:step])
    finally:
        sharded.shutdown()
        plain.shutdown()


class _Small(gc.nn.Module):
    """50 params, one buffer split 25 / 25: a.weight to rank 0, the rest of a and b to rank 1."""

    def __init__(self):
        super().__init__()
        self.a = gc.nn.Linear(3, 8, **F64)
        self.b = gc.nn.Linear(8, 2, **F64)

    def forward(self, x):
        return self.b(gc.tanh(self.a(x)))


def test_averaged_copy_on_every_worker_at_every_step(ray_cluster):
    """EMA weight averaging, clipping and dynamic loss scaling (step 3 overflows on rank 1's shard and
    the whole batch: skipped, still averaged): after every step, ``state_dict()`` and each worker's own
    params and averaged copy equal one process's to 1e-12 (each averages after taking the other's slice)."""
    swa = gc.optim.swa_utils
    arts = gc.training.generate(gc.capture(_Small(), x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(0.01, weight_decay=0.1, max_grad_norm=0.05),
                                averaged=swa.AveragedModel(multi_avg_fn=swa.get_ema_multi_avg_fn(0.8)),
                                loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 10))
    one = gc.Trainer(arts, backend="numpy")
    sharded = gc.Trainer(arts, shard_optimizer=True, backend="numpy", **WORKERS)
    try:
        assert sharded._plan.pieces == [{"params.float64": (0, 25)}, {"params.float64": (25, 50)}]
        for step in range(5):
            batch = {"x": RNG.standard_normal((8, 3)), "y": RNG.standard_normal((8, 2))}
            if step == 2:
                batch["y"][6, 0] = np.inf
            sharded.step(batch)
            one.step(batch)
            want = one.state_dict()
            _same_state(sharded.state_dict(), want)
            for held in sharded.worker_states():
                copies = [n for n in held if n.startswith("averaged.") or n in arts.manifest.trainable]
                assert len(copies) == 9
                for name in copies:
                    np.testing.assert_allclose(held[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)
        assert int(want["loss_scale.skipped_steps"]) == 1 and int(want["averaged.n_averaged"]) == 5
    finally:
        sharded.shutdown()


def test_a_worker_lost_between_steps_fails_state_dict_naming_it(ray_cluster):
    """Rank 1 killed right after step 3 (its update's new params may not be made yet): ``state_dict()``
    raises WorkerLost naming it and the step, twice alike, and Ray logs no error never read (before: the
    unread norms of step 3's update, and rank 0's apply that waited on rank 1's new params)."""
    arts = _arts(OPTIMIZERS["adamw"](CLIP), width=24)
    sharded = gc.Trainer(arts, shard_optimizer=True, backend="numpy", **WORKERS)
    try:
        for _ in range(2):
            sharded.step(_data(8))
        pid = sharded.worker_pids()[1]
        sharded.step(_data(8))
        with unhandled_errors() as unhandled:
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            for _ in range(2):
                with pytest.raises(gc.distributed.WorkerLost,
                                   match=rf"^worker rank 1 \(pid {pid}\) died during the optimizer update of step 3"):
                    sharded.state_dict()
        assert unhandled == [] and sharded.step_count == 3
    finally:
        sharded.shutdown()
