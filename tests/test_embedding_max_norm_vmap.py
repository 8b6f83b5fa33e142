"""``gc.nn.functional.embedding(..., max_norm=...)`` inside ``gc.vmap`` bodies against torch's Python loop
over the examples (``torch.func.vmap`` refuses the in-place renormalisation): an ensemble's stacked tables
(``in_dims`` 0) each renormalised by its own member's rows, and a table the body closes over renormalised
at the rows of every example; forward values in eval mode and 6 training steps, float64, numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.errors import ArtifactsError, PassError
from ray_util import ray_cluster  # noqa: F401 - the module's fixture

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
MEMBERS, ROWS, DIM = 3, 8, 3
F = gc.nn.functional
OPTIMIZERS = {"sgd": (lambda: gc.optim.SGD(lr=0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
              "adamw": (lambda: gc.optim.AdamW(lr=0.05, weight_decay=0.1),
                        lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1))}


def _member(w, i):
    """One member (example): its rows looked up with max_norm, summed, plus a read of its table after the
    lookup, which sees the rows it renormalised."""
    return gc_or_torch(w).nn.functional.embedding(i, w, max_norm=1.0).sum(0) + w.sum(0) * 0.25


def gc_or_torch(x):
    return torch if isinstance(x, torch.Tensor) else gc


class _Ensemble(gc.nn.Module):
    """``MEMBERS`` stacked tables, mapped at ``dim``; ``shared``: every member looks up the same indices
    (``in_dims`` None), else its own. The stacked tables are read again after the call (a tied layer)."""

    def __init__(self, dim: int, shared: bool):
        super().__init__()
        start = RNG.normal(size=(MEMBERS, ROWS, DIM)) * 1.5  # row norms about 0.6 to 5: most over max_norm
        self.w = gc.nn.Parameter(np.moveaxis(start, 0, dim).copy(), dtype="float64")
        self.dim, self.shared = dim, shared

    def forward(self, i):
        out = gc.vmap(_member, in_dims=(self.dim, None if self.shared else 0))(self.w, i)
        return out + gc.movedim(self.w, self.dim, 0).sum(1) * 0.5


def _torch_ensemble(tables, i, shared: bool):
    out = torch.stack([_member(w, i if shared else i[m]) for m, w in enumerate(tables)])
    return out + torch.stack([w.sum(0) for w in tables]) * 0.5


def _tables(net: _Ensemble) -> list:
    stacked = np.moveaxis(net.w.numpy(), net.dim, 0)
    return [torch.nn.Parameter(torch.from_numpy(stacked[m].copy())) for m in range(MEMBERS)]


def _indices(shared: bool):
    i = RNG.integers(0, ROWS, (4,) if shared else (MEMBERS, 4))
    return i


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("shared", [True, False])
def test_an_ensemble_reads_each_members_renormalised_table(dim, shared):
    """Eval mode: the in-body read sees the member's rows renormalised, the read after the call every
    member's; off by up to 1.9 before (the stacked tables were read as stored after the call)."""
    net = _Ensemble(dim, shared)
    tables = _tables(net)
    i = _indices(shared)
    with torch.no_grad():
        want = _torch_ensemble(tables, torch.from_numpy(i), shared).numpy()
    model = gc.capture(net, i=gc.spec("int64", i.shape))
    onnx = pytest.importorskip("onnx")
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"i": i})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=backend)


def _train(net, arts, batches, torch_forward, params, opt, backend):
    torch_opt, want = OPTIMIZERS[opt][1](params), []
    for b in batches:
        torch_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(torch_forward(torch.from_numpy(b["i"])), torch.from_numpy(b["y"]))
        loss.backward()
        torch_opt.step()
        want.append(loss.item())
    trainer = gc.Trainer(arts, backend=backend)
    np.testing.assert_allclose([trainer.step(b) for b in batches], want, rtol=1e-12, atol=1e-15)
    return trainer.state_dict()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("dim,shared", [(0, False), (1, True)])
def test_training_an_ensemble_matches_torchs_loop_over_members(dim, shared, opt, backend):
    """Losses and tables over 6 steps equal torch's per-member tables to 1e-12: each member's table
    stepped from its own renormalised rows (before, train_step stepped the tables as stored)."""
    net = _Ensemble(dim, shared)
    tables = _tables(net)
    model = gc.capture(net, i=gc.spec("int64", _indices(shared).shape))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), OPTIMIZERS[opt][0]())
    assert arts.manifest.renormed == ["w"]
    batches = [{"i": _indices(shared), "y": RNG.normal(size=(MEMBERS, DIM))} for _ in range(6)]
    got = _train(net, arts, batches, lambda i: _torch_ensemble(tables, i, shared), tables, opt, backend)
    np.testing.assert_allclose(np.moveaxis(got["w"], dim, 0), np.stack([t.detach().numpy() for t in tables]),
                               rtol=1e-12, atol=1e-15)


class _Closed(gc.nn.Module):
    """Per-example lookups, in a gc.vmap body, of one table the body closes over (twice, the second
    re-reading rows the first renormalised), then a tied output layer after the call."""

    def __init__(self):
        super().__init__()
        self.emb = gc.nn.Embedding(ROWS, DIM, max_norm=1.0, dtype="float64")
        self.emb.weight = gc.nn.Parameter(RNG.normal(size=(ROWS, DIM)) * 1.5, dtype="float64")

    def forward(self, i):
        out = gc.vmap(lambda row: self.emb(row).sum(0) + self.emb(row[:2]).mean(0))(i)
        return out @ self.emb.weight.T


def _torch_closed(weight, i):
    lookup = lambda row: torch.nn.functional.embedding(row, weight, max_norm=1.0)  # noqa: E731
    return torch.stack([lookup(row).sum(0) + lookup(row[:2]).mean(0) for row in i]) @ weight.T


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_training_a_closed_over_table_matches_torchs_loop_over_examples(opt, backend):
    """The table renormalised at every example's rows (a row shared by examples once), which the tied
    layer after the call reads and the optimizer steps from; before, generate refused it."""
    net = _Closed()
    weight = torch.nn.Parameter(torch.from_numpy(net.emb.weight.numpy().copy()))
    model = gc.capture(net, i=gc.spec("int64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), OPTIMIZERS[opt][0]())
    assert arts.manifest.renormed == ["emb.weight"]
    batches = []
    for _ in range(6):
        i = RNG.integers(0, 6, (3, 4))  # rows 6 and 7 never looked up
        i[2, 0] = i[0, 1]
        batches.append({"i": i, "y": RNG.normal(size=(3, ROWS))})
    got = _train(net, arts, batches, lambda i: _torch_closed(weight, i), [weight], opt, backend)
    np.testing.assert_allclose(got["emb.weight"], weight.detach().numpy(), rtol=1e-12, atol=1e-15)


def test_a_closed_over_table_read_besides_its_lookups_is_refused():
    """Torch's loop would show each example the rows earlier examples renormalised: refused, naming it."""
    net = _Closed()
    net.forward = lambda i: gc.vmap(lambda row: net.emb(row).sum(0) + net.emb.weight.sum(0))(i)
    model = gc.capture(net, i=gc.spec("int64", (3, 4)))
    with pytest.raises(PassError, match=r"the embedding of 'emb.weight' with max_norm at .*test_embedding_max_norm_"
                                        r"vmap\.py:\d+ is trained inside a control-flow body that does not carry the "
                                        r"weight out \(a gc.vmap body that reads the weight it closes over"):
        gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1))


def test_data_parallel_training_refuses_an_ensembles_tables():
    net = _Ensemble(0, False)
    arts = gc.training.generate(gc.capture(net, i=gc.spec("int64", (MEMBERS, 4))),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1))
    with pytest.raises(ArtifactsError, match=r"renormalises \['w'\] inside a gc.vmap body that maps the weight.*"
                                             r"train with one worker"):
        gc.Trainer(arts, workers=2)


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_workers_train_a_closed_over_table_as_torch_on_the_whole_batch(ray_cluster, backend):
    """The lookup made again after the call is a main-graph one, so the workers renormalise the union of
    their shards' rows there (shards reading disjoint rows at step 1): 2 workers equal torch's loop over the
    whole batch to 1e-12."""
    pytest.importorskip("ray")
    net = _Closed()
    weight = torch.nn.Parameter(torch.from_numpy(net.emb.weight.numpy().copy()))
    arts = gc.training.generate(gc.capture(net, i=gc.spec("int64", ("N", 4))), gc.losses.mse("output", label="y"),
                                OPTIMIZERS["adamw"][0]())
    batches = []
    for step in range(6):
        i = RNG.integers(0, 6, (4, 4))
        if step == 1:
            i[:2], i[2:] = RNG.integers(0, 3, (2, 4)), RNG.integers(3, 6, (2, 4))
        batches.append({"i": i, "y": RNG.normal(size=(4, ROWS))})
    trainer = gc.Trainer(arts, workers=2, num_cpus=0.5, timeout_s=120, backend=backend)
    try:
        torch_opt, want = OPTIMIZERS["adamw"][1]([weight]), []
        for b in batches:
            torch_opt.zero_grad()
            loss = torch.nn.functional.mse_loss(_torch_closed(weight, torch.from_numpy(b["i"])),
                                                torch.from_numpy(b["y"]))
            loss.backward()
            torch_opt.step()
            want.append(loss.item())
        np.testing.assert_allclose([trainer.step(b) for b in batches], want, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(trainer.state_dict()["emb.weight"], weight.detach().numpy(), rtol=1e-12,
                                   atol=1e-15)
    finally:
        trainer.shutdown()
