"""``gc.Trainer.fit`` from a ``ray.data.Dataset`` (``gc.data.RayDataLoader``), against a
``gc.data.DataLoader`` over the same rows as the oracle: its batches, shards and order read
directly, and ``fit`` from it (float64 MLP, numpy and ort-cpu), on one loopback Ray session for the
module; datasets whose blocks disagree (dtypes, columns, shapes, None), strings, no rows. The
data-parallel test, two workers started, is opt-in (``GRAPHC_RAY_DATA_DP_TESTS=1``)."""

from __future__ import annotations

import gc as collector
import importlib.util
import os
import threading

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


def _pieces(ray, *pieces: list) -> object:
    """A dataset of one block a piece (a list of row dicts), joined by ``union`` (the pieces' schemas kept)."""
    parts = [ray.data.from_items(rows, override_num_blocks=1) for rows in pieces]
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]


@pytest.mark.parametrize("first, second", [(np.int32, np.int64), (np.float32, np.float64), (np.uint8, np.int16),
                                           ("list", np.int32)])
def test_blocks_of_one_kind_widen_as_a_dataloader_over_the_same_rows(ray, first, second):
    """Blocks of one column in two dtypes of a kind (or equal-length lists, which Ray Data reads as
    an object array of arrays) are served in the one dtype torch and numpy give their rows,
    stacked: every batch, a block's rows alone too (was: the first block's dtype, or an object array)."""
    torch = pytest.importorskip("torch")
    rows = RNG.integers(0, 100, size=(ROWS, 3))
    head = [{"x": r.tolist() if first == "list" else r.astype(first), "y": float(i)} for i, r in enumerate(rows[:9])]
    tail = [{"x": r.astype(second), "y": float(i)} for i, r in enumerate(rows[9:], 9)]
    loader = gc.data.RayDataLoader(_pieces(ray, head, tail), 4, seed=3)
    stacked = np.concatenate([np.stack([r["x"] for r in part]) for part in (head, tail)])
    assert str(stacked.dtype) == str(torch.cat([torch.as_tensor(np.stack([r["x"] for r in part]))
                                                for part in (head, tail)]).dtype).removeprefix("torch.")
    want = gc.data.DataLoader({"x": stacked, "y": np.arange(ROWS, dtype=np.float64)}, 4, seed=3, prefetch=0)
    assert loader.arrays["x"].dtype == stacked.dtype and loader.fingerprint() == want.fingerprint()
    for epoch in (0, 1):
        for index, (got, expected) in enumerate(zip(loader.iter_epoch(epoch), want.iter_epoch(epoch))):
            _equal(got, expected, f"epoch {epoch} batch {index}")
    np.testing.assert_array_equal(loader.batch(0, 1, slice(2, 4))["x"], want.batch(0, 1, slice(2, 4))["x"])


@pytest.mark.parametrize("pieces, words", [
    ([[{"x": 1, "y": 0.5}] * 4, [{"x": 2.5, "y": 0.5}] * 3],
     r"column 'x' is int64 in block 0 \(rows 0-3\) and float64 in block 1 \(rows 4-6\): no dtype holds both"),
    ([[{"x": 1.0, "y": 0.5}] * 4, [{"x": 2.0}] * 3],
     r"column 'y' is in block 0 \(rows 0-3\) but not in block 1 \(rows 4-6\): every block"),
    ([[{"x": 1.0, "y": v} for v in (1, 2, None, 4, None)]],
     r"column 'y' has 2 null value\(s\) \(None\) in block 0 \(rows 0-4\), the first at row 2: numpy would read"),
    ([[{"x": 1.0, "y": 1.0}] * 2, [{"x": 1.0, "y": None}, {"x": 1.0, "y": "a"}]],
     r"column 'y' has 1 null value\(s\) \(None\) in block 1 \(rows 2-3\), the first at row 2"),
    ([[{"x": np.zeros((2, 2)), "y": 1.0}] * 3, [{"x": np.zeros((3, 2)), "y": 1.0}] * 2],
     r"column 'x' holds rows of different shapes: \(2, 2\) \(row 0\) and \(3, 2\) \(row 3\); a batch stacks"),
    ([[{"x": np.zeros((4, 4, 3)), "y": 1.0}, {"x": np.zeros((5, 3, 3)), "y": 1.0}]],
     r"column 'x' holds rows of different shapes: \(4, 4, 3\) \(row 0\) and \(5, 3, 3\) \(row 1\)"),
    ([[{"x": [1, 2, 3], "y": 1.0}] * 2, [{"x": [1, 2], "y": 1.0}, {"x": [1, 2, 3, 4], "y": 1.0}]],
     r"column 'x' holds rows of different shapes: \(2,\) \(row 2\) and \(4,\) \(row 3\)"),
], ids=["int-float", "missing", "none-int", "none-string", "images-blocks", "images-block", "token-lists"])
def test_columns_that_are_not_one_array_are_refused_naming_the_column_and_rows(ray, pieces, words):
    """A column in two kinds of dtype, missing from a block, with None, or of ragged rows (images,
    token lists) is an InputError at the first use, ``fit``'s too (was: silent casts, NaN, or
    numpy's errors from inside a Ray task at the batch reaching that block)."""
    with pytest.raises(gc.InputError, match=words):
        list(gc.data.RayDataLoader(_pieces(ray, *pieces), 2, shuffle=False))
    with pytest.raises(gc.InputError, match=words):
        gc.Trainer(_arts(), backend="numpy").fit(gc.data.RayDataLoader(_pieces(ray, *pieces), 2), epochs=1,
                                                 progress=False)


def test_strings_empty_data_and_data_smaller_than_a_batch_as_a_dataloader(ray):
    """A string column is served as an object array of str (torch's collate: a list of them) and a
    model input of it gets the DataLoader's dtype error; no rows, or fewer than a batch with
    ``drop_last``, give no batch and ``fit``'s DataLoader error; fewer without, one short batch."""
    rows = [{"x": RNG.normal(size=4), "y": RNG.normal(size=2), "w": w} for w in ("a", "bb", "ccc", "dddd")]
    data = {name: np.array([r[name] for r in rows], dtype=object if name == "w" else None) for name in rows[0]}
    for drop_last in (False, True):
        loader = gc.data.RayDataLoader(_pieces(ray, rows[:1], rows[1:]), 6, drop_last=drop_last, seed=1)
        want = gc.data.DataLoader(data, 6, drop_last=drop_last, seed=1, prefetch=0)
        assert len(loader) == len(want) == (0 if drop_last else 1)
        for got, expected in zip(loader.iter_epoch(0), want.iter_epoch(0), strict=True):
            _equal(got, expected, "the short batch")
        if drop_last:
            with pytest.raises(ValueError, match=r"training loader gives no batch: 4 rows in batches of 6, the last"):
                gc.Trainer(_arts(), backend="numpy").fit(loader, epochs=1, progress=False)
    trainer = gc.Trainer(_arts(), backend="numpy")  # the string column given as the model's input 'x'
    with pytest.raises(gc.InputError, match=r"array 'x': expected dtype float64") as expected:
        trainer.fit(gc.data.DataLoader({"x": data["w"], "y": data["y"]}, 2), epochs=1, progress=False)
    strings = _pieces(ray, [{"x": r["w"], "y": r["y"]} for r in rows])
    with pytest.raises(gc.InputError, match=r"array 'x': expected dtype float64") as got:
        trainer.fit(gc.data.RayDataLoader(strings, 2), epochs=1, progress=False)
    assert str(got.value) == str(expected.value)
    empty = gc.data.RayDataLoader(_pieces(ray, rows).filter(lambda r: False), 6)
    assert (empty.num_samples, len(empty), list(empty), empty.arrays) == (0, 0, [], {})
    with pytest.raises(ValueError, match=r"the training loader gives no batch: 0 rows in batches of 6$"):
        gc.Trainer(_arts(), backend="numpy").fit(empty, epochs=1, progress=False)


def _while_every_cpu_is_held(ray, target, waited: str) -> None:
    """Run ``target`` in a thread while a placement group holds every CPU of the cluster (as
    data-parallel workers may); it must end within 30 s (``waited`` says what hung otherwise). The
    CPUs are freed after, and the thread given 30 s more to end."""
    held = ray.util.placement_group([{"CPU": ray.cluster_resources()["CPU"]}])
    ray.get(held.ready(), timeout=30)
    reader = threading.Thread(target=target, daemon=True)
    try:
        reader.start()
        reader.join(30)
        assert not reader.is_alive(), waited
    finally:
        ray.util.remove_placement_group(held)
        reader.join(30)


def test_the_loaders_tasks_run_while_workers_hold_every_cpu(ray):
    """Data-parallel workers may hold all the cluster's CPUs (``workers=N`` of one CPU on N; two of
    0.5 spread over two 1-CPU nodes: ``test_distributed_multinode.py``). The loader's tasks asked
    for one CPU each, Ray's default, and the reader waited for ever: here a placement group holds
    the CPUs the workers would."""
    data = _data()
    loader = gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=2)
    assert loader.num_samples == ROWS  # the dataset's own execution ran (its map tasks ask for a CPU)
    got: dict = {}
    _while_every_cpu_is_held(ray, lambda: got.update(y=loader.column(0, 1, "y")), "the loader's tasks waited for a CPU")
    np.testing.assert_array_equal(got["y"], gc.data.DataLoader(data, BATCH, seed=2).column(0, 1, "y"))


def test_a_dataset_run_that_finds_no_cpu_fails_within_the_bound_naming_it(ray):
    """A dataset's read and map tasks ask for a CPU each: with every CPU held (here by a placement
    group), its first use waited for ever; bounded (a data-parallel fit bounds it by timeout_s)
    it fails naming the dataset's run and the likely cause, and runs once the CPUs are free."""
    from graphc.runtime.ray_waits import waits_at_most

    data = _data()
    loader = gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=2)
    failed: dict = {}

    def first_use() -> None:
        with waits_at_most(2.0), pytest.raises(gc.GraphcError) as failed["error"]:
            loader.num_samples  # noqa: B018 - runs the dataset
    _while_every_cpu_is_held(ray, first_use, "the dataset's run waited past its bound")
    message = str(failed["error"].value)
    assert "the dataset's run" in message and "more than 2 s" in message and "no free CPU" in message, message
    assert not loader.stored and loader.num_samples == ROWS


@pytest.mark.skipif(os.environ.get("GRAPHC_RAY_DATA_DP_TESTS") != "1",
                    reason="starts Ray workers twice, 12-20 s: set GRAPHC_RAY_DATA_DP_TESTS=1")
def test_workers_holding_every_cpu_fit_from_a_dataset_never_run_before(ray):
    """Opt-in. Workers of one CPU each on every CPU: ``fit`` from a loader never used ran the
    dataset inside it, where its map tasks found no CPU and ``fit`` waited for ever; the trainer
    now stops its workers to run it first, then goes on as one process would."""
    data, arts = _data(), _arts()
    want = gc.Trainer(arts, backend="numpy").fit(gc.data.DataLoader(data, BATCH, seed=4), epochs=1, progress=False)
    loader = gc.data.RayDataLoader(_dataset(ray, data), BATCH, seed=4)
    dp = gc.Trainer(arts, backend="numpy", workers=int(ray.cluster_resources()["CPU"]), timeout_s=60)
    got: dict = {}
    fitting = threading.Thread(target=lambda: got.update(h=dp.fit(loader, epochs=1, progress=False)), daemon=True)
    try:
        fitting.start()
        fitting.join(45)
        assert not fitting.is_alive(), "fit waited for the dataset's tasks"
        np.testing.assert_allclose(got["h"].step_losses, want.step_losses, rtol=1e-12)
    finally:
        dp.shutdown()


@pytest.mark.skipif(os.environ.get("GRAPHC_RAY_DATA_DP_TESTS") != "1",
                    reason="starts two Ray workers, 6-9 s: set GRAPHC_RAY_DATA_DP_TESTS=1")
def test_two_workers_reading_their_rows_from_a_dataset_equal_one_process(ray, monkeypatch):
    """Opt-in: on 2 loaded cores starting the two workers takes 4 s and their first fit 2-3 s
    (the dataset's store 0.5 s, each epoch 0.05 s), so smaller data or fewer steps cannot bring it
    under 3 s, and no other test of the module starts workers to share them with."""
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
