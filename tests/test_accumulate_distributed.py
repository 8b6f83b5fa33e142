"""Gradient accumulation on data-parallel workers (``gc.Trainer(workers=2, accumulate=k)``) against
one process with ``accumulate=k`` and a torch 2.13 accumulation loop, float64, numpy backend, on
the loopback Ray cluster the data-parallel modules share: AdamW with clipping, k=2 and 3 over 7
loader batches a epoch (the last of 2 rows, the last group partial), one combine of the workers'
gradients per optimizer step, a mid-epoch resume, and what stays refused."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import graphc as gc
from graphc.errors import ArtifactsError
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from test_accumulate import BATCH, _artifacts, _assert_state, _data, _Net, _optimizers, _torch_fit, _twin

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
WORKERS = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120, "backend": "numpy"}
ROWS = 26  # 7 loader batches of 4, 4, 4, 4, 4, 4, 2 rows


def _loader(data, shuffle=False):
    return gc.data.DataLoader(data, batch_size=BATCH, shuffle=shuffle, seed=3)


@pytest.mark.parametrize("k", [2, 3])
def test_two_workers_equal_one_process_and_torch(ray_cluster, k):
    """2 epochs: params, step losses and step_grad_norms (clip_grad_norm_'s return) as one process's
    accumulate=k and torch's loop to 1e-12; the workers combined their gradients once per step."""
    net, data = _Net(batchnorm=False), _data(ROWS)
    optimizer, make_opt = _optimizers("adamw", True)
    norms: list[float] = []
    want = _torch_fit(_twin(net), make_opt, data, k, 2, True, norms=norms)
    arts = _artifacts(net, optimizer)
    single = gc.Trainer(arts, backend="numpy", accumulate=k)
    expected = single.fit(_loader(data), epochs=2, progress=False, quiet=True)
    dp = gc.Trainer(arts, accumulate=k, **WORKERS)
    try:
        history = dp.fit(_loader(data), epochs=2, progress=False, quiet=True)
        steps = 2 * -(-7 // k)
        assert dp.step_count == dp.combines == steps == len(norms)
        np.testing.assert_allclose(history.step_losses, expected.step_losses, rtol=1e-12)
        np.testing.assert_allclose(history.step_grad_norms, norms, rtol=1e-12)
        np.testing.assert_allclose(history.step_grad_norms, expected.step_grad_norms, rtol=1e-12)
        _assert_state(dp, want)
        _assert_state(dp, single.state_dict())
        batch = _data(7)  # step(batch): split by rows into k micro-batches, as one process's
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-12)
        assert dp.combines == steps + 1
        _assert_state(dp, single.state_dict())
    finally:
        dp.shutdown()


def test_resume_mid_epoch_is_exact(ray_cluster, tmp_path, monkeypatch):
    """Ctrl-C after optimizer step 5 (epoch 2, 4 of its 7 shuffled batches done, k=2) saves at the
    step's end, recording k; the run resumed from it on 2 workers ends where one that never
    stopped does."""
    from graphc.runtime import checkpoint as ckpt

    net, data = _Net(batchnorm=False), _data(ROWS)
    arts = _artifacts(net, _optimizers("adamw", True)[0])
    straight = gc.Trainer(arts, backend="numpy", accumulate=2)
    straight.fit(_loader(data, True), epochs=2, progress=False, quiet=True)
    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:6")
    stopped = gc.Trainer(arts, accumulate=2, **WORKERS)
    try:
        with pytest.raises(gc.runtime.trainer.TrainingInterrupted):
            stopped.fit(_loader(data, True), epochs=2, progress=False, quiet=True, checkpoint=tmp_path / "ck")
        assert (stopped.epoch, stopped.batch_in_epoch, stopped.step_count) == (1, 4, 6)
    finally:
        stopped.shutdown()
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    assert ckpt.read_meta(tmp_path / "ck").accumulate == 2  # another k: refused as in one process
    resumed = gc.Trainer(tmp_path / "ck", accumulate=2, **WORKERS)
    try:
        resumed.fit(_loader(data, True), epochs=2, progress=False, quiet=True)
        assert resumed.step_count == straight.step_count == 8
        _assert_state(resumed, straight.state_dict())
    finally:
        resumed.shutdown()


def test_sync_batchnorm_stays_refused():
    """SyncBatchNorm's exchanges would run per micro-batch: refused, naming it, before any worker starts."""
    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn = gc.nn.Linear(4, 3, dtype="float64"), gc.nn.SyncBatchNorm(3, dtype="float64")

        def forward(self, x):
            return self.bn(self.fc(x))

    arts = _artifacts(Net(), _optimizers("sgd", False)[0])
    with pytest.raises(ArtifactsError, match="accumulate=2: SyncBatchNorm"):
        gc.Trainer(arts, accumulate=2, **WORKERS)


def test_a_data_parallel_trainer_made_directly_with_accumulate_is_the_accumulating_one():
    """gc.distributed.DistributedTrainer(accumulate=2) trained with k=1 whatever accumulate said (its __init__
    opens with k=1); it is now made as the accumulating trainer, as gc.Trainer(workers=2, accumulate=2) is."""
    from graphc.runtime.distributed.accumulating import DistributedAccumulatingTrainer

    made = gc.distributed.DistributedTrainer.__new__(gc.distributed.DistributedTrainer, None, workers=2, accumulate=2)
    assert type(made) is DistributedAccumulatingTrainer
    plain = gc.distributed.DistributedTrainer.__new__(gc.distributed.DistributedTrainer, None, workers=2)
    assert type(plain) is gc.distributed.DistributedTrainer
