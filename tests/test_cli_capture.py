"""`graphc capture` and `graphc inspect` through the real console script, in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import graphc as gc
try:
    from dsl_util import check, run_ort
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import check, run_ort

ROOT = Path(__file__).resolve().parent.parent
GRAPHC = Path(sys.executable).parent / "graphc"


def graphc(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    if not GRAPHC.exists():
        pytest.skip(f"console script not installed at {GRAPHC}")
    return subprocess.run([str(GRAPHC), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def in_process(*args: str) -> int:
    """The same CLI in this process (fast; the subprocess tests above cover the console script)."""
    from graphc.cli import main

    with pytest.raises(SystemExit) as done:
        main([str(a) for a in args])
    return done.value.code or 0


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "net.py").write_text(textwrap.dedent("""
        import graphc as gc
        from graphc import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(8, 16)
                self.fc2 = nn.Linear(16, 3)

            def forward(self, x):
                return self.fc2(gc.relu(self.fc1(x)))

        net = Net()

        def double(x, y):
            return {"sum": x + y, "prod": x * y}

        CONSTANT = 3

        def broken(x):
            raise RuntimeError("not ready")

        def misspelled(x):
            return x.nope
    """))
    return folder / "net.py"


def test_capture_then_inspect_the_two_layer_net(tmp_path):
    out = tmp_path / "m.onnx"
    res = graphc("capture", "models/two_layer_net.py:TwoLayerNet", "--input", "x:float32[N,784]", "-o", out)
    assert res.returncode == 0, res.stderr
    model = gc.load(out)
    check(model)
    assert model.inputs[0].shape == ("N", 784) and model.outputs[0].shape == ("N", 10)
    res = graphc("inspect", out, "--dim", "N=64")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    for needle in ("x", "float32", "[N, 784]", "output", "Gemm", "Relu", "101,770", "407,080",
                   f"{2 * 64 * (784 * 128 + 128 * 10):,}", "opset"):
        assert needle in text, needle


@pytest.mark.parametrize("target,inputs", [
    ("Net", ["x:float32[N,8]"]),          # a Module class
    ("net", ["x:float32[B,8]"]),          # a Module instance
    ("double", ["x:float32[N,4]", "y:float32[N,4]"]),  # a function
])
def test_capture_kinds_of_objects(tmp_path, user_file, target, inputs):
    out = tmp_path / "m.onnx"
    args = [a for spec in inputs for a in ("--input", spec)]
    assert in_process("capture", f"{user_file}:{target}", *args, "-o", out, "--opset", "18", "--seed", "5") == 0
    model = gc.load(out)
    check(model)
    assert model.opset == 18
    feeds = {s.name: np.ones((2, *s.shape[1:]), np.float32) for s in model.inputs}
    assert all(np.isfinite(v).all() for v in run_ort(model, feeds).values())


def test_seed_changes_params(tmp_path, user_file):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    for path, seed in ((a, "1"), (b, "2")):
        assert in_process("capture", f"{user_file}:Net", "--input", "x:float32[N,8]", "-o", path, "--seed",
                          seed) == 0
    assert not np.array_equal(gc.load(a).params["fc1.weight"], gc.load(b).params["fc1.weight"])


@pytest.mark.parametrize("args", [
    ["capture", "models/two_layer_net.py:TwoLayerNet", "--input", "x:float32[N,100]"],
    ["inspect", "README.md"],
], ids=["graph_error", "not_a_model"])
def test_console_script_bad_input_exits_2(tmp_path, args):
    if args[0] == "capture":
        args = args + ["-o", str(tmp_path / "m.onnx")]
    res = graphc(*args)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args,needle", [
    (["capture", "models/two_layer_net.py:Nope", "--input", "x:float32[N,784]"], "no object"),
    (["capture", "models/two_layer_net.py:TwoLayerNet", "--input", "x:float32[N,100]"], "two_layer_net.py:16"),
    (["capture", "models/two_layer_net.py:TwoLayerNet", "--input", "x:floaty[N,784]"], "dtype"),
    (["capture", "models/two_layer_net.py:TwoLayerNet", "--input", "garbage"], "NAME:DTYPE"),
    (["capture", "no/such/file.py:X", "--input", "x:float32[3]"], "no such file"),
    (["capture", "models:X", "--input", "x:float32[3]"], "models: a folder, not a Python file"),  # was "no such file"
    (["capture", "models/two_layer_net.py", "--input", "x:float32[3]"], "FILE.py:OBJECT"),
    (["capture", "USER:CONSTANT", "--input", "x:float32[3]"], "expected a Module"),
    # the user's code raising printed a traceback
    (["capture", "USER:broken", "--input", "x:float32[3]"], "RuntimeError in the captured code at USER:22: not ready"),
    (["capture", "USER:misspelled", "--input", "x:float32[3]"],
     "AttributeError in the captured code at USER:25: 'Tensor' object has no attribute 'nope'"),
    (["inspect", "README.md"], "not a valid ONNX model"),
    (["inspect", "nothere.onnx"], "no such model file"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, user_file, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    args = [a.replace("USER", str(user_file)) for a in args]
    if args[0] == "capture":
        args += ["-o", str(tmp_path / "m.onnx")]
    assert in_process(*args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle.replace("USER", str(user_file)) in lines[0]
    assert "Traceback" not in err


def test_inspect_an_imported_model(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert in_process("inspect", "tests/data/torch_cnn_bn.onnx", "--dim", "N=2") == 0
    out = capsys.readouterr().out
    assert "BatchNormalization" in out and "Conv" in out and "total" in out
