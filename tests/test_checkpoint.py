"""graphc.checkpoint: safetensors round trip, atomic replace, corruption detected, kill mid-save."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from graphc import checkpoint as ckpt


def tensors(seed=0, n=1000):
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.standard_normal((n, 64)).astype(np.float32),
            "fc.weight.exp_avg": rng.standard_normal((n, 64)).astype(np.float32),
            "step": np.array(seed, dtype=np.int64)}


def test_round_trip_file_and_directory(tmp_path):
    meta = ckpt.CheckpointMeta(step=7, epoch=2, batch_in_epoch=3, rng={"a": 1}, roles={"step": "state"})
    for target in (tmp_path / "one.safetensors", tmp_path / "ckdir"):
        written = ckpt.save(target, tensors(3), meta)
        assert written == ckpt.resolve(target) and written.is_file()
        got, got_meta = ckpt.load(target)
        assert set(got) == set(tensors(3))
        for k, v in tensors(3).items():
            np.testing.assert_array_equal(got[k], v)
            assert got[k].dtype == v.dtype
        assert (got_meta.step, got_meta.epoch, got_meta.batch_in_epoch) == (7, 2, 3)
        assert got_meta.rng == {"a": 1}
    assert (tmp_path / "ckdir" / "checkpoint.safetensors").is_file()
    assert not list(tmp_path.glob("**/.*tmp*"))  # no temp files left behind


def test_missing_and_corrupted_checkpoints_fail_clearly(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint here"):
        ckpt.load(tmp_path / "nothing")
    path = ckpt.save(tmp_path / "c.safetensors", tensors(), ckpt.CheckpointMeta())
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # flip bits in the tensor data: the header still parses
    path.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="corrupted.*SHA-256"):
        ckpt.load(path)
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ckpt.CheckpointError, match="corrupted or truncated"):
        ckpt.load(path)
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ckpt.CheckpointError, match="not a readable graphc checkpoint"):
        ckpt.load(path)


def test_failed_replace_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "c"
    ckpt.save(target, tensors(1), ckpt.CheckpointMeta(step=1))

    def fail(*args):
        raise OSError("simulated crash at rename")

    monkeypatch.setattr(ckpt.os, "replace", fail)
    with pytest.raises(OSError, match="simulated"):
        ckpt.save(target, tensors(2), ckpt.CheckpointMeta(step=2))
    monkeypatch.undo()
    got, meta = ckpt.load(target)
    assert meta.step == 1
    np.testing.assert_array_equal(got["fc.weight"], tensors(1)["fc.weight"])
    assert not list(target.glob(".*tmp*"))


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from graphc import checkpoint as ckpt
    rng = np.random.default_rng(0)
    big = {"w": rng.standard_normal((2000, 1000)).astype(np.float32)}  # 8 MB per save
    step = 0
    while True:
        step += 1
        big["step"] = np.array(step, dtype=np.int64)
        big["w"][0, 0] = step
        ckpt.save(sys.argv[1], big, ckpt.CheckpointMeta(step=step))
        print(step, flush=True)
""")


def test_sigkill_during_save_leaves_a_loadable_checkpoint(tmp_path):
    target = tmp_path / "ck"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(target)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # let it complete a few saves, then kill it while it is writing
            assert proc.stdout.readline(), "writer died"
        time.sleep(0.013)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    got, meta = ckpt.load(target)
    assert meta.step >= 3
    assert int(got["step"]) == meta.step and got["w"][0, 0] == meta.step
    # A later save cleans up what the killed writer left and works as usual.
    ckpt.save(target, {"w": np.zeros(3, np.float32)}, ckpt.CheckpointMeta(step=99))
    assert ckpt.load(target)[1].step == 99
    assert not list(target.glob(".*tmp*"))
