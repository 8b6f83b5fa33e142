"""``gc.nn.Embedding(max_norm=...)`` looked up inside a ``gc.cond`` branch whose predicate reads the batch, and
inside a ``gc.cond`` in a loop's body, trained by data-parallel workers on a real local Ray cluster, against torch's
single-process ``if`` (and loop) over the whole batch, to 1e-12 in float64.

Torch's own DistributedDataParallel is no oracle here: each replica takes its shard's branch and renormalises, in
its own weight, only the rows its shard looks up, and DDP never re-broadcasts params, so the replicas drift apart
(2 gloo ranks, one SGD step on disjoint rows: the replicas' weights differ by 5.4). The workers instead compute a
main-graph predicate from the whole batch (the batch inputs it reads, joined in rank order) and renormalise the
union of the shards' rows: one process's step."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import graphc as gc
from graphc.errors import ArtifactsError

torch = pytest.importorskip("torch")

from ray_util import ray_cluster, workers_step_as_torch  # noqa: F401 - the module's fixture
from test_embedding_max_norm import OPTIMIZERS, ROWS, _Net, _Twin
from test_embedding_max_norm_loops_dp import MAX_NORM_PARAMS, STEPS, _artifacts

RNG = np.random.default_rng(0)


def _batch(rows: int, rng: np.random.Generator = RNG) -> dict:
    """``rows`` examples, the first 3 (shard 0's) looking up rows 0-3, the others rows 4-7: a worker
    renormalising only its own shard's rows leaves the other's over max_norm for the tied layer."""
    return {"i": np.concatenate([rng.integers(0, 4, (3, STEPS)), rng.integers(4, ROWS, (rows - 3, STEPS))]),
            "y": rng.normal(size=(rows, ROWS))}


def _batches(predicate: str) -> tuple[list[dict], int]:
    """6 batches and the threshold of ``predicate`` (the batch's index sum, or its size) that takes each branch on
    the whole batch at least twice, the first two batches different ones, while neither shard (3 and 2, or 2 and 2
    examples) ever passes it. Fixed batches: the assertions below hold for these."""
    rng = np.random.default_rng(2)
    if predicate == "size":
        return [_batch(5 if k % 2 else 4, rng) for k in range(6)], 4
    batches = [_batch(5, rng) for _ in range(6)]
    return batches, int(np.median([b["i"].sum() for b in batches]))


def _picked(predicate: str, i, threshold: int) -> bool:
    return bool((i.sum() if predicate == "sum" else i.shape[0]) > threshold)


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("predicate", ["sum", "size"])
def test_workers_take_the_branch_a_batch_predicate_picks_on_the_whole_batch(ray_cluster, predicate, backend):
    """``gc.cond(i.sum() > t)`` / ``gc.cond(i.shape[0] > 4)``: each shard's predicate is always false, the whole
    batch's true at 3 of 6 AdamW steps; 2 workers take the whole batch's branch and renormalise both shards' rows,
    matching torch's ``if`` on the whole batch to 1e-12 (losses, weights, ``evaluate``). Before, refused."""
    batches, threshold = _batches(predicate)
    net = _Net(tied=True)

    def forward(i):
        pick = (i.sum() if predicate == "sum" else i.shape[0]) - threshold > 0
        return net.fc(gc.cond(pick, lambda: net.emb(i[:, 1]), lambda: net.emb(i[:, 0]) * 0.5))

    net.forward = forward
    twin = _Twin(net, 2.0, True)

    def torch_loss(model, b):
        i = torch.from_numpy(b["i"])
        out = model.fc(model.emb(i[:, 1]) if _picked(predicate, b["i"], threshold) else model.emb(i[:, 0]) * 0.5)
        return torch.nn.functional.mse_loss(out, torch.from_numpy(b["y"]))

    taken = [_picked(predicate, b["i"], threshold) for b in batches]
    shards = [_picked(predicate, b["i"][lo:hi], threshold) for b in batches for lo, hi in ((0, 3), (3, None))]
    assert 2 <= sum(taken) <= 4 and not any(shards), (taken, shards)
    assert taken[0] != taken[1]  # evaluate: the first two batches take different branches
    arts = _artifacts(net)
    want = _torch_steps(twin, batches, torch_loss)
    with torch.no_grad():
        want_eval = [torch_loss(copy.deepcopy(twin), b).item() for b in batches[:2]]
    workers_step_as_torch(arts, backend, batches, want, twin, MAX_NORM_PARAMS, want_eval)


def _torch_steps(twin, batches, loss_of) -> list[float]:
    """Torch's AdamW steps on ``batches``, one process on each whole batch: their losses."""
    opt, losses = OPTIMIZERS["adamw"][1](twin.parameters()), []
    for b in batches:
        opt.zero_grad()
        loss = loss_of(twin, b)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


LOOKED_UP = 2  # the cond in the loop's body looks up at iterations k < LOOKED_UP, else halves the sum


def _gc_loop_forward(net, kind: str):
    """A tied output layer over a loop whose body, at iteration k < LOOKED_UP, adds the lookup of every example's
    token k (a gc.cond on the counter: the same on every worker), else halves the running sum."""
    def step(k, a, tokens):
        return gc.cond(k < LOOKED_UP, lambda: a + net.emb(tokens), lambda: a * 0.5)

    def forward(i):
        acc = net.emb(i[:, 0]) * 0.0
        if kind == "fori_loop":
            acc = gc.fori_loop(0, STEPS, lambda k, a: step(k, a, i[:, k]), acc)
        elif kind == "while_loop":
            acc = gc.while_loop(lambda k, a: k < STEPS, lambda k, a: (k + 1, step(k, a, i[:, k])),
                                (gc.tensor(0), acc))[1]
        else:  # the counter carried along
            acc = gc.scan(lambda c, tokens: ((c[0] + 1, step(c[0], c[1], tokens)), tokens), (gc.tensor(0), acc), i.T)[0][1]
        return net.fc(acc)

    return forward


def _torch_loop_loss(twin, batch):
    i = torch.from_numpy(batch["i"])
    acc = twin.emb(i[:, 0]) * 0.0
    for k in range(STEPS):
        acc = acc + twin.emb(i[:, k]) if k < LOOKED_UP else acc * 0.5
    return torch.nn.functional.mse_loss(twin.fc(acc), torch.from_numpy(batch["y"]))


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind", ["fori_loop", "while_loop", "scan"])
def test_workers_train_lookups_in_a_cond_inside_a_loop_as_torch_on_the_whole_batch(ray_cluster, kind, backend):
    """A gc.cond on the loop's counter inside the body: iterations 0 and 1 renormalise the rows every example looks
    up there, iteration 2 none; 2 workers on shards of 3 and 2 examples (disjoint rows) match torch's loop on the
    whole batch over 6 AdamW steps to 1e-12 (losses, weights, ``evaluate``). Before, refused as a nested body."""
    net = _Net(tied=True)
    net.forward = _gc_loop_forward(net, kind)
    twin = _Twin(net, 2.0, True)
    arts = _artifacts(net)
    batches = [_batch(5) for _ in range(6)]
    want = _torch_steps(twin, batches, _torch_loop_loss)
    with torch.no_grad():
        want_eval = [_torch_loop_loss(copy.deepcopy(twin), b).item() for b in batches[:2]]
    workers_step_as_torch(arts, backend, batches, want, twin, MAX_NORM_PARAMS, want_eval)


REFUSALS = {  # what the predicate in the fori_loop body reads -> the message, from the first graph refused
    "tokens": r"the embedding of 'emb.weight' with max_norm at .* renormalises rows in a gc.cond branch \(node .*\) "
              r"inside the body of node .* whose predicate reads the batch \(\['i'\]\): each worker would compute it "
              r"at each iteration from its own shard.*\(the loop's counter, a param, a constant\) or train with one "
              r"worker",
    "carried": r"the embedding of 'emb.weight' with max_norm at .* renormalises rows in a gc.cond branch \(node .*\) "
               r"whose predicate reads the batch \(\['i'\]\) through a control-flow node \(\[.*If.*\]\): the "
               r"workers compute such a predicate from the whole batch by copying the nodes between, not yet.*train "
               r"with one worker"}


@pytest.mark.parametrize("reads", sorted(REFUSALS))
def test_a_cond_in_a_loop_body_picked_from_the_batch_is_refused(reads):
    """A predicate in a loop's body that reads the batch would be each shard's at each iteration: refused, naming
    the param, the cond, the batch input and why. The gradients graph unrolls the 3-step loop into Ifs: a predicate
    on the iteration's tokens is then computed from the whole batch there, but the eval graph's Loop refuses it; one
    on the running sum reads the previous iteration's If, which the workers do not copy: refused there."""
    net = _Net(tied=True)

    def forward(i):
        def body(k, a):
            pick = (i[:, k].sum() if reads == "tokens" else a.sum()) > 10
            return gc.cond(pick, lambda: a + net.emb(i[:, k]), lambda: a * 0.5)
        return net.fc(gc.fori_loop(0, STEPS, body, net.emb(i[:, 0]) * 0.0))

    net.forward = forward
    with pytest.raises(ArtifactsError, match=REFUSALS[reads]):
        gc.Trainer(_artifacts(net, "sgd"), workers=2)


def test_a_lookup_in_a_cond_nested_in_a_cond_in_a_loop_body_stays_refused():
    """A cond in a cond in a gc.fori_loop body: refused, naming the nesting."""
    net = _Net(tied=True)

    def forward(i):
        def body(k, a):
            gate = net.fc.bias.sum() > 0
            return a + gc.cond(gate, lambda: gc.cond(gate, lambda: net.emb(i[:, k]), lambda: a * 0.0), lambda: a * 0.0)
        return net.fc(gc.fori_loop(0, STEPS, body, net.emb(i[:, 0]) * 0.0))

    net.forward = forward
    with pytest.raises(ArtifactsError, match=r"renormalises rows inside a body nested in another .*not yet nested "
                                             r"deeper \(a loop in a loop, a gc.cond in a gc.cond\); train with one "
                                             r"worker"):
        gc.Trainer(_artifacts(net, "sgd"), workers=2)
