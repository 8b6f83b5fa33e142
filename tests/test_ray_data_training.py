"""``gc.Trainer.fit`` from a ``ray.data.Dataset`` (``gc.data.RayDataLoader``), against a
``gc.data.DataLoader`` over the same rows as the oracle: its batches, shards and order read
directly, and ``fit`` from it (float64 MLP, numpy and ort-cpu), on one loopback Ray session for the
module. The data-parallel test, two workers started, is opt-in (``GRAPHC_RAY_DATA_DP_TESTS=1``)."""

from __future__ import annotations

import gc as collector
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


@pytest.fixture(scope="module")
def ray(ray_cluster):  # noqa: F811 - the fixture imported above
    """The module's Ray session, Ray Data's progress bars off."""
    ray_cluster.data.DataContext.get_current().enable_progress_bars = False
    return ray_cluster


def _arts():
    return gc.training.generate(mlp(), gc.losses.mse("out", label="y"), gc.optim.AdamW(0.01, weight_decay=0.1))


def _data() -> dict[str, np.ndarray]:
    return {"x": RNG.normal(size=(ROWS, 4)), "y": RNG.normal(size=(ROWS, 2))}


def _dataset(ray, data: dict[str, np.ndarray], blocks: int = 3):
    """The rows of ``data`` as a Ray dataset of ``blocks`` blocks, through a preprocessing step."""
    rows = [{name: a[i] for name, a in data.items()} for i in range(ROWS)]
    return ray.data.from_items(rows, override_num_blocks=blocks).map_batches(lambda b: b, batch_format="numpy")


def _equal(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].flags.writeable, (what, name)
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{what}: {name}")


def _close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("blocks, size, shuffle, drop_last", [(3, BATCH, True, False), (1, BATCH, False, True),
                                                              (ROWS, 4, True, True), (3, ROWS + 8, True, False)])
def test_batches_shards_and_labels_are_a_dataloaders(ray, blocks, size, shuffle, drop_last):
    data = _data()
    want = gc.data.DataLoader(data, size, shuffle=shuffle, drop_last=drop_last, seed=7, prefetch=0)
    loader = gc.data.RayDataLoader(_dataset(ray, data, blocks), size, shuffle=shuffle, drop_last=drop_last, seed=7)
    assert (len(loader), loader.num_samples, loader.fingerprint()) == (len(want), ROWS, want.fingerprint())
    for epoch in (0, 1):
        np.testing.assert_array_equal(loader.order(epoch), want.order(epoch))
        for start in (0, len(want) - 1):
            got, expected = list(loader.iter_epoch(epoch, start)), list(want.iter_epoch(epoch, start))
            assert len(got) == len(expected)
            for index, (a, b) in enumerate(zip(got, expected), start=start):
                _equal(a, b, f"epoch {epoch} batch {index}")
    for index in range(len(want)):  # as two data-parallel workers and their driver read epoch 1
        rows = min(size, ROWS - index * size)
        for shard in (slice(0, rows // 2), slice(rows // 2, rows)):
            _equal(loader.batch(1, index, shard), want.batch(1, index, shard), f"batch {index} rows {shard}")
        np.testing.assert_array_equal(loader.column(1, index, "y"), want.column(1, index, "y"))


@pytest.mark.parametrize("backend, shuffle", [("numpy", False), ("numpy", True), ("ort-cpu", True)])
def test_fit_from_a_dataset_equals_fit_from_a_dataloader_over_the_same_rows(ray, backend, shuffle):
    data, arts = _data(), _arts()
    want = gc.Trainer(arts, backend=backend)
    history = want.fit(gc.data.DataLoader(data, BATCH, shuffle=shuffle, seed=5), epochs=2, progress=False)
    got = gc.Trainer(arts, backend=backend)
    loader = gc.data.RayDataLoader(_dataset(ray, data), BATCH, shuffle=shuffle, seed=5)
    eval_loader = gc.data.RayDataLoader(_dataset(ray, data, blocks=2), BATCH, shuffle=False)
    result = got.fit(loader, epochs=2, eval_loader=eval_loader, progress=False)
    np.testing.assert_allclose(result.step_losses, history.step_losses, rtol=1e-12)
    assert len(result.step_losses) == 8 and loader.epoch == 2
    _close(got.params, want.params)
    assert result.epochs[-1].eval["loss"] == pytest.approx(
        want.evaluate_loader(gc.data.DataLoader(data, BATCH, shuffle=False))["loss"], rel=1e-12)


def test_a_mid_epoch_checkpoint_resumes_exactly_and_another_seed_is_refused(ray, tmp_path):
    data, arts = _data(), _arts()
    loader = gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=2)
    want = gc.Trainer(arts, backend="numpy")
    whole = want.fit(loader, epochs=2, progress=False)
    first = gc.Trainer(arts, backend="numpy")
    first.fit(gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=2), epochs=1, progress=False)
    first.step(gc.data.DataLoader(data, BATCH, seed=2).batch(1, 0))  # epoch 2's first batch, by hand
    first.batch_in_epoch = 1
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = gc.Trainer(arts, backend="numpy")
    resumed.load_checkpoint(tmp_path / "ckpt")
    other = gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=3)
    with pytest.raises(ValueError, match=r"resuming mid-epoch.*seed 2 \(now 3\)"):
        resumed.fit(other, epochs=2, progress=False)
    rest = resumed.fit(gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=2), epochs=2, progress=False)
    np.testing.assert_allclose(rest.step_losses, whole.step_losses[5:], rtol=1e-12)
    _close(resumed.params, want.params)


def test_bad_columns_get_the_dataloaders_errors(ray):
    data, trainer = _data(), gc.Trainer(_arts(), backend="numpy")
    for change, words in [({"y": None}, r"the data has no array 'y' for the model input"),
                          ({"x": data["x"].astype(np.float32)}, r"array 'x': expected dtype float64"),
                          ({"x": data["x"][:, :3]}, r"array 'x': expected size 4 on axis 1")]:
        given = {k: v for k, v in {**data, **change}.items() if v is not None}
        dl = gc.data.DataLoader(given, BATCH, shuffle=False)
        with pytest.raises(gc.InputError, match=words) as want:
            trainer.fit(dl, epochs=1, progress=False)
        with pytest.raises(gc.InputError, match=words) as got:
            trainer.fit(gc.data.RayDataLoader(_dataset(ray, given), BATCH, shuffle=False), epochs=1, progress=False)
        assert str(got.value) == str(want.value)
    with pytest.raises(TypeError, match="RayDataLoader takes a ray.data.Dataset, got dict"):
        gc.data.RayDataLoader(data, BATCH)
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 1, got 0"):
        gc.data.RayDataLoader(_dataset(ray, data), 0)


@pytest.mark.skipif(os.environ.get("GRAPHC_RAY_DATA_DP_TESTS") != "1",
                    reason="starts two Ray workers, about 7 s: set GRAPHC_RAY_DATA_DP_TESTS=1")
def test_two_workers_reading_their_rows_from_a_dataset_equal_one_process(ray, monkeypatch):
    data, arts = _data(), _arts()
    want = gc.Trainer(arts, backend="numpy")
    history = want.fit(gc.data.DataLoader(data, BATCH, seed=4), epochs=2, progress=False)
    loader = gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=4)
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


def test_no_stream_left_open_logs_after_ray_shuts_down_last_in_module(ray, capfd, caplog):
    """Streams read to their end, closed by ``close`` and by a ``fit`` that stopped mid-epoch leave
    nothing that logs Ray's "not initialized" errors once Ray is shut down. Ends the module's Ray
    session, so it stays the module's last test."""
    data = _data()
    loader = gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=1)
    for index in range(len(loader)):  # as a data-parallel driver reads the labels
        loader.column(0, index, "y")
    part = loader.iter_epoch(1)
    next(part)
    loader.close()
    with pytest.raises(StopIteration):
        next(part)
    data["x"][14, 0] = np.nan  # in batch 3 of 4
    bad = gc.data.RayDataLoader(_dataset(ray, data), BATCH, shuffle=False)
    with pytest.raises(gc.runtime.trainer.TrainingFailed, match="batch 3") as failed:
        gc.Trainer(_arts(), backend="numpy").fit(bad, epochs=1, progress=False)
    capfd.readouterr()
    caplog.clear()
    ray.shutdown()
    del loader, part, bad, failed  # what still held a stream goes now
    collector.collect()
    assert "not initialized" not in capfd.readouterr().err + caplog.text
