"""``gc.Trainer.fit`` from a ``ray.data.Dataset`` (``gc.data.RayDataLoader``), against ``fit`` from a
``gc.data.DataLoader`` over the same rows as the oracle: float64 MLP, numpy backend, loopback Ray.
A Ray Data pipeline takes seconds here (2 cores): the data-parallel test, over 20 s, is opt-in
(``GRAPHC_RAY_DATA_DP_TESTS=1``)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import graphc as gc
from float64_models import mlp
from ray_util import ray_cluster  # noqa: F401 - the module's fixture

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
ROWS, BATCH = 22, 6  # 4 batches, the last of 4 rows


def _arts():
    return gc.training.generate(mlp(), gc.losses.mse("out", label="y"), gc.optim.AdamW(0.01, weight_decay=0.1))


def _data() -> dict[str, np.ndarray]:
    return {"x": RNG.normal(size=(ROWS, 4)), "y": RNG.normal(size=(ROWS, 2))}


def _dataset(ray, data: dict[str, np.ndarray], blocks: int = 3):
    """The rows of ``data`` as a Ray dataset of ``blocks`` blocks, through a preprocessing step."""
    rows = [{name: a[i] for name, a in data.items()} for i in range(ROWS)]
    return ray.data.from_items(rows, override_num_blocks=blocks).map_batches(lambda b: b, batch_format="numpy")


def _quiet(ray) -> None:
    ray.data.DataContext.get_current().enable_progress_bars = False


def _close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("shuffle", [False, True])
def test_fit_from_a_dataset_equals_fit_from_a_dataloader_over_the_same_rows(ray_cluster, shuffle):
    _quiet(ray_cluster)
    data, arts = _data(), _arts()
    want = gc.Trainer(arts, backend="numpy")
    history = want.fit(gc.data.DataLoader(data, BATCH, shuffle=shuffle, seed=5), epochs=2, progress=False)
    got = gc.Trainer(arts, backend="numpy")
    loader = gc.data.RayDataLoader(_dataset(ray_cluster, data), BATCH, shuffle=shuffle, seed=5)
    eval_loader = gc.data.RayDataLoader(_dataset(ray_cluster, data, blocks=2), BATCH, shuffle=False)
    result = got.fit(loader, epochs=2, eval_loader=eval_loader, progress=False)
    np.testing.assert_allclose(result.step_losses, history.step_losses, rtol=1e-12)
    assert len(result.step_losses) == 8 and loader.epoch == 2
    _close(got.params, want.params)
    assert result.epochs[-1].eval["loss"] == pytest.approx(
        want.evaluate_loader(gc.data.DataLoader(data, BATCH, shuffle=False))["loss"], rel=1e-12)


def test_a_mid_epoch_checkpoint_resumes_exactly_and_another_seed_is_refused(ray_cluster, tmp_path):
    _quiet(ray_cluster)
    data, arts = _data(), _arts()
    loader = gc.data.RayDataLoader(_dataset(ray_cluster, data), BATCH, seed=2)
    want = gc.Trainer(arts, backend="numpy")
    whole = want.fit(loader, epochs=2, progress=False)
    first = gc.Trainer(arts, backend="numpy")
    first.fit(gc.data.RayDataLoader(_dataset(ray_cluster, data), BATCH, seed=2), epochs=1, progress=False)
    first.step(gc.data.DataLoader(data, BATCH, seed=2).batch(1, 0))  # epoch 2's first batch, by hand
    first.batch_in_epoch = 1
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = gc.Trainer(arts, backend="numpy")
    resumed.load_checkpoint(tmp_path / "ckpt")
    other = gc.data.RayDataLoader(_dataset(ray_cluster, data), BATCH, seed=3)
    with pytest.raises(ValueError, match=r"resuming mid-epoch.*seed 2 \(now 3\)"):
        resumed.fit(other, epochs=2, progress=False)
    rest = resumed.fit(gc.data.RayDataLoader(_dataset(ray_cluster, data), BATCH, seed=2), epochs=2, progress=False)
    np.testing.assert_allclose(rest.step_losses, whole.step_losses[5:], rtol=1e-12)
    _close(resumed.params, want.params)


def test_bad_columns_get_the_dataloaders_errors(ray_cluster):
    _quiet(ray_cluster)
    data, trainer = _data(), gc.Trainer(_arts(), backend="numpy")
    for change, words in [({"y": None}, r"the data has no array 'y' for the model input"),
                          ({"x": data["x"].astype(np.float32)}, r"array 'x': expected dtype float64"),
                          ({"x": data["x"][:, :3]}, r"array 'x': expected size 4 on axis 1")]:
        given = {k: v for k, v in {**data, **change}.items() if v is not None}
        dl = gc.data.DataLoader(given, BATCH)
        with pytest.raises(gc.InputError, match=words) as want:
            trainer.fit(dl, epochs=1, progress=False)
        with pytest.raises(gc.InputError, match=words) as got:
            trainer.fit(gc.data.RayDataLoader(_dataset(ray_cluster, given), BATCH), epochs=1, progress=False)
        assert str(got.value) == str(want.value)
    with pytest.raises(TypeError, match="RayDataLoader takes a ray.data.Dataset, got dict"):
        gc.data.RayDataLoader(data, BATCH)
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 1, got 0"):
        gc.data.RayDataLoader(_dataset(ray_cluster, data), 0)


@pytest.mark.skipif(os.environ.get("GRAPHC_RAY_DATA_DP_TESTS") != "1",
                    reason="a Ray Data pipeline per worker and epoch, over 20 s: set GRAPHC_RAY_DATA_DP_TESTS=1")
def test_two_workers_reading_their_rows_from_a_dataset_equal_one_process(ray_cluster, monkeypatch):
    _quiet(ray_cluster)
    data, arts = _data(), _arts()
    want = gc.Trainer(arts, backend="numpy")
    history = want.fit(gc.data.DataLoader(data, BATCH, seed=4), epochs=2, progress=False)
    loader = gc.data.RayDataLoader(_dataset(ray_cluster, data), BATCH, seed=4)
    read, stream = [], gc.data.RayDataLoader._stream
    monkeypatch.setattr(gc.data.RayDataLoader, "_stream",
                        lambda self, *args, **kw: read.append(args[4]) or stream(self, *args, **kw))
    dp = gc.Trainer(arts, backend="numpy", workers=2, num_cpus=0.5, timeout_s=300)
    try:
        got = dp.fit(loader, epochs=2, progress=False)
        assert read == [("y",), ("y",)]  # the driver read the labels alone, a stream an epoch
        np.testing.assert_allclose(got.step_losses, history.step_losses, rtol=1e-12)
        _close(dp.params, want.params)
    finally:
        dp.shutdown()
