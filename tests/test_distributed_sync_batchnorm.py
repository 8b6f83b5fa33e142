"""gc.nn.SyncBatchNorm under ``gc.Trainer(..., workers=2)`` on a local Ray cluster: the workers run
their gradients graph stage by stage, the statistics (and their gradients' sums) exchanged between,
so each step equals one process on the whole batch, which is torch's SyncBatchNorm under DDP
(BatchNorm over the global batch): uneven shards, a shard whose every label is ignored (weight 0),
a batch that only one worker gets rows of, a resumed run; after an embedding's max_norm, whose union of the
shards' rows the staged step renormalises."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from test_sync_batchnorm import _forward, _layers, _Net

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
IGNORED = 2  # the cross-entropy's ignore_index
WORKER = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120, "backend": "ort-cpu"}
# rows per step: 4+4, 5+4 (uneven), 4+4 with rank 0's labels all ignored, 3+0 (BatchNorm1d: no 1-row shard)
SIZES = [8, 9, 8, 3]
CLASSES = 3


def _batches() -> list[dict[str, np.ndarray]]:
    batches = [{"x": RNG.normal(size=(n, 2, 5, 5)) * 2 + 1.5, "y": RNG.integers(0, CLASSES, n)} for n in SIZES]
    batches[2]["y"][:4] = IGNORED
    batches[2]["y"][4:] = np.where(batches[2]["y"][4:] == IGNORED, 0, batches[2]["y"][4:])
    return batches


def _torch_steps(arts, batches):
    """torch BatchNorm over each global batch (SyncBatchNorm under DDP), SGD(0.1): losses and the
    final params and buffers by graphc's names."""
    torch = pytest.importorskip("torch")
    net = torch.nn.Module()
    norms = (torch.nn.BatchNorm2d, torch.nn.BatchNorm1d)
    for name, layer in _layers(torch.nn, norms, CLASSES, dtype=torch.float64).items():
        net.add_module(name, layer)
    net.load_state_dict({k: torch.tensor(v) for k, v in arts.state.items()}, strict=False)
    loss_of = lambda b: torch.nn.functional.cross_entropy(  # noqa: E731
        _forward(net, torch.tensor(b["x"])), torch.tensor(b["y"]), ignore_index=IGNORED)
    losses = _torch_losses(torch.optim.SGD(net.parameters(), lr=0.1), batches, loss_of)
    return losses, {k: v.detach().numpy() for k, v in net.state_dict().items()}


def _torch_losses(opt, batches: list, loss_of) -> list[float]:
    """torch's losses over ``batches``, one ``opt`` step on each (``loss_of(batch)``: the loss tensor)."""
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss = loss_of(batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_sync_batchnorm_trains_on_two_workers_as_one_process_and_torch(ray_cluster, tmp_path):
    model = gc.capture(_Net(outputs=CLASSES, dtype="float64").train(), seed=0, x=gc.spec("float64", ("N", 2, 5, 5)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y", ignore_index=IGNORED),
                                gc.optim.SGD(0.1))
    batches = _batches()
    dp, one = gc.Trainer(arts, **WORKER), gc.Trainer(arts, backend="numpy")
    losses = []
    for step, batch in enumerate(batches):
        if step == 2:
            dp.save_checkpoint(tmp_path / "ckpt")
        losses.append(dp.step(batch))
        # one process's train_step is plain BatchNorm's lowering, which rounds otherwise (5e-12 on step 0's
        # loss; the workers' written-out form is torch's to 1e-16 there), up to 4e-12 on a param by step 2
        assert losses[-1] == pytest.approx(one.step(batch), rel=1e-10), step
        got, want = dp.state_dict(), one.state_dict()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-11, err_msg=f"step {step} {name}")
        first, second = dp.worker_states()
        for name in first:
            np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    torch_losses, torch_state = _torch_steps(arts, batches)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-12)
    got = dp.state_dict()
    torch_state.pop("bn.num_batches_tracked")  # graphc keeps no counter where momentum is not None
    assert {"bn.running_var", "bn2.num_batches_tracked"} <= set(torch_state) <= set(got)
    for name, value in torch_state.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-10, atol=1e-13, err_msg=name)
    dp.shutdown()

    resumed = gc.Trainer(tmp_path / "ckpt", **WORKER)  # steps 2 and 3 again: the same bits
    assert [resumed.step(b) for b in batches[2:]] == losses[2:]
    again = resumed.state_dict()
    for name in got:
        np.testing.assert_array_equal(again[name], got[name], err_msg=name)
    resumed.shutdown()


class _Lookup(nn.Module):
    """Embedding(max_norm) -> mean over the sequence -> SyncBatchNorm -> Linear tied to the embedding."""

    def __init__(self):
        from test_embedding_max_norm import DIM, ROWS, START

        super().__init__()
        self.emb = nn.Embedding(ROWS, DIM, max_norm=1.0, dtype="float64")
        self.emb.weight = nn.Parameter(START, dtype="float64")
        self.bn = nn.SyncBatchNorm(DIM, momentum=0.25, dtype="float64")
        self.fc = nn.Linear(DIM, ROWS, dtype="float64")
        self.fc.weight = self.emb.weight

    def forward(self, i):
        return self.fc(self.bn(self.emb(i).mean(1)))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_sync_batchnorm_after_an_embeddings_max_norm_trains_on_two_workers_as_torch(ray_cluster, backend):
    """The staged step renormalises the union of the shards' rows (fed to stage 0) and the update steps
    the weight from rank 0's renormalised value, as ``step``: 2 workers (shards 2+2, 3+2, at step 1 rows
    0-2 and 3-5 apart) match torch's Embedding(max_norm) + BatchNorm1d on the whole batch."""
    torch = pytest.importorskip("torch")
    from test_embedding_max_norm import ROWS

    net = _Lookup()
    model = gc.capture(net.train(), i=gc.spec("int64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(lr=0.05, weight_decay=0.1))
    rng = np.random.default_rng(3)
    batches = [{"i": rng.integers(0, 6, (n, 4)), "y": rng.normal(size=(n, ROWS))} for n in (4, 4, 5, 4)]
    batches[1]["i"][:2], batches[1]["i"][2:] = rng.integers(0, 3, (2, 4)), rng.integers(3, 6, (2, 4))
    dp = gc.Trainer(arts, **{**WORKER, "backend": backend})
    losses = [dp.step(b) for b in batches]

    twin = torch.nn.Module()
    twin.emb = torch.nn.Embedding(ROWS, 3, max_norm=1.0, dtype=torch.float64)
    twin.bn = torch.nn.BatchNorm1d(3, momentum=0.25, dtype=torch.float64)
    twin.fc = torch.nn.Linear(3, ROWS, dtype=torch.float64)
    twin.fc.weight = twin.emb.weight
    twin.load_state_dict({k: torch.tensor(v) for k, v in arts.state.items()}, strict=False)
    loss_of = lambda b: torch.nn.functional.mse_loss(  # noqa: E731
        twin.fc(twin.bn(twin.emb(torch.tensor(b["i"])).mean(1))), torch.tensor(b["y"]))
    want = _torch_losses(torch.optim.AdamW(twin.parameters(), lr=0.05, weight_decay=0.1), batches, loss_of)
    np.testing.assert_allclose(losses, want, rtol=1e-12)
    got = dp.state_dict()
    for name, value in twin.state_dict().items():
        if name in got:
            np.testing.assert_allclose(got[name], value.detach().numpy(), rtol=1e-10, atol=1e-13, err_msg=name)
    assert {"emb.weight", "bn.running_var"} <= set(got)
    first, second = dp.worker_states()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    dp.shutdown()


def test_sync_batchnorm_without_running_statistics_on_two_workers_is_torchs(ray_cluster):
    """SyncBatchNorm(track_running_stats=False) (plain ops): 3 SGD steps on 2 workers (4+4, 5+4)
    are torch's BatchNorm over each global batch (losses 1e-12, params 1e-10, float64); ``predict``
    normalises each worker's shard by its own statistics, as torch's SyncBatchNorm in eval mode,
    which does not sync."""
    torch = pytest.importorskip("torch")
    from test_sync_batchnorm import _Untracked, _untracked

    model = gc.capture(_Untracked().train(), seed=0, x=gc.spec("float64", ("N", 2, 5, 5)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    batches = [{"x": RNG.normal(size=(n, 2, 5, 5)) * 2 + 1.5, "y": RNG.normal(size=(n, 2))} for n in (8, 9, 9)]
    dp = gc.Trainer(arts, **WORKER)
    losses = [dp.step(b) for b in batches]
    shards = dp.predict({"x": batches[0]["x"]})["output"]

    net = torch.nn.Module()
    for name, layer in _untracked(torch.nn, torch.nn.BatchNorm2d, torch.nn.BatchNorm1d, dtype=torch.float64).items():
        net.add_module(name, layer)
    net.load_state_dict({k: torch.tensor(v) for k, v in arts.state.items()}, strict=False)
    loss_of = lambda b: torch.nn.functional.mse_loss(  # noqa: E731
        _forward(net, torch.tensor(b["x"])), torch.tensor(b["y"]))
    want = _torch_losses(torch.optim.SGD(net.parameters(), lr=0.1), batches, loss_of)
    np.testing.assert_allclose(losses, want, rtol=1e-12)
    got = dp.state_dict()
    for name, value in net.state_dict().items():
        np.testing.assert_allclose(got[name], value.numpy(), rtol=1e-10, atol=1e-13, err_msg=name)
    with torch.no_grad():
        each = [_forward(net.eval(), torch.tensor(part)).numpy() for part in np.split(batches[0]["x"], 2)]
    np.testing.assert_allclose(shards, np.concatenate(each), rtol=1e-12, atol=1e-14)
    dp.shutdown()
