"""``gc.optim.swa_utils`` weight averaging with gradient accumulation (``gc.Trainer(..., accumulate=k)``)
against torch 2.13's loop in float64: ``(loss * rows / step_rows).backward()`` per micro-batch, then
``optimizer.step()`` (with loss scaling ``scaler.step(opt); scaler.update()``) and
``avg.update_parameters(model)`` once per optimizer step; on numpy and ort-cpu. Also: equal to one
process's plain run on the k times larger batch, resumed mid-epoch bit for bit, ``update_bn``, the
averaged predict/evaluate/export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}
BACKENDS = ["numpy", "ort-cpu"]
RNG = np.random.default_rng(0)
K, ROWS = 3, 12  # a step's batch: 3 micro-batches of 4 rows
swa, torch_swa = gc.optim.swa_utils, torch.optim.swa_utils


class _Net(gc.nn.Module):
    def __init__(self, batchnorm: bool = True):
        super().__init__()
        self.fc = gc.nn.Linear(3, 6, **F64)
        self.bn = gc.nn.BatchNorm1d(6, **F64) if batchnorm else gc.nn.Identity()
        self.out = gc.nn.Linear(6, 2, **F64)

    def forward(self, x):
        return self.out(self.bn(gc.tanh(self.fc(x))))


def _twin(net: _Net):
    f64 = {"dtype": torch.float64}
    twin = torch.nn.Sequential()
    twin.add_module("fc", torch.nn.Linear(3, 6, **f64))
    twin.add_module("tanh", torch.nn.Tanh())
    twin.add_module("bn", torch.nn.BatchNorm1d(6, **f64))
    twin.add_module("out", torch.nn.Linear(6, 2, **f64))
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return twin


def _fns(module, kind: str) -> dict:
    """AveragedModel's keyword for ``kind`` from ``module`` (``gc.optim.swa_utils`` or torch's)."""
    return {"ema": {"multi_avg_fn": module.get_ema_multi_avg_fn(0.8)}, "ema1": {"avg_fn": module.get_ema_avg_fn(0.9)},
            "swa": {}}[kind]


def _arts(net, averaged, optimizer=None, **options):
    return gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                optimizer or gc.optim.SGD(0.1, momentum=0.5), averaged=averaged, **options)


def _batch(rows: int = ROWS) -> dict:
    return {"x": RNG.standard_normal((rows, 3)) * 2 + 0.5, "y": RNG.standard_normal((rows, 2))}


def _torch_micro(twin, batch, scale=lambda loss: loss):
    """torch's k backward calls on ``batch`` cut as ``np.array_split`` cuts it, each loss times its rows' share."""
    twin.train()
    for rows in np.array_split(np.arange(len(batch["x"])), K):
        x, y = torch.from_numpy(batch["x"][rows]), torch.from_numpy(batch["y"][rows])
        scale(torch.nn.functional.mse_loss(twin(x), y) * (len(rows) / len(batch["x"]))).backward()


def _assert_averaged(trainer, averaged, err: str, rtol=1e-10) -> None:
    state = trainer.state_dict()
    for name, value in averaged.module.state_dict().items():
        if value.is_floating_point():
            np.testing.assert_allclose(state[f"averaged.{name}"], value.numpy(), rtol=rtol, atol=1e-14,
                                       err_msg=f"{err} {name}")
    assert int(state["averaged.n_averaged"]) == int(averaged.n_averaged), err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,use_buffers,start,every", [("ema", True, 0, 1), ("ema1", False, 0, 1),
                                                         ("swa", True, 2, 2)])
def test_average_advances_once_per_optimizer_step_as_torch_s(tmp_path, backend, kind, use_buffers, start, every,
                                                            torch_float64):
    """6 optimizer steps of 3 micro-batches each: after each, the averaged params and BatchNorm statistics
    within 1e-10 of torch's AveragedModel updated once after ``optimizer.step()`` (when ``t > start`` and
    ``(t - start) % every == 0``), n_averaged equal; then update_bn over 3 batches gives torch's statistics,
    and the averaged predict, evaluate and checked export are torch's averaged module's eval forward."""
    net = _Net()
    trainer = gc.Trainer(_arts(net, swa.AveragedModel(net, use_buffers=use_buffers, start=start, every=every,
                                                      **_fns(swa, kind))), backend=backend, accumulate=K)
    twin = _twin(net)
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.5)
    averaged = torch_swa.AveragedModel(twin, use_buffers=use_buffers, **_fns(torch_swa, kind))
    for t in range(1, 7):
        batch = _batch()
        trainer.step(batch)
        opt.zero_grad()
        _torch_micro(twin, batch)
        opt.step()
        if t > start and (t - start) % every == 0:
            averaged.update_parameters(twin)
        _assert_averaged(trainer, averaged, f"step {t}")
    assert trainer.step_count == 6
    loader = [_batch(5) for _ in range(3)]
    swa.update_bn(loader, trainer)
    torch_swa.update_bn([torch.from_numpy(b["x"]) for b in loader], averaged)
    _assert_averaged(trainer, averaged, "update_bn")
    x = _batch(5)
    with torch.no_grad():
        want = averaged.module.eval()(torch.from_numpy(x["x"])).numpy()
        loss = torch.nn.functional.mse_loss(torch.from_numpy(want), torch.from_numpy(x["y"])).item()
    np.testing.assert_allclose(trainer.predict({"x": x["x"]}, averaged=True)["output"], want, rtol=1e-10)
    np.testing.assert_allclose(trainer.evaluate(x, averaged=True)["loss"], loss, rtol=1e-10)
    path = trainer.export_inference(tmp_path / "averaged.onnx", averaged=True)
    onnx.checker.check_model(str(path), full_check=True)
    np.testing.assert_allclose(gc.Session(gc.load(path), backend=backend).run({"x": x["x"]})["output"], want,
                               rtol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,start,every", [("ema", 0, 1), ("swa", 1, 2)])
def test_skipped_steps_count_once_as_torch_s_grad_scaler_loop(backend, kind, start, every, torch_float64):
    """Dynamic loss scaling, 3 micro-batches a step, steps 3 and 6 of 8 with an infinite label in one
    micro-batch (skipped): the average advances once per optimizer step, skipped or not, as torch's
    ``scaler.step(opt); scaler.update()`` then ``avg.update_parameters(model)``: within 1e-10 of torch's and
    n_averaged equal after every step."""
    net = _Net()
    arts = _arts(net, swa.AveragedModel(net, use_buffers=True, start=start, every=every, **_fns(swa, kind)),
                 gc.optim.AdamW(0.01), loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 10))
    trainer = gc.Trainer(arts, backend=backend, accumulate=K)
    twin = _twin(net)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    averaged = torch_swa.AveragedModel(twin, use_buffers=True, **_fns(torch_swa, kind))
    for it in range(1, 9):
        batch = _batch()
        if it in (3, 6):
            batch["y"][5, 1] = np.inf  # the second micro-batch's
        trainer.step(batch)
        opt.zero_grad()
        _torch_micro(twin, batch, scaler.scale)
        scaler.step(opt)
        scaler.update()
        if it > start and (it - start) % every == 0:
            averaged.update_parameters(twin)
        _assert_averaged(trainer, averaged, f"step {it}")
    assert trainer.skipped_steps == 2 and int(trainer.state_dict()["step"]) == 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulated_average_is_one_process_on_a_k_times_larger_batch(backend):
    """Without BatchNorm, accumulate=3 on 12-row batches averages as a plain Trainer on the same batches
    (SWA every 2nd step from step 2, AdamW with clipping): the averaged state within 1e-12 after each step."""
    net = _Net(batchnorm=False)
    arts = _arts(net, swa.AveragedModel(start=1, every=2), gc.optim.AdamW(0.01, max_grad_norm=0.05))
    whole, split = gc.Trainer(arts, backend=backend), gc.Trainer(arts, backend=backend, accumulate=K)
    for t in range(5):
        batch = _batch()
        assert split.step(batch) == pytest.approx(whole.step(batch), rel=1e-12)
        want, got = whole.state_dict(), split.state_dict()
        for name in (n for n in want if n.startswith("averaged.")):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15, err_msg=f"step {t + 1} {name}")


def test_resumed_mid_epoch_the_average_is_the_uninterrupted_run_s(tmp_path, monkeypatch):
    """Ctrl-C after optimizer step 4 (epoch 2, accumulate=2 over a loader of 6 batches an epoch) saves at
    that step's end; resumed (on ort-cpu) the averaged copy and n_averaged end as the run that never
    stopped (EMA with buffers every 2 steps)."""
    net, data = _Net(), _batch(22)
    arts = _arts(net, swa.AveragedModel(multi_avg_fn=swa.get_ema_multi_avg_fn(0.8), use_buffers=True, every=2))
    loader = lambda: gc.data.DataLoader(data, batch_size=4, shuffle=True, seed=3)  # noqa: E731
    straight = gc.Trainer(arts, backend="numpy", accumulate=2)
    straight.fit(loader(), epochs=3, progress=False, quiet=True)
    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:4")
    stopped = gc.Trainer(arts, backend="numpy", accumulate=2)
    with pytest.raises(gc.runtime.trainer.TrainingInterrupted):
        stopped.fit(loader(), epochs=3, progress=False, quiet=True, checkpoint=tmp_path / "ck")
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    assert (stopped.epoch, stopped.batch_in_epoch, stopped.step_count) == (1, 2, 4)
    resumed = gc.Trainer(tmp_path / "ck", backend="ort-cpu", accumulate=2)
    resumed.fit(loader(), epochs=3, progress=False, quiet=True)
    want, got = straight.state_dict(), resumed.state_dict()
    averaged = [n for n in want if n.startswith("averaged.")]
    assert len(averaged) == 9 and int(got["averaged.n_averaged"]) == 4  # 6 params, 2 statistics, the count
    for name in averaged:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)
