"""gc.convert_float: float32 models as float16/bfloat16, outputs against the float32 model on the
numpy backend and onnxruntime (its own session on the raw file: onnxruntime casts around CPU
kernels it lacks for float16), block lists, keep_io_types, subgraphs, range clamping, Triton."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.models import EXAMPLES
from graphc.passes.precision import RangeWarning
from graphc.runtime import feeds as feeding
from optimize_util import make_model

RNG = np.random.default_rng(0)
# max |half - float32| / max |float32| per output, measured worst 0.9e-3 (float16), 6.2e-3 (bfloat16)
TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2}
NUMPY = {"float16": np.float16, "bfloat16": gc.bfloat16.numpy}


def _feeds(model: gc.Model, batch: int = 2) -> dict[str, np.ndarray]:
    return feeding.random_feeds(feeding.required_specs(model), seed=1, default_dim=batch, int_high=2)


def _as(feeds: dict, dtype: str) -> dict:
    return {k: v.astype(NUMPY[dtype]) if v.dtype == np.float32 else v for k, v in feeds.items()}


def _ort(model: gc.Model, feeds: dict, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> dict:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    sess = ort.InferenceSession(model.proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _assert_near(reference: dict, got: dict, dtype: str, what: str) -> None:
    assert reference.keys() == got.keys()
    for name, want in reference.items():
        have = np.asarray(got[name])
        if want.dtype == np.float32:
            assert have.dtype == NUMPY[dtype], f"{what} {name}: {have.dtype}"
            err = np.max(np.abs(have.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-6)
            assert err < TOLERANCE[dtype], f"{what} {name}: relative error {err:.2e}"
        else:
            np.testing.assert_array_equal(have, want)


def _check_backends(model: gc.Model, dtype: str, batch: int = 2,
                    level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> gc.Model:
    half = gc.convert_float(model, dtype)
    onnx.checker.check_model(half.proto, full_check=True)
    feeds = _feeds(model, batch)
    reference = gc.Session(model, backend="numpy").run(feeds)
    _assert_near(reference, gc.Session(half, backend="numpy").run(_as(feeds, dtype)), dtype, "numpy")
    if level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL:
        _assert_near(reference, gc.Session(half, backend="ort-cpu").run(_as(feeds, dtype)), dtype, "ort-cpu")
    if dtype == "float16":  # onnxruntime itself (graphc's session lowers bfloat16 for it)
        _assert_near(reference, _ort(half, _as(feeds, dtype), level), dtype, "onnxruntime")
    return half


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["cnn", "resnet", "transformer"])
def test_examples_match_float32(name, dtype):
    factory, inputs = EXAMPLES[name]
    half = _check_backends(gc.capture(factory(), **inputs()), dtype)
    assert half.outputs[0].dtype == dtype


def test_lstm_language_model_float16():
    from graphc.models.lstm_lm import LSTMLanguageModel, example_inputs

    # a plain onnxruntime 1.31 session segfaults on this float16 model at ORT_ENABLE_ALL; graphc's
    # ort-cpu turns off the rewrite behind it (backends/fusions.py; tested in a child process in
    # test_ort_transposed_matvec.py), so here onnxruntime itself runs at ORT_ENABLE_EXTENDED
    half = _check_backends(gc.capture(LSTMLanguageModel(), **example_inputs()), "float16",
                           level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    assert half.inputs[0].dtype == "int64"  # token ids stay integers


def test_vae_with_given_noise_and_its_random_op():
    from graphc.models.vae import VAE, example_inputs

    inputs = example_inputs()
    _check_backends(gc.capture(VAE(), **inputs, eps=gc.spec("float32", ("N", 8), name="eps")), "float16")
    sampled = gc.convert_float(gc.capture(VAE(), **inputs), "float16")
    randoms = [n for n in sampled.proto.graph.node if n.op_type.startswith("Random")]
    assert randoms and all(n.output[0] in _dtypes(sampled, TensorProto.FLOAT16) for n in randoms)
    out = gc.Session(sampled, backend="numpy").run(_as(_feeds(sampled), "float16"))
    assert all(np.isfinite(v).all() and v.dtype == np.float16 for v in out.values())


def _dtypes(model: gc.Model, elem: int) -> set[str]:
    """Names of the values of element type ``elem`` (inferred)."""
    inferred = onnx.shape_inference.infer_shapes(model.proto)
    infos = [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    return {v.name for v in infos if v.type.tensor_type.elem_type == elem}


def test_keep_io_types_casts_at_the_edges():
    factory, inputs = EXAMPLES["cnn"]
    model = gc.capture(factory(), **inputs())
    half = gc.convert_float(model, "float16", keep_io_types=True)
    assert [s.dtype for s in half.inputs] == [s.dtype for s in model.inputs] == ["float32"]
    assert half.outputs[0].dtype == "float32" and half.outputs[0].name == model.outputs[0].name
    graph = half.proto.graph
    assert graph.node[0].op_type == "Cast" and graph.node[-1].op_type == "Cast"
    assert {i.data_type for i in graph.initializer if i.data_type != TensorProto.INT64} == {TensorProto.FLOAT16}
    feeds = _feeds(model)
    reference = gc.Session(model, backend="numpy").run(feeds)
    for got in (gc.Session(half, backend="numpy").run(feeds), _ort(half, feeds)):
        assert got["output"].dtype == np.float32
        np.testing.assert_allclose(got["output"], reference["output"], atol=4e-3 * np.abs(reference["output"]).max())


def test_block_lists_keep_nodes_float32():
    factory, inputs = EXAMPLES["transformer"]
    model = gc.capture(factory(), **inputs())
    softmax = next(n for n in model.proto.graph.node if n.op_type == "Softmax")
    matmul = next(n for n in model.proto.graph.node if n.op_type == "MatMul")
    half, report = gc.convert_float(model, "float16", op_block_list=["Softmax"], node_block_list=[matmul.name],
                                    report=True)
    floats = _dtypes(half, TensorProto.FLOAT)
    for node in half.proto.graph.node:
        if node.op_type == "Softmax" or node.name == matmul.name:
            assert set(node.input) <= floats | {""} and set(node.output) <= floats, node.name
    assert f"MatMul {matmul.name!r}" in report.blocked and f"Softmax {softmax.name!r}" in report.blocked
    _assert_near(gc.Session(model, backend="numpy").run(_feeds(model)),
                 gc.Session(half, backend="numpy").run(_as(_feeds(model), "float16")), "float16", "blocked")
    with pytest.raises(gc.GraphError, match="node_block_list names nodes .* 'nope'"):
        gc.convert_float(model, node_block_list=["nope"])
    with pytest.raises(gc.GraphError, match="dtype must be one of"):
        gc.convert_float(model, "float8")


def _range_resize_model() -> gc.Model:
    """Range (no float16 schema) and Resize (float-only scales) after float16-capable ops."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Resize", ["r", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["zero", "nf", "one"], ["ramp"]),
             helper.make_node("ReduceSumSquare", ["up"], ["sq"], keepdims=0),
             helper.make_node("Mul", ["ramp", "k"], ["y"])]
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, 1, 2, 2]), ("n", TensorProto.INT64, [])],
                      [("up", TensorProto.FLOAT, [1, 1, 4, 4]), ("y", TensorProto.FLOAT, ["L"]), ("sq", TensorProto.FLOAT, [])],
                      [("scales", np.array([1, 1, 2, 2], np.float32)), ("zero", np.array(0, np.float32)),
                       ("one", np.array(1, np.float32)), ("k", np.array(1e5, np.float32))], opset=19)


def test_schema_fixed_inputs_stay_float32_and_range_is_clamped():
    model = _range_resize_model()
    with pytest.warns(RangeWarning, match=r"1 finite float32 values beyond float16's range .* 'k' \(1\)"):
        half, report = gc.convert_float(model, "float16", report=True)
    inits = {i.name: i.data_type for i in half.proto.graph.initializer}
    assert inits["scales"] == inits["zero"] == inits["one"] == TensorProto.FLOAT  # float32 consumers only
    assert inits["k"] == TensorProto.FLOAT16 and report.clamped == {"k": 1}
    floats = _dtypes(half, TensorProto.FLOAT)
    assert "nf" in floats  # the Cast feeding Range stays float32: 3000 is exact
    # Range has no float16 kernel; ReduceSumSquare is blocked by default
    assert {n.output[0] for n in half.proto.graph.node if n.op_type in ("Range", "ReduceSumSquare")} <= floats
    feeds = {"x": (RNG.standard_normal((1, 1, 2, 2)) * 50).astype(np.float16), "n": np.array(3000, np.int64)}
    for got in (gc.Session(half, backend="numpy").run(feeds), _ort(half, feeds)):
        assert got["y"].shape == (3000,) and got["y"].dtype == np.float16  # Range counted 3000 exactly
        assert got["y"][1] == np.float16(65504) and np.isinf(got["y"][2])  # k clamped; 2 * 65504 overflows
        squares = np.sum(np.maximum(feeds["x"], 0).astype(np.float32) ** 2) * 4
        np.testing.assert_allclose(got["sq"], squares.astype(np.float16), rtol=1e-3)
        np.testing.assert_array_equal(got["up"], np.repeat(np.repeat(np.maximum(feeds["x"], 0), 2, 2), 2, 3))


def test_if_and_loop_bodies_convert():
    then = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value_floats=[-1e9] * 3)], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Add", ["acc", "x"], ["acc_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["acc_out", "i_f"], ["scan"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(n, e, None) for n, e in
         (("c_out", TensorProto.BOOL), ("acc_out", TensorProto.FLOAT), ("scan", TensorProto.FLOAT))])
    nodes = [helper.make_node("If", ["flag"], ["chosen"], then_branch=then, else_branch=other),
             helper.make_node("Loop", ["trips", "", "x"], ["final", "steps"], body=body)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3]), ("flag", TensorProto.BOOL, []),
                               ("trips", TensorProto.INT64, [])],
                       [("chosen", TensorProto.FLOAT, [3]), ("final", TensorProto.FLOAT, [3]),
                        ("steps", TensorProto.FLOAT, ["T", 3])], [("w", np.array(2, np.float32))], opset=19)
    with pytest.warns(RangeWarning, match="'e'|Constant"):
        half = gc.convert_float(model, "float16")
    bodies = [a.g for n in half.proto.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    assert all(o.type.tensor_type.elem_type in (TensorProto.FLOAT16, TensorProto.BOOL) for g in bodies for o in g.output)
    x = RNG.standard_normal(3).astype(np.float32)
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag), "trips": np.array(4, np.int64)}
        reference = gc.Session(model, backend="numpy").run(feeds)
        if not flag:  # the else branch's -1e9 is clamped to float16's -65504
            reference["chosen"] = np.full(3, -65504, np.float32)
        for got in (gc.Session(half, backend="numpy").run(_as(feeds, "float16")), _ort(half, _as(feeds, "float16"))):
            _assert_near(reference, got, "float16", f"flag={flag}")


def test_local_functions_are_inlined_and_converted():
    scale = onnx.helper.make_function("local", "Scale", ["a"], ["b"], [
        helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.array(3, np.float32))),
        helper.make_node("Mul", ["a", "c"], ["b"])], [helper.make_opsetid("", 19)])
    graph = helper.make_graph([helper.make_node("Scale", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    proto = helper.make_model(graph, functions=[scale], ir_version=9,
                              opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("local", 1)])
    half = gc.convert_float(proto, "float16")
    assert not half.proto.functions and half.outputs[0].dtype == "float16"
    x = np.array([1.5, -2], np.float16)
    np.testing.assert_array_equal(_ort(half, {"x": x})["y"], x * np.float16(3))


def _torch_export(module, *example):
    import io

    import torch

    buffer = io.BytesIO()
    # with gradients on: TransformerEncoderLayer's inference fast path has no ONNX export
    torch.onnx.export(module.eval(), example, buffer, input_names=["x"], output_names=["y"], dynamo=False,
                      opset_version=17, dynamic_axes={"x": {0: "N"}})
    with torch.no_grad():
        expected = module(*example).numpy()
    return gc.load(buffer.getvalue()), example[0].numpy(), expected


def _resnet_block(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

        def forward(self, x):
            return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))

    return Block(), torch.randn(2, 8, 12, 12)


def _transformer_block(torch):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)

        def forward(self, x):
            return self.layer(x, is_causal=False)

    return Block(), torch.randn(2, 10, 32)


@pytest.mark.parametrize("build", [_resnet_block, _transformer_block])
def test_torch_exports_match_torch(build):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module, example = build(torch)
    model, x, expected = _torch_export(module, example)
    half = gc.convert_float(model, "float16")
    onnx.checker.check_model(half.proto, full_check=True)
    for got in (gc.Session(half, backend="numpy").run({"x": x.astype(np.float16)})["y"],
                _ort(half, {"x": x.astype(np.float16)})["y"]):
        err = np.max(np.abs(got.astype(np.float64) - expected)) / np.max(np.abs(expected))
        assert got.dtype == np.float16 and err < TOLERANCE["float16"], err


def test_written_file_and_triton_repository(tmp_path):
    factory, inputs = EXAMPLES["cnn"]
    half = gc.convert_float(gc.capture(factory(), **inputs()), "float16")
    onnx.checker.check_model(str(half.save(tmp_path / "half.onnx")), full_check=True)
    folder = gc.deploy.triton(tmp_path / "half.onnx", tmp_path / "repo", "cnn16", max_batch_size=8)
    config = (folder / "config.pbtxt").read_text()
    assert config.count("TYPE_FP16") == 2 and "TYPE_FP32" not in config
    onnx.checker.check_model(str(folder / "1" / "model.onnx"), full_check=True)


def test_trainer_export_and_cli_write_half_models(tmp_path, capsys):
    from cli_util import one_line_error, run_cli
    from trainer_models import blobs, bn_artifacts

    trainer = gc.Trainer(bn_artifacts(), backend="numpy")
    trainer.fit(gc.data.DataLoader(blobs(64), batch_size=32), 1, progress=False)
    batch = blobs(7, seed=3)
    expected = trainer.predict(batch)["logits"]
    path = trainer.export_inference(tmp_path / "half.onnx", dtype="float16")
    onnx.checker.check_model(str(path), full_check=True)
    got = _ort(gc.load(path), {"x": batch["x"].astype(np.float16)})
    _assert_near({"logits": expected}, got, "float16", "export")

    trainer.save_checkpoint(tmp_path / "ck")
    assert run_cli(capsys, "export", tmp_path / "ck", "-o", tmp_path / "cli.onnx", "--dtype", "bfloat16").code == 0
    assert gc.load(tmp_path / "cli.onnx").inputs[0].dtype == "bfloat16"
    trainer.export_inference(tmp_path / "f32.onnx")
    result = run_cli(capsys, "optimize", tmp_path / "f32.onnx", "-o", tmp_path / "opt.onnx", "--dtype", "float16")
    assert result.code == 0 and "float16" in result.out
    assert gc.load(tmp_path / "opt.onnx").outputs[0].dtype == "float16"
    bad = run_cli(capsys, "optimize", path, "-o", tmp_path / "x.onnx", "--dtype", "float8")
    assert "--dtype float8: graphc converts to bfloat16 or float16 (did you mean 'float16'?)" in one_line_error(bad)
    assert not (tmp_path / "x.onnx").exists()


def test_deploy_triton_converts_in_one_step(tmp_path):
    factory, inputs = EXAMPLES["cnn"]
    model = gc.capture(factory(), **inputs())
    folder = gc.deploy.triton(model, tmp_path / "repo", "cnn16", max_batch_size=8, dtype="float16",
                              keep_io_types=False)
    config = (folder / "config.pbtxt").read_text()
    assert config.count("TYPE_FP16") == 2 and "TYPE_FP32" not in config
    written = gc.load(folder / "1" / "model.onnx")
    onnx.checker.check_model(str(folder / "1" / "model.onnx"), full_check=True)
    assert written.opset == 17 and written.inputs[0].dtype == "float16"
    feeds = _feeds(model, batch=3)
    _assert_near(gc.Session(model, backend="numpy").run(feeds), _ort(written, _as(feeds, "float16")), "float16",
                 "deployed")
    bf16 = gc.deploy.triton(model, tmp_path / "repo", "cnnbf16", dtype="bfloat16", keep_io_types=False)
    assert (bf16 / "config.pbtxt").read_text().count("TYPE_BF16") == 2
    with pytest.raises(gc.GraphError, match="dtype must be one of \\['bfloat16', 'float16'\\], got 'half'"):
        gc.deploy.triton(model, tmp_path / "repo", "bad", dtype="half")
    assert not (tmp_path / "repo" / "bad").exists()


def test_cli_prints_a_range_warning_as_one_line(tmp_path, capsys):
    from cli_util import run_cli

    _range_resize_model().save(tmp_path / "m.onnx")
    deployed = run_cli(capsys, "deploy", "triton", tmp_path / "m.onnx", "--repo", tmp_path / "repo", "--name", "m",
                       "--dtype", "float16", "--no-keep-io-types")
    optimized = run_cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--dtype", "float16")
    for result in (deployed, optimized):
        assert result.code == 0, result.err
        assert result.err.strip().splitlines() == [
            "warning: 1 finite float32 values beyond float16's range were clamped to its largest finite value, "
            "in 'k' (1)"], result.err
    assert "TYPE_FP16" in (tmp_path / "repo" / "m" / "config.pbtxt").read_text()


def test_a_scan_body_converts():
    """A running sum scaled by a body constant: the Scan's state, scanned input, body Constant
    and outputs all become float16, and the numbers match float32's."""
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT, [], [0.5])),
         helper.make_node("Mul", ["row", "k"], ["half_row"]), helper.make_node("Add", ["acc", "half_row"], ["acc_out"]),
         helper.make_node("Tanh", ["acc_out"], ["scanned"])], "body",
        [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [4]), helper.make_tensor_value_info("row", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("scanned", TensorProto.FLOAT, [4])])
    model = make_model([helper.make_node("Scan", ["init", "xs"], ["total", "ys"], body=body, num_scan_inputs=1)],
                       [("init", TensorProto.FLOAT, [4]), ("xs", TensorProto.FLOAT, ["T", 4])],
                       [("total", TensorProto.FLOAT, [4]), ("ys", TensorProto.FLOAT, ["T", 4])])
    half = gc.convert_float(model, "float16")
    onnx.checker.check_model(half.proto, full_check=True)
    (scan_body,) = [a.g for a in half.proto.graph.node[0].attribute if a.name == "body"]
    assert {v.type.tensor_type.elem_type for v in [*scan_body.input, *scan_body.output]} == {TensorProto.FLOAT16}
    assert scan_body.node[0].attribute[0].t.data_type == TensorProto.FLOAT16
    feeds = {"init": RNG.standard_normal(4).astype(np.float32), "xs": RNG.standard_normal((6, 4)).astype(np.float32)}
    reference = gc.Session(model, backend="numpy").run(feeds)
    for backend in ("numpy", "ort-cpu"):
        _assert_near(reference, gc.Session(half, backend=backend).run(_as(feeds, "float16")), "float16", backend)
    _assert_near(reference, _ort(half, _as(feeds, "float16")), "float16", "onnxruntime")


def test_the_report_counts_values_that_become_subnormal_beside_those_flushed():
    values = np.array([1e-3, 1e-5, -2e-5, 3e-8, 1e-8, 0.0, 6.2e-5], np.float32)
    model = make_model([helper.make_node("Mul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, [7])],
                       [("y", TensorProto.FLOAT, [7])], [("w", values)])
    half, report = gc.convert_float(model, "float16", report=True)
    # float16's smallest normal is 6.1e-5, its smallest subnormal 6e-8: 1e-5, -2e-5 and 3e-8 (to 6e-8)
    # become subnormals, 1e-8 becomes 0; 6.2e-5 stays normal
    as_half = values.astype(np.float16)
    assert report.subnormal == {"w": 3} and report.flushed == {"w": 1}
    assert np.count_nonzero((as_half != 0) & (np.abs(as_half) < np.finfo(np.float16).smallest_normal)) == 3
    assert gc.convert_float(model, "bfloat16", report=True)[1].subnormal == {}  # float32's exponent range
    got = gc.Session(half, backend="numpy").run({"x": np.ones(7, np.float16)})["y"]
    np.testing.assert_array_equal(got, as_half)
