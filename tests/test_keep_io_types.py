"""keep_io_types in the one-step half-precision forms: Trainer.export_inference, graphc export and
optimize, gc.deploy.triton and graphc deploy triton. A model converted with float32 inputs and
outputs kept runs float32 feeds on numpy and ort-cpu within float16/bfloat16 tolerance of the
float32 model; Triton's config lists TYPE_FP32 for them, and `graphc serve` of such a repository
answers a float32 JSON request."""

from __future__ import annotations

import inspect

import httpx
import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.compile.export import export_inference, inference_model
from graphc.models import EXAMPLES
from cli_util import one_line_error, run_cli
from serve_util import mixed_model, parse_pbtxt, serve_process
from trainer_models import blobs, bn_artifacts

# max |half - float32| / max |float32|, as tests/test_convert_float.py (measured worst 0.9e-3, 6.2e-3)
TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2}
RNG = np.random.default_rng(0)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.dtype == np.float32, got.dtype  # the kept interface: float32 out for float32 in
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-6))


def _assert_float32_interface_runs(path, feeds: dict, expected: dict, dtype: str) -> None:
    """The file passes the full check, keeps float32 inputs and outputs around a half-precision
    body, and answers float32 ``feeds`` within ``dtype``'s tolerance on numpy and ort-cpu."""
    onnx.checker.check_model(str(path), full_check=True)
    model = gc.load(path)
    assert {s.dtype for s in (*model.inputs, *model.outputs)} == {"float32"}
    assert not [i.name for i in model.proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(feeds)
        for name, want in expected.items():
            err = _relative_error(got[name], want)
            assert err < TOLERANCE[dtype], f"{backend} {name}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_trainer_export_with_kept_io_takes_float32_feeds(tmp_path, dtype):
    trainer = gc.Trainer(bn_artifacts(), backend="numpy")
    trainer.fit(gc.data.DataLoader(blobs(64), batch_size=32), 1, progress=False)
    batch = blobs(7, seed=3)
    expected = {"logits": trainer.predict(batch)["logits"]}
    path = trainer.export_inference(tmp_path / "half.onnx", dtype=dtype, keep_io_types=True)
    _assert_float32_interface_runs(path, {"x": batch["x"]}, expected, dtype)
    assert gc.load(trainer.export_inference(tmp_path / "plain.onnx", dtype=dtype)).inputs[0].dtype == dtype


def test_cli_export_and_optimize_keep_io_types(tmp_path, capsys):
    trainer = gc.Trainer(bn_artifacts(), backend="numpy")
    trainer.fit(gc.data.DataLoader(blobs(64), batch_size=32), 1, progress=False)
    batch = blobs(5, seed=4)
    expected = {"logits": trainer.predict(batch)["logits"]}
    trainer.save_checkpoint(tmp_path / "ck")
    exported = run_cli(capsys, "export", tmp_path / "ck", "-o", tmp_path / "e.onnx", "--dtype", "float16",
                       "--keep-io-types")
    assert exported.code == 0, exported.err
    _assert_float32_interface_runs(tmp_path / "e.onnx", {"x": batch["x"]}, expected, "float16")
    assert (tmp_path / "e.onnx").read_bytes() == trainer.export_inference(
        tmp_path / "p.onnx", dtype="float16", keep_io_types=True).read_bytes()

    trainer.export_inference(tmp_path / "f32.onnx")
    optimized = run_cli(capsys, "optimize", tmp_path / "f32.onnx", "-o", tmp_path / "o.onnx", "--dtype", "bfloat16",
                        "--keep-io-types")
    assert optimized.code == 0, optimized.err
    _assert_float32_interface_runs(tmp_path / "o.onnx", {"x": batch["x"]}, expected, "bfloat16")
    assert run_cli(capsys, "optimize", tmp_path / "f32.onnx", "-o", tmp_path / "h.onnx", "--dtype",
                   "float16").code == 0
    assert gc.load(tmp_path / "h.onnx").inputs[0].dtype == "float16"  # the default converts the interface too


def test_deploy_keeps_float32_io_by_default_and_converts_it_when_asked(tmp_path, capsys):
    onnx.save(mixed_model(), tmp_path / "m.onnx")
    runs = {flags: run_cli(capsys, "deploy", "triton", tmp_path / "m.onnx", "--repo", tmp_path / "repo", "--name",
                           name, "--max-batch-size", "8", "--dtype", "float16", *flags)
            for name, flags in (("kept", ("--keep-io-types",)), ("default", ()), ("half", ("--no-keep-io-types",)))}
    assert all(r.code == 0 for r in runs.values()), [r.err for r in runs.values()]

    def types(name: str) -> dict[str, str]:
        config = parse_pbtxt((tmp_path / "repo" / name / "config.pbtxt").read_text())
        return {t["name"][0]: t["data_type"][0] for t in (*config["input"], *config["output"])}

    kept = {"x": "TYPE_FP32", "idx": "TYPE_INT64", "mask": "TYPE_BOOL",
            "y": "TYPE_FP32", "s": "TYPE_INT64", "m": "TYPE_BOOL"}
    assert types("kept") == types("default") == kept
    assert types("half") == {**kept, "x": "TYPE_FP16", "y": "TYPE_FP16"}
    written = gc.load(tmp_path / "repo" / "kept" / "1" / "model.onnx")
    assert written.opset == 17 and [i.data_type for i in written.proto.graph.initializer if i.name == "w"] == [
        onnx.TensorProto.FLOAT16]
    gc.deploy.triton(mixed_model(), tmp_path / "repo", "api", dtype="bfloat16")
    assert types("api") == types("kept")
    gc.deploy.triton(mixed_model(), tmp_path / "repo", "api16", dtype="bfloat16", keep_io_types=False)
    assert types("api16") == {**kept, "x": "TYPE_BF16", "y": "TYPE_BF16"}


def test_keep_io_types_without_a_dtype_is_refused_and_writes_nothing(tmp_path, capsys):
    onnx.save(mixed_model(), tmp_path / "m.onnx")
    with pytest.raises(gc.GraphError, match=r"keep_io_types=False says how to convert to a dtype, and no dtype "
                                            r"was given: pass dtype='float16' or 'bfloat16' too"):
        gc.deploy.triton(tmp_path / "m.onnx", tmp_path / "repo", "m", keep_io_types=False)
    assert not (tmp_path / "repo").exists()
    with pytest.raises(gc.GraphError, match="keep_io_types=True says how to convert"):
        export_inference(tmp_path / "nowhere", tmp_path / "x.onnx", keep_io_types=True, allow_untrained=True)
    with pytest.raises(gc.GraphError, match="keep_io_types must be True or False, got 'yes'"):
        gc.convert_float(mixed_model(), keep_io_types="yes")
    for command, flag in ((("deploy", "triton", tmp_path / "m.onnx", "--repo", tmp_path / "repo", "--name", "m"),
                           "--keep-io-types"),
                          (("deploy", "triton", tmp_path / "m.onnx", "--repo", tmp_path / "repo", "--name", "m"),
                           "--no-keep-io-types"),
                          (("optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx"), "--keep-io-types")):
        result = run_cli(capsys, *command, flag)
        assert result.code == 2
        assert one_line_error(result).strip() == (f"error: ValueError: {flag} says how --dtype converts the model's inputs "
                                          "and outputs, and no --dtype was given: add --dtype float16 or bfloat16, "
                                          "or leave it out")
    assert not (tmp_path / "repo").exists() and not (tmp_path / "o.onnx").exists()


def test_defaults_are_false_for_conversions_and_true_for_deployments():
    """convert_float keeps onnxconverter-common's False, and the forms that write a model file
    follow it; a deployment keeps the interface its clients already call."""
    def default(fn):
        return inspect.signature(fn).parameters["keep_io_types"].default

    assert [default(f) for f in (gc.convert_float, inference_model, export_inference,
                                 gc.Trainer.export_inference)] == [False] * 4
    assert default(gc.deploy.triton) is True


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_serve_answers_a_float32_json_request_to_a_half_deployment(tmp_path, capsys, backend):
    factory, inputs = EXAMPLES["cnn"]
    model = gc.capture(factory(), **inputs())
    model.save(tmp_path / "cnn.onnx")
    deployed = run_cli(capsys, "deploy", "triton", tmp_path / "cnn.onnx", "--repo", tmp_path / "repo", "--name", "cnn",
                       "--max-batch-size", "8", "--dtype", "float16")
    assert deployed.code == 0, deployed.err
    (spec,) = model.inputs
    x = RNG.standard_normal((3, *spec.shape[1:])).astype(np.float32)
    expected = gc.Session(model, backend="numpy").run({spec.name: x})[model.outputs[0].name]
    request = {"inputs": [{"name": spec.name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    with serve_process(str(tmp_path / "repo"), "--backend", backend) as (_, port):
        reply = httpx.post(f"http://127.0.0.1:{port}/v2/models/cnn/infer", json=request, timeout=60)
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert output["datatype"] == "FP32" and output["shape"] == list(expected.shape)
    got = np.asarray(output["data"], np.float32).reshape(expected.shape)
    assert _relative_error(got, expected) < TOLERANCE["float16"]
