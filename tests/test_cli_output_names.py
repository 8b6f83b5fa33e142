"""What a command writes is named as the user meant: an ONNX model's -o ends in .onnx (`graphc
optimize m.onnx -o m.npz` wrote ONNX under an .npz name, `-o dir/` a file named dir); `graphc grad
-o DIR` never writes into the folder holding its MODEL (`grad arts/inference.onnx -o arts` replaced
it); an empty path (`-o "$UNSET"`) is refused, where it was the current folder; and a save that
fails part way leaves the artifacts there before."""

import os

import numpy as np
import onnx
import pytest

from cli_util import NET_PY, one_line_error, run_cli, workspace


@pytest.fixture
def ws(tmp_path, monkeypatch):
    root = workspace(tmp_path)
    (root / "net.py").write_text(NET_PY)
    monkeypatch.chdir(root)
    return root


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


ONNX_WRITERS = {
    "capture": ["capture", "net.py:Net", "-i", "x:float32[N,4]", "-o"],
    "optimize": ["optimize", "mlp.onnx", "-o"],
    "export": ["export", "arts", "--allow-untrained", "-o"],
}


@pytest.mark.parametrize("given, suggested", [("m.npz", "m.onnx"), ("m", "m.onnx"), ("new/", "new.onnx"),
                                              ("m.onnx.bak", "m.onnx.onnx")])
@pytest.mark.parametrize("command", ONNX_WRITERS)
def test_an_onnx_output_not_named_onnx_is_refused_before_any_work(ws, capsys, command, given, suggested):
    before = _tree(ws)
    err = one_line_error(run_cli(capsys, *ONNX_WRITERS[command], given))
    shown = given.rstrip("/")
    assert f"-o/--output {shown}: graphc writes an ONNX model here" in err, err
    assert f"give a .onnx name, such as {suggested}" in err, err
    assert _tree(ws) == before


@pytest.mark.parametrize("command", ONNX_WRITERS)
def test_an_onnx_output_in_any_case_is_written(ws, capsys, command):
    result = run_cli(capsys, *ONNX_WRITERS[command], "M.ONNX")
    assert result.code == 0, result.err
    onnx.checker.check_model(onnx.load(ws / "M.ONNX"))


def test_grad_into_the_folder_holding_its_model_is_refused(ws, capsys):
    (ws / "g").mkdir()
    os.link(ws / "mlp.onnx", ws / "g" / "inference.onnx")  # a hard link: replaced in g, mlp.onnx kept its data
    os.symlink("g/inference.onnx", ws / "link.onnx")
    (ws / "h").mkdir()
    os.link(ws / "mlp.onnx", ws / "h" / "inference.onnx")
    before = _tree(ws)
    cases = [("g/inference.onnx", "g", "the folder holding the input MODEL.onnx g/inference.onnx"),
             ("mlp.onnx", ".", "the folder holding the input MODEL.onnx mlp.onnx"),
             ("link.onnx", "g", "the folder holding the input MODEL.onnx link.onnx"),
             ("mlp.onnx", "h", "a folder where the input MODEL.onnx mlp.onnx is its inference.onnx")]
    for model, folder, said in cases:
        err = one_line_error(run_cli(capsys, "grad", model, "--loss", "mse:logits", "-o", folder))
        assert f"-o/--output {folder}: {said}; graphc never writes beside or over its input" in err, err
    assert _tree(ws) == before


@pytest.mark.parametrize("args", [["grad", "mlp.onnx", "--loss", "mse:logits", "-o", ""],
                                  ["grad", "mlp.onnx", "--loss", "mse:logits", "--output="],
                                  ["demo", "-o", ""], ["deploy", "triton", "mlp.onnx", "--name", "m", "--repo", ""],
                                  ["inspect", ""]])
def test_an_empty_path_is_refused(ws, capsys, args):
    """Converted, "" was the current folder: grad and deploy wrote into it, inspect described it."""
    before = _tree(ws)
    err = one_line_error(run_cli(capsys, *args))
    assert ": an empty path (an unset shell variable?); give a path" in err, err
    assert _tree(ws) == before


@pytest.mark.parametrize("args, option", [(["grad", "mlp.onnx", "--loss", "mse:logits", "-o", "-"], "-o/--output"),
                                          (["deploy", "triton", "mlp.onnx", "--name", "m", "--repo", "-"], "--repo")])
def test_dash_for_a_folder_says_folder(ws, capsys, args, option):
    err = one_line_error(run_cli(capsys, *args))
    assert f"{option} -: graphc writes into a folder here, not standard output; give a folder path" in err, err


def test_a_grad_save_failing_part_way_keeps_the_artifacts_there(ws, capsys, monkeypatch):
    """A guard (this held before): the new files are written into a temp folder first."""
    import graphc.compile.training as training

    before = _tree(ws / "arts")
    real = training.write_synced

    def full_disk(path, data, mode=0o644):
        if path.name == training.MANIFEST_FILE:
            raise OSError(28, "No space left on device", str(path))
        real(path, data, mode)

    monkeypatch.setattr(training, "write_synced", full_disk)
    err = one_line_error(run_cli(capsys, "grad", "mlp.onnx", "--loss", "mse:logits", "--optimizer", "sgd", "-o", "arts"))
    assert "No space left on device" in err and "arts/manifest.json" in err, err
    assert _tree(ws / "arts") == before
    assert np.isfinite(np.load(ws / "data.npz")["x"]).all()  # the workspace's other files untouched
