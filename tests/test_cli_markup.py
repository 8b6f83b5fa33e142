"""What the CLI prints from a model is shown as it is, never read as rich markup: a torch.onnx
dynamo export names its batch dim in lower case (``batch``, ``s0``), and ``[batch, 1, 8, 8]``
or a NaN output's ``[nan inf]`` looks to rich like a style tag, which it used to drop silently."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import graphc as gc

from cli_util import run_cli


def lowercase_dims_model(path) -> None:
    """``y = log(x)``, x: float32[batch, 3] (a dim name rich would take for a tag)."""
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "logs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_inspect_shows_lowercase_dim_names(capsys, tmp_path):
    lowercase_dims_model(tmp_path / "m.onnx")
    result = run_cli(capsys, "inspect", tmp_path / "m.onnx")
    assert result.code == 0, result.err
    assert result.out.count("[batch, 3]") == 2, result.out  # the input's and the output's


def test_inspect_of_artifacts_shows_lowercase_dim_names(capsys, tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], np.ones(6, np.float32))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "lin", [x],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])], [w])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    gc.training.generate(model, gc.losses.mse("logits", label="y"), gc.optim.SGD(0.1)).save(tmp_path / "arts")
    result = run_cli(capsys, "inspect", tmp_path / "arts")
    assert result.code == 0, result.err
    assert "[batch, 3]" in result.out and "[batch, 2]" in result.out, result.out  # x, and the label y


def test_run_shows_nan_and_infinite_values(capsys, tmp_path):
    lowercase_dims_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([[-1.0, np.inf, 1.0]], np.float32))
    result = run_cli(capsys, "run", tmp_path / "m.onnx", "--backend", "numpy", "--input", f"x={tmp_path / 'x.npy'}")
    assert result.code == 0, result.err
    assert "[[nan inf  0.]]" in result.out, result.out
