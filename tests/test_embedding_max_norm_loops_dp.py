"""``gc.nn.Embedding(max_norm=...)`` looked up inside ``gc.fori_loop``, ``gc.scan`` and ``gc.while_loop``
bodies and ``gc.cond`` branches, trained by data-parallel workers on a real local Ray cluster, against torch's
single-process Python loop or ``if`` over the whole batch: each iteration, or the branch taken, renormalises the
rows the whole batch looks up there (the union of the shards' rows), so 2 workers on uneven shards equal one
process to 1e-12 in float64. A branch picked from the batch, and a cond in a loop's body:
``test_embedding_max_norm_conds_dp.py``."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import graphc as gc
from graphc.errors import ArtifactsError

torch = pytest.importorskip("torch")

from ray_util import ray_cluster, workers_step_as_torch  # noqa: F401 - the module's fixture
from test_embedding_max_norm import OPTIMIZERS, ROWS, _Net, _Twin

MAX_NORM_PARAMS = ("emb.weight", "fc.bias")  # the twin's params checked

RNG = np.random.default_rng(0)
STEPS = 3  # tokens per example: the loop's iterations


def _gc_forward(kind: str):
    """A tied output layer over the sum of the lookups of token k of every example at iteration k."""
    def forward(net, i):
        acc = net.emb(i[:, 0]) * 0.0
        if kind == "fori_loop":
            acc = gc.fori_loop(0, STEPS, lambda k, a: a + net.emb(i[:, k]), acc)
        elif kind == "while_loop":
            acc = gc.while_loop(lambda k, a: k < STEPS, lambda k, a: (k + 1, a + net.emb(i[:, k])),
                                (gc.tensor(0), acc))[1]
        else:
            acc = gc.scan(lambda a, tokens: (a + net.emb(tokens), tokens), acc, i.T)[0]
        return net.fc(acc)

    return forward


def _torch_forward(twin, i):
    """Torch's loop over the whole batch: iteration k renormalises the rows of every example's token k."""
    acc = twin.emb(i[:, 0]) * 0.0
    for k in range(STEPS):
        acc = acc + twin.emb(i[:, k])
    return twin.fc(acc)


def _batches() -> list[dict]:
    """5 examples (shards of 3 and 2); at step 1 the shards look up disjoint rows at each iteration, so a
    worker renormalising only its own rows would leave the other's over max_norm."""
    out = []
    for step in range(6):
        i = RNG.integers(0, ROWS, (5, STEPS))
        if step == 1:
            i[:3], i[3:] = RNG.integers(0, 4, (3, STEPS)), RNG.integers(4, ROWS, (2, STEPS))
        out.append({"i": i, "y": RNG.normal(size=(5, ROWS))})
    return out


def _artifacts(net, opt: str = "adamw"):
    model = gc.capture(net, i=gc.spec("int64", ("N", STEPS)))
    return gc.training.generate(model, gc.losses.mse("output", label="y"), OPTIMIZERS[opt][0]())


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind", ["fori_loop", "while_loop", "scan"])
def test_workers_train_lookups_inside_a_loop_as_torch_on_the_whole_batch(ray_cluster, kind, backend):
    """Losses and weights over 6 AdamW steps equal torch's loop on the whole batch to 1e-12
    (before, gc.Trainer(workers=2) refused a lookup inside a body), with no gc.DataParallelWarning."""
    net = _Net(tied=True)
    net.forward = _gc_forward(kind).__get__(net)
    twin = _Twin(net, 2.0, True)
    arts = _artifacts(net)
    batches = _batches()
    torch_opt, want = OPTIMIZERS["adamw"][1](twin.parameters()), []
    for b in batches:
        torch_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(_torch_forward(twin, torch.from_numpy(b["i"])), torch.from_numpy(b["y"]))
        loss.backward()
        torch_opt.step()
        want.append(loss.item())
    workers_step_as_torch(arts, backend, batches, want, twin, MAX_NORM_PARAMS)


def test_indices_the_loop_computes_from_the_weight_are_refused():
    """Greedy decoding: each iteration looks up the row the previous one's embedding picks, so the rows are
    known only in the forward, not before it: refused, naming the weight they depend on."""
    net = _Net(tied=True)

    def forward(i):
        def step(k, carry):
            tokens, acc = carry
            e = net.emb(tokens)
            return gc.argmax(e, -1) + 4, acc + e
        return net.fc(gc.fori_loop(0, STEPS, step, (i[:, 0], net.emb(i[:, 0]) * 0.0))[1])

    net.forward = forward
    with pytest.raises(ArtifactsError, match=r"the rows an embedding with max_norm renormalises depend on "
                                             r"\['emb.weight'\].*a loop's carried values.*train with one worker"):
        gc.Trainer(_artifacts(net, "sgd"), workers=2)


GATE = 0.05  # the cond's threshold on fc.bias.sum(): 0.03 at first, so the first steps take the else branch


def _cond_forward(net, gate):
    """A tied output layer over ``emb(i[:, 1])`` where ``gate`` (a param's sum) is over GATE, else
    ``emb(i[:, 0]) * 0.5``: each branch looks up rows, and the predicate reads no batch row."""
    def forward(i):
        return net.fc(gc.cond(gate() > GATE, lambda: net.emb(i[:, 1]), lambda: net.emb(i[:, 0]) * 0.5))

    return forward


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_workers_train_lookups_inside_a_cond_branch_as_torch_on_the_whole_batch(ray_cluster, backend):
    """A gc.cond on a param (the same on every worker and on the whole batch) whose branches both look up: 2
    workers on shards of 3 and 2 examples that look up disjoint rows at every step (rows 0-3 and 4-7), so a worker
    renormalising its own shard's rows only would leave the tied layer reading the other's over max_norm, match
    torch's ``if`` on the whole batch over 6 AdamW steps that take both branches, to 1e-12 (before, refused)."""
    net = _Net(tied=True)
    net.forward = _cond_forward(net, lambda: net.fc.bias.sum())
    twin = _Twin(net, 2.0, True)
    arts = _artifacts(net)
    rng = np.random.default_rng(0)  # fixed batches: the steps below take both branches
    batches = [{"i": np.concatenate([rng.integers(0, 4, (3, STEPS)), rng.integers(4, ROWS, (2, STEPS))]),
                "y": rng.normal(size=(5, ROWS))} for _ in range(6)]
    torch_opt, want, taken = OPTIMIZERS["adamw"][1](twin.parameters()), [], []
    for b in batches:
        taken.append(twin.fc.bias.sum().item() > GATE)
        torch_opt.zero_grad()
        loss = _torch_cond_loss(twin, b)
        loss.backward()
        torch_opt.step()
        want.append(loss.item())
    assert 0 < sum(taken) < len(taken), taken
    with torch.no_grad():  # evaluate: the taken branch's tied layer reads both shards' rows renormalised
        want_eval = [_torch_cond_loss(copy.deepcopy(twin), b).item() for b in batches[:2]]
    workers_step_as_torch(arts, backend, batches, want, twin, MAX_NORM_PARAMS, want_eval)


def _torch_cond_loss(twin, batch):
    """Torch's ``if`` on the whole batch: the branch ``_cond_forward`` picks, its lookup renormalising in place."""
    i = torch.from_numpy(batch["i"])
    out = twin.fc(twin.emb(i[:, 1]) if twin.fc.bias.sum().item() > GATE else twin.emb(i[:, 0]) * 0.5)
    return torch.nn.functional.mse_loss(out, torch.from_numpy(batch["y"]))


def test_the_rows_graph_keeps_a_carried_value_only_a_nested_cond_reads_through_a_body_value():
    """The indices are computed inside a gc.cond from a body value (``off * 3``) that only the cond's branches
    read, itself from a carried value: the rows graph's Loop keeps that carried value (before, it was dropped
    from the body's inputs, and the rows graph read an undefined value), and stacks each iteration's rows."""
    from graphc.model import Model
    from graphc.passes.training.max_norm_shards import sharded

    net = _Net(tied=True)

    def forward(i):
        def body(k, off, acc):
            shifted = off * 3
            return k + 1, off * 2, acc + net.emb(gc.cond(k > 0, lambda: i[:, k] + shifted, lambda: i[:, k] - shifted))
        return net.fc(gc.while_loop(lambda k, off, a: k < STEPS, lambda k, off, a: body(k, off, a),
                                    (gc.tensor(0), gc.tensor(0), net.emb(i[:, 0]) * 0.0))[2])

    net.forward = forward
    rows = sharded(_artifacts(net, "sgd").eval.ir, ["emb.weight"], ["i"], renormed=False).rows
    i = RNG.integers(0, ROWS, (3, STEPS))
    got = gc.Session(Model(rows), backend="numpy").run({"i": i})
    steps = [v for k, v in got.items() if k.endswith(".steps")]
    assert len(steps) == 1
    np.testing.assert_array_equal(steps[0], i.T[..., None])
