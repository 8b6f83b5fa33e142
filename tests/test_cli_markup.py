"""What the CLI prints from a model is shown as it is, never read as rich markup: a torch.onnx
dynamo export names its batch dim in lower case (``batch``, ``s0``), and ``[batch, 1, 8, 8]``
or a NaN output's ``[nan inf]`` looks to rich like a style tag, which it used to drop silently."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import graphc as gc

from cli_util import run_cli
from trainer_models import blobs, imported_mlp


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


def test_paths_and_names_with_brackets_print_as_they_are(capsys, tmp_path, monkeypatch):
    """A folder, files and names holding ``[bold]`` through capture, grad, train, export,
    optimize, deploy triton and serve: each line shows them whole (rich took ``[bold]`` for a
    style, dropped it and printed the rest bold)."""
    from graphc.serving import serve

    root = tmp_path / "[bold]run"
    root.mkdir()
    (root / "net.py").write_text("def double(x):\n    return {'logits': x + x}\n")

    def said(*args) -> str:
        result = run_cli(capsys, *args)
        assert result.code == 0, result.err
        return result.out.replace("\n", "")

    assert "captured [bold]net in" in said("capture", f"{root / 'net.py'}:double", "-i", "x:float32[N,3]",
                                             "--name", "[bold]net", "-o", root / "[bold]cap.onnx")
    assert f"-> {root / '[bold]cap.onnx'}" in said("capture", f"{root / 'net.py'}:double", "-i", "x:float32[N,3]",
                                                    "-o", root / "[bold]cap.onnx")
    onnx.save(imported_mlp(), root / "[bold]mlp.onnx")
    grad = said("grad", root / "[bold]mlp.onnx", "--loss", "cross_entropy:logits:[bold]y", "-o", root / "[bold]arts")
    assert f"to {root / '[bold]arts'}:" in grad and "(label input '[bold]y')" in grad, grad
    data = blobs(64)
    np.savez(root / "[bold]d.npz", **{"x": data["x"], "[bold]y": data["y"]})
    np.savez(root / "[bold]e.npz", **{"x": data["x"][:16], "[bold]y": data["y"][:16]})
    train = said("train", root / "[bold]arts", "--data", root / "[bold]d.npz", "--eval-data", root / "[bold]e.npz",
                 "--epochs", "1", "--batch-size", "32", "-q", "-b", "numpy", "--checkpoint", root / "[bold]ck",
                 "--log", root / "[bold]log.jsonl")
    for shown in (f"evaluating on x, [bold]y of --eval-data {root / '[bold]e.npz'}", f"epoch log: {root / '[bold]log.jsonl'}",
                  f"checkpoint: {root / '[bold]ck'}"):
        assert shown in train, (shown, train)
    assert f"wrote {root / '[bold]inf.onnx'}" in said("export", root / "[bold]ck", "-o", root / "[bold]inf.onnx")
    optimized = said("optimize", root / "[bold]inf.onnx", "-o", root / "[bold]opt.onnx")
    assert f"{root / '[bold]inf.onnx'} -> {root / '[bold]opt.onnx'}:" in optimized, optimized
    deployed = said("deploy", "triton", root / "[bold]opt.onnx", "--repo", root / "[bold]repo", "--name", "m")
    assert f"wrote {root / '[bold]repo' / 'm' / 'config.pbtxt'}" in deployed, deployed
    monkeypatch.setattr(serve, "serve_app", lambda app, host, port, on_ready, **_: on_ready(("127.0.0.1", 8000)))
    served = said("serve", root / "[bold]opt.onnx", "-b", "numpy", "--name", "m")
    assert f"serving {root / '[bold]opt.onnx'} on" in served and "model m: version 1 on numpy" in served and f"stopped serving {root / '[bold]opt.onnx'}" in served
