"""Buffers a training-mode forward writes (``self.ema.mul_(d).add_(...)``, ``self.n = self.n + 1``,
spectral norm's power iteration on ``u``/``v``) are training state: train_step outputs their next
value, the Trainer carries it (checkpoints and exact resume included), eval/inference read the stored
value, export_inference folds the trained one in; no gradient flows through a write. Against torch
(float64, AdamW) on numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.utils.parametrizations  # noqa: F401 - importable as torch's
from graphc.nn import utils as U
from graphc.passes.values import BUFFER_UPDATE_KEY, BUFFER_WRITE_KEY

torch = pytest.importorskip("torch")

try:
    from torch_grad_util import assert_step_matches_torch
    from trainer_models import straight_and_resumed
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch
    from tests.trainer_models import straight_and_resumed

F64 = {"dtype": "float64"}
DECAY = 0.75


class _EMA(gc.nn.Module):
    """A Linear whose output is centred by an EMA of its batch means, and a call counter."""

    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 2, **F64)
        self.ema = gc.nn.Parameter(np.array([0.5, -0.25]), buffer=True, **F64)
        self.register_buffer("calls", np.array(0, np.int64))

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            with gc.no_grad():
                self.ema.mul_(DECAY).add_((1 - DECAY) * y.mean(0))
            self.calls = self.calls + 1  # a write is detached with no_grad or without
        return y - self.ema


class _TorchEMA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2, dtype=torch.float64)
        self.register_buffer("ema", torch.tensor([0.5, -0.25], dtype=torch.float64))
        self.register_buffer("calls", torch.tensor(0))

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            with torch.no_grad():
                self.ema.mul_(DECAY).add_((1 - DECAY) * y.mean(0))
                self.calls = self.calls + 1
        return y - self.ema


def _twin(net: gc.nn.Module, twin: torch.nn.Module) -> torch.nn.Module:
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return twin


def _batches(n: int, features: int = 3, out: int = 2) -> list[dict]:
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((4, features)) + 1, "y": rng.standard_normal((4, out))} for _ in range(n)]


def _artifacts(net: gc.nn.Module, features: int = 3):
    model = gc.capture(net, training=True, x=gc.spec("float64", ("N", features)))
    return gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(lr=0.0625))


def _train_like_torch(arts, twin, batches, backends=("numpy",), checkpoint=None, resume_at=None):
    """Step a Trainer and ``twin`` (torch.optim.AdamW) through ``batches``, each step against torch
    (``assert_step_matches_torch``: loss and every state_dict entry, buffers included); at
    ``resume_at`` the run is saved to ``checkpoint`` and resumed by a new Trainer on the next backend."""
    opt = torch.optim.AdamW(twin.parameters(), lr=0.0625)
    trainer = gc.Trainer(arts, backend=backends[0])
    for step, batch in enumerate(batches):
        if step == resume_at:
            trainer.save_checkpoint(checkpoint)
            trainer = gc.Trainer(arts, backend=backends[-1])
            trainer.load_checkpoint(checkpoint)
        x, y = (torch.from_numpy(batch[k]) for k in ("x", "y"))
        assert_step_matches_torch(trainer, batch, opt, lambda x=x, y=y: torch.nn.functional.mse_loss(twin(x), y),
                                  twin, step, rtol=1e-9)
    return trainer


def test_ema_buffer_and_counter_are_carried_like_torch_through_a_resume(tmp_path):
    net = _EMA()
    arts = _artifacts(net)
    assert arts.manifest.feeds["ema.next"] == "ema" and arts.manifest.feeds["calls.next"] == "calls"
    roles = {e.name: e.role for e in arts.manifest.graphs["train_step"].inputs}
    assert roles["ema"] == roles["calls"] == "state"
    trainer = _train_like_torch(arts, _twin(net, _TorchEMA()), _batches(5), ("ort-cpu", "numpy"),
                                tmp_path / "ckpt", resume_at=3)
    assert int(trainer.state_dict()["calls"]) == 5


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    straight, resumed = straight_and_resumed(_artifacts(_EMA()), _batches(6), 2, tmp_path / "ckpt")
    want, got = straight.state_dict(), resumed.state_dict()
    assert set(want) == set(got) and not np.array_equal(want["ema"], _EMA().state_dict()["ema"])
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_eval_and_inference_read_the_stored_buffer_and_export_folds_the_trained_one(tmp_path):
    net = _EMA()
    arts = _artifacts(net)
    twin = _twin(net, _TorchEMA())
    trainer = _train_like_torch(arts, twin, _batches(3))
    assert "ema" not in [v.name for v in arts.inference.inputs]
    assert not any(BUFFER_WRITE_KEY in n.metadata_props for g in (arts.eval, arts.inference) for n in g.graph)
    x = _batches(4)[-1]["x"]
    state = trainer.state_dict()
    with torch.no_grad():
        want = twin.eval()(torch.from_numpy(x)).numpy()  # torch's eval forward writes nothing either
    np.testing.assert_allclose(state["ema"], twin.ema.numpy(), rtol=1e-12)
    feeds = {"x": x, "y": np.zeros((4, 2)), **trainer.params, "ema": state["ema"]}
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(arts.eval, backend=backend).run(feeds)
        np.testing.assert_allclose(got["output"], want, rtol=1e-12, err_msg=backend)
        assert set(got) == {"loss", "output"}  # no update computed
    path = trainer.export_inference(tmp_path / "model.onnx")
    onnx.checker.check_model(onnx.load(path), full_check=True)
    exported = gc.load(path)
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(exported, backend=backend).run({"x": x})["output"], want, rtol=1e-12)


def test_the_marks_survive_save_and_load(tmp_path):
    model = gc.capture(_EMA(), training=True, x=gc.spec("float64", ("N", 3)))
    marks = {n.metadata_props[BUFFER_UPDATE_KEY] for n in model.graph if BUFFER_UPDATE_KEY in n.metadata_props}
    assert marks == {"ema", "calls"}
    model.save(tmp_path / "ema.onnx")
    loaded = gc.load(tmp_path / "ema.onnx")
    arts = gc.training.generate(loaded, gc.losses.mse("output", label="y"), gc.optim.AdamW(lr=0.0625))
    assert {arts.manifest.feeds[f"{b}.next"] for b in ("ema", "calls")} == {"ema", "calls"}
    batch = _batches(1)[0]
    runs = [gc.Trainer(a, backend="numpy") for a in (arts, _artifacts(_EMA()))]
    for trainer in runs:
        trainer.step(batch)
    np.testing.assert_array_equal(runs[0].state_dict()["ema"], runs[1].state_dict()["ema"])


def test_no_gradient_flows_through_a_write():
    class Leak(gc.nn.Module):  # the write reads the weight; the output reads the written buffer
        def __init__(self):
            super().__init__()
            self.w = gc.nn.Parameter(np.array([1.5, -2.0]), **F64)
            self.u = gc.nn.Parameter(np.zeros(2), buffer=True, **F64)

        def forward(self, x):
            self.u.copy_(self.w * self.w)
            return x * self.w + self.u

    model = gc.capture(Leak(), training=True, x=gc.spec("float64", ("N", 2)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    x, y = np.ones((1, 2)), np.zeros((1, 2))
    got = gc.Session(arts.gradients, backend="numpy").run({"x": x, "y": y})
    w = np.array([1.5, -2.0])
    # d/dw mean((x*w + stop(w*w))**2) = 2 (x*w + w*w) x / 2: no 2w term from the write
    np.testing.assert_allclose(got["w_grad"], (x[0] * w + w * w) * x[0], rtol=1e-12)
    np.testing.assert_allclose(got["u.next"], w * w)


SPECTRAL = {"old": (U.spectral_norm, lambda: torch.nn.utils.spectral_norm, ("weight_orig", "weight_u", "weight_v")),
            "parametrizations": (U.parametrizations.spectral_norm,
                                 lambda: torch.nn.utils.parametrizations.spectral_norm,
                                 ("parametrizations.weight.original", "parametrizations.weight.0._u",
                                  "parametrizations.weight.0._v"))}


def _spectral_pair(api: str, iterations: int):
    """A Linear(4, 3) under spectral norm, then a Linear(3, 2), in graphc and (same values) torch."""
    norm, torch_norm, _ = SPECTRAL[api]
    net = gc.nn.Sequential(norm(gc.nn.Linear(4, 3, **F64), n_power_iterations=iterations), gc.nn.Tanh(),
                           gc.nn.Linear(3, 2, **F64))
    twin = torch.nn.Sequential(torch_norm()(torch.nn.Linear(4, 3, dtype=torch.float64),
                                            n_power_iterations=iterations),
                               torch.nn.Tanh(), torch.nn.Linear(3, 2, dtype=torch.float64))
    return net, _twin(net, twin)


@pytest.mark.parametrize("iterations", [1, 2])
@pytest.mark.parametrize("api", list(SPECTRAL))
def test_spectral_norm_trains_u_v_and_weight_like_torch(api, iterations, tmp_path):
    net, twin = _spectral_pair(api, iterations)
    arts = _artifacts(net.train(), features=4)
    keys = SPECTRAL[api][2]
    assert {arts.manifest.feeds[f"0.{k}.next"] for k in keys[1:]} == {f"0.{k}" for k in keys[1:]}
    before = net.state_dict()
    trainer = _train_like_torch(arts, twin.train(), _batches(4, 4), ("ort-cpu", "numpy"), tmp_path / "c", 2)
    state = trainer.state_dict()
    for key in keys:  # they moved (the checks against torch above are not of values at rest)
        assert not np.allclose(state[f"0.{key}"], before[f"0.{key}"]), key
    x = _batches(5, 4)[-1]["x"]
    twin.eval()
    with torch.no_grad():
        want = twin(torch.from_numpy(x)).numpy()
        weight = twin[0].weight.numpy()  # orig / sigma from the trained u, v (eval: no iteration)
    mat, u, v = (state[f"0.{k}"] for k in keys)
    np.testing.assert_allclose(mat / (u @ mat @ v), weight, rtol=1e-10)
    got = gc.Session(arts.eval, backend="ort-cpu").run({"x": x, "y": np.zeros((4, 2)), **trainer.params,
                                                          **{f"0.{k}": state[f"0.{k}"] for k in keys[1:]}})
    np.testing.assert_allclose(got["output"], want, rtol=1e-10)
    exported = gc.load(trainer.export_inference(tmp_path / "sn.onnx"))
    np.testing.assert_allclose(gc.Session(exported, backend="numpy").run({"x": x})["output"], want, rtol=1e-10)


@pytest.mark.parametrize("api", list(SPECTRAL))
def test_spectral_norm_in_eval_mode_reads_u_and_v_as_stored(api):
    net, twin = _spectral_pair(api, 1)
    model = gc.capture(net, x=gc.spec("float64", ("N", 4)))
    assert not any(BUFFER_WRITE_KEY in n.metadata_props for n in model.graph)
    x = _batches(1, 4)[0]["x"]
    with torch.no_grad():
        want = twin.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(gc.Session(model, backend="numpy").run({"x": x})["output"], want, rtol=1e-10)


class _Writer(gc.nn.Module):
    def __init__(self, write):
        super().__init__()
        self.register_buffer("u", np.zeros(3, np.float32))
        self.write = write

    def forward(self, x):
        self.write(self, x)
        return x + self.u


X = gc.spec("float32", ("N", 3))


def test_a_write_in_eval_mode_is_refused_by_name_and_line():
    with pytest.raises(gc.CaptureError, match=r"write into the buffer u in eval mode at .*test_buffer_updates.py:\d+.*"
                                              r"if self.training"):
        gc.capture(_Writer(lambda m, x: m.u.add_(1.0)), x=X)


def test_a_write_into_a_buffer_of_a_closed_over_module_is_refused():
    writer = _Writer(lambda m, x: m.u.add_(1.0)).train()
    with pytest.raises(gc.CaptureError, match=r"in-place write into the parameter or buffer _writer.u .*would not "
                                              r"persist"):
        gc.capture(lambda x: writer(x), x=X)


@pytest.mark.parametrize("write, match", [
    (lambda m, x: setattr(m, "u", x.sum(0, keepdim=True)), r"shape \(1, 3\) is not the written tensor's \(3,\)"),
    (lambda m, x: setattr(m, "u", x.sum(0).double()), r"dtype float64 is not the written tensor's float32"),
    (lambda m, x: m.u.unsqueeze_(0), r"shape-changing in-place method on u, which is a buffer"),
], ids=["shape", "dtype", "unsqueeze_"])
def test_a_write_that_changes_the_buffer_is_refused(write, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(_Writer(write), training=True, x=X)


def test_assignment_and_view_writes_are_recorded_and_read_after():
    def write(m, x):
        m.u = x.mean(0)
        m.u[0] = 7.0

    model = gc.capture(_Writer(write), training=True, x=X)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(gc.Session(model, backend="numpy").run({"x": x})["output"],
                               x + np.array([7.0, 2.5, 3.5], np.float32))
    writes = [n.metadata_props for n in model.graph if BUFFER_WRITE_KEY in n.metadata_props]
    assert [w[BUFFER_WRITE_KEY] for w in writes] == ["u", "u"] and BUFFER_UPDATE_KEY in writes[-1]


def test_writing_a_batchnorm_statistic_is_refused_by_name():
    class Meddle(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = gc.nn.Linear(3, 3)
            self.bn = gc.nn.BatchNorm1d(3)

        def forward(self, x):
            self.bn.running_mean.zero_()
            return self.bn(self.fc(x))

    model = gc.capture(Meddle(), training=True, x=X)
    with pytest.raises(gc.GraphError, match=r"buffer 'bn.running_mean'.*is a BatchNorm running statistic"):
        gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))


def test_no_grad_stops_gradients_like_torch():
    def f(x, w):
        with gc.no_grad():
            s = (x * w).sum() * x  # reads x and w from outside the block
        return (x * w * s).sum() + w.sum()

    x, w = np.array([0.5, -1.5, 2.0]), np.array([1.25, 0.75, -0.5])
    model = gc.capture(f, x=gc.spec("float64", (3,)), w=gc.spec("float64", (3,)))
    got = gc.Session(gc.grad(model, "output", wrt=["x", "w"]), backend="numpy").run({"x": x, "w": w})
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    with torch.no_grad():
        ts = (tx * tw).sum() * tx
    want = (tx * tw * ts).sum() + tw.sum()
    want.backward()
    np.testing.assert_allclose(got["output"], want.item(), rtol=1e-12)
    np.testing.assert_allclose(got["x_grad"], tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got["w_grad"], tw.grad.numpy(), rtol=1e-12)
    with gc.no_grad():  # outside a capture: nothing to do, as torch's outside autograd
        pass
