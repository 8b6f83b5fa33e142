"""``gc.optim.swa_utils`` weight averaging in the train_step variants the plain MLP tests do not
reach, against torch 2.13's ``AveragedModel.update_parameters`` (float64, numpy and ort-cpu):
conv weights train_step holds in another axis order (``Manifest.orders``, fused and per-param
updates; torch's SWA + ``update_bn`` recipe through a checkpoint to the export) and loss scaling's
skipped steps (torch's ``scaler.step(opt); scaler.update(); avg.update_parameters(model)`` loop).
accumulate=k: test_swa_utils_accumulate.py; workers=N: test_swa_utils_distributed.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}
BACKENDS = ["numpy", "ort-cpu"]
RNG = np.random.default_rng(0)
swa, torch_swa = gc.optim.swa_utils, torch.optim.swa_utils


class _Cnn(gc.nn.Module):
    """Conv 3x3 (2 -> 8 channels, 4x4 maps: a product reading x's pixels, its weight held as
    [Co, kh, kw, Ci]) -> ReLU -> BatchNorm2d -> Linear."""

    def __init__(self):
        super().__init__()
        self.conv = gc.nn.Conv2d(2, 8, 3, padding=1, **F64)
        self.bn = gc.nn.BatchNorm2d(8, **F64)
        self.fc = gc.nn.Linear(8 * 4 * 4, 3, **F64)

    def forward(self, x):
        return self.fc(gc.flatten(self.bn(gc.relu(self.conv(x))), 1))


class _TorchCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        f64 = {"dtype": torch.float64}
        self.conv, self.bn = torch.nn.Conv2d(2, 8, 3, padding=1, **f64), torch.nn.BatchNorm2d(8, **f64)
        self.fc = torch.nn.Linear(8 * 4 * 4, 3, **f64)

    def forward(self, x):
        return self.fc(torch.flatten(self.bn(torch.relu(self.conv(x))), 1))


class _Mlp(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.out = gc.nn.Linear(3, 4, **F64), gc.nn.BatchNorm1d(4, **F64), gc.nn.Linear(4, 2, **F64)

    def forward(self, x):
        return self.out(self.bn(gc.tanh(self.fc(x))))


class _TorchMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        f64 = {"dtype": torch.float64}
        self.fc, self.bn = torch.nn.Linear(3, 4, **f64), torch.nn.BatchNorm1d(4, **f64)
        self.out = torch.nn.Linear(4, 2, **f64)

    def forward(self, x):
        return self.out(self.bn(torch.tanh(self.fc(x))))


def _twin(net, cls):
    twin = cls()
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return twin


def _fns(module, kind: str) -> dict:
    """AveragedModel's keyword for ``kind`` (EMA 0.8 over all params at once, or SWA) from
    ``module`` (``gc.optim.swa_utils`` or torch's)."""
    return {"multi_avg_fn": module.get_ema_multi_avg_fn(0.8)} if kind == "ema" else {}


def _assert_averaged(trainer, averaged, err: str) -> None:
    state = trainer.state_dict()
    for name, value in averaged.module.state_dict().items():
        if value.is_floating_point():
            np.testing.assert_allclose(state[f"averaged.{name}"], value.numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"{err} {name}")
    assert int(state["averaged.n_averaged"]) == int(averaged.n_averaged), err


def _cnn_batches(n: int) -> list[dict]:
    return [{"x": RNG.standard_normal((16, 2, 4, 4)), "y": RNG.standard_normal((16, 3))} for _ in range(n)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind", ["ema", "swa"])
def test_held_conv_weights_average_as_torch_s(tmp_path, backend, fused, kind, torch_float64):
    """A CNN whose conv weight train_step holds as [Co, kh, kw, Ci] (``orders``), use_buffers=True, 5 AdamW
    steps: its averaged params and BatchNorm statistics within 1e-12 of torch's AveragedModel at every
    step, and the averaged predict and checked export equal torch's averaged eval forward (1e-12)."""
    net = _Cnn()
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 2, 4, 4))), gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(0.01, weight_decay=0.1), fused=fused,
                                averaged=swa.AveragedModel(net, use_buffers=True, **_fns(swa, kind)))
    held = {e.name: e.shape for e in arts.manifest.graphs["train_step"].inputs}
    assert arts.manifest.orders == {"conv.weight": [0, 2, 3, 1]}
    assert held["conv.weight"] == held["averaged.conv.weight"] == [8, 3, 3, 2]
    trainer = gc.Trainer(arts, backend=backend)
    twin = _twin(net, _TorchCnn)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.01, weight_decay=0.1)
    averaged = torch_swa.AveragedModel(twin, use_buffers=True, **_fns(torch_swa, kind))
    for t, batch in enumerate(_cnn_batches(5), start=1):
        trainer.step(batch)
        opt.zero_grad()
        torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"])).backward()
        opt.step()
        averaged.update_parameters(twin)
        _assert_averaged(trainer, averaged, f"step {t}")
    x = RNG.standard_normal((5, 2, 4, 4))
    with torch.no_grad():
        want = averaged.module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(trainer.predict({"x": x}, averaged=True)["output"], want, rtol=1e-12, atol=1e-14)
    path = trainer.export_inference(tmp_path / "averaged.onnx", averaged=True)
    onnx.checker.check_model(str(path), full_check=True)
    got = gc.Session(gc.load(path), backend=backend).run({"x": x})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fused", [True, False])
def test_conv_net_update_bn_checkpoint_and_export_are_torch_s(tmp_path, backend, fused, torch_float64):
    """torch's SWA recipe on the CNN: SWA from step 2 of 5 (no use_buffers), then ``update_bn`` over 3
    batches (ort-cpu raised 'Failed to find NodeArg with name: conv.weight'); the averaged statistics
    within 1e-12 of torch's update_bn, and a checkpoint taken after it resumes into a Trainer whose
    checked averaged export is torch's averaged module in eval mode (1e-12)."""
    net = _Cnn()
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 2, 4, 4))), gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(0.01, weight_decay=0.1), fused=fused,
                                averaged=swa.AveragedModel(net, start=1))
    trainer = gc.Trainer(arts, backend=backend)
    twin = _twin(net, _TorchCnn)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.01, weight_decay=0.1)
    averaged = torch_swa.AveragedModel(twin)
    for t, batch in enumerate(_cnn_batches(5), start=1):
        trainer.step(batch)
        opt.zero_grad()
        torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"])).backward()
        opt.step()
        if t > 1:
            averaged.update_parameters(twin)
    loader = [{"x": RNG.standard_normal((5, 2, 4, 4)) + 1.0} for _ in range(3)]
    swa.update_bn(loader, trainer)
    torch_swa.update_bn([torch.from_numpy(b["x"]) for b in loader], averaged)
    _assert_averaged(trainer, averaged, "update_bn")
    trainer.save_checkpoint(tmp_path / "ck")
    path = gc.Trainer(tmp_path / "ck", backend=backend).export_inference(tmp_path / "swa.onnx", averaged=True)
    onnx.checker.check_model(str(path), full_check=True)
    x = RNG.standard_normal((4, 2, 4, 4))
    with torch.no_grad():
        want = averaged.module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(gc.Session(gc.load(path), backend=backend).run({"x": x})["output"], want,
                               rtol=1e-12, atol=1e-14)


def _scaled_batches(n: int, overflow=(2, 5)) -> list[dict]:
    """``n`` batches; those at ``overflow`` have an infinite label entry (an inf gradient: a skipped step)."""
    out = []
    for k in range(n):
        y = RNG.standard_normal((6, 2)) * 0.5
        if k in overflow:
            y[0, 0] = np.inf
        out.append({"x": RNG.standard_normal((6, 3)), "y": y})
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,start,every", [("ema", 0, 1), ("swa", 1, 2)])
def test_skipped_steps_average_as_torch_s_grad_scaler_loop(backend, kind, start, every, torch_float64):
    """Dynamic loss scaling whose steps 3 and 6 of 8 overflow (skipped): the average is updated per
    train_step call, skipped or not, as torch's loop ``scaler.step(opt); scaler.update()`` then
    ``if it > start and (it - start) % every == 0: avg.update_parameters(model)``; its params and
    BatchNorm statistics (use_buffers) within 1e-12 of torch's and n_averaged equal at every step."""
    net = _Mlp()
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(0.01), loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 10),
                                averaged=swa.AveragedModel(net, use_buffers=True, start=start, every=every,
                                                           **_fns(swa, kind)))
    trainer = gc.Trainer(arts, backend=backend)
    twin = _twin(net, _TorchMlp)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    averaged = torch_swa.AveragedModel(twin, use_buffers=True, **_fns(torch_swa, kind))
    for it, batch in enumerate(_scaled_batches(8), start=1):
        trainer.step(batch)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if it > start and (it - start) % every == 0:
            averaged.update_parameters(twin)
        _assert_averaged(trainer, averaged, f"call {it}")
    assert trainer.skipped_steps == 2 and int(trainer.state_dict()["step"]) == 6

