"""An ``--opset`` graphc cannot write: one line naming the option, the value and the opsets it
can (onnx's version converter's C++ assertion text was printed as it came)."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import graphc as gc
import graphc.nn as nn
from cli_util import one_line_error, run_cli, workspace
from graphc.compile.opsets import OpsetError, convert_opset


def _linear(path: Path) -> Path:
    gc.capture(nn.Linear(3, 2), x=gc.spec("float32", ("N", 3))).save(path)  # a Gemm, at opset 21
    return path


def test_capture_names_the_option_and_its_range(capsys, tmp_path: Path):
    (tmp_path / "net.py").write_text("import graphc.nn as nn\nNet = nn.Linear(3, 2)\n")
    for opset in (5, 24):
        err = one_line_error(run_cli(capsys, "capture", f"{tmp_path / 'net.py'}:Net", "-i", "x:float32[N,3]",
                                     "-o", tmp_path / "m.onnx", "--opset", opset))
        assert f"--opset {opset}: graphc captures ai.onnx opsets 17 to 23" in err
    assert not (tmp_path / "m.onnx").exists()


def test_deploy_names_the_op_and_the_lowest_opset_the_model_reaches(capsys, tmp_path: Path):
    model = _linear(tmp_path / "lin.onnx")
    err = one_line_error(run_cli(capsys, "deploy", "triton", model, "--repo", tmp_path / "repo", "--name", "m",
                                 "--opset", 5))
    assert err.startswith("error: OpsetError: --opset 5: cannot convert model 'Linear' from opset 21 to 5: ")
    assert "takes Gemm no lower than opset 13; the lowest opset this model converts to is 13" in err
    assert "Assertion" not in err and "pass opset=" not in err  # the hint is for the default opset only
    err = one_line_error(run_cli(capsys, "deploy", "triton", model, "--repo", tmp_path / "repo", "--name", "m",
                                 "--opset", 40))
    assert "--opset 40: cannot convert model 'Linear' to opset 40: " in err and "ai.onnx opsets 1 to 28" in err
    # the lowest said is right: 13 converts (and runs as the model does), 12 does not
    assert run_cli(capsys, "deploy", "triton", model, "--repo", tmp_path / "repo", "--name", "m",
                   "--opset", 13).code == 0
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "repo" / "m" / "1" / "model.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, gc.Session(gc.load(model), backend="numpy").run({"x": x})["output"], rtol=1e-5)
    with pytest.raises(OpsetError, match="Gemm no lower than opset 13"):
        convert_opset(gc.load(model), 12)


def test_the_lowest_opset_follows_each_op_the_converter_stops_at():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return gc.relu(self.fc(x))  # Gemm stops at 13, Relu at 14

    model = gc.capture(Net(), x=gc.spec("float32", ("N", 3)))
    with pytest.raises(OpsetError, match="the lowest opset this model converts to is 14"):
        convert_opset(model, 5)
    assert convert_opset(model, 14).opset == 14


def test_export_names_the_option(capsys, tmp_path: Path):
    ws = workspace(tmp_path)
    err = one_line_error(run_cli(capsys, "export", ws / "arts", "-o", ws / "m.onnx", "--opset", 5,
                                 "--allow-untrained"))
    assert err.startswith("error: OpsetError: --opset 5: cannot convert model ") and "Assertion" not in err
    assert "the lowest opset this model converts to is" in err
