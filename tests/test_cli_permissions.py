"""An output in a folder the user may not write in: one line naming the option and the folder,
before any work (`graphc train --plot` failed after the whole run, `--log` and `--checkpoint`
after the first epoch, each as a bare PermissionError), and nothing written; an input the user
may not read, named by its option. Run as a real unprivileged user: root may read and write
anywhere, so as root the command runs as `nobody` (setpriv)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from cli_util import workspace

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ws():
    with tempfile.TemporaryDirectory() as folder:  # not pytest's tmp_path, which only its owner may enter
        root = workspace(Path(folder))
        (root / "home").mkdir()
        for path in (root, root / "home"):
            path.chmod(0o777)
        (root / "ro").mkdir(mode=0o555)
        np.save(root / "secret.npy", np.zeros((2, 8), np.float32))
        (root / "secret.npy").chmod(0)
        yield root


AS_A_USER = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []


def _user_runs_graphc() -> bool:
    """Whether the unprivileged user can start graphc from this checkout (a checkout under a root-only
    home, or a missing setpriv, leaves nobody to drop to)."""
    if not AS_A_USER:
        return True
    if shutil.which("setpriv") is None:
        return False
    done = subprocess.run([*AS_A_USER, sys.executable, "-c", "import graphc.cli"], capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
                          cwd="/", timeout=120, check=False)
    return done.returncode == 0


needs_a_user = pytest.mark.skipif(not _user_runs_graphc(), reason="no unprivileged user that can run this checkout")


@needs_a_user
@pytest.mark.parametrize("args, option", [
    (["train", "arts", "--data", "data.npz", "--epochs", "1", "--batch-size", "8", "--plot", "ro/loss.png"], "--plot"),
    (["train", "arts", "--data", "data.npz", "--epochs", "1", "--batch-size", "8", "--log", "ro/e.csv"], "--log"),
    (["train", "arts", "--data", "data.npz", "--epochs", "1", "--batch-size", "8", "--checkpoint", "ro/ck"],
     "--checkpoint"),
    (["optimize", "mlp.onnx", "-o", "ro/sub/opt.onnx"], "-o/--output"),
    (["grad", "mlp.onnx", "--loss", "cross_entropy:logits:y", "-o", "ro"], "-o/--output"),
])
def test_an_output_in_a_read_only_folder_is_refused_up_front(ws, args, option):
    said = f"{option} {args[-1]}: no permission to write in the folder ro"
    _refused(ws, args, said)
    assert list((ws / "ro").iterdir()) == []


@needs_a_user
def test_an_input_the_user_may_not_read_is_named_by_its_option(ws):
    # it was a bare PermissionError naming the file only
    _refused(ws, ["run", "mlp.onnx", "--input", "x=secret.npy"], "--input x secret.npy: no permission to read the file")


def _refused(ws, args, said):
    """`graphc ARGS` as an unprivileged user exits 2 before any work, saying `said` on one line."""
    env = {**os.environ, "HOME": str(ws / "home"), "MPLCONFIGDIR": str(ws / "home"),
           "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    entry = "import sys; from graphc.cli import main; sys.exit(main())"
    done = subprocess.run([*AS_A_USER, sys.executable, "-c", entry, *args],
                          capture_output=True, text=True, cwd=ws, env=env, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # refused before training started
    assert done.stderr == f"error: InputError: {said}\n"
