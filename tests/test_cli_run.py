"""`graphc backends`, `graphc run`, `graphc parity`: output, files and exit codes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest

from graphc.cli import main
from graphc.runtime.feeds import random_feeds
from graphc.model.dtypes import spec
from onnx_graphs import linear_relu

X = np.random.default_rng(4).standard_normal((3, 3)).astype(np.float32)
B = np.zeros((3, 2), np.float32)


def graphc(*args: str) -> int:
    with pytest.raises(SystemExit) as done:
        main([str(a) for a in args])
    return done.value.code or 0


@pytest.fixture
def files(tmp_path):
    onnx.save(linear_relu(), str(tmp_path / "net.onnx"))
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "b.npy", B)
    return tmp_path


def test_backends_prints_the_table(capsys):
    assert graphc("backends") == 0
    out = capsys.readouterr().out
    for name in ("ort-cuda", "ort-cpu", "numpy", "available", "reason"):
        assert name in out


def test_run_prints_outputs(files, capsys):
    assert graphc("run", files / "net.onnx", "--backend", "ort-cpu",
                  "--input", f"x={files / 'x.npy'}", "--input", f"b={files / 'b.npy'}") == 0
    out = capsys.readouterr().out
    assert "net.onnx on ort-cpu" in out and "float32" in out and "[3, 2]" in out


def test_run_writes_npz(files):
    target = files / "out" / "y.npz"
    assert graphc("run", files / "net.onnx", "-b", "ort-cpu", "-i", f"x={files / 'x.npy'}",
                  "-i", f"b={files / 'b.npy'}", "-o", target) == 0
    with np.load(target, allow_pickle=False) as saved:
        w = np.arange(6, dtype=np.float32).reshape(3, 2) / 6
        np.testing.assert_allclose(saved["y"], np.maximum(X @ w + B, 0), rtol=1e-6)
    assert [p.name for p in target.parent.iterdir()] == ["y.npz"]  # no temp file left behind


def _two_outputs(tmp_path) -> None:
    """``tmp_path/m.onnx``: outputs ``file`` (-x) and ``allow_pickle`` (relu x); ``x.npy``: [-1, 2]."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("file", "allow_pickle")]
    nodes = [helper.make_node("Neg", ["x"], ["file"]), helper.make_node("Relu", ["x"], ["allow_pickle"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.save(tmp_path / "x.npy", np.array([-1.0, 2.0], np.float32))


def test_run_writes_outputs_of_any_name(tmp_path):
    """np.savez(f, **outputs) failed on an output named 'file' (its own argument's name)."""
    _two_outputs(tmp_path)
    assert graphc("run", tmp_path / "m.onnx", "-b", "numpy", "-i", f"x={tmp_path / 'x.npy'}", "-o",
                  tmp_path / "y.npz") == 0
    with np.load(tmp_path / "y.npz", allow_pickle=False) as saved:
        assert saved["file"].tolist() == [1.0, -2.0] and saved["allow_pickle"].tolist() == [0.0, 2.0]


def _expected(x: np.ndarray) -> np.ndarray:
    """linear_relu's output: relu(x @ w + b), w = arange(6) / 6, b = B."""
    return np.maximum(x @ (np.arange(6, dtype=np.float32).reshape(3, 2) / 6) + B, 0)


@pytest.mark.parametrize("name", ["y.npy", "Y.NPY", "y.json"])
def test_run_writes_npy_and_json_by_extension(files, name):
    # -o took any name and wrote an .npz archive under it; an inf in x makes inf and 0 * inf = nan
    x = X.copy()
    x[0, 0], x[1, 1] = np.inf, -np.inf
    np.save(files / "x.npy", x)
    target = files / name
    assert graphc("run", files / "net.onnx", "-b", "numpy", "-i", f"x={files / 'x.npy'}",
                  "-i", f"b={files / 'b.npy'}", "-o", target) == 0
    with np.errstate(invalid="ignore"):
        want = _expected(x)
    assert np.isnan(want).any() and np.isinf(want).any()
    if target.suffix.lower() == ".npy":
        got = np.load(target, allow_pickle=False)
    else:
        saved = json.loads(target.read_text())
        assert list(saved) == ["y"] and (saved["y"]["dtype"], saved["y"]["shape"]) == ("float32", [3, 2])
        got = np.array(saved["y"]["data"], dtype=np.float32)  # "inf", "-inf", "nan" strings read as floats
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("name", ["y.txt", "y", "y.npz.bak", "y.onnx"])
def test_run_refuses_an_output_of_another_extension(tmp_path, capsys, name):
    # refused before the model is even looked for (there is none): nothing runs, nothing is written
    assert graphc("run", tmp_path / "missing.onnx", "-o", tmp_path / name) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"-o/--output {tmp_path / name}: graphc run writes the format its extension names" in err
    assert "accepted: .npz (every output by name), .npy (a model's one output), .json" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_npy_for_two_outputs(tmp_path, capsys):
    _two_outputs(tmp_path)
    assert graphc("run", tmp_path / "m.onnx", "-b", "numpy", "-i", f"x={tmp_path / 'x.npy'}", "-o",
                  tmp_path / "y.npy") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "a .npy file holds one array and the model has 2 outputs (file, allow_pickle); write .npz or .json" in err
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("args, message", [
    (["--input", "x"], "bad --input 'x'; expected NAME=FILE.npy"),
    (["--input", "x=missing.npy"], "no such file missing.npy"),
    (["--input", "x={x}"], "missing input 'b'"),
    (["--input", "x={x}", "--input", "b={x}"], "input 'b': expected b: float32[N,2]"),
    (["--input", "x={x}", "--input", "b={b}", "--backend", "tpu"], "unknown backend 'tpu'"),
    (["--input", "x={x}", "--input", "x={b}", "--input", "b={b}"], "--input 'x' given twice"),  # the last had won
])
def test_run_bad_input_exits_2_with_one_line(files, capsys, args, message):
    args = [a.format(x=files / "x.npy", b=files / "b.npy") for a in args]
    assert graphc("run", files / "net.onnx", *args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err


def test_parity_with_random_feeds_passes(files, capsys):
    assert graphc("parity", files / "net.onnx", "--dim", "N=7", "--bisect") == 0
    out = capsys.readouterr().out
    assert "parity OK" in out and "[7, 2]" in out and "every intermediate value agrees" in out


def test_parity_with_given_feeds(files, capsys):
    assert graphc("parity", files / "net.onnx", "--backends", "ort-cpu,numpy",
                  "-i", f"x={files / 'x.npy'}", "-i", f"b={files / 'b.npy'}") == 0
    assert "reference ort-cpu" in capsys.readouterr().out


def test_parity_mismatch_exits_1_and_bisect_names_the_node(files, capsys, monkeypatch):
    from graphc.backends.numpy import kernels

    kernels.lookup("Add", 21)
    faulty = [dataclasses.replace(k, fn=lambda a, b: (a + b + np.float32(1),)) for k in kernels.KERNELS[("", "Add")]]
    monkeypatch.setitem(kernels.KERNELS, ("", "Add"), faulty)
    assert graphc("parity", files / "net.onnx", "--bisect") == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "parity MISMATCH" in out and "node 'add_0' (Add) at net.py:11" in out


def test_parity_refuses_a_backend_named_twice(files, capsys):
    # it compared numpy with itself and passed: exit 0 without a comparison
    assert graphc("parity", files / "net.onnx", "--backends", "numpy,ort-cpu,numpy") == 2
    assert ("--backends numpy,ort-cpu,numpy: names numpy twice; name each backend once"
            in capsys.readouterr().err)


def test_parity_bad_dim_exits_2(files, capsys):
    assert graphc("parity", files / "net.onnx", "--dim", "N") == 2
    assert "bad --dim 'N'" in capsys.readouterr().err
    # the last size was taken silently
    assert graphc("parity", files / "net.onnx", "--dim", "N=4", "--dim", "N=8") == 2
    assert "--dim N given twice (N=4 and N=8); give each dim once" in capsys.readouterr().err
    # a name the model lacks, or sizes for given arrays, were ignored
    assert graphc("parity", files / "net.onnx", "--dim", "M=9") == 2
    assert "the model's inputs have no dim named 'M'; their dim names: N" in " ".join(capsys.readouterr().err.split())
    assert graphc("parity", files / "net.onnx", "--dim", "N=3", "-i", f"x={files / 'x.npy'}",
                  "-i", f"b={files / 'b.npy'}") == 2
    assert "with --input the arrays give every size" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--rtol", "nan"), ("--atol", "-1e-3"), ("--rtol", "inf")])
def test_parity_bad_tolerance_exits_2(files, capsys, flag, value):
    # `--rtol nan` printed parity OK whatever the outputs were
    assert graphc("parity", files / "net.onnx", flag, value) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().startswith(f"error: ValueError: {flag[2:]} must be a finite number >= 0, got")
    assert len(captured.err.strip().splitlines()) == 1 and "parity OK" not in captured.out


def test_random_feeds_follow_the_specs():
    feeds = random_feeds([spec("float32", ("N", 3), name="x"), spec("int64", ("N",), name="ids"),
                          spec("bool", (None, 2), name="mask")], {"N": 5}, seed=1)
    assert feeds["x"].shape == (5, 3) and feeds["x"].dtype == np.float32
    assert feeds["ids"].shape == (5,) and feeds["ids"].dtype == np.int64 and feeds["ids"].max() < 4
    assert feeds["mask"].shape == (2, 2) and feeds["mask"].dtype == np.bool_
    again = random_feeds([spec("float32", ("N", 3), name="x")], {"N": 5}, seed=1)
    np.testing.assert_array_equal(again["x"], feeds["x"])
