"""`graphc optimize`: writes atomically, reports, never touches the input, exits 2 on bad input."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from typer.testing import CliRunner

import graphc as gc
from graphc.cli import app
from optimize_util import F, make_model, op_types

runner = CliRunner()


@pytest.fixture
def model_file(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    rng = np.random.default_rng(0)
    m = make_model(nodes, [("x", F, ["N", 8])], [("y", F, ["N", 5])],
                   [("W", rng.standard_normal((8, 5)).astype(np.float32)), ("b", np.zeros(5, np.float32))])
    return m.save(tmp_path / "net.onnx")


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_optimize_writes_output_and_report(model_file, tmp_path):
    before = digest(model_file)
    out = tmp_path / "net.opt.onnx"
    result = runner.invoke(app, ["optimize", str(model_file), "-o", str(out), "-O", "2", "--report"])
    assert result.exit_code == 0, result.output
    assert "MatMulAddToGemm" in result.output and "2 -> 1 nodes" in result.output
    assert op_types(gc.load(out)) == ["Gemm"]
    assert digest(model_file) == before


@pytest.mark.parametrize("flags, nodes", [((), 1), (("--dtype", "float16"), 1),
                                          (("--dtype", "float16", "--keep-io-types"), 3)])
def test_the_summary_counts_the_nodes_written(model_file, tmp_path, flags, nodes):
    """With --keep-io-types the file holds the Gemm and a Cast at each edge: the summary says 3, not the
    optimized model's 1 from before the conversion."""
    out = tmp_path / "o.onnx"
    result = runner.invoke(app, ["optimize", str(model_file), "-o", str(out), *flags])
    assert result.exit_code == 0, result.output
    assert len(gc.load(out).proto.graph.node) == nodes
    assert f"2 -> {nodes} nodes (level 2" in result.output


def test_optimize_refuses_o_naming_its_input(model_file):
    """It optimized in place; graphc never overwrites a command's input (tests/test_cli_own_input.py)."""
    before = digest(model_file)
    result = runner.invoke(app, ["optimize", str(model_file), "-o", str(model_file), "-O", "2"])
    assert isinstance(result.exception, gc.InputError), result.output  # graphc.cli.main: exit 2
    assert "graphc never overwrites its input" in str(result.exception)
    assert digest(model_file) == before


def test_invalid_model_exits_2_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    out = tmp_path / "out.onnx"
    from graphc.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["optimize", str(bad), "-o", str(out)])
    assert exc.value.code == 2
    assert not out.exists() and bad.read_bytes() == b"not a model"
    assert [p.name for p in tmp_path.iterdir()] == ["bad.onnx"]  # no temp files left behind


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be created")
def test_an_output_that_cannot_be_written_is_named_not_its_temp_file(model_file, capsys):
    from graphc.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["optimize", str(model_file), "-o", "/proc/o.onnx"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.strip() == "error: FileNotFoundError: [Errno 2] No such file or directory: '/proc/o.onnx'"


def test_bad_level_is_usage_error(model_file, tmp_path):
    result = runner.invoke(app, ["optimize", str(model_file), "-o", str(tmp_path / "o.onnx"), "-O", "7"])
    assert result.exit_code == 2
    assert not (tmp_path / "o.onnx").exists()


def test_pass_failure_exits_2_without_writing(model_file, tmp_path, monkeypatch):
    import graphc.passes.optimize as opt

    def broken(model, level):
        raise RuntimeError("boom")

    monkeypatch.setattr(opt, "optimize_in_place", broken)
    monkeypatch.setattr("graphc.compile.optimize.optimize_in_place", broken)
    out = tmp_path / "o.onnx"
    from graphc.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["optimize", str(model_file), "-o", str(out)])
    assert exc.value.code == 2 and not out.exists()
