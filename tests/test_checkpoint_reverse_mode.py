"""Checkpoint regions in bodies whose gradient is not unrolled (a gc.scan of more than 32 steps, a
gc.fori_loop of run-time length, a gc.while_loop: reverse mode) and under gc.vmap: recomputed, not kept.

Oracles: the same float64 model without regions (gradients to 1e-12), torch 2.13's
torch.utils.checkpoint over a Python loop of the same cell (1e-10), and the graphs themselves (what
the taped forward loop stacks, which nodes the backward reads as copies)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
from graphc.model import CHECKPOINT_KEY, RECOMPUTED_KEY
from graphc.utils.checkpoint import checkpoint

import test_checkpoint_grad

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}
RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
T = 40  # past MAX_SCAN_UNROLL: the gc.scan's gradient is in reverse mode too


class _Steps(test_checkpoint_grad._Steps):
    """test_checkpoint_grad's tanh cell over the steps of ``xs`` as ``kind`` (its gc.while_loop too), at a number of
    steps known only at run time."""

    def forward(self, xs):
        h = xs[0] * 0.0
        steps = (xs[0, 0, 0] * 0 + T).to(gc.int64)  # known only at run time
        if self.kind == "scan":
            h = gc.scan(lambda c, x: (self.step(c, x), c), h, xs)[0]
        elif self.kind == "fori_loop":
            h = gc.fori_loop(0, steps, lambda i, c: self.step(c, xs[i]), h)
        else:
            h = gc.while_loop(lambda i, c: i < steps, lambda i, c: (i + 1, self.step(c, xs[i])), (gc.tensor(0), h))[1]
        return (h * h).sum()


def _graded(kind: str, regions: bool) -> gc.Model:
    gc.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region recomputed warns of nothing
        return gc.grad(gc.capture(_Steps(kind, regions), xs=gc.spec("float64", (T, 3, 4))), "output")


def _taped(model: gc.Model):
    """The forward loop (the taped copy, first Scan or Loop of the graph) and how many values it stacks."""
    node = next(n for n in model.proto.graph.node if n.op_type in ("Scan", "Loop"))
    return node, len(node.output)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["scan", "fori_loop", "while_loop"])
def test_a_region_in_a_reverse_mode_body_is_recomputed_not_taped(kind, backend):
    graded = {r: _graded(kind, r) for r in (True, False)}
    (node, stacked), (_, plain_stacked) = _taped(graded[True]), _taped(graded[False])
    # without regions the forward stacks each step's Gemms and Tanhs for the backward; with them only
    # the carried values (the regions' inputs): the backward runs each step's region again from them
    body = next(a.g for a in node.attribute if a.name == "body")
    producer = {out: n for n in body.node for out in n.output}
    tapes = [producer[out.name] for out in body.output if out.name.rpartition("/")[2].startswith("tape")]
    taped = [producer.get(tape.input[0]) for tape in tapes]
    assert tapes and not [n.op_type for n in taped if n is not None and any(p.key == CHECKPOINT_KEY
                                                                           for p in n.metadata_props)]
    assert stacked < plain_stacked
    xs = RNG.normal(size=(T, 3, 4))
    got, want = (gc.Session(graded[r], backend=backend).run({"xs": xs}) for r in (True, False))
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-12, atol=1e-15, err_msg=key)
    test_checkpoint_grad.matches_torch_checkpoint(got, graded[True].params, xs)


class _Mapped(gc.nn.Module):
    def __init__(self, regions: bool):
        super().__init__()
        self.regions = regions
        self.fc1, self.fc2 = gc.nn.Linear(4, 8, **F64), gc.nn.Linear(8, 4, **F64)

    def cell(self, x):
        return gc.tanh(self.fc2(gc.tanh(self.fc1(x))))

    def forward(self, xs):
        f = (lambda x: checkpoint(self.cell, x, use_reentrant=False)) if self.regions else self.cell
        return (gc.vmap(f)(xs) ** 2).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_region_under_vmap_is_recomputed_whole(backend):
    """The batched ops vmap writes for a region's ops join the region: the backward reads copies of all
    its values (the batched MatMuls, Adds and Tanhs), not of the weights' Transposes only."""
    graded = {}
    for regions in (True, False):
        gc.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            graded[regions] = gc.grad(gc.capture(_Mapped(regions), xs=gc.spec("float64", (5, 3, 4))), "output")
    copies = [n.op_type for n in graded[True].proto.graph.node if any(p.key == RECOMPUTED_KEY for p in n.metadata_props)]
    assert sorted(copies) == sorted(["Transpose", "MatMul", "Add", "Tanh"] * 2)
    xs = RNG.normal(size=(5, 3, 4))
    got, want = (gc.Session(graded[r], backend=backend).run({"xs": xs}) for r in (True, False))
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-12, atol=1e-15, err_msg=key)
