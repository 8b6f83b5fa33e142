"""generate(recompute=True): the backward reads recomputed copies of cheap forward values.

Oracles: the same artifacts without recomputation (the numbers must not change: numpy gives the
same bits, onnxruntime float tolerance) and onnxruntime's optimized graph (the copies must
survive its common-subexpression elimination)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.backends import get_backend
from graphc.models import EXAMPLES
from graphc.passes.training.recompute import CHEAP

LR = 1e-2


@pytest.fixture(scope="module")
def resnet():
    factory, inputs = EXAMPLES["resnet"]
    return gc.capture(factory(), seed=0, **inputs())


def artifacts(model, recompute):
    return gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.AdamW(LR),
                                recompute=recompute)


def batches(n=3):
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(4, 3, 32, 32)).astype(np.float32), "y": rng.integers(0, 10, 4)} for _ in range(n)]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_recomputation_changes_no_number(resnet, backend):
    runs = []
    for recompute in (False, True):
        trainer = gc.Trainer(artifacts(resnet, recompute), backend=backend)
        runs.append(([trainer.step(b) for b in batches()], trainer.state_dict()))
    rtol = 0 if backend == "numpy" else 1e-5
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=rtol)
    for name, value in runs[0][1].items():
        # onnxruntime rounds a BatchNorm's Conv-form normalisation (``rules_norm.normalize``)
        # with a Relu fused into it unlike the same Conv alone, which it is where the backward
        # reads a recomputed copy of the Relu: AdamW, whose step divides by the gradient's own
        # size, carries that rounding of gradients near 0 into their params, up to 1.4e-4 of a
        # step (lr) in three steps over six draws of batches; a wrong value read moves whole steps
        atol = 0 if backend == "numpy" else max(1e-3 * LR, rtol * np.abs(value).max())
        np.testing.assert_allclose(runs[1][1][name], value, rtol=rtol, atol=atol, err_msg=name)


def test_the_backward_reads_copies_and_the_manifest_says_so(resnet):
    plain, recomputed = artifacts(resnet, False), artifacts(resnet, True)
    assert recomputed.manifest.recompute and not plain.manifest.recompute
    copies = [n for n in recomputed.train_step.proto.graph.node if n.name.startswith("recompute/")]
    assert copies and {n.op_type for n in copies} <= CHEAP and "Relu" in {n.op_type for n in copies}
    read = {i for n in recomputed.train_step.proto.graph.node if not n.name.startswith("recompute/") for i in n.input}
    assert read & {o for c in copies for o in c.output}
    assert len(recomputed.train_step.proto.graph.node) == len(plain.train_step.proto.graph.node) + len(copies)


def test_onnxruntime_keeps_the_copies_only_when_told(resnet):
    proto = artifacts(resnet, True).train_step.proto
    ort = get_backend("ort-cpu")
    kept = [n for n in ort.prepare(proto, keep_recomputation=True).placement if n.startswith("recompute/")]
    merged = [n for n in ort.prepare(proto).placement if n.startswith("recompute/")]
    assert kept and len(merged) < len(kept)  # common-subexpression elimination merges them back
