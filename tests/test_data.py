"""gc.data.DataLoader: batching, deterministic shuffling, prefetch thread, shape/dtype checks."""

import threading
import time

import numpy as np
import pytest

import graphc as gc
from graphc.runtime.data import DataLoader


def arrays(n=10):
    return {"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3), "y": np.arange(n, dtype=np.int64)}


@pytest.mark.parametrize("prefetch", [0, 2])
def test_batches_cover_the_data_and_keep_rows_together(prefetch):
    loader = DataLoader(arrays(10), batch_size=4, shuffle=True, seed=3, prefetch=prefetch)
    assert len(loader) == 3
    batches = list(loader)
    assert [len(b["y"]) for b in batches] == [4, 4, 2]
    ys = np.concatenate([b["y"] for b in batches])
    assert sorted(ys.tolist()) == list(range(10))
    for b in batches:
        np.testing.assert_array_equal(b["x"][:, 0], b["y"] * 3)
        assert b["x"].dtype == np.float32 and b["y"].dtype == np.int64


def test_drop_last_and_no_shuffle():
    loader = DataLoader(arrays(10), batch_size=4, shuffle=False, drop_last=True)
    assert len(loader) == 2
    assert [b["y"].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_is_deterministic_per_epoch_and_differs_between_epochs():
    a = DataLoader(arrays(50), batch_size=8, seed=7)
    b = DataLoader(arrays(50), batch_size=8, seed=7, prefetch=0)
    epoch0_a, epoch1_a = [np.concatenate([x["y"] for x in a]) for _ in range(2)]
    epoch0_b, epoch1_b = [np.concatenate([x["y"] for x in b]) for _ in range(2)]
    np.testing.assert_array_equal(epoch0_a, epoch0_b)
    np.testing.assert_array_equal(epoch1_a, epoch1_b)
    assert not np.array_equal(epoch0_a, epoch1_a)
    c = DataLoader(arrays(50), batch_size=8, seed=8)
    assert not np.array_equal(np.concatenate([x["y"] for x in c]), epoch0_a)


def test_iter_epoch_resumes_mid_epoch():
    loader = DataLoader(arrays(20), batch_size=3, seed=1)
    full = [b["y"].tolist() for b in loader.iter_epoch(4)]
    assert [b["y"].tolist() for b in loader.iter_epoch(4, start=2)] == full[2:]
    assert loader.batch(4, 5)["y"].tolist() == full[5]
    # a data-parallel worker reads only its rows of a batch (the last one is short)
    assert loader.batch(4, 5, slice(0, 2))["y"].tolist() + loader.batch(4, 5, slice(2, 3))["y"].tolist() == full[5]
    assert loader.batch(4, 6, slice(1, 3))["y"].tolist() == full[6][1:]
    unshuffled = DataLoader(arrays(20), batch_size=3, shuffle=False)
    assert unshuffled.batch(0, 6, slice(1, 2))["y"].tolist() == [19]


def test_prefetch_runs_ahead_on_a_background_thread():
    seen = []
    loader = DataLoader(arrays(40), batch_size=4, prefetch=3, shuffle=False)
    original = loader._gather

    def gather(order, index):
        seen.append((index, threading.current_thread().name))
        return original(order, index)

    loader._gather = gather
    it = iter(loader)
    first = next(it)
    deadline = time.time() + 2
    while len(seen) < 4 and time.time() < deadline:
        time.sleep(0.01)
    assert first["y"].tolist() == [0, 1, 2, 3]
    assert len(seen) >= 4  # batch 0 consumed, up to 3 more queued
    assert all(name == "graphc-dataloader" for _, name in seen)
    it.close()


def test_early_break_stops_the_thread():
    before = {t.ident for t in threading.enumerate()}
    loader = DataLoader(arrays(1000), batch_size=2, prefetch=2)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    deadline = time.time() + 2
    while time.time() < deadline:
        extra = [t for t in threading.enumerate() if t.ident not in before and t.name == "graphc-dataloader"]
        if not extra:
            break
        time.sleep(0.01)
    assert not extra


def test_producer_exception_is_raised_in_the_consumer():
    loader = DataLoader(arrays(20), batch_size=4, prefetch=2)

    def boom(order, index):
        if index == 2:
            raise RuntimeError("disk on fire")
        return DataLoader._gather(loader, order, index)

    loader._gather = boom
    got = []
    with pytest.raises(RuntimeError, match="disk on fire"):
        for b in loader:
            got.append(b)
    assert len(got) == 2


def test_bad_construction():
    with pytest.raises(ValueError, match="same length"):
        DataLoader({"x": np.zeros((3, 2)), "y": np.zeros(4)}, batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(arrays(), batch_size=0)
    # once taken as int(2.5) = 2, True = 1, and a seed of -1 failed at the first shuffle
    for option, value, least in (("batch_size", 2.5, 1), ("batch_size", True, 1), ("seed", -1, 0), ("prefetch", -1, 0)):
        with pytest.raises(ValueError, match=rf"{option} must be a whole number >= {least}, got {value!r}"):
            DataLoader(arrays(), **{"batch_size": 2, option: value})
    assert len(DataLoader(arrays(), batch_size=np.int64(2))) > 0
    with pytest.raises(TypeError, match="DataLoader takes a dict of arrays .*got ndarray"):
        DataLoader(np.zeros((4, 2)), batch_size=2)


def test_check_against_names_the_array_expected_and_got():
    loader = DataLoader({"x": np.zeros((10, 5), np.float32), "y": np.zeros(10, np.int64)}, batch_size=4)
    loader.check_against([gc.spec("float32", ("N", 5), name="x"), gc.spec("int64", ("N",), name="y")])
    with pytest.raises(gc.InputError, match=r"array 'x'.*size 6 on axis 1.*float32\[10,5\]"):
        loader.check_against([gc.spec("float32", ("N", 6), name="x")])
    with pytest.raises(gc.InputError, match=r"array 'y': expected dtype int32.*got int64"):
        loader.check_against([gc.spec("int32", ("N",), name="y")])
    with pytest.raises(gc.InputError, match=r"array 'x': expected rank 3"):
        loader.check_against([gc.spec("float32", ("N", 5, 1), name="x")])
    with pytest.raises(gc.InputError, match=r"no array 'label'.*arrays given: x, y"):
        loader.check_against([gc.spec("int64", ("N",), name="label")])
    with pytest.raises(gc.InputError, match="fixed batch size 8"):
        loader.check_against([gc.spec("float32", (8, 5), name="x")])
    with pytest.raises(gc.InputError, match="drop_last"):
        loader.check_against([gc.spec("float32", (4, 5), name="x")])
    DataLoader(loader.arrays, batch_size=4, drop_last=True).check_against([gc.spec("float32", (4, 5), name="x")])
