"""gc.load reads external data only from inside the model's folder, for every tensor anywhere
in the model, and refuses malformed external-data entries before reading any data file.

The oracle is an audit hook on ``open`` that watches the inodes of the sentinel outside the
folder (and of the model's own data files, for "nothing read before everything is checked")."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import graphc as gc
from cli_util import one_line_error, run_cli
from model_fuzz import OpenAudit, rich_model, sentinel_ids, write_seed
from graphc.model.file import tensors

# Every place rich_model keeps a tensor: initializer, Constant, If branch initializer and
# Constant, a function's Constant, a sparse initializer's values and indices.
PLACES = ["w", "c_value", "e_init", "tv", "k", "sp", "sp_idx"]
ATTACKS = {
    "last key wins": ["../outside/secret.bin"],
    "dotdot": ["../outside/secret.bin"],
    "absolute": ["{outside}/secret.bin"],
    "symlink": ["link.bin"],
    "symlinked folder": ["linkdir/secret.bin"],
    "hard link": ["hard.bin"],
}


def tensor_named(proto: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for _, t in tensors(proto) if t.name == name)


def point(tensor: onnx.TensorProto, location: str, keep_first: bool) -> None:
    """Make ``tensor`` external at ``location`` (after a harmless first location if ``keep_first``)."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        tensor.ClearField("raw_data")
        for field in ("float_data", "int64_data", "int32_data"):
            tensor.ClearField(field)
        tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    if keep_first:
        tensor.external_data.add(key="location", value="w.bin")
    tensor.external_data.add(key="location", value=location)


@pytest.fixture
def seed(tmp_path):
    """(model path, audit) with the audit watching the sentinel and the model's data files."""
    path = write_seed(tmp_path)
    audit = OpenAudit.get()
    data = {(s.st_dev, s.st_ino) for s in (os.stat(path.parent / n) for n in ("w.bin", "c.bin"))}
    audit.watch, audit.hits = sentinel_ids(tmp_path) | data, []
    yield path, audit
    audit.watch = set()


def load_expecting_error(path, proto, match: str, audit) -> str:
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(gc.ModelLoadError, match=match) as err:
        gc.load(path)
    assert audit.hits == [], "a file was opened before the model was refused"
    assert str(path) in str(err.value)
    return str(err.value)


def test_the_seed_loads_with_every_tensor_in_place(seed):
    path, audit = seed
    model = gc.load(path)
    assert audit.hits  # the oracle works: the model's own data files were read
    assert {"w", "sp"} <= set(model.ir.graph.initializers)
    got = gc.Session(model, backend="numpy").run({"x": np.ones(8, np.float32), "flag": np.array(False)})["y"]
    np.testing.assert_array_equal(got, np.arange(8, dtype=np.float32) + 1 + np.eye(8, dtype=np.float32)[3] * 5)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("place", PLACES)
def test_external_data_outside_the_folder_is_refused_everywhere(seed, place, attack):
    path, audit = seed
    if attack == "hard link" and not (path.parent / "hard.bin").exists():
        pytest.skip("no hard links on this file system")
    proto = rich_model()
    location = ATTACKS[attack][0].replace("{outside}", str(path.parent.parent / "outside"))
    point(tensor_named(proto, place), location, keep_first=attack == "last key wins")
    match = "given more than once" if attack == "last key wins" else \
        "outside the model's folder|symbolic link|hard links"
    message = load_expecting_error(path, proto, match, audit)
    assert repr(place) in message


def test_a_repeated_key_is_refused_even_when_both_point_inside(seed):
    path, audit = seed
    proto = rich_model()
    tensor_named(proto, "w").external_data.add(key="offset", value="0")
    load_expecting_error(path, proto, "'offset' is given more than once", audit)


@pytest.mark.parametrize("key, value, match", [
    ("offset", "-4", "not a non-negative integer"),
    ("offset", "abc", "not a non-negative integer"),
    ("offset", " 4", "not a non-negative integer"),
    ("offset", "1e3", "not a non-negative integer"),
    ("offset", "9" * 5000, "not a non-negative integer"),
    ("offset", "4096", "past the end"),
    ("length", "-1", "not a non-negative integer"),
    ("length", "4096", "past the end"),
    ("length", "0x10", "not a non-negative integer"),
    ("length", "4", "holds 4 bytes, but its FLOAT"),  # the dims take more: numpy's reshape failed later
    ("location", "w.bin\x00../../outside/secret.bin", "NUL byte"),
    ("location", "", "no 'location'"),
    ("location", "missing.bin", "cannot be read"),
    ("location", "sub", "not a regular file"),
    ("evil", "1", "unknown external-data key 'evil'"),
    ("__class__", "1", "unknown external-data key"),
])
def test_malformed_external_data_entries_are_refused(seed, key, value, match):
    path, audit = seed
    proto = rich_model()
    tensor = tensor_named(proto, "w")
    entries = {e.key: e.value for e in tensor.external_data} | {key: value}
    del tensor.external_data[:]
    for k, v in entries.items():
        tensor.external_data.add(key=k, value=v)
    load_expecting_error(path, proto, match, audit)


def test_an_external_data_location_that_is_not_utf8_is_refused(seed):
    """protobuf returns a string field holding invalid UTF-8 as bytes (found by the load fuzzer)."""
    path, audit = seed
    proto = rich_model()
    tensor = tensor_named(proto, "w")
    entries = {e.key: e.value for e in tensor.external_data} | {"location": "QQQQQ.bin"}
    del tensor.external_data[:]
    for k, v in entries.items():
        tensor.external_data.add(key=k, value=v)
    data = proto.SerializeToString()
    assert data.count(b"QQQQQ.bin") == 1
    path.write_bytes(data.replace(b"QQQQQ.bin", b"\xff\xfeQQQ.bin"))  # same length: the framing holds
    with pytest.raises(gc.ModelLoadError, match="not UTF-8") as err:
        gc.load(path)
    assert audit.hits == [] and str(path) in str(err.value)


def test_an_offset_and_length_that_end_exactly_at_the_file_end_load(seed):
    path, _ = seed
    proto = rich_model()
    tensor = tensor_named(proto, "w")
    del tensor.external_data[:]
    for k, v in (("location", "w.bin"), ("offset", "32"), ("length", "32"), ("checksum", "x"), ("basepath", "")):
        tensor.external_data.add(key=k, value=v)
    path.write_bytes(proto.SerializeToString())
    np.testing.assert_array_equal(gc.load(path).params["w"], np.zeros(8, np.float32))


def test_external_data_needs_a_path(seed):
    path, _ = seed
    for source in (path.read_bytes(), rich_model()):
        with pytest.raises(gc.ModelLoadError, match="load it from its file path"):
            gc.load(source)


def test_external_data_models_are_checked_from_their_path(seed, monkeypatch):
    """The checker sees the file's path (how onnx checks models whose data is over 2 GiB),
    never a proto with the data read into it."""
    path, _ = seed
    seen = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda m, *a, **k: (seen.append(m), real(m, *a, **k))[1])
    gc.load(path)
    assert seen == [str(path)]
    gc.load(rich_model_inline())  # no external data: the proto itself is checked
    assert isinstance(seen[-1], onnx.ModelProto)


def rich_model_inline() -> onnx.ModelProto:
    proto = rich_model()
    for name, data in (("w", np.arange(8, dtype=np.float32)), ("c_value", np.ones(8, np.float32)),
                       ("e_init", np.zeros(8, np.float32)), ("k", np.zeros(8, np.float32))):
        tensor = tensor_named(proto, name)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
        tensor.raw_data = data.tobytes()
    return proto


def test_strings_that_are_not_utf8_are_a_load_error(tmp_path, capsys):
    good = rich_model_inline().SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(good.replace(b"then_c", b"th\xff\xfe_c"))
    with pytest.raises(gc.ModelLoadError, match=r"node\[0\]\.name is not UTF-8"):
        gc.load(path)
    for command in ("inspect", "run"):
        err = one_line_error(run_cli(capsys, command, path))
        assert "is not UTF-8" in err and str(path) in err


def test_a_tensor_of_an_unknown_data_type_is_a_load_error(seed, capsys):
    """A data type ONNX does not define, on a Constant inside a function (where onnx's checker
    does not look; onnx-ir imported it and failed only when the model was written again) or on
    an initializer: a load error naming the tensor's place, at the CLI one line."""
    path, audit = seed
    for place in ("function", "initializer"):
        proto = rich_model_inline()
        tensor = proto.functions[0].node[0].attribute[0].t if place == "function" else tensor_named(proto, "w")
        tensor.data_type = 226191198
        where = r"functions\[0\]\(AddK\)\.node\[0\]\(fk\)" if place == "function" else r"graph\(rich\)\.initializer\[0\]\(w\)"
        load_expecting_error(path, proto, where + r".*data type 226191198 is not one ONNX defines", audit)
        err = one_line_error(run_cli(capsys, "inspect", path))
        assert "ModelLoadError" in err and "226191198" in err and str(path) in err


def test_an_external_tensor_of_undefined_type_is_a_load_error(seed):
    """Inside a function (where onnx's checker does not look first): the external-data size
    check asked onnx-ir for UNDEFINED's bit width, a TypeError (found by the load fuzzer)."""
    path, audit = seed
    proto = rich_model()
    tensor = proto.functions[0].node[0].attribute[0].t
    assert tensor.data_location == onnx.TensorProto.EXTERNAL
    tensor.data_type = onnx.TensorProto.UNDEFINED
    load_expecting_error(path, proto, "data_type field .* to UNDEFINED is not allowed", audit)


def test_a_name_with_a_line_break_is_escaped_in_a_load_error(seed, capsys):
    """A place named with a line break (a node of a fuzzed file) is quoted escaped: the error
    stays one line."""
    path, audit = seed
    proto = rich_model_inline()
    proto.functions[0].node[0].name = "f\nk"
    proto.functions[0].node[0].attribute[0].t.data_type = 226191198
    load_expecting_error(path, proto, r"node\[0\]\(f\\nk\)", audit)
    assert "f\\nk" in one_line_error(run_cli(capsys, "inspect", path))


def test_a_graph_output_of_undefined_element_type_is_a_load_error(seed, capsys):
    """elem_type 0 on a graph output passes onnx's checker, but onnxruntime refuses the model
    and graphc could not describe it: a load error naming the output."""
    path, audit = seed
    proto = rich_model_inline()
    proto.graph.output[0].type.tensor_type.elem_type = 0
    load_expecting_error(path, proto, "graph output 'y' has an undefined element type", audit)
    err = one_line_error(run_cli(capsys, "inspect", path))
    assert "undefined element type" in err and str(path) in err


def test_checker_errors_are_one_line_at_the_cli(tmp_path, capsys):
    proto = rich_model_inline()
    proto.graph.node[1].input[0] = "nowhere"
    path = tmp_path / "bad.onnx"
    path.write_bytes(proto.SerializeToString())
    err = one_line_error(run_cli(capsys, "inspect", path))
    assert "ModelLoadError" in err and "invalid ONNX model" in err and str(path) in err


def test_sparse_initializers_become_dense_without_changing_the_callers_proto():
    proto = rich_model_inline()
    before = proto.SerializeToString()
    model = gc.load(proto)
    np.testing.assert_array_equal(model.ir.graph.initializers["sp"].const_value.numpy(), np.eye(8, dtype=np.float32)[3] * 5)
    assert proto.SerializeToString() == before


def test_a_folder_or_a_missing_file_is_named_as_such(tmp_path, capsys):
    with pytest.raises(gc.ModelLoadError, match="not a file"):
        gc.load(tmp_path)
    assert "no such model file" in one_line_error(run_cli(capsys, "inspect", tmp_path / "none.onnx"))
