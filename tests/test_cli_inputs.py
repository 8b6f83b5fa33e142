"""`graphc train | run` with bad inputs: one clear line, exit 2, and nothing trained or unpickled."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_util import one_line_error, run_cli, workspace
from trainer_models import blobs


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return workspace(tmp_path_factory.mktemp("cli_inputs"))


@pytest.fixture
def ws(shared, tmp_path):
    """A private copy of the workspace (tests write checkpoints into it)."""
    return Path(shutil.copytree(shared, tmp_path / "ws"))


def train(capsys, ws, *extra):
    return run_cli(capsys, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "16",
                   "--backend", "numpy", "--no-progress", *extra)


class Unpickled:
    """Unpickling this creates ``marker``: proof that something was unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_data_given_as_a_single_npy_array(capsys, ws):
    np.save(ws / "x.npy", blobs(8)["x"])
    err = one_line_error(run_cli(capsys, "train", ws / "arts", "--data", ws / "x.npy", "--epochs", "1",
                                 "--batch-size", "4"))
    assert "x.npy: expected arrays saved by name with np.savez" in err and "found a single-array .npy file" in err


def test_data_that_is_not_numpy_at_all(capsys, ws):
    (ws / "data.csv").write_text("1,2,3\n")
    err = one_line_error(train(capsys, ws, "--data", ws / "data.csv"))
    assert "found a file that is neither .npy nor .npz" in err
    (ws / "broken.npz").write_bytes(b"PK\x03\x04" + b"\0" * 40)
    assert "broken.npz: not a readable .npz archive" in one_line_error(train(capsys, ws, "--data", ws / "broken.npz"))


def test_object_arrays_are_refused_without_unpickling(capsys, ws):
    marker = ws / "unpickled"
    labels = np.array([Unpickled(marker)] + [0] * 7, dtype=object)
    np.savez(ws / "pickled.npz", x=blobs(8)["x"], y=labels)
    err = one_line_error(train(capsys, ws, "--data", ws / "pickled.npz"))
    assert "array 'y' holds Python objects (dtype object)" in err and "never unpickles" in err
    assert "allow_pickle" not in err and not marker.exists()

    np.save(ws / "x.npy", labels)
    err = one_line_error(run_cli(capsys, "run", ws / "mlp.onnx", "--backend", "numpy", "--input", f"x={ws / 'x.npy'}"))
    assert "--input x" in err and "holds Python objects" in err and not marker.exists()


def _header_only(shape) -> bytes:
    """The bytes of a .npy file whose header declares float32 ``shape`` and holds 64 bytes of data."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 64


def test_an_array_header_declaring_more_than_its_file_holds(capsys, ws):
    # numpy allocates what the header declares before it reads: 16 TB here, a MemoryError
    (ws / "huge.npy").write_bytes(_header_only((10**12, 4)))
    err = one_line_error(run_cli(capsys, "run", ws / "mlp.onnx", "--backend", "numpy", "--input",
                                 f"x={ws / 'huge.npy'}"))
    assert "--input x" in err and "is truncated: its header declares float32[1000000000000, 4]" in err
    assert "the file holds 64 bytes of data" in err
    import zipfile

    with zipfile.ZipFile(ws / "huge.npz", "w") as archive:
        archive.writestr("x.npy", _header_only((10**12, 4)))
        archive.writestr("y.npy", _header_only((16,)))
    err = one_line_error(train(capsys, ws, "--data", ws / "huge.npz"))
    assert "array 'x' is truncated" in err and "training on" not in err


def test_os_errors_are_one_line(capsys, ws):
    # an output under a file: mkdir's FileExistsError, once a traceback, now refused before the work
    result = run_cli(capsys, "optimize", ws / "mlp.onnx", "-o", ws / "data.npz" / "sub.onnx")
    assert "data.npz is a file, not a folder" in one_line_error(result)


def test_run_input_given_as_an_npz(capsys, ws):
    err = one_line_error(run_cli(capsys, "run", ws / "mlp.onnx", "--input", f"x={ws / 'data.npz'}"))
    assert "--input x" in err and "expected one array saved with np.save (.npy), found an .npz archive" in err


def test_plot_without_matplotlib_fails_before_training(capsys, ws, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.backend_bases", None)
    result = train(capsys, ws, "--plot", ws / "loss.png", "--checkpoint", ws / "ck")
    assert "needs matplotlib, which is not installed: pip install 'graphc[plot]'" in one_line_error(result)
    assert "training on" not in result.out and not (ws / "ck").exists()


def test_plot_to_a_format_matplotlib_cannot_write_fails_before_training(capsys, ws):
    result = train(capsys, ws, "--plot", ws / "loss.xyz")
    assert "matplotlib writes no 'xyz' images; use one of" in one_line_error(result)
    assert "training on" not in result.out


def test_resume_without_a_checkpoint_is_an_error(capsys, ws):
    result = train(capsys, ws, "--checkpoint", ws / "ck", "--resume")
    err = one_line_error(result)
    assert f"--resume: no checkpoint at {ws / 'ck' / 'checkpoint.safetensors'} to resume from" in err
    assert "training on" not in result.out and not (ws / "ck").exists()


@pytest.mark.parametrize("resume", [True, False])
def test_a_directory_where_the_checkpoint_file_goes(capsys, ws, resume):
    (ws / "ck" / "checkpoint.safetensors").mkdir(parents=True)
    result = train(capsys, ws, "--checkpoint", ws / "ck", *(["--resume"] if resume else []))
    assert "checkpoint.safetensors is a directory, not a checkpoint file" in one_line_error(result)
    assert "training on" not in result.out and not (ws / "ck" / "artifacts").exists()


def test_an_existing_checkpoint_needs_resume_and_other_files_are_never_overwritten(capsys, ws):
    assert train(capsys, ws, "--checkpoint", ws / "ck").code == 0
    err = one_line_error(train(capsys, ws, "--checkpoint", ws / "ck"))
    assert "already holds a checkpoint (step 4, epoch 1); pass --resume to continue it" in err
    before = (ws / "data.npz").read_bytes()
    err = one_line_error(train(capsys, ws, "--checkpoint", ws / "data.npz"))
    assert "data.npz exists and is not a graphc checkpoint" in err and "refusing to overwrite it" in err
    assert (ws / "data.npz").read_bytes() == before


def test_resume_from_a_checkpoint_whose_header_is_nonsense(capsys, ws):
    from safetensors.numpy import save_file

    (ws / "ck").mkdir()
    save_file({"w": np.zeros(2, np.float32)}, str(ws / "ck" / "checkpoint.safetensors"),
              metadata={"graphc": json.dumps({"format": "graphc-checkpoint/1", "step": -5})})
    result = train(capsys, ws, "--checkpoint", ws / "ck", "--resume")
    assert "invalid checkpoint metadata (step: Input should be greater than or equal to 0 (got -5))" in one_line_error(result)
    assert "training on" not in result.out


def test_a_checkpoint_given_as_artifacts_resumes_and_says_so(capsys, ws):
    """It resumed without a word, its loader error spoke of a --resume not given, and a run
    already past --epochs trained nothing and said nothing."""
    assert train(capsys, ws, "--checkpoint", ws / "ck").code == 0
    again = ["train", ws / "ck", "--data", ws / "data.npz", "--batch-size", "16", "--backend", "numpy", "--no-progress"]
    result = run_cli(capsys, *again, "--epochs", "1")
    assert result.code == 0 and f"resumed from {ws / 'ck'} after epoch 1 (step 4)" in result.out
    assert "nothing to train: the run has done 1 epoch of --epochs 1; raise --epochs to train on" in result.out
    result = run_cli(capsys, *again, "--epochs", "2")
    assert result.code == 0 and ", epoch 2" in result.out and "epoch 2/2" in result.out
    err = one_line_error(run_cli(capsys, *again, "--epochs", "3", "--seed", "5"))
    assert f"resuming {ws / 'ck'} (given as ARTIFACTS): the checkpoint's run used a loader with seed 0 (now 5)" in err
