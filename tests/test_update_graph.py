"""The optimizer update as a graph of its own (``gc.training.update_model``) and the gradients
graph's BatchNorm outputs: ``gradients`` then ``update`` on its gradients is ``train_step``."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.compile.training import update_model
from graphc.passes.training import adam_moments
from trainer_models import BNNet, blobs

OPTIMIZERS = {
    "sgd": gc.optim.SGD(0.1),
    "sgd-momentum": gc.optim.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": gc.optim.Adam(1e-2, weight_decay=0.01),
    "adamw": gc.optim.AdamW(1e-2, weight_decay=0.1, no_decay=("*.bias",)),
}


def _inputs(arts, graph: str, values: dict) -> dict:
    names = {e.name for e in arts.manifest.graphs[graph].inputs}
    return {n: v for n, v in values.items() if n in names}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-param"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_gradients_then_update_is_train_step(opt, fused):
    model = gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), OPTIMIZERS[opt], fused=fused)
    batch = blobs(24, seed=3)
    state = arts.manifest.pack(arts.state)
    state["step"] = np.array(4, np.int64)  # Adam's bias correction depends on it
    for name in list(state):
        if name.endswith((".exp_sum", ".exp_sum_sq", ".momentum_buffer")):
            state[name] = np.abs(np.random.default_rng(1).standard_normal(state[name].shape)).astype(np.float32)
    want = gc.Session(arts.train_step, backend="numpy").run({**batch, **_inputs(arts, "train_step", state)})
    grads = gc.Session(arts.gradients, backend="numpy").run({**batch, **_inputs(arts, "gradients", state)})
    update = update_model(arts.manifest)
    names = {s.name for s in update.inputs}
    got = gc.Session(update, backend="numpy").run({n: v for n, v in {**state, **grads}.items() if n in names})
    assert set(got) == {n for n in want if n not in ("loss", "logits") and not n.startswith("bn.running")}
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    for stat in ("bn.running_mean.next", "bn.running_var.next"):
        np.testing.assert_array_equal(grads[stat], want[stat])
    roles = {e.name: e.role for e in arts.manifest.graphs["gradients"].outputs}
    assert roles["bn.running_mean.next"] == "state" and roles["fc1.weight_grad"] == "grad"


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-param"])
@pytest.mark.parametrize(("format", "averaged"), [("graphc.training/3", (adam_moments.FIRST, adam_moments.SECOND)),
                                                  ("graphc.training/5", (adam_moments.SECOND,))],
                         ids=["format 3", "format 5"])
def test_earlier_artifacts_get_their_moments_as_averages(fused, format, averaged):
    """Artifacts saved before format 6 hold Adam's second moment as PyTorch's ``exp_avg_sq``,
    before format 4 the first too (``exp_avg``): their update (data-parallel training builds it
    from the manifest) reads and writes those averages, and steps as the sums' update does from
    the same state."""
    model = gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    spec = OPTIMIZERS["adamw"]
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), spec, fused=fused)
    grads = gc.Session(arts.gradients, backend="numpy").run(
        {**blobs(24, seed=3), **_inputs(arts, "gradients", arts.manifest.pack(arts.state))})
    rng = np.random.default_rng(1)
    state = {n: rng.standard_normal(v.shape).astype(v.dtype) if n.endswith(".exp_sum") else
             np.abs(rng.standard_normal(v.shape)).astype(v.dtype) if n.endswith(".exp_sum_sq") else v
             for n, v in arts.manifest.pack(arts.state).items()}
    state["step"] = np.array(4, np.int64)
    kept = {f".{total}": (f".{average}", np.float32(1 - spec.betas[beta])) for total, average, beta in averaged}

    def as_kept(name):  # the name that format gives a tensor, and the factor that turns a sum into its average
        suffix = next((s for s in kept if name.endswith(s)), None)
        return (name, None) if suffix is None else (name.removesuffix(suffix) + kept[suffix][0], kept[suffix][1])

    legacy = {}  # the same state as that format held it
    for name, value in state.items():
        old, factor = as_kept(name)
        legacy[old] = value if factor is None else value * factor
    runs, older = [], arts.manifest.model_copy(update={"format": format})
    for manifest, values in ((arts.manifest, state), (older, legacy)):
        update = update_model(manifest)
        names = {s.name for s in update.inputs}
        averages = {n for n in names if n.endswith(tuple(a for a, _ in kept.values()))}
        assert averages == ({n for n in legacy if n not in state} if values is legacy else set()) and len(names) > 9
        feeds = {n: v for n, v in {**values, **grads}.items() if n in names}
        runs.append(gc.Session(update, backend="numpy").run(feeds))
    now, before = runs
    for name, value in now.items():
        old, factor = as_kept(name.removesuffix(".next"))
        np.testing.assert_allclose(before[f"{old}.next"], value if factor is None else value * factor,
                                   rtol=1e-5, atol=1e-7, err_msg=name)
