"""`graphc inspect --dim` tells the truth (issue 15, item 7) and `graphc capture` checks input
names against the signature (item 8); in process, through ``graphc.cli.main``."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.model.inspection import flops_estimate

from cli_util import one_line_error, run_cli

CONV_FLOPS_PER_SAMPLE = 2 * 4 * 6 * 6 * 1 * 3 * 3  # Conv(1 -> 4, 3x3) on 8x8: 4x6x6 outputs, 9 mul-adds each


@pytest.fixture(scope="module")
def net_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    (root / "nets.py").write_text(textwrap.dedent("""
        import graphc as gc
        from graphc import nn

        class Img(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 4, 3)

            def forward(self, x):
                return self.conv(x.reshape((-1, 1, 8, 8)))

        def pooled(x, w):
            return x.sum(axis=0, keepdims=True) @ w
    """))
    return root


def test_reshape_keeps_the_batch_dim_name(net_file):
    import importlib.util

    spec = importlib.util.spec_from_file_location("inspect_nets", net_file / "nets.py")
    nets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nets)
    model = gc.capture(nets.Img(), x=gc.spec("float32", ("N", 64)))
    assert model.outputs[0].shape == ("N", 4, 6, 6)
    out = gc.Session(model, backend="numpy").run({"x": np.ones((5, 64), np.float32)})["output"]
    assert out.shape == (5, 4, 6, 6)


def test_flops_follow_the_dim_through_a_reshape_of_an_imported_model():
    # a model graphc did not write: its Reshape(-1) output has no dim name, only inference's '?'
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["img"]), helper.make_node("Conv", ["img", "w"], ["y"])],
        "imported", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, None, None])],
        [helper.make_tensor("shape", TensorProto.INT64, [4], [-1, 1, 8, 8]),
         helper.make_tensor("w", TensorProto.FLOAT, [4, 1, 3, 3], np.zeros(36, np.float32))])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    for n in (1, 64):
        est = flops_estimate(model, {"N": n})
        assert est.by_op == {"Conv": n * CONV_FLOPS_PER_SAMPLE} and not est.unknown and not est.independent


def test_inspect_dim_counts_the_batch(capsys, net_file, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    onnx_path = net_file / "img.onnx"
    assert run_cli(capsys, "capture", f"{net_file / 'nets.py'}:Img", "--input", "x:float32[N,64]", "-o", onnx_path).code == 0
    r = run_cli(capsys, "inspect", onnx_path, "--dim", "N=64")
    assert r.code == 0, r.err
    assert f"{64 * CONV_FLOPS_PER_SAMPLE:,}" in r.out and "[N, 4, 6, 6]" in r.out
    assert "note:" not in r.out
    r = run_cli(capsys, "inspect", onnx_path)
    assert "N not given" in r.out and f"{CONV_FLOPS_PER_SAMPLE:,}" in r.out


def test_inspect_says_when_the_figure_does_not_depend_on_a_dim(capsys, net_file, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = net_file / "pooled.onnx"
    r = run_cli(capsys, "capture", f"{net_file / 'nets.py'}:pooled", "--input", "x:float32[N,8]",
                "--input", "w:float32[8,4]", "-o", path)
    assert r.code == 0, r.err
    r = run_cli(capsys, "inspect", path, "--dim", "N=64")
    assert r.code == 0 and "does not depend on N" in r.out
    assert f"{2 * 8 * 4:,}" in r.out


def test_inspect_unknown_dim_name_is_one_line_exit_2(capsys, net_file):
    path = net_file / "img2.onnx"
    run_cli(capsys, "capture", f"{net_file / 'nets.py'}:Img", "--input", "x:float32[N,64]", "-o", path)
    err = one_line_error(run_cli(capsys, "inspect", path, "--dim", "M=4"))
    assert "no dim named 'M'" in err and "its dim names: N" in err


def test_capture_input_names_are_checked_against_forward(capsys, net_file):
    out = net_file / "bad.onnx"
    err = one_line_error(run_cli(capsys, "capture", f"{net_file / 'nets.py'}:Img", "--input", "y:float32[N,64]",
                                 "-o", out))
    assert "Img.forward(x)" in err and "expected x, got y" in err
    assert not out.exists()
    err = one_line_error(run_cli(capsys, "capture", f"{net_file / 'nets.py'}:pooled", "--input", "x:float32[N,8]",
                                 "-o", out))
    assert "expected x, w, got x" in err and not out.exists()


def test_inspect_prints_a_long_model_path_whole(capsys, net_file, monkeypatch):
    """Its header line was wrapped at the 80 columns of a pipe, cutting the path across lines."""
    monkeypatch.setenv("COLUMNS", "80")
    path = net_file / ("d" * 90) / "img.onnx"
    path.parent.mkdir()
    run_cli(capsys, "capture", f"{net_file / 'nets.py'}:Img", "--input", "x:float32[N,64]", "-o", path)
    r = run_cli(capsys, "inspect", path)
    assert r.code == 0, r.err
    assert r.out.splitlines()[0].startswith(f"Img  ({path})  opset: ai.onnx ")


def test_inspect_shows_a_complex_models_complex_values_and_their_pairs(capsys, tmp_path, monkeypatch):
    """It listed only the float64[N, 8, 2] pairs, while graphc run takes and writes complex128[N, 8] arrays."""
    monkeypatch.setenv("COLUMNS", "160")
    gc.capture(lambda z, w: (z * w, w + 1.0), z=gc.spec("complex128", ("N", 8)),
               w=gc.spec("complex128", ("N", 8)), name="cmul").save(tmp_path / "c.onnx")
    model = gc.load(tmp_path / "c.onnx")
    out = run_cli(capsys, "inspect", tmp_path / "c.onnx").out
    assert "│ z    │ complex128 │ [N, 8] │ float64[N,8,2] real pair │" in out, out
    assert "graphc run takes a complex .npy (or the pair) and writes complex arrays" in out
    said = json.loads(run_cli(capsys, "inspect", tmp_path / "c.onnx", "--json").out)
    assert said["inputs"][0] == {"name": "z", "dtype": "float64", "shape": ["N", 8, 2],
                                 "complex": {"dtype": "complex128", "shape": ["N", 8]}}
    assert [o["complex"] for o in said["outputs"]] == [{"dtype": "complex128", "shape": ["N", 8]}] * 2
    assert len(model.outputs) == 2
    plain = tmp_path / "p.onnx"
    gc.capture(lambda x: x + 1.0, x=gc.spec("float32", ("N", 3)), name="plain").save(plain)
    text = run_cli(capsys, "inspect", plain).out
    assert "held as" not in text and "real pairs" not in text
    assert json.loads(run_cli(capsys, "inspect", plain, "--json").out)["inputs"][0]["complex"] is None
