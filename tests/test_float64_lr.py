"""The learning rate of float64 params: a float64 ``lr`` input, so a float64 model steps as
torch.optim does (a float32 lr stepped it by float32(0.01), 2e-8 relative off); float32,
float16 and bfloat16 models keep their float32 lr; artifacts saved before, whose float64
params have a float32 lr (``tests/data/float64_lr32``, written by commit 5f1065e from
``float64_models.mlp()``, ``AdamW(0.01, weight_decay=0.1)``, ``mse("out", label="y")``, with a
checkpoint after ``mlp_batches(3)`` on the numpy backend), still train and resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import float64_models
import graphc as gc
from graphc.compile.training import update_model
from graphc.runtime.checkpoint import CheckpointError

FIXTURE = Path(__file__).parent / "data" / "float64_lr32"
FIXTURE_SPEC = gc.optim.AdamW(0.01, weight_decay=0.1)
STEPS = 20
SPECS = [
    gc.optim.SGD(0.01),
    gc.optim.SGD(0.01, momentum=0.9, weight_decay=0.01),
    gc.optim.SGD(0.01, momentum=0.9, nesterov=True, weight_decay=0.01, no_decay=("b",)),
    gc.optim.Adam(0.01),
    gc.optim.Adam(0.01, betas=(0.8, 0.99), weight_decay=0.01),
    gc.optim.AdamW(0.01),
    gc.optim.AdamW(0.01, weight_decay=0.1, no_decay=("b",)),
]
IDS = [f"{s.kind}-{i}" for i, s in enumerate(SPECS)]


def torch_optimizer(torch, spec, params: dict):
    """torch.optim's single-tensor optimizer for ``spec``, its ``no_decay`` params a group of their own."""
    from fnmatch import fnmatchcase

    hyper = {k: v for k, v in spec.model_dump().items() if k not in ("kind", "no_decay")}
    plain = [p for n, p in params.items() if any(fnmatchcase(n, pat) for pat in spec.no_decay)]
    decayed = [p for n, p in params.items() if not any(fnmatchcase(n, pat) for pat in spec.no_decay)]
    groups = [{"params": decayed}, *([{"params": plain, "weight_decay": 0.0}] if plain else [])]
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.kind]
    return cls(groups, foreach=False, **hyper)


def assert_relative(got: dict, want: dict, rtol: float) -> None:
    """Each tensor within ``rtol`` of its largest element."""
    for name, value in want.items():
        err = np.max(np.abs(got[name] - value)) / np.max(np.abs(value))
        assert err <= rtol, f"{name}: {err:.3g} relative"


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("schedule", [None, 0.9], ids=["constant", "exponential"])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_float64_params_step_as_torch_optim(spec, schedule, backend):
    """Twenty steps of ``linear_loss`` (its gradients are the batch itself, in both): the params
    and torch's within 1e-15 of each tensor's largest element (4e-10 to 9e-9 with the float32 lr), the lr
    set between steps as ``torch.optim.lr_scheduler.ExponentialLR(gamma=schedule)`` sets it."""
    torch = pytest.importorskip("torch")
    arts = gc.training.generate(float64_models.linear_loss(), "loss", spec)
    trainer = gc.Trainer(arts, backend=backend)
    params = {n: torch.nn.Parameter(torch.from_numpy(np.array(arts.state[n]))) for n in arts.manifest.trainable}
    opt = torch_optimizer(torch, spec, params)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, schedule) if schedule else None
    rng = np.random.default_rng(1)
    for _ in range(STEPS):
        batch = {"x": rng.normal(size=(3, 4)), "z": rng.normal(size=4)}
        trainer.step(batch)
        opt.zero_grad()
        ((params["w"] * torch.from_numpy(batch["x"])).sum() + (params["b"] * torch.from_numpy(batch["z"])).sum()).backward()
        opt.step()
        if scheduler:
            scheduler.step()
            trainer.lr = scheduler.get_last_lr()[0]
    state = trainer.state_dict()
    assert_relative(state, {n: p.detach().numpy() for n, p in params.items()}, 1e-15)
    assert state["lr"].dtype == np.float64 and state["lr"] == opt.param_groups[0]["lr"]


@pytest.mark.parametrize("spec", [SPECS[2], SPECS[4], SPECS[5]], ids=[IDS[2], IDS[4], IDS[5]])
def test_a_float64_mlp_trains_as_torch(spec):
    """A Tanh MLP under an MSE loss: its gradients round as graphc computes them, the params
    within 1e-14 of torch's after 20 steps (2.4e-9 to 3e-9 with the float32 lr)."""
    torch = pytest.importorskip("torch")
    arts = gc.training.generate(float64_models.mlp(), gc.losses.mse("out", label="y"),
                                spec.model_copy(update={"no_decay": ("fc2.bias",)}))
    trainer = gc.Trainer(arts, backend="numpy")
    params = {n: torch.nn.Parameter(torch.from_numpy(np.array(arts.state[n]))) for n in arts.manifest.trainable}
    opt = torch_optimizer(torch, spec.model_copy(update={"no_decay": ("fc2.bias",)}), params)
    for batch in float64_models.mlp_batches(STEPS):
        trainer.step(batch)
        h = torch.tanh(torch.from_numpy(batch["x"]) @ params["fc1.weight"].T + params["fc1.bias"])
        loss = torch.mean((h @ params["fc2.weight"].T + params["fc2.bias"] - torch.from_numpy(batch["y"])) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert_relative(trainer.state_dict(), {n: p.detach().numpy() for n, p in params.items()}, 1e-14)


def _lr_dtypes(arts) -> tuple[str, str]:
    entry = next(e for e in arts.manifest.graphs["train_step"].inputs if e.name == "lr")
    return entry.dtype, arts.state["lr"].dtype.name


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_narrower_models_keep_a_float32_lr(dtype):
    """Their graphs are those of before (the float32, float16 and bfloat16 train_step, gradients,
    eval and update graphs were checked byte for byte against commit 5f1065e's)."""
    model = gc.capture(gc.nn.Linear(3, 2, dtype=dtype), x=gc.spec(dtype, ("N", 3)))
    arts = gc.training.generate(model, gc.losses.mse(model.outputs[0].name, label="y"), gc.optim.Adam(0.01))
    assert _lr_dtypes(arts) == ("float32", "float32")
    assert next(s for s in update_model(arts.manifest).inputs if s.name == "lr").dtype == "float32"


def test_a_float64_param_among_float32_ones_makes_lr_float64():
    from test_fused_update import mixed_model

    arts = gc.training.generate(mixed_model(), gc.losses.mse("out", label="y"), gc.optim.SGD(0.01))
    assert _lr_dtypes(arts) == ("float64", "float64")
    assert next(s for s in update_model(arts.manifest).inputs if s.name == "lr").dtype == "float64"


def test_artifacts_saved_with_a_float32_lr_train_and_resume():
    """The fixture's checkpoint resumes on its own graphs (found beside it), its lr fed as the
    float32 they declare, set too, as an uninterrupted run of those graphs."""
    resumed = gc.Trainer(FIXTURE, backend="numpy")
    assert resumed.step_count == 3 and _lr_dtypes(resumed.artifacts) == ("float32", "float32")
    straight = gc.Trainer(FIXTURE / "artifacts", backend="numpy")
    data = float64_models.mlp_batches(6)
    for b in data[:3]:  # the checkpoint's three steps again
        straight.step(b)
    for name, value in straight.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)
    straight.lr = resumed.lr = 0.005
    assert resumed.state_dict()["lr"].dtype == np.float32
    assert [straight.step(b) for b in data[3:]] == [resumed.step(b) for b in data[3:]]
    for name, value in straight.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)


def test_the_update_rebuilt_from_a_float32_lr_manifest_takes_a_float32_lr():
    """``update_model`` (data-parallel training's update) takes the lr as the fixture's
    train_step declares it, and computes train_step's update."""
    arts = gc.training.load(FIXTURE / "artifacts")
    feeds = {**float64_models.mlp_batches(4)[3], **arts.manifest.pack(gc.Trainer(FIXTURE, backend="numpy").state_dict())}

    def take(model):
        return {s.name: feeds[s.name] for s in model.inputs if s.name in feeds}

    want = gc.Session(arts.train_step, backend="numpy").run(take(arts.train_step))
    feeds.update(gc.Session(arts.gradients, backend="numpy").run(take(arts.gradients)))
    update = update_model(arts.manifest)
    assert next(s for s in update.inputs if s.name == "lr").dtype == "float32"
    for name, value in gc.Session(update, backend="numpy").run(take(update)).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)


def test_checkpoints_cross_between_float32_and_float64_lr_graphs(tmp_path):
    """The fixture's checkpoint (lr float32) resumes on today's graphs of the same model (lr
    float64, the checkpoint's value widened), and today's checkpoint, written beside the old
    graphs in a copy of the fixture, is refused (those graphs keep Adam's second moment as an average)."""
    today = gc.training.generate(float64_models.mlp(), gc.losses.mse("out", label="y"), FIXTURE_SPEC)
    assert _lr_dtypes(today) == ("float64", "float64")
    resumed = gc.Trainer(today, backend="numpy")
    resumed.load_checkpoint(FIXTURE)
    lr = resumed.state_dict()["lr"]
    assert resumed.step_count == 3 and lr.dtype == np.float64 and lr == np.float32(0.01)
    old = gc.Trainer(FIXTURE, backend="numpy")
    data = float64_models.mlp_batches(5)
    np.testing.assert_allclose([resumed.step(b) for b in data[3:]], [old.step(b) for b in data[3:]], rtol=1e-14)
    # beside the fixture's graphs, which keep Adam's second moment as an average (format 5), today's
    # checkpoint is refused, the folder left as it was; another folder takes it and resumes
    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder)
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match="earlier format"):
        resumed.save_checkpoint(folder)
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    resumed.save_checkpoint(tmp_path / "today")
    back = gc.Trainer(tmp_path / "today", backend="numpy")
    assert back.step_count == 5 and back.state_dict()["lr"].dtype == np.float64
    np.testing.assert_array_equal(back.state_dict()["fc1.weight"], resumed.state_dict()["fc1.weight"])


def test_a_state_file_whose_lr_has_another_width_still_refuses_other_dtypes():
    """Only a hyper-parameter may come in the other float width: a float32 param is refused."""
    from graphc.runtime import checkpoint as ckpt

    expected = gc.training.load(FIXTURE / "artifacts").manifest.carried()
    have = {n: (e.dtype, e.shape) for n, e in expected.items()}
    assert ckpt.mismatch(expected, {**have, "lr": ("float64", [])}) is None
    assert "'lr' as int64" in ckpt.mismatch(expected, {**have, "lr": ("int64", [])})
    assert "'fc1.bias' as float32" in ckpt.mismatch(expected, {**have, "fc1.bias": ("float32", [8])})
