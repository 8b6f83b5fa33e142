"""``gc.optim.swa_utils``: weight averaging in train_step (EMA, SWA) against torch 2.13's
``AveragedModel.update_parameters`` after each ``optimizer.step()`` (float64, numpy and ort-cpu),
``SWALR``, ``update_bn``, a resumed run and the exported averaged model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.errors import ArtifactsError

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}
BACKENDS = ["numpy", "ort-cpu"]
swa = gc.optim.swa_utils


class _Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 4, **F64)
        self.bn = gc.nn.BatchNorm1d(4, **F64)
        self.out = gc.nn.Linear(4, 1, **F64)

    def forward(self, x):
        return self.out(gc.relu(self.bn(self.fc(x))))


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        f64 = {"dtype": torch.float64}
        self.fc, self.bn, self.out = torch.nn.Linear(3, 4, **f64), torch.nn.BatchNorm1d(4, **f64), torch.nn.Linear(4, 1, **f64)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


def _twin(net: _Net):
    twin = _TorchNet()
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v).copy()) for k, v in net.state_dict().items()})
    return twin


def _forward(twin, x):
    return twin(torch.as_tensor(x))


def _batches(n: int):
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((6, 3)) * 2 + 1, "y": rng.standard_normal((6, 1))} for _ in range(n)]


def _arts(net, averaged, optimizer=None):
    return gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                optimizer or gc.optim.SGD(0.125, momentum=0.5), averaged=averaged)


def _torch_step(twin, opt, batch):
    twin.train()
    opt.zero_grad()
    torch.nn.functional.mse_loss(_forward(twin, batch["x"]), torch.from_numpy(batch["y"])).backward()
    opt.step()


def _assert_averaged(trainer, avg_model, err=""):
    """The trainer's averaged copy equals torch's ``avg_model.module`` (params and float buffers)."""
    state = trainer.state_dict()
    for name, value in avg_model.module.state_dict().items():
        if value.is_floating_point():
            np.testing.assert_allclose(state[f"averaged.{name}"], value.numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"{err} {name}")
    assert int(state["averaged.n_averaged"]) == int(avg_model.n_averaged), err


TORCH_FNS = {"ema_multi": lambda: {"multi_avg_fn": "get_ema_multi_avg_fn", "args": (0.9,)},
             "ema": lambda: {"avg_fn": "get_ema_avg_fn", "args": (0.9,)},
             "swa_multi": lambda: {"multi_avg_fn": "get_swa_multi_avg_fn", "args": ()},
             "swa": lambda: {}}


def _fn_kwargs(module, kind):
    found = TORCH_FNS[kind]()
    args = found.pop("args", ())
    return {key: getattr(module, name)(*args) for key, name in found.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,use_buffers", [("ema_multi", True), ("ema", False), ("swa_multi", False), ("swa", True)])
def test_averaged_copy_is_torch_averaged_model_step_for_step(backend, kind, use_buffers, torch_float64):
    """6 SGD steps, the copy updated after each: every averaged param (and BatchNorm statistic, averaged with
    use_buffers, else synced) within 1e-12 of torch's AveragedModel, n_averaged equal; the averaged
    evaluate and predict are torch's averaged module's eval forward."""
    net = _Net()
    trainer = gc.Trainer(_arts(net, swa.AveragedModel(net, use_buffers=use_buffers, **_fn_kwargs(swa, kind))),
                         backend=backend)
    twin = _twin(net)
    opt = torch.optim.SGD(twin.parameters(), lr=0.125, momentum=0.5)
    averaged = torch.optim.swa_utils.AveragedModel(twin, use_buffers=use_buffers,
                                                   **_fn_kwargs(torch.optim.swa_utils, kind))
    for t, batch in enumerate(_batches(6), start=1):
        trainer.step(batch)
        _torch_step(twin, opt, batch)
        averaged.update_parameters(twin)
        _assert_averaged(trainer, averaged, f"step {t}")
    x = _batches(7)[-1]
    with torch.no_grad():
        want = _forward(averaged.module.eval(), x["x"]).numpy()
        loss = torch.nn.functional.mse_loss(torch.from_numpy(want), torch.from_numpy(x["y"])).item()
    np.testing.assert_allclose(trainer.predict({"x": x["x"]}, averaged=True)["output"], want, rtol=1e-12)
    np.testing.assert_allclose(trainer.evaluate(x, averaged=True)["loss"], loss, rtol=1e-12)
    assert abs(trainer.evaluate(x)["loss"] - loss) > 1e-6  # the live weights are another model


@pytest.mark.parametrize("backend", BACKENDS)
def test_swa_from_a_start_step_with_swalr_then_update_bn(backend, torch_float64):
    """SWA after step 3 (``start=3``), the lr a CosineAnnealingLR until then and SWALR(swa_lr=0.05,
    anneal_epochs=3) after, per step, as torch's recipe: lrs, averaged params and n_averaged equal torch's
    at every step (1e-12); update_bn over 3 batches then gives torch's update_bn statistics, and the
    averaged predict torch's averaged module's."""
    net = _Net()
    trainer = gc.Trainer(_arts(net, swa.AveragedModel(net, start=3)), backend=backend)
    twin = _twin(net)
    opt = torch.optim.SGD(twin.parameters(), lr=0.125, momentum=0.5)
    averaged = torch.optim.swa_utils.AveragedModel(twin)
    ours = (gc.optim.lr_scheduler.CosineAnnealingLR(trainer, T_max=10), swa.SWALR(trainer, 0.05, anneal_epochs=3))
    theirs = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
              torch.optim.swa_utils.SWALR(opt, 0.05, anneal_epochs=3))
    for t, batch in enumerate(_batches(8), start=1):
        trainer.step(batch)
        _torch_step(twin, opt, batch)
        late = t > 3
        if late:
            averaged.update_parameters(twin)
        ours[late].step()
        theirs[late].step()
        assert trainer.lr_group["lr"] == pytest.approx(opt.param_groups[0]["lr"], rel=1e-15), f"step {t}"
        _assert_averaged(trainer, averaged, f"step {t}")
    loader = _batches(3)
    swa.update_bn(loader, trainer)
    torch.optim.swa_utils.update_bn([torch.from_numpy(b["x"]) for b in loader], averaged)
    _assert_averaged(trainer, averaged, "update_bn")
    with torch.no_grad():
        want = _forward(averaged.module.eval(), loader[0]["x"]).numpy()
    np.testing.assert_allclose(trainer.predict({"x": loader[0]["x"]}, averaged=True)["output"], want, rtol=1e-12)


def test_swalr_lrs_are_torch_s():
    """SWALR's lr after each of 14 steps, cos and linear, anneal_epochs 0 and 5: torch's to 1e-15."""
    net = _Net()
    for strategy in ("cos", "linear"):
        for epochs in (0, 5):
            trainer = gc.Trainer(_arts(net, None), backend="numpy")
            opt = torch.optim.SGD(_twin(net).parameters(), lr=0.125)
            ours = swa.SWALR(trainer, 0.01, anneal_epochs=epochs, anneal_strategy=strategy)
            theirs = torch.optim.swa_utils.SWALR(opt, 0.01, anneal_epochs=epochs, anneal_strategy=strategy)
            for _ in range(14):
                opt.step()  # no gradients: torch's order of calls, without its warning
                ours.step()
                theirs.step()
                assert ours.get_last_lr()[0] == pytest.approx(theirs.get_last_lr()[0], rel=1e-15, abs=1e-18)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resumed_mid_run_the_average_is_bit_for_bit_the_same(tmp_path, backend):
    """EMA with buffers, checkpointed after step 3 of 6 and resumed in a new Trainer: the averaged state
    (and n_averaged) equal the uninterrupted run's exactly."""
    net, batches = _Net(), _batches(6)
    arts = _arts(net, swa.AveragedModel(multi_avg_fn=swa.get_ema_multi_avg_fn(0.9), use_buffers=True, every=2))
    whole = gc.Trainer(arts, backend=backend)
    for batch in batches:
        whole.step(batch)
    first = gc.Trainer(arts, backend=backend)
    for batch in batches[:3]:
        first.step(batch)
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = gc.Trainer(arts, backend=backend)
    resumed.load_checkpoint(tmp_path / "ckpt")
    for batch in batches[3:]:
        resumed.step(batch)
    want, got = whole.state_dict(), resumed.state_dict()
    averaged = [k for k in want if k.startswith("averaged.")]
    assert len(averaged) == 9 and int(got["averaged.n_averaged"]) == 3  # 6 params, 2 statistics, the count
    for key in averaged:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exported_averaged_model_is_torch_s_averaged_forward(tmp_path, backend, torch_float64):
    """export_inference(averaged=True) after 4 EMA steps: a checked ONNX file whose forward is torch's
    averaged module's in eval mode (1e-12); the plain export differs from it."""
    net = _Net()
    trainer = gc.Trainer(_arts(net, swa.AveragedModel(multi_avg_fn=swa.get_ema_multi_avg_fn(0.9),
                                                      use_buffers=True)), backend=backend)
    twin = _twin(net)
    opt = torch.optim.SGD(twin.parameters(), lr=0.125, momentum=0.5)
    averaged = torch.optim.swa_utils.AveragedModel(twin, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9),
                                                   use_buffers=True)
    for batch in _batches(4):
        trainer.step(batch)
        _torch_step(twin, opt, batch)
        averaged.update_parameters(twin)
    path = trainer.export_inference(tmp_path / "ema.onnx", averaged=True)
    onnx.checker.check_model(str(path), full_check=True)
    x = _batches(5)[-1]["x"]
    got = gc.Session(gc.load(path), backend=backend).run({"x": x})["output"]
    with torch.no_grad():
        np.testing.assert_allclose(got, _forward(averaged.module.eval(), x).numpy(), rtol=1e-12)
    plain = gc.Session(gc.load(trainer.export_inference(tmp_path / "live.onnx")), backend=backend).run({"x": x})
    assert np.abs(plain["output"] - got).max() > 1e-6


def test_refusals_name_the_problem():
    net = _Net()
    with pytest.raises(TypeError, match="get_ema_multi_avg_fn"):
        swa.AveragedModel(net, multi_avg_fn=lambda a, b, n: None)
    with pytest.raises(TypeError, match="get_ema_avg_fn"):
        swa.AveragedModel(net, avg_fn=swa.get_ema_multi_avg_fn(0.9))
    with pytest.raises(ValueError, match="Only one of avg_fn and multi_avg_fn"):
        swa.AveragedModel(net, avg_fn=swa.get_swa_avg_fn(), multi_avg_fn=swa.get_swa_multi_avg_fn())
    with pytest.raises(ValueError, match=r"\[0,1\]"):
        swa.get_ema_multi_avg_fn(1.5)
    with pytest.raises(ValueError, match="every"):
        swa.AveragedModel(every=0)
    with pytest.raises(TypeError, match="AveragedModel"):
        _arts(net, "ema")
    plain = gc.Trainer(_arts(net, None), backend="numpy")
    with pytest.raises(ArtifactsError, match="averaged=gc.optim.swa_utils.AveragedModel"):
        plain.evaluate(_batches(1)[0], averaged=True)
    with pytest.raises(ArtifactsError, match="no averaged weights"):
        swa.update_bn(_batches(1), plain)


def test_graphs_without_averaging_are_unchanged():
    """generate without averaged= keeps train_step's nodes and inputs as before (no averaging state)."""
    net = _Net()
    plain, averaged = _arts(net, None), _arts(net, swa.AveragedModel())
    assert plain.manifest.averaging is None
    assert not [i for i in plain.train_step.ir.graph.inputs if i.name.startswith("averaged.")]
    extra = {i.name for i in averaged.train_step.ir.graph.inputs} - {i.name for i in plain.train_step.ir.graph.inputs}
    assert extra == {"averaged.n_averaged", *(f"averaged.{n}" for n in averaged.manifest.averaging["names"])}
