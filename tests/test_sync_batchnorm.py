"""gc.nn.SyncBatchNorm's training graphs: shards run stage by stage with the exchanged values gathered
between (``graphc.runtime.staged``) compute what one run on the whole batch does, which is torch's
SyncBatchNorm under DDP (global mean and biased variance; running_var from the global unbiased count)."""

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.passes.training.stages import split
from graphc.passes.values import EXCHANGE_KEY
from graphc.runtime.averaging import counted_labels
from graphc.runtime.staged import StagedRun, exchange, scales
from graphc.runtime.trainer import without_initializers

RNG = np.random.default_rng(0)
ROWS = 9


def _layers(nn, norms, outputs=2, **dtype):
    """Conv, BatchNorm2d, then a Linear and a BatchNorm over [N, C] with torch's cumulative average
    (momentum=None), from ``nn`` (graphc's or torch's) with the norm layers ``norms``, and a Linear
    head of ``outputs`` features."""
    norm2d, norm1d = norms
    return {"conv": nn.Conv2d(2, 3, 3, **dtype), "bn": norm2d(3, momentum=0.25, **dtype), "fc": nn.Linear(3, 4, **dtype),
            "bn2": norm1d(4, momentum=None, **dtype), "head": nn.Linear(4, outputs, **dtype)}


def _forward(net, x):
    h = net.bn(net.conv(x)).relu().mean((2, 3))
    return net.head(net.bn2(net.fc(h)).relu())


class _Net(nn.Module):
    def __init__(self, norms=(nn.SyncBatchNorm, nn.SyncBatchNorm), outputs=2, **dtype):
        super().__init__()
        for name, layer in _layers(nn, norms, outputs, **dtype).items():
            setattr(self, name, layer)

    forward = _forward


def _artifacts(norms=(nn.SyncBatchNorm, nn.SyncBatchNorm), loss=gc.losses.mse("output", label="y")):
    model = gc.capture(_Net(norms, dtype="float64").train(), seed=0, x=gc.spec("float64", ("N", 2, 5, 5)))
    return gc.training.generate(model, loss, gc.optim.SGD(0.1))


def _batch():
    return {"x": RNG.normal(size=(ROWS, 2, 5, 5)) * 2 + 1.5, "y": RNG.normal(size=(ROWS, 2))}


def _combined(arts, outs, shares):
    """The shards' gradients outputs as one process's: loss weighted by share, gradients by scale
    (as the data-parallel Trainer does), running statistics any shard's (each has the global ones)."""
    kinds = {e.name: e.role for e in arts.manifest.graphs["gradients"].outputs}
    got = {}
    for name, role in kinds.items():
        if role in ("loss", "grad"):
            weights = shares if role == "loss" else scales(shares)
            got[name] = sum(weight * out[name] for weight, out in zip(weights, outs))
        elif role == "state":
            assert all(np.array_equal(out[name], outs[0][name]) for out in outs), name
            got[name] = outs[0][name]
        else:
            got[name] = np.concatenate([out[name] for out in outs])
    return got


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("cuts", [(0, 4, 9), (0, 2, 5, 9)])
def test_shards_run_in_stages_equal_the_whole_batch(backend, cuts):
    """2 and 3 uneven shards: loss, every gradient, the running statistics and the counter equal one
    run of the gradients graph on the whole batch to 1e-12 (float64); plain BatchNorm's shards don't."""
    arts = _artifacts()
    batch, state = _batch(), arts.state
    staged = StagedRun(arts.gradients, backend)
    whole = staged.run([{**batch, **state}], [1.0])[0]
    shares = [(b - a) / ROWS for a, b in zip(cuts, cuts[1:])]
    shards = [{**{k: v[a:b] for k, v in batch.items()}, **state} for a, b in zip(cuts, cuts[1:])]
    got = _combined(arts, staged.run(shards, shares), shares)
    assert set(got) == set(whole) and "bn2.num_batches_tracked.next" in got
    for name, value in whole.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_shard_whose_labels_are_all_ignored_is_seeded_0_and_counts_by_its_rows(backend):
    """Cross-entropy with ignore_index: shard 0's labels all ignored (share 0, its own mean 0/0). Fed
    labels that count (``counted_labels``) and seeded 0, it still moves the statistics, and its
    gradients through them count once: the whole batch's to 1e-12."""
    arts = _artifacts(loss=gc.losses.cross_entropy("output", label="y", ignore_index=1))
    batch, state = {"x": _batch()["x"], "y": np.array([1, 1, 1, 1, 0, 1, 0, 0, 0])}, arts.state
    staged = StagedRun(arts.gradients, backend)
    whole = staged.run([{**batch, **state}], [1.0])[0]
    shards = [counted_labels(arts.manifest.loss, {k: v[:4] for k, v in batch.items()}), {k: v[4:] for k, v in batch.items()}]
    assert shards[0]["y"].tolist() == [0] * 4
    shares = [0.0, 1.0]
    got = _combined(arts, staged.run([{**s, **state} for s in shards], shares), shares)
    for name, value in whole.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-13, err_msg=name)


def test_the_staged_run_is_torch_syncbatchnorm_over_the_global_batch():
    """torch's SyncBatchNorm under DDP normalises by the global batch: one process's BatchNorm on it.
    Three shards' combined loss, gradients and running statistics are torch's to 1e-12."""
    torch = pytest.importorskip("torch")
    arts = _artifacts()
    batch, state = _batch(), arts.state
    cuts = (0, 3, 4, 9)
    shares = [(b - a) / ROWS for a, b in zip(cuts, cuts[1:])]
    shards = [{**{k: v[a:b] for k, v in batch.items()}, **state} for a, b in zip(cuts, cuts[1:])]
    got = _combined(arts, StagedRun(arts.gradients, "ort-cpu").run(shards, shares), shares)

    net = torch.nn.Module()
    for name, layer in _layers(torch.nn, (torch.nn.BatchNorm2d, torch.nn.BatchNorm1d), dtype=torch.float64).items():
        net.add_module(name, layer)
    net.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    net.train()
    loss = torch.nn.functional.mse_loss(_forward(net, torch.tensor(batch["x"])), torch.tensor(batch["y"]))
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-12)
    for name, param in net.named_parameters():
        np.testing.assert_allclose(got[f"{name}_grad"], param.grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=name)
    buffers = {f"{name}.next": b.numpy() for name, b in net.named_buffers() if f"{name}.next" in got}
    assert len(buffers) == 5  # bn's num_batches_tracked is not kept (momentum is not None)
    for name, buffer in buffers.items():
        np.testing.assert_allclose(got[name], buffer, rtol=1e-12, atol=1e-14, err_msg=name)


def test_exchanges_are_syncbatchnorm_only():
    """Three gathers per SyncBatchNorm (its count, its mean and its squared deviations, one
    exchange), two "gather_grad" ones for the two that carry a gradient (one exchange back); plain
    BatchNorm's graphs have none (one stage), and the train_step (plain BatchNorm's), eval and
    inference graphs of either have none. Five stages: both counts and bn's statistics first (the
    counts read shapes only), then one exchange at a time (bn2's, bn2's gradient, bn's)."""
    arts = _artifacts()
    marks = [n.metadata_props[EXCHANGE_KEY] for n in arts.gradients.graph if EXCHANGE_KEY in n.metadata_props]
    assert sorted(marks) == ["gather"] * 6 + ["gather_grad"] * 4
    plain = _artifacts((nn.BatchNorm2d, nn.BatchNorm1d))
    for key in ("train_step", "gradients", "eval", "inference"):
        assert not any(EXCHANGE_KEY in n.metadata_props for n in getattr(plain, key).graph), key
    for key in ("train_step", "eval", "inference"):
        assert not any(EXCHANGE_KEY in n.metadata_props for n in getattr(arts, key).graph), key
    # one process runs train_step: plain BatchNorm's (the written-out form cost 10 % a step)
    assert [n.op_type for n in arts.train_step.graph] == [n.op_type for n in plain.train_step.graph]
    assert len(split(plain.gradients.ir)) == 1
    assert [len(s.exchanges) for s in split(arts.gradients.ir)] == [4, 2, 2, 2, 0]


def test_exchange_and_bad_shares():
    """A "gather" stacks the parts in rank order; a "gather_grad" takes the receiver's row of the
    scale-weighted sum over its scale (a share, 1 for a share of 0). Shares that do not match the
    shards, or are all 0, are refused naming them."""
    parts, shares = [np.array([[1.0, 2.0]]), np.array([[3.0, 5.0]])], [0.25, 0.75]
    np.testing.assert_array_equal(exchange(parts, shares, 1, "gather"), [[1.0, 2.0], [3.0, 5.0]])
    cotangents = [np.array([[1.0, 2.0], [7.0, 9.0]]), np.array([[3.0, 5.0], [0.5, 1.0]])]
    np.testing.assert_allclose(exchange(cotangents, shares, 0, "gather_grad"), np.array([[2.5, 4.25]]) / 0.25)
    np.testing.assert_allclose(exchange(cotangents, shares, 1, "gather_grad"), np.array([[2.125, 3.0]]) / 0.75)
    staged = StagedRun(_artifacts().gradients)
    with pytest.raises(gc.InputError, match="one share per shard.*got 1 shards and 2 shares"):
        staged.run([{}], [0.5, 0.5])
    assert scales([0.0, 0.5, -0.25]) == [1.0, 0.5, -0.25]
    with pytest.raises(gc.InputError, match=r"shares: expected one that is not 0, got \[0.0, 0.0\]"):
        staged.run([{}, {}], [0.0, 0.0])


def _bn_first(net, x):
    """A BatchNorm2d straight on the input, then a Linear head."""
    return net.head(net.bn(x).relu().mean((2, 3)))


class _BnFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn, self.head = nn.SyncBatchNorm(3, dtype="float32"), nn.Linear(3, 2, dtype="float32")

    forward = _bn_first


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("shift", [0.0, 1000.0])
def test_float32_statistics_of_a_large_mean_are_torchs(backend, shift):
    """float32, values 1000 + N(0, 1) on shards of 7 and 5 rows, against torch's float64 on the
    global batch. The statistics are combined about the running mean: at 0 (a first step), the
    combination is torch's own (the variance ~4e-7 relative off, the gradients ~1e-4 of their
    largest, as torch's float32 BatchNorm2d); at the data's mean (later steps), x - s is exact and
    everything is within 1e-6, where the two-exchange two-pass form was 6e-5 off on the gradients
    and torch float32 1e-4. A single sum of squares about 0 was 0.26 off on the variance."""
    torch = pytest.importorskip("torch")
    model = gc.capture(_BnFirst().train(), seed=0, x=gc.spec("float32", ("N", 3, 8, 8)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    state = {**arts.state, "bn.running_mean": np.full(3, shift, np.float32)}
    x = (RNG.normal(size=(12, 3, 8, 8)) + 1000 + RNG.normal(size=(1, 3, 1, 1))).astype(np.float32)
    y = RNG.normal(size=(12, 2)).astype(np.float32)
    shares = [7 / 12, 5 / 12]
    shards = [{"x": x[a:b], "y": y[a:b], **state} for a, b in ((0, 7), (7, 12))]
    got = _combined(arts, StagedRun(without_initializers(arts.gradients.proto, set(state)), backend).run(shards, shares),
                    shares)

    net = torch.nn.Module()
    net.bn, net.head = torch.nn.BatchNorm2d(3, dtype=torch.float64), torch.nn.Linear(3, 2, dtype=torch.float64)
    net.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in state.items()}, strict=False)
    loss = torch.nn.functional.mse_loss(_bn_first(net, torch.tensor(x, dtype=torch.float64)), torch.tensor(y, dtype=torch.float64))
    loss.backward()
    want = {"loss": loss.item(), **{f"{k}_grad": p.grad.numpy() for k, p in net.named_parameters()},
            **{f"{k}.next": b.numpy() for k, b in net.named_buffers() if f"{k}.next" in got}}
    assert len(want) == 7
    for name, value in want.items():
        far = 1e-6 if shift or name.endswith(".next") else 5e-4
        np.testing.assert_allclose(got[name], value, rtol=0, atol=far * np.max(np.abs(value)), err_msg=name)


def _untracked(nn, norm2d, norm1d, **dtype):
    """Conv, a BatchNorm2d and (affine=False) a BatchNorm over [N, C], both without running statistics."""
    return {"conv": nn.Conv2d(2, 3, 3, **dtype), "bn": norm2d(3, track_running_stats=False, **dtype),
            "fc": nn.Linear(3, 4, **dtype), "bn2": norm1d(4, affine=False, track_running_stats=False, **dtype),
            "head": nn.Linear(4, 2, **dtype)}


class _Untracked(nn.Module):
    def __init__(self, norm2d=nn.SyncBatchNorm, norm1d=nn.SyncBatchNorm, dtype="float64"):
        super().__init__()
        for name, layer in _untracked(nn, norm2d, norm1d, dtype=dtype).items():
            setattr(self, name, layer)

    forward = _forward


def _untracked_artifacts(*norms):
    model = gc.capture(_Untracked(*norms).train(), seed=0, x=gc.spec("float64", ("N", 2, 5, 5)))
    return gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("cuts", [(0, 4, 9), (0, 3, 4, 9)])
def test_without_running_statistics_shards_are_torch_syncbatchnorm_over_the_global_batch(backend, cuts):
    """SyncBatchNorm(track_running_stats=False) (plain ops, no BatchNormalization node) normalises
    by every shard's statistics too, as torch's in training: 2 and 3 uneven shards' loss and
    gradients are torch's BatchNorm on the whole batch to 1e-12 (float64), and one run's."""
    torch = pytest.importorskip("torch")
    arts = _untracked_artifacts()
    batch, state = _batch(), arts.state
    staged = StagedRun(arts.gradients, backend)
    whole = staged.run([{**batch, **state}], [1.0])[0]
    shares = [(b - a) / ROWS for a, b in zip(cuts, cuts[1:])]
    got = _combined(arts, staged.run([{**{k: v[a:b] for k, v in batch.items()}, **state}
                                      for a, b in zip(cuts, cuts[1:])], shares), shares)
    for name, value in whole.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-13, err_msg=name)

    net = torch.nn.Module()
    for name, layer in _untracked(torch.nn, torch.nn.BatchNorm2d, torch.nn.BatchNorm1d, dtype=torch.float64).items():
        net.add_module(name, layer)
    net.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    loss = torch.nn.functional.mse_loss(_forward(net.train(), torch.tensor(batch["x"])), torch.tensor(batch["y"]))
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-12)
    grads = {f"{name}_grad": p.grad.numpy() for name, p in net.named_parameters()}
    assert len(grads) == 8 and set(grads) <= set(got)
    for name, grad in grads.items():
        np.testing.assert_allclose(got[name], grad, rtol=1e-10, atol=1e-13, err_msg=name)


def test_without_running_statistics_the_exchanges_are_the_gradients_graphs_only():
    """Four gathers a layer (count, mean, squared deviations, and the worker's own shift the
    statistics are taken about), "gather_grad" for the two that carry a gradient, the shift none
    (no gradient: the result does not depend on it). Five stages: bn's statistics and bn2's count
    first, then one exchange at a time (bn2's, bn2's gradient, bn's). train_step, eval and inference
    are plain BatchNorm's ops, without exchanges."""
    arts, plain = _untracked_artifacts(), _untracked_artifacts(nn.BatchNorm2d, nn.BatchNorm1d)
    marks = [n.metadata_props[EXCHANGE_KEY] for n in arts.gradients.graph if EXCHANGE_KEY in n.metadata_props]
    assert sorted(marks) == ["gather"] * 8 + ["gather_grad"] * 4
    assert [len(s.exchanges) for s in split(arts.gradients.ir)] == [5, 3, 2, 2, 0]
    assert len(split(plain.gradients.ir)) == 1
    for key in ("train_step", "eval", "inference"):
        assert [n.op_type for n in getattr(arts, key).graph] == [n.op_type for n in getattr(plain, key).graph], key
        assert not any(EXCHANGE_KEY in n.metadata_props for n in getattr(arts, key).graph), key


class _UntrackedFirst(nn.Module):
    def __init__(self, norm=nn.SyncBatchNorm):
        super().__init__()
        self.bn, self.head = norm(3, track_running_stats=False, dtype="float32"), nn.Linear(3, 2, dtype="float32")

    forward = _bn_first


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_float32_statistics_of_a_large_mean_without_running_statistics(backend):
    """float32, values 1000 + N(0, 1) on shards of 7 and 5 rows, against torch's float64 on the
    global batch: each worker's statistics about its own mean, rebased to worker 0's, keep the loss
    and gradients within 1e-6 of their largest (measured 2.4e-7), where torch's float32 BatchNorm2d
    is 2.6e-4 off and a combination about 0 was 5.4e-4."""
    torch = pytest.importorskip("torch")
    model = gc.capture(_UntrackedFirst().train(), seed=0, x=gc.spec("float32", ("N", 3, 8, 8)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    x = (RNG.normal(size=(12, 3, 8, 8)) + 1000 + RNG.normal(size=(1, 3, 1, 1))).astype(np.float32)
    y = RNG.normal(size=(12, 2)).astype(np.float32)
    shares = [7 / 12, 5 / 12]
    shards = [{"x": x[a:b], "y": y[a:b], **arts.state} for a, b in ((0, 7), (7, 12))]
    got = _combined(arts, StagedRun(arts.gradients, backend).run(shards, shares), shares)

    net = torch.nn.Module()
    net.bn = torch.nn.BatchNorm2d(3, track_running_stats=False, dtype=torch.float64)
    net.head = torch.nn.Linear(3, 2, dtype=torch.float64)
    net.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in arts.state.items()}, strict=False)
    loss = torch.nn.functional.mse_loss(_bn_first(net, torch.tensor(x, dtype=torch.float64)), torch.tensor(y, dtype=torch.float64))
    loss.backward()
    want = {"loss": loss.item(), **{f"{k}_grad": p.grad.numpy() for k, p in net.named_parameters()}}
    assert len(want) == 5
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6 * np.max(np.abs(value)), err_msg=name)
