"""`graphc train | run` with bad inputs: one clear line, exit 2, and nothing trained or unpickled."""

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


def test_run_input_given_as_an_npz(capsys, ws):
    err = one_line_error(run_cli(capsys, "run", ws / "mlp.onnx", "--input", f"x={ws / 'data.npz'}"))
    assert "--input x" in err and "expected one array saved with np.save (.npy), found an .npz archive" in err
