"""graphc's own safetensors reader (``graphc.tensorfile``) against the safetensors package."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save, save_file

from graphc.tensorfile import read_header, read_tensors


def tensors():
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((3, 5)).astype(np.float32), "d": rng.standard_normal(7),
            "h": rng.standard_normal((2, 2)).astype(np.float16), "step": np.array(4, np.int64),
            "empty": np.zeros((0, 3), np.float32), "mask": rng.random(6) > 0.5,
            "i32": rng.integers(-9, 9, (2, 3), dtype=np.int32), "u8": rng.integers(0, 255, 4, dtype=np.uint8),
            "bf": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16), "bf0": np.array(1.5, ml_dtypes.bfloat16)}


def test_reads_what_safetensors_writes_each_tensor_into_a_writable_array_of_its_own(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file(tensors(), path, metadata={"k": "v"})
    got, theirs = read_tensors(path), load_file(path)
    assert got.keys() == theirs.keys()
    for name, value in theirs.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape and np.array_equal(got[name], value)
        assert got[name].flags.writeable and got[name].flags.owndata, name
    header, start = read_header(path)
    assert header["__metadata__"] == {"k": "v"} and start == 8 + int.from_bytes(path.read_bytes()[:8], "little")


def _with_header(tmp_path, data: bytes, change) -> object:
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    change(header)
    text = json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])
    return path


@pytest.mark.parametrize("change, message", [
    (lambda h: h["w"].update(dtype="F8_E4M3"), "tensor 'w': dtype 'F8_E4M3' is not one of"),
    (lambda h: h["w"].update(shape=[3, -5]), "tensor 'w': shape [3, -5] is not a list of sizes"),
    (lambda h: h["w"].update(shape=[4, 5]), "tensor 'w': data_offsets"),
    (lambda h: h["w"].update(data_offsets=[10**9, 10**9 + 60]), "within the file's"),
    (lambda h: h.update(x=7), "tensor 'x': dtype 7"),
])
def test_a_bad_header_entry_names_the_tensor(tmp_path, change, message):
    path = _with_header(tmp_path, save({"w": np.zeros((3, 5), np.float32)}), change)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_tensors(path)


def test_truncated_or_foreign_files_are_refused(tmp_path):
    data = save({"w": np.ones((64, 64), np.float32)})
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[:-100])
    with pytest.raises(ValueError, match="'w'"):
        read_tensors(path)
    path.write_bytes(data[:20])
    with pytest.raises(ValueError, match="truncated within its header"):
        read_header(path)
    path.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_tensors(path)


def _layout_changed(tmp_path, change, tail=b""):
    data = save({"w": np.zeros((3, 5), np.float32), "b": np.ones(4, np.float32)})
    path = _with_header(tmp_path, data, change)
    path.write_bytes(path.read_bytes() + tail)
    return path


@pytest.mark.parametrize("change, tail, message", [
    (lambda h: h["b"].update(data_offsets=h["w"]["data_offsets"][:1] + [h["w"]["data_offsets"][0] + 16]), b"",
     "tensors that overlap or leave a gap"),  # b reads w's first bytes
    (lambda h: None, b"extra", "5 bytes belong to no tensor"),  # appended bytes
    (lambda h: h["b"].update(shape=[True, 4]), b"", r"shape \[True, 4\] is not a list of sizes"),
])
def test_a_layout_the_safetensors_package_refuses_is_refused_naming_it(tmp_path, change, tail, message):
    """Tensors sharing bytes, bytes of no tensor, a boolean dim: the safetensors package refuses
    each (the oracle); graphc's reader read the first two as they came and failed on the third with
    numpy's bare TypeError."""
    path = _layout_changed(tmp_path, change, tail)
    with pytest.raises(Exception):
        load_file(path)
    with pytest.raises(ValueError, match=message):
        read_tensors(path)


def test_a_tensor_named_twice_is_refused_not_read_as_the_last(tmp_path):
    """json (and the safetensors package) keep the last entry of a name given twice, so the file
    read as one tensor and silently ignored the other; the header is refused, naming it."""
    data = save({"w": np.zeros((3, 5), np.float32)})
    size = int.from_bytes(data[:8], "little")
    text = data[8:8 + size].decode().strip()
    twice = ('{"w": {"dtype": "F32", "shape": [5, 3], "data_offsets": [0, 60]}, ' + text[1:]).encode()
    path = tmp_path / "twice.safetensors"
    path.write_bytes(len(twice).to_bytes(8, "little") + twice + data[8 + size:])
    assert load_file(path)["w"].shape == (3, 5)  # the package reads the last
    with pytest.raises(ValueError, match="the header names 'w' twice"):
        read_header(path)
