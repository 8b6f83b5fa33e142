"""`graphc` shows a warning as one ``warning: MESSAGE`` line on stderr, whichever command and
library raised it: not Python's ``file.py:LINE: UserWarning:`` form followed by a line of
graphc's own source, which `graphc grad` printed for a torch.onnx export's merged parameters."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cli_util import run_cli


def shared_norm_model(path) -> None:
    """Two LayerNorms reading one scale and one bias, as torch.onnx's dynamo exporter merges a
    fresh model's equal initializers: `graphc grad` warns that each is trained as one."""
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "g"), numpy_helper.from_array(np.zeros(4, np.float32), "b"),
             numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], name="ln_a"),
             helper.make_node("MatMul", ["h", "w"], ["m"]),
             helper.make_node("LayerNormalization", ["m", "g", "b"], ["out"], name="ln_b")]
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_warning_is_one_line_naming_no_source_file(capsys, tmp_path):
    shared_norm_model(tmp_path / "m.onnx")
    result = run_cli(capsys, "grad", tmp_path / "m.onnx", "--loss", "mse:out:y", "-o", tmp_path / "arts")
    assert result.code == 0, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: one tensor is the scale or bias of several "
                                                   "normalization nodes"), result.err
    assert "UserWarning" not in result.err and ".py:" not in result.err, result.err


def test_python_shows_warnings_as_before_once_the_command_is_done(capsys, tmp_path):
    shared_norm_model(tmp_path / "m.onnx")
    before = warnings.showwarning
    run_cli(capsys, "grad", tmp_path / "m.onnx", "--loss", "mse:out:y", "-o", tmp_path / "arts")
    assert warnings.showwarning is before
