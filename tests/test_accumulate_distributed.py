"""Gradient accumulation on data-parallel workers (``gc.Trainer(workers=2, accumulate=k)``) against
one process with ``accumulate=k`` and a torch 2.13 accumulation loop, float64, numpy backend, on
the loopback Ray cluster the data-parallel modules share: AdamW with clipping, k=2 and 3 over 7
loader batches a epoch (the last of 2 rows, the last group partial), one combine of the workers'
gradients per optimizer step, a mid-epoch resume, and what stays refused; at k=2 BatchNorm's running
statistics, loss scaling, Dropout seeding, ignored micro-batches and shards, ort-cpu, a killed worker and
one killed between two micro-batches of a step."""

from __future__ import annotations

import importlib.util
import os
import signal
import warnings

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


def _dp_and_single(arts, backend: str, k: int, **kwargs):
    return (gc.Trainer(arts, accumulate=k, **{**WORKERS, "backend": backend}, **kwargs),
            gc.Trainer(arts, backend=backend, accumulate=k, **kwargs))


def _workers_agree(dp) -> None:
    first, second = dp.worker_states()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_batchnorm_running_stats_are_rank_0s_shards_in_turn(ray_cluster, tmp_path, backend):
    """k=2, BatchNorm1d: a step of 8 rows (micro-batches 0:4, 4:8, each 2+2 rows) leaves the running
    statistics one process's accumulate=2 step makes on rank 0's rows (0:2 then 4:6) from the same
    state; a step of 6 rows (micro-batches of 3: rank 0 takes all, no shard of 1 row, rank 1 none)
    equals one process's whole step, params too, to 1e-12; every worker holds the same bits."""
    net = _Net(batchnorm=True)
    arts = _artifacts(net, _optimizers("adamw", True)[0])
    dp, single = _dp_and_single(arts, backend, 2)
    stats = ("bn.running_mean", "bn.running_var")
    try:
        for step in range(2):
            batch = _data(8)
            dp.save_checkpoint(tmp_path / f"before{step}")
            rank0 = gc.Trainer(tmp_path / f"before{step}", backend=backend, accumulate=2)
            rank0.step({n: np.concatenate([a[0:2], a[4:6]]) for n, a in batch.items()})
            dp.step(batch)
            got, want = dp.state_dict(), rank0.state_dict()
            whole = gc.Trainer(tmp_path / f"before{step}", backend=backend, accumulate=2)
            whole.step(batch)  # the whole batch's statistics differ: the check can fail
            assert not np.allclose(whole.state_dict()["bn.running_mean"], got["bn.running_mean"])
            for name in stats:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)
            _workers_agree(dp)
        dp.save_checkpoint(tmp_path / "after")
        single.load_checkpoint(tmp_path / "after")
        batch = _data(6)
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-12)
        _assert_state(dp, single.state_dict())
        _workers_agree(dp)
    finally:
        dp.shutdown()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_loss_scaling_skips_the_whole_step_on_every_worker_as_one_process(ray_cluster, backend):
    """k=2, loss scaling, AdamW with clipping, 8 loader batches of 6 rows: an inf label in rank 1's
    shard of batch 3 (step 2's second micro-batch) and in rank 0's of batch 6 (step 3's first) makes
    steps 2 and 3 overflow: skipped on every worker, the scale backed off and grown again as one
    process's accumulate=2; norms (inf where skipped), losses, scale, skip count and params to 1e-12."""
    model = gc.capture(gc.nn.Linear(3, 2, dtype="float64"), x=gc.spec("float64", ("N", 3)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(1e-2, weight_decay=0.1, max_grad_norm=0.5),
                                loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=1))
    data = {"x": RNG.standard_normal((48, 3)), "y": RNG.standard_normal((48, 2))}
    data["y"][17, 1] = data["y"][30, 0] = np.inf
    loader = gc.data.DataLoader(data, batch_size=6, shuffle=False)
    dp, single = _dp_and_single(arts, backend, 2)
    try:
        want, got = (t.fit(loader, epochs=1, progress=False, quiet=True) for t in (single, dp))
        assert np.isinf(got.step_grad_norms).tolist() == [False, True, True, False]
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        finite = np.isfinite(want.step_losses)
        np.testing.assert_allclose(np.asarray(got.step_losses)[finite], np.asarray(want.step_losses)[finite],
                                   rtol=1e-12)
        assert got.epochs[0].skipped_steps == want.epochs[0].skipped_steps == 2
        assert (dp.loss_scale, dp.skipped_steps, dp.step_count) == (single.loss_scale, single.skipped_steps, 4)
        assert got.epochs[0].loss_scale == want.epochs[0].loss_scale
        _assert_state(dp, single.state_dict())
        _workers_agree(dp)
    finally:
        dp.shutdown()


class _DropNet(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop = gc.nn.Linear(4, 6, dtype="float64"), gc.nn.Dropout(0.3)
        self.out = gc.nn.Linear(6, 3, dtype="float64")

    def forward(self, x):
        return self.out(self.drop(gc.relu(self.fc(x))))


def _noise(step: int, rank: int, index: int) -> np.ndarray:
    """The documented draw of a 2-row shard's noise (seed 7)."""
    return np.random.default_rng([7, step, rank, *([index] if index else [])]).random((2, 6), dtype=np.float32)


def test_dropout_noise_is_seeded_per_step_rank_and_micro_batch_and_replays_on_resume(ray_cluster, tmp_path):
    """k=2, 2 steps of 8 rows (micro-batches of 4, shards of 2): each worker's noise for micro-batch i
    of step s is drawn from default_rng([seed, s, rank, i]) (i=0: [seed, s, rank], as k=1): the same
    noise given in the batches gives the same bits; a run resumed from the checkpoint after step 1
    replays step 2 bit for bit, with the checkpoint's seed."""
    arts = _artifacts(_DropNet(), _optimizers("adamw", True)[0])
    noise = arts.manifest.graphs["train_step"].inputs[-1].name
    batches = [_data(8), _data(8)]
    dp = gc.Trainer(arts, seed=7, accumulate=2, **WORKERS)
    try:
        dp.save_checkpoint(tmp_path / "start")
        losses = [dp.step(batches[0])]
        dp.save_checkpoint(tmp_path / "step1")
        losses.append(dp.step(batches[1]))
        drawn = dp.state_dict()
        dp.load_checkpoint(tmp_path / "start")
        k1 = np.concatenate([_noise(0, rank, 0) for _ in range(2) for rank in range(2)])
        assert dp.step({**batches[0], noise: k1}) != losses[0]  # each micro-batch draws anew: the check can fail
        dp.load_checkpoint(tmp_path / "start")
        for step, batch in enumerate(batches):
            given = np.concatenate([_noise(step, rank, i) for i in range(2) for rank in range(2)])
            assert dp.step({**batch, noise: given}) == losses[step]
        _assert_state(dp, drawn, rtol=0, atol=0)
    finally:
        dp.shutdown()
    resumed = gc.Trainer(tmp_path / "step1", accumulate=2, **WORKERS)
    try:
        assert resumed.step(batches[1]) == losses[1]
        _assert_state(resumed, drawn, rtol=0, atol=0)
    finally:
        resumed.shutdown()


def test_micro_batches_of_ignored_labels_and_empty_shards_weigh_as_one_process(ray_cluster):
    """k=2, cross-entropy with ignore_index 2: a micro-batch whose every label is ignored, one whose
    rank 0 shard's are, and (fit, 7 batches of 4 and a last of 2 rows: 1+1) such micro-batches inside
    optimizer steps count for nothing on every worker, as one process's accumulate=2 (losses, norms,
    params to 1e-12, the same warnings)."""
    arts = gc.training.generate(gc.capture(_Net(batchnorm=False), x=gc.spec("float64", ("N", 4))),
                                gc.losses.cross_entropy("output", label="y", ignore_index=2),
                                _optimizers("adamw", True)[0])
    dp, single = _dp_and_single(arts, "numpy", 2)
    try:
        batch = {"x": RNG.standard_normal((8, 4)), "y": np.array([2, 2, 2, 2, 2, 2, 0, 1])}
        losses = []
        for trainer in (dp, single):
            with pytest.warns(UserWarning, match="micro-batch 1 of 2: every label in 'y' is the ignore index 2; left out"):
                losses.append(trainer.step(batch))
        assert losses[0] == pytest.approx(losses[1], rel=1e-12)
        _assert_state(dp, single.state_dict())
        data = _data(ROWS)
        data["y"][data["y"] == 2] = 0
        data["y"][4:8] = data["y"][18:20] = 2  # batch 2 (step 1's second micro-batch); rank 0's rows of batch 5
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            want, got = (t.fit(_loader(data), epochs=1, progress=False, quiet=True) for t in (single, dp))
        said = [str(w.message) for w in caught if "left out" in str(w.message)]
        assert len(said) == 2 and said[0] == said[1]
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        assert got.epochs[0].samples == want.epochs[0].samples
        _assert_state(dp, single.state_dict())
        _workers_agree(dp)
    finally:
        dp.shutdown()


def test_a_workers_micro_batches_whose_class_weights_cancel_count_as_torch_on_the_whole_batch(ray_cluster):
    """k=2, class weights [1, -1, 2]: rank 1's shards weigh 2 and -2, so its step's gradients have no
    mean (total weight 0) but a weighted sum; they were left out (params 0.25 off after 2 SGD
    steps), and now add to the workers' average as torch's mean over the 16 rows (1e-12)."""
    classes = [1.0, -1.0, 2.0]
    model = gc.capture(gc.nn.Linear(6, 3, dtype="float64"), seed=0, x=gc.spec("float64", ("N", 6)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y", weight=classes),
                                gc.optim.SGD(0.5))
    batch = {"x": RNG.standard_normal((16, 6)), "y": np.array([2, 2, 2, 2, 0, 0, 0, 1, 2, 2, 2, 2, 1, 1, 1, 0])}
    dp = gc.Trainer(arts, accumulate=2, **WORKERS)
    try:
        twin = torch.nn.Linear(6, 3).double()
        twin.load_state_dict({k: torch.tensor(v) for k, v in dp.params.items()})
        descent = torch.optim.SGD(twin.parameters(), lr=0.5)
        for _ in range(2):
            descent.zero_grad()
            loss = torch.nn.functional.cross_entropy(twin(torch.tensor(batch["x"])), torch.tensor(batch["y"]),
                                                     weight=torch.tensor(classes, dtype=torch.float64))
            assert dp.step(batch) == pytest.approx(loss.item(), rel=1e-12)
            loss.backward()
            descent.step()
        _assert_state(dp, {k: v.detach().numpy() for k, v in twin.state_dict().items()})
        _workers_agree(dp)
    finally:
        dp.shutdown()


def test_a_killed_worker_restarts_from_the_epochs_start_with_each_steps_loss_and_norm(ray_cluster):
    """k=2, 3 epochs of 4 optimizer steps: rank 1 killed before step 6 (epoch 2's second, its
    gradients summed over 2 micro-batches): the workers restart from step 4's state (epoch 2's
    start) and the run ends as one process's accumulate=2, every step's loss and norm recorded once."""
    net, data = _Net(batchnorm=False), _data(ROWS)
    arts = _artifacts(net, _optimizers("adamw", True)[0])
    single = gc.Trainer(arts, backend="numpy", accumulate=2)
    want = single.fit(_loader(data, True), epochs=3, progress=False, quiet=True)
    dp = gc.Trainer(arts, accumulate=2, **WORKERS)
    step_on, killed = dp._step_on, []
    pid = dp.worker_pids()[1]

    def kill_before_step_6(*args):
        if dp.step_count == 5 and not killed:
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
        return step_on(*args)

    dp._step_on = kill_before_step_6
    try:
        with pytest.warns(UserWarning, match="restarting the 2 workers from step 4"):
            got = dp.fit(_loader(data, True), epochs=3, progress=False, quiet=True)
        assert killed and dp.step_count == 12 and len(got.step_losses) == len(got.step_grad_norms) == 12
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        assert [(e.epoch, e.steps, e.samples) for e in got.epochs] == [(e, 4, ROWS) for e in (1, 2, 3)]
        np.testing.assert_allclose([e.loss for e in got.epochs], [e.loss for e in want.epochs], rtol=1e-12)
        _assert_state(dp, single.state_dict())
    finally:
        del dp._step_on
        dp.shutdown()


class _KilledBetweenMicroBatches:
    """Rank ``rank``'s actor handle, which, the first time it is sent micro-batch 2 of a step, first
    sends the actor a call that SIGKILLs its process: the actor runs its calls in order, so it dies
    after micro-batch 1 added its gradients to its sums and before micro-batch 2 (the driver sends
    a step's calls at once, so only the actor's own queue can place the kill there). The kill is
    sent once micro-batch 1's reply is back: killed sooner, the actor can die with that reply unsent
    (its task done, the reply still queued), and the driver rightly names micro-batch 1."""

    def __init__(self, handle, killed: list):
        self._handle, self._killed, self._first = handle, killed, []

    def __getattr__(self, name):
        return getattr(self._handle, name)

    @property
    def step(self):
        import ray

        handle, killed, first = self._handle, self._killed, self._first

        class Step:
            @staticmethod
            def options(**options):
                call = handle.step.options(**options)

                class Call:
                    @staticmethod
                    def remote(message, *args):
                        if message["micro"][0] == 0:
                            refs = first[:] = call.remote(message, *args)
                            return refs
                        if message["micro"][0] == 1 and not killed:
                            ray.wait(first, num_returns=len(first), timeout=WORKERS["timeout_s"])
                            killed.append(message["step"])
                            handle.__ray_call__.remote(lambda actor: os.kill(os.getpid(), signal.SIGKILL))
                        return call.remote(message, *args)
                return Call
        return Step


def _kill_between_micro_batches(dp, rank: int, before_step: int) -> list:
    """From optimizer step ``before_step`` on, kill ``rank`` between its first and second micro-batch
    (once); returns the list that records the kill."""
    step_on, killed = dp._step_on, []

    def wrapped(*args):
        if dp.step_count + 1 != before_step or killed:
            return step_on(*args)
        handle = dp._actors[rank]
        dp._actors[rank] = _KilledBetweenMicroBatches(handle, killed)
        try:
            return step_on(*args)
        finally:
            dp._actors[rank] = handle  # ray.kill takes the handle itself

    dp._step_on = wrapped
    return killed


@pytest.mark.parametrize("rank", [0, 1])
def test_a_worker_killed_between_two_micro_batches_restarts_as_an_unkilled_run(ray_cluster, rank):
    """k=2, 2 epochs of 4 optimizer steps: rank ``rank`` killed after micro-batch 1 of step 6 (epoch
    2's second), its gradients for micro-batch 1 summed and micro-batch 2 not yet run, the other
    worker going on into the combine: the step fails as a lost worker, the workers restart from
    step 4's state (epoch 2's start) and the run ends as an unkilled one (one process's
    accumulate=2): losses, norms, params to 1e-12, each step once."""
    net, data = _Net(batchnorm=False), _data(ROWS)
    arts = _artifacts(net, _optimizers("adamw", True)[0])
    single = gc.Trainer(arts, backend="numpy", accumulate=2)
    want = single.fit(_loader(data, True), epochs=2, progress=False, quiet=True)
    dp = gc.Trainer(arts, accumulate=2, **WORKERS)
    killed = _kill_between_micro_batches(dp, rank, 6)
    try:
        with pytest.warns(UserWarning, match=f"worker rank {rank} .*died during training step 6, micro-batch 2 of 2.*"
                                             "restarting the 2 workers from step 4"):
            got = dp.fit(_loader(data, True), epochs=2, progress=False, quiet=True)
        assert killed and dp.step_count == 8 and len(got.step_losses) == 8
        assert dp.combines == 5 + 4  # steps 1-5, then 5-8 again from the restart
        np.testing.assert_allclose(got.step_losses, want.step_losses, rtol=1e-12)
        np.testing.assert_allclose(got.step_grad_norms, want.step_grad_norms, rtol=1e-12)
        np.testing.assert_allclose([e.loss for e in got.epochs], [e.loss for e in want.epochs], rtol=1e-12)
        _assert_state(dp, single.state_dict())
        _workers_agree(dp)
    finally:
        del dp._step_on
        dp.shutdown()


def test_a_worker_killed_between_two_micro_batches_of_step_fails_naming_it(ray_cluster):
    """step(batch), k=2: rank 1 killed between its two micro-batches: the step raises WorkerLost naming
    the worker, the step and micro-batch 2, and leaves step_count and the state as they were."""
    from graphc.runtime.distributed.cluster import WorkerLost

    arts = _artifacts(_Net(batchnorm=False), _optimizers("adamw", True)[0])
    dp = gc.Trainer(arts, accumulate=2, **WORKERS)
    try:
        dp.step(_data(8))
        before = dp.state_dict()
        killed = _kill_between_micro_batches(dp, 1, 2)
        with pytest.raises(WorkerLost, match=r"worker rank 1 .*on rows 2:4 of the batch died during training step 2, "
                                             r"micro-batch 2 of 2"):
            dp.step(_data(8))
        assert killed and dp.step_count == 1 and dp.combines == 1
        del dp._step_on
        dp._actors = dp._actors[:1]  # rank 0 lives on, its update of step 2 not made
        np.testing.assert_array_equal(dp.worker_states()[0]["fc.weight"], before["fc.weight"])
    finally:
        dp.shutdown()


def test_the_driver_builds_and_weighs_each_micro_batch_once_a_step(ray_cluster, monkeypatch):
    """step(batch), k=3, on 2 workers: the driver builds each micro-batch's feeds (Trainer._batch_feeds)
    and weighs it (averaging.shard_weight) once a step: ``counting``'s feeds are the ones cut into
    shards (they were built again for the shards: 6 builds); the step equals one process's (1e-12)."""
    from graphc.runtime import averaging
    from graphc.runtime.distributed.accumulating import DistributedAccumulatingTrainer

    arts = gc.training.generate(gc.capture(_Net(batchnorm=False), x=gc.spec("float64", ("N", 4))),
                                gc.losses.cross_entropy("output", label="y", weight=[1.0, 2.0, 0.5]),
                                _optimizers("adamw", True)[0])
    dp, single = _dp_and_single(arts, "numpy", 3)
    try:
        batch, built, weighed = _data(12), [], []
        build, weigh = DistributedAccumulatingTrainer._batch_feeds, averaging.shard_weight
        monkeypatch.setattr(DistributedAccumulatingTrainer, "_batch_feeds",
                            lambda self, *args: built.append(len(args[0]["x"])) or build(self, *args))
        monkeypatch.setattr(averaging, "shard_weight", lambda *args: weighed.append(args[2]) or weigh(*args))
        assert dp.step(batch) == pytest.approx(single.step(batch), rel=1e-12)
        assert built == [4, 4, 4] and weighed[:3] == [4, 4, 4] and len(weighed) == 3 + 3  # one process's 3
        _assert_state(dp, single.state_dict())
    finally:
        dp.shutdown()
