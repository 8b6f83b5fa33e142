"""``gc.optim.swa_utils`` weight averaging on data-parallel workers (``gc.Trainer(workers=2)``, with
``shard_optimizer=True`` and ``accumulate=k`` too), float64 on the numpy backend, on the loopback Ray
cluster the data-parallel modules share: the averaged copy equals one process's (which
test_swa_utils*.py hold to torch's AveragedModel) at the same global batch, sharded equals unsharded,
``update_bn`` is torch's on the averaged copy, a mid-epoch resume is the uninterrupted run, and the
averaged predict/evaluate/export."""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest

import graphc as gc
from ray_util import ray_cluster  # noqa: F401 - the module's fixture

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
WORKERS = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120, "backend": "numpy"}
F64 = {"dtype": "float64"}
swa, torch_swa = gc.optim.swa_utils, torch.optim.swa_utils


class _Net(gc.nn.Module):
    """Two Linears, each a flat buffer of its own with AdamW (``flat.ALONE_ELEMENTS``): one per worker
    sharded; a BatchNorm1d between them with ``batchnorm``."""

    def __init__(self, batchnorm: bool = False):
        super().__init__()
        self.a = gc.nn.Linear(3, 40, **F64)
        self.bn = gc.nn.BatchNorm1d(40, **F64) if batchnorm else gc.nn.Identity()
        self.b = gc.nn.Linear(40, 2, **F64)

    def forward(self, x):
        return self.b(self.bn(gc.tanh(self.a(x))))


def _twin(state: dict):
    """torch's twin of a BatchNorm ``_Net`` holding ``state`` (named per param)."""
    f64 = {"dtype": torch.float64}
    twin = torch.nn.Sequential()
    twin.add_module("a", torch.nn.Linear(3, 40, **f64))
    twin.add_module("tanh", torch.nn.Tanh())
    twin.add_module("bn", torch.nn.BatchNorm1d(40, **f64))
    twin.add_module("b", torch.nn.Linear(40, 2, **f64))
    twin.load_state_dict({k: torch.from_numpy(np.array(state[k])) for k in twin.state_dict()
                          if not k.endswith("num_batches_tracked")}, strict=False)
    return twin


def _arts(net, averaged, **options):
    return gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                gc.optim.AdamW(0.01, weight_decay=0.1, max_grad_norm=0.05), averaged=averaged, **options)


def _data(rows: int) -> dict:
    return {"x": RNG.standard_normal((rows, 3)), "y": RNG.standard_normal((rows, 2))}


def _loader(data):
    return gc.data.DataLoader(data, batch_size=6, shuffle=True, seed=3)  # 26 rows: 4 batches of 6, one of 2


def _averaged(trainer) -> dict:
    return {n: a for n, a in trainer.state_dict().items() if n.startswith("averaged.")}


def _same(got: dict, want: dict, rtol=1e-12, err="") -> None:
    assert set(got) == set(want) and got
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-15, err_msg=f"{err} {name}")


@pytest.mark.parametrize("sharded", [False, True], ids=["all-reduce", "zero1"])
@pytest.mark.parametrize("k", [1, 2])
def test_workers_average_as_one_process(ray_cluster, tmp_path, sharded, k):
    """2 epochs of fit (SWA from step 2 every 2nd, AdamW clipping every step): the averaged copy and
    n_averaged as one process's with the same accumulate=k to 1e-12, and the averaged evaluate, predict
    and checked export as its too."""
    data, test = _data(26), _data(5)
    arts = _arts(_Net(), swa.AveragedModel(start=1, every=2))
    one = gc.Trainer(arts, backend="numpy", accumulate=k)
    one.fit(_loader(data), epochs=2, progress=False, quiet=True)
    workers = gc.Trainer(arts, shard_optimizer=sharded, accumulate=k, **WORKERS)
    try:
        workers.fit(_loader(data), epochs=2, progress=False, quiet=True)
        assert workers.step_count == one.step_count == 2 * -(-5 // k)
        _same(_averaged(workers), _averaged(one))
        assert int(_averaged(workers)["averaged.n_averaged"]) == (one.step_count - 1) // 2  # t = 3, 5, ...
        want = one.predict({"x": test["x"]}, averaged=True)["output"]
        np.testing.assert_allclose(workers.predict({"x": test["x"]}, averaged=True)["output"], want, rtol=1e-12)
        assert workers.evaluate(test, averaged=True)["loss"] == pytest.approx(one.evaluate(test, averaged=True)["loss"],
                                                                              rel=1e-12)
        path = workers.export_inference(tmp_path / "averaged.onnx", averaged=True)
    finally:
        workers.shutdown()
    onnx.checker.check_model(str(path), full_check=True)
    np.testing.assert_allclose(gc.Session(gc.load(path), backend="numpy").run({"x": test["x"]})["output"], want,
                               rtol=1e-12)


def test_zero1_batchnorm_copy_is_unsharded_one_and_update_bn_is_torch_s(ray_cluster):
    """EMA with buffers under dynamic loss scaling (step 3 of 5 overflows: skipped, still counted), a
    BatchNorm the workers' shards normalise apart: the sharded workers' averaged params and statistics
    equal the unsharded ones' (1e-12), n_averaged 5; then update_bn over 3 batches gives torch's
    update_bn on the averaged copy, and the averaged predict torch's averaged module's eval forward."""
    arts = _arts(_Net(batchnorm=True), swa.AveragedModel(multi_avg_fn=swa.get_ema_multi_avg_fn(0.8), use_buffers=True),
                 loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 10))
    batches = [_data(8) for _ in range(5)]
    batches[2]["y"][6, 0] = np.inf  # rank 1's shard
    runs = []
    for sharded in (False, True):
        trainer = gc.Trainer(arts, shard_optimizer=sharded, **WORKERS)
        try:
            for batch in batches:
                trainer.step(batch)
            assert trainer.skipped_steps == 1
            runs.append(_averaged(trainer))
            if sharded:
                loader = [_data(6) for _ in range(3)]
                swa.update_bn(loader, trainer)
                after = trainer.state_dict()
                predicted = trainer.predict({"x": loader[0]["x"]}, averaged=True)["output"]
        finally:
            trainer.shutdown()
    _same(runs[1], runs[0])
    assert int(runs[1]["averaged.n_averaged"]) == 5
    averaged = torch_swa.AveragedModel(_twin({n[len("averaged."):]: a for n, a in runs[1].items()}))
    torch_swa.update_bn([torch.from_numpy(b["x"]) for b in loader], averaged)
    for name in ("bn.running_mean", "bn.running_var"):
        np.testing.assert_allclose(after[f"averaged.{name}"], averaged.module.state_dict()[name].numpy(), rtol=1e-12,
                                   err_msg=name)
    with torch.no_grad():
        want = averaged.module.eval()(torch.from_numpy(loader[0]["x"])).numpy()
    np.testing.assert_allclose(predicted, want, rtol=1e-12)


def test_resumed_mid_epoch_the_average_is_the_uninterrupted_run_s(ray_cluster, tmp_path, monkeypatch):
    """Ctrl-C after step 3 (epoch 1, 3 of its 5 batches) on sharded workers saves at the step's end; resumed
    on sharded workers, the averaged copy and n_averaged end bit for bit as the run that never stopped."""
    data = _data(26)
    arts = _arts(_Net(), swa.AveragedModel(multi_avg_fn=swa.get_ema_multi_avg_fn(0.8), every=2))
    straight = gc.Trainer(arts, shard_optimizer=True, **WORKERS)
    try:
        straight.fit(_loader(data), epochs=2, progress=False, quiet=True)
        want = _averaged(straight)
    finally:
        straight.shutdown()
    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:3")
    stopped = gc.Trainer(arts, shard_optimizer=True, **WORKERS)
    try:
        with pytest.raises(gc.runtime.trainer.TrainingInterrupted):
            stopped.fit(_loader(data), epochs=2, progress=False, quiet=True, checkpoint=tmp_path / "ck")
        assert (stopped.epoch, stopped.batch_in_epoch, stopped.step_count) == (0, 3, 3)
    finally:
        stopped.shutdown()
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    resumed = gc.Trainer(tmp_path / "ck", shard_optimizer=True, **WORKERS)
    try:
        resumed.fit(_loader(data), epochs=2, progress=False, quiet=True)
        got = _averaged(resumed)
    finally:
        resumed.shutdown()
    assert set(got) == set(want) and int(got["averaged.n_averaged"]) == 5
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
