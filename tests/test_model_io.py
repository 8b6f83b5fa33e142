"""graphc.model: save/load round trips, external data (and its path-traversal guard), corrupt
files, and importing ONNX files we did not write (onnx's test data, PyTorch exports)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.models import EXAMPLES
try:
    from dsl_util import check, rng, run_ort
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import check, rng, run_ort

DATA = Path(__file__).parent / "data"
ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def _captured(name: str = "cnn") -> gc.Model:
    factory, inputs = EXAMPLES[name]
    return gc.capture(factory(), seed=3, **inputs())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_round_trip_is_bit_exact(tmp_path, name):
    model = _captured(name)
    path = model.save(tmp_path / f"{name}.onnx")
    loaded = gc.load(path)
    assert loaded.proto.SerializeToString() == model.proto.SerializeToString()
    assert list(loaded.params) == list(model.params)
    for key, value in model.params.items():
        assert loaded.params[key].tobytes() == value.tobytes()
    assert loaded.inputs == model.inputs and loaded.outputs == model.outputs
    assert [n.metadata_props.get("graphc.source") for n in loaded.ir.graph] == \
           [n.metadata_props.get("graphc.source") for n in model.ir.graph]
    # bytes and ModelProto sources give the same model
    assert gc.load(path.read_bytes()).proto == loaded.proto
    assert gc.load(onnx.load(str(path))).proto == loaded.proto


def test_save_is_atomic_and_readable(tmp_path):
    model = _captured("two_layer_net")
    path = model.save(tmp_path / "sub" / "m.onnx")
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(path.parent)) == ["m.onnx"]  # no scratch files left behind


def test_external_data_round_trip(tmp_path):
    model = _captured("two_layer_net")
    path = model.save(tmp_path / "m.onnx", external_data=True)
    data = tmp_path / "m.onnx.data"
    assert data.is_file() and data.stat().st_size > 400_000
    assert path.stat().st_size < 10_000
    loaded = gc.load(path)
    for key, value in model.params.items():
        np.testing.assert_array_equal(loaded.params[key], value)
    x = rng(0).standard_normal((2, 784)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(loaded, {"x": x})["output"], run_ort(model, {"x": x})["output"])
    with pytest.raises(gc.ModelLoadError, match="bytes"):
        gc.load(path.read_bytes())


def _model_with_external(tmp_path: Path, location: str) -> Path:
    """A tiny model whose one initializer claims to live in ``location``."""
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[2],
                              data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", "8")):
        tensor.external_data.add(key=key, value=value)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])], initializer=[tensor])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)])
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_inside_the_folder_loads(tmp_path):
    path = _model_with_external(tmp_path, "w.bin")
    (path.parent / "w.bin").write_bytes(np.array([1, 2], np.float32).tobytes())
    np.testing.assert_array_equal(gc.load(path).params["w"], [1, 2])


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink"])
def test_external_data_outside_the_folder_is_refused(tmp_path, kind):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.array([7, 7], np.float32).tobytes())
    if kind == "absolute":
        path = _model_with_external(tmp_path, str(secret))
    elif kind == "dotdot":
        path = _model_with_external(tmp_path, "../secret.bin")
    else:
        path = _model_with_external(tmp_path, "link.bin")
        os.symlink(secret, path.parent / "link.bin")
    with pytest.raises(gc.ModelLoadError, match="outside the model's folder"):
        gc.load(path)


def test_missing_external_file(tmp_path):
    with pytest.raises(gc.ModelLoadError, match="missing"):
        gc.load(_model_with_external(tmp_path, "nothere.bin"))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "text", "missing"])
def test_corrupt_files_give_model_load_error(tmp_path, damage):
    good = _captured("two_layer_net").save(tmp_path / "good.onnx").read_bytes()
    bad = tmp_path / "bad.onnx"
    payload = {"truncated": good[: len(good) // 3], "garbage": rng(0).bytes(4096), "empty": b"",
               "text": b"hello, this is not a model\n"}.get(damage)
    if payload is not None:
        bad.write_bytes(payload)
    with pytest.raises(gc.ModelLoadError) as err:
        gc.load(bad)
    assert "Traceback" not in str(err.value) and len(str(err.value).splitlines()) == 1


def test_invalid_graph_gives_model_load_error():
    graph = onnx.helper.make_graph([onnx.helper.make_node("NoSuchOp", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    with pytest.raises(gc.ModelLoadError, match="invalid ONNX model"):
        gc.load(onnx.helper.make_model(graph))


_LIGHT = sorted((ONNX_DATA / "light").glob("*.onnx"))
_CONVERTED = sorted((ONNX_DATA / "pytorch-converted").glob("*/model.onnx"))


@pytest.mark.parametrize("path", _LIGHT, ids=[p.stem for p in _LIGHT])
def test_load_onnx_light_models(path):
    model = gc.load(path)
    assert model.inputs and model.outputs and len(model.ir.graph) > 0
    assert "Conv" in model.summary()


def test_load_onnx_pytorch_converted_models():
    assert len(_CONVERTED) > 50
    for path in _CONVERTED:
        model = gc.load(path)
        assert model.outputs, path
        again = gc.load(model.proto)
        assert len(again.ir.graph) == len(model.ir.graph)


def test_onnx_pytorch_converted_outputs_match():
    """Loaded models still compute what their test data says (a sample of them)."""
    from onnx import numpy_helper

    import onnxruntime as ort

    ran = 0
    for path in _CONVERTED:
        model = gc.load(path)
        data = path.parent / "test_data_set_0"
        inputs = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("input_*.pb"))]
        outputs = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("output_*.pb"))]
        feed_names = [s.name for s in model.inputs if s.name not in model.ir.graph.initializers]
        try:
            out = run_ort(model, dict(zip(feed_names, inputs)))
        except ort.capi.onnxruntime_pybind11_state.NotImplemented:
            continue  # opset-1 era ops onnxruntime no longer implements (e.g. AveragePool-1)
        ran += 1
        for got, want in zip(out.values(), outputs):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=str(path))
    assert ran >= 20


@pytest.mark.parametrize("name", ["torch_mlp", "torch_cnn_bn", "torch_attention"])
def test_load_pytorch_exports(tmp_path, name):
    model = gc.load(DATA / f"{name}.onnx")
    check(model)
    ref = np.load(DATA / f"{name}.npz", allow_pickle=False)
    out = run_ort(model, {"x": ref["input_x"]})
    np.testing.assert_allclose(out["y"], ref["output_y"], rtol=1e-4, atol=1e-5)
    # round trip through graphc keeps it bit-exact
    again = gc.load(model.save(tmp_path / f"{name}.onnx"))
    assert again.proto.graph == model.proto.graph
    if name == "torch_cnn_bn":
        assert {"conv.weight", "bn.running_mean", "fc.weight"} <= set(model.params)
        assert model.inputs[0].shape[0] == "N"


def test_tests_data_stays_small():
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 300_000


def test_every_onnx_element_type_has_a_spec():
    """A model may use any ONNX element type: each maps to a dtype name and numpy dtype, so specs,
    inspect and feed validation work (uint32 once raised a bare TypeError from ``model.inputs``)."""
    from graphc.model.dtypes import as_dtype, to_numpy, to_onnx

    for name, code in onnx.TensorProto.DataType.items():
        if code == onnx.TensorProto.UNDEFINED:
            continue
        dtype = as_dtype(code)
        assert to_onnx(dtype) == code and dtype == as_dtype(to_numpy(dtype)), name
    assert as_dtype(onnx.TensorProto.UINT32) == "uint32" and as_dtype(onnx.TensorProto.STRING) == "string"
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("BitShift", ["a", "b"], ["c"], direction="RIGHT")], "shift",
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UINT32, ["N"]) for n in "ab"],
        [onnx.helper.make_tensor_value_info("c", onnx.TensorProto.UINT32, ["N"])])
    model = gc.load(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]))
    assert str(model.inputs[0]) == "a: uint32[N]"
    got = gc.Session(model, backend="numpy").run({"a": np.array([16, 7], np.uint32), "b": np.array([2, 1], np.uint32)})
    assert got["c"].dtype == np.uint32 and got["c"].tolist() == [4, 3]
    with pytest.raises(gc.InputError, match="input 'a'"):
        gc.Session(model, backend="numpy").run({"a": np.array([1], np.int64), "b": np.array([1], np.uint32)})


def test_dims_written_as_minus_one_or_repeated_placeholder_are_unknown_each_on_its_own():
    """A Paddle-style input [-1, 3, '?', '?']: inspectable, runnable with any sizes on those axes
    (two '?' axes of different sizes, and a second input whose '?' differs again)."""
    from onnx import TensorProto, helper as oh

    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"]), oh.make_node("ReduceSum", ["z"], ["s"], keepdims=0)], "paddle",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"]),
         oh.make_tensor_value_info("z", TensorProto.FLOAT, ["?"])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3, "?", "?"]),
         oh.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    model = gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    assert model.inputs[0].shape == (None, 3, None, None) and model.inputs[1].shape == (None,)
    assert model.outputs[0].shape == (None, 3, None, None)
    x, z = rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32), np.arange(7, dtype=np.float32)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x, "z": z})
        np.testing.assert_array_equal(got["y"], np.maximum(x, 0))
        assert got["s"] == 21
    with pytest.raises(gc.InputError, match="x"):
        gc.Session(model, backend="numpy").run({"x": x[:, :2], "z": z})  # the fixed dim 3 still holds
