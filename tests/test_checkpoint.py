"""graphc.runtime.checkpoint: safetensors round trip, atomic replace, corruption detected, kill mid-save."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from graphc.runtime import checkpoint as ckpt
from graphc.tensorfile import read_header


def tensors(seed=0, n=1000):
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.standard_normal((n, 64)).astype(np.float32),
            "fc.weight.exp_avg": rng.standard_normal((n, 64)).astype(np.float32),
            "step": np.array(seed, dtype=np.int64)}


def test_round_trip_file_and_directory(tmp_path):
    rng = np.random.default_rng(5).bit_generator.state
    meta = ckpt.CheckpointMeta(step=7, epoch=2, batch_in_epoch=3, rng=rng, roles={"step": "state"})
    for target in (tmp_path / "one.safetensors", tmp_path / "ckdir"):
        written = ckpt.save(target, tensors(3), meta)
        assert written == ckpt.resolve(target) and written.is_file()
        got, got_meta = ckpt.load(target)
        assert set(got) == set(tensors(3))
        for k, v in tensors(3).items():
            np.testing.assert_array_equal(got[k], v)
            assert got[k].dtype == v.dtype
        assert (got_meta.step, got_meta.epoch, got_meta.batch_in_epoch) == (7, 2, 3)
        assert got_meta.rng == rng
    assert (tmp_path / "ckdir" / "checkpoint.safetensors").is_file()
    assert not list(tmp_path.glob("**/.*tmp*"))  # no temp files left behind


def test_non_finite_train_metric_sums_round_trip_exactly(tmp_path):
    """A train metric undefined on a batch (NaN), or infinite, makes its running sum so: pydantic
    wrote such a sum as null, which the loader refused, so the checkpoint fit saved could not be
    resumed. Now written as the strings "NaN", "Infinity", "-Infinity" (the header stays JSON) and
    read back as they were; a null, a word, a non-finite loss sum or time are still refused."""
    sums = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "fine": -0.25}
    meta = ckpt.CheckpointMeta(step=3, batch_in_epoch=3, progress={"steps": 3, "metric_sums": sums})
    path = ckpt.save(tmp_path / "c.safetensors", tensors(), meta)
    header = json.loads(read_header(path)[0]["__metadata__"]["graphc"], parse_constant=pytest.fail)
    assert header["progress"]["metric_sums"] == {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity", "fine": -0.25}
    got = ckpt.load(path)[1].progress.metric_sums
    assert np.isnan(got.pop("nan")) and got == {"inf": float("inf"), "-inf": float("-inf"), "fine": -0.25}
    for bad, message in ((None, "Input should be a valid number"), ("many", "Input should be a valid number")):
        forged = forge(tmp_path / "f.safetensors", tensors(), format=ckpt.FORMAT,
                       progress={"metric_sums": {"acc": bad}})
        with pytest.raises(ckpt.CheckpointError, match=rf"progress\.metric_sums\.acc: {message}"):
            ckpt.load(forged)
    for field in ("loss_sum", "seconds"):
        with pytest.raises(ValueError, match="must be finite"):
            ckpt.EpochProgress(**{field: float("inf")})


def test_a_format_3_checkpoint_with_a_null_metric_sum_loads_it_as_nan(tmp_path):
    """Before format 4 pydantic wrote a NaN or infinite train-metric sum as null, which the loader
    refused as not a number: the checkpoint fit had saved could not be resumed. The fixture was
    written by graphc's checkpoint.save of 0210270~1; its digest hashed the null, and still verifies.
    Format 4 writes "NaN" and refuses a null (above)."""
    fixture = Path(__file__).parent / "data" / "checkpoint_null_metric_sum.safetensors"
    assert '"recall":null' in read_header(fixture)[0]["__metadata__"]["graphc"]
    got, meta = ckpt.load(fixture)
    assert meta.format == "graphc-checkpoint/3" and meta.step == 3
    sums = dict(meta.progress.metric_sums)
    assert np.isnan(sums.pop("recall")) and sums == {"accuracy": 30.0}
    assert ckpt.batch_weighted(meta).loss_sum == 4.5  # format 3's sums are weighted already
    np.testing.assert_array_equal(got["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
    tampered = tmp_path / "t.safetensors"
    data = fixture.read_bytes()
    assert data.count(b'\\"accuracy\\":30.0') == 1
    tampered.write_bytes(data.replace(b'\\"accuracy\\":30.0', b'\\"accuracy\\":31.0'))
    with pytest.raises(ckpt.CheckpointError, match="does not match its recorded SHA-256"):
        ckpt.load(tampered)
    resaved = ckpt.save(tmp_path / "again.safetensors", got, meta)  # written now: format 4, "NaN"
    assert '"recall":"NaN"' in read_header(resaved)[0]["__metadata__"]["graphc"]
    assert np.isnan(ckpt.load(resaved)[1].progress.metric_sums["recall"])


@pytest.mark.parametrize("progress", ["x", [1], 5])
def test_a_format_3_header_whose_progress_is_not_an_object_is_invalid_metadata(tmp_path, progress):
    # reading format 3's null sums took progress for a dict: AttributeError, not the CheckpointError
    from safetensors.numpy import save_file

    path = tmp_path / "c.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(path),
              metadata={ckpt._META_KEY: json.dumps({"format": "graphc-checkpoint/3", "progress": progress})})
    with pytest.raises(ckpt.CheckpointError, match=r"invalid checkpoint metadata \(progress"):
        ckpt.read_meta(path)


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


def forge(path, tensors_, **fields):
    """A format-1 checkpoint (digest over the tensors only) whose header holds ``fields`` as
    given (not validated)."""
    from safetensors.numpy import save_file

    legacy = ckpt.CheckpointMeta(format="graphc-checkpoint/1")
    meta = {**legacy.model_dump(), "digest": ckpt._digest(tensors_, legacy), **fields}
    save_file(tensors_, str(path), metadata={"graphc": json.dumps(meta)})
    return path


def test_a_changed_header_field_fails_the_digest(tmp_path):
    """The digest covers the header: a step count changed in place (same length, so the
    safetensors framing still holds) is caught, not resumed from."""
    path = ckpt.save(tmp_path / "c.safetensors", tensors(), ckpt.CheckpointMeta(step=5, epoch=1))
    data = path.read_bytes()
    old, new = b'\\"step\\":5', b'\\"step\\":6'  # the meta JSON is a string inside the header's JSON
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    assert ckpt.read_meta(path).step == 6  # the header itself is valid
    with pytest.raises(ckpt.CheckpointError, match="header does not match its recorded SHA-256"):
        ckpt.load(path)


def test_format_1_checkpoints_still_load(tmp_path):
    """Checkpoints written before the digest covered the header (format 1) load as before."""
    path = forge(tmp_path / "old.safetensors", tensors(), step=3)
    got, meta = ckpt.load(path)
    assert meta.step == 3 and meta.format == "graphc-checkpoint/1"
    assert all(np.array_equal(got[k], v) for k, v in tensors().items())


def test_format_2_progress_is_read_weighted_by_batch_size(tmp_path):
    """Before format 3 an epoch's running loss sum was the plain sum of its steps' losses; fit
    now keeps it weighted by batch size, and reads an earlier one as the mean times the samples."""
    meta = ckpt.CheckpointMeta(format="graphc-checkpoint/2", epoch=0, batch_in_epoch=2,
                               progress={"steps": 2, "loss_sum": 3.0, "samples": 32})
    assert ckpt.batch_weighted(meta).loss_sum == 48.0  # (1.5 a step) x 32 samples
    now = meta.model_copy(update={"format": ckpt.FORMAT})
    assert ckpt.batch_weighted(now).loss_sum == 3.0
    path = ckpt.save(tmp_path / "c.safetensors", tensors(), now)
    assert ckpt.read_meta(path).format == "graphc-checkpoint/5"


def test_a_format_2_checkpoint_without_format_3_fields_still_verifies(tmp_path):
    """Its digest hashed a header without ``loader.data`` and ``progress.metric_examples``:
    written here as that graphc wrote it."""
    import hashlib

    from safetensors.numpy import save_file

    fields = {"format": "graphc-checkpoint/2", "step": 2, "epoch": 0, "batch_in_epoch": 2,
              "loader": {"seed": 0, "batch_size": 16, "shuffle": True, "drop_last": False, "num_samples": 100}}
    lacked = {"digest", "seed", "schedule", "optimizer", "graphs", "accumulate", "structure"}  # fields it lacked
    header = ckpt.CheckpointMeta(**fields).model_dump(exclude=lacked)
    del header["loader"]["data"], header["progress"]["metric_examples"], header["progress"]["skipped_steps"]
    h = hashlib.sha256(json.dumps(header, separators=(",", ":")).encode())
    for name in sorted(tensors()):
        a = tensors()[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    save_file(tensors(), str(tmp_path / "c.safetensors"),
              metadata={"graphc": json.dumps({**header, "digest": h.hexdigest()})})
    _, meta = ckpt.load(tmp_path / "c.safetensors")
    assert meta.loader.data == "" and meta.step == 2


LOADER = {"seed": 0, "batch_size": 16, "shuffle": True, "drop_last": False, "num_samples": 100}  # 7 batches


@pytest.mark.parametrize("fields, message", [
    ({"step": -5}, r"step: Input should be greater than or equal to 0 \(got -5\)"),
    ({"epoch": -1, "batch_in_epoch": -2}, r"epoch: .* than or equal to 0 \(got -1\); 1 more error"),
    ({"step": "many"}, r"step: Input should be a valid integer"),
    ({"loader": {**LOADER, "batch_size": 0}}, r"loader.batch_size: Input should be greater than 0"),
    ({"loader": {**LOADER, "num_samples": -3}}, r"loader.num_samples: .* than or equal to 0"),
    ({"loader": {**LOADER, "seed": -1}}, r"loader.seed: .* than or equal to 0"),
    ({"loader": {"seed": 0}}, r"loader.batch_size: Field required"),
    ({"loader": LOADER, "batch_in_epoch": 8}, r"batch_in_epoch 8 is past the end of an epoch of 7 batches"),
    ({"rng": {"bit_generator": "PCG64", "state": "noise"}}, r"rng: .*not a numpy PCG64 generator state"),
    ({"graph_rng": {"eval": {"bit_generator": "MT19937"}}}, r"graph_rng: .*not a numpy PCG64 generator state"),
    ({"batch_in_epoch": 2, "progress": {"steps": 3}}, r"progress.steps 3 is more than the 2 batches of the epoch"),
    ({"progress": {"loss_sum": float("inf")}}, r"progress.loss_sum: must be finite \(got inf\)"),
    ({"progress": {"samples": -1}}, r"progress.samples: .* than or equal to 0"),
    ({"surprise": 1}, r"surprise: not a field of a graphc checkpoint header"),
    # an interval fit never steps at (the schedule silently frozen), state a resume fails deep in
    ({"schedule": json.dumps({"kind": "StepLR", "interval": "batch", "group": {}, "state": {}})},
     r"schedule: not a saved lr scheduler state \(interval: Input should be 'epoch' or 'step'"),
    ({"schedule": json.dumps({"kind": "StepLR", "interval": "step", "group": {}})},
     r"schedule: not a saved lr scheduler state \(state: Field required"),
    ({"schedule": "StepLR"}, r"schedule: not a saved lr scheduler state \(Invalid JSON"),
    ({"progress": {"bogus": 5}}, r"progress.bogus: not a field of a graphc checkpoint header"),
    ({"loader": {**LOADER, "workers": 2}}, r"loader.workers: not a field of a graphc checkpoint header"),
])
def test_nonsense_header_metadata_is_a_checkpoint_error(tmp_path, fields, message):
    path = forge(tmp_path / "c.safetensors", tensors(), **fields)
    for read in (ckpt.load, ckpt.read_meta):
        with pytest.raises(ckpt.CheckpointError, match=r"c\.safetensors: invalid checkpoint metadata \(" + message):
            read(path)
    with pytest.raises(ValueError):  # and it cannot be written either
        ckpt.CheckpointMeta(**fields)


def _with_metadata(path, edit):
    """Rewrite the JSON metadata text of the checkpoint at ``path`` with ``edit`` (text -> text)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header["__metadata__"]["graphc"] = edit(header["__metadata__"]["graphc"])
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda text: '{"rng_v2": {}, ' + text[1:], r"rng_v2: not a field of a graphc checkpoint header"),
    (lambda text: '{"step": 99, ' + text[1:], r"the header names 'step' twice"),
])
def test_a_header_field_the_digest_does_not_cover_is_refused(tmp_path, edit, message):
    """The digest hashes the header's fields as read: an unknown field (dropped by pydantic) and
    the first of a field written twice (json keeps the last) were ignored unread and the file
    loaded as if they were not there; now refused, naming the field."""
    path = ckpt.save(tmp_path / "c.safetensors", tensors(), ckpt.CheckpointMeta(step=5, epoch=1))
    _with_metadata(path, edit)
    for read in (ckpt.load, ckpt.read_meta):
        with pytest.raises(ckpt.CheckpointError, match=r"c\.safetensors: invalid checkpoint metadata \(" + message):
            read(path)


def test_files_that_are_not_checkpoints_say_what_they_are(tmp_path):
    from safetensors.numpy import save_file

    save_file(tensors(), str(tmp_path / "state.safetensors"))
    with pytest.raises(ckpt.CheckpointError, match="a safetensors file without graphc checkpoint metadata"):
        ckpt.load(tmp_path / "state.safetensors")
    forge(tmp_path / "old.safetensors", tensors(), format="graphc-checkpoint/0")
    with pytest.raises(ckpt.CheckpointError, match="unknown checkpoint format 'graphc-checkpoint/0'"):
        ckpt.load(tmp_path / "old.safetensors")
    (tmp_path / "model.onnx").write_bytes(b"\x08\x08\x12\x07pytorch" + bytes(range(256)))
    with pytest.raises(ckpt.CheckpointError, match=r"not a readable graphc checkpoint \(not a safetensors file"):
        ckpt.read_meta(tmp_path / "model.onnx")


def test_a_directory_in_place_of_the_checkpoint_file(tmp_path):
    (tmp_path / "ck" / ckpt.FILE_NAME).mkdir(parents=True)
    for call in (lambda: ckpt.load(tmp_path / "ck"), lambda: ckpt.save(tmp_path / "ck", tensors(), ckpt.CheckpointMeta())):
        with pytest.raises(ckpt.CheckpointError, match="checkpoint.safetensors is a directory, not a checkpoint file"):
            call()
    assert list((tmp_path / "ck").rglob("*")) == [tmp_path / "ck" / ckpt.FILE_NAME]


def test_save_never_overwrites_a_file_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.safetensors").write_text("keep me")
    with pytest.raises(ckpt.CheckpointError, match="notes.safetensors exists and is not a graphc checkpoint .*"
                                                   "refusing to overwrite it"):
        ckpt.save(tmp_path / "notes.safetensors", tensors(), ckpt.CheckpointMeta())
    assert (tmp_path / "notes.safetensors").read_text() == "keep me"
    ckpt.save(tmp_path / "c", tensors(1), ckpt.CheckpointMeta(step=1))
    assert ckpt.save(tmp_path / "c", tensors(2), ckpt.CheckpointMeta(step=2)) and ckpt.read_meta(tmp_path / "c").step == 2


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
    from graphc.runtime import checkpoint as ckpt
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
