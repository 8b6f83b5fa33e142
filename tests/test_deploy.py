"""gc.deploy.triton / `graphc deploy triton`: config.pbtxt checked field by field against the
model, batch dims, opset/IR for servers, external data, atomic re-deploys (confinement and
names: test_deploy_confinement.py)."""

from __future__ import annotations

import os
import stat

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc as gc
from graphc.cli import main
from serve_util import fixed_model, mixed_feeds, mixed_model, parse_pbtxt

TRITON_TYPES = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.INT64: "TYPE_INT64",
                onnx.TensorProto.BOOL: "TYPE_BOOL", onnx.TensorProto.UINT16: "TYPE_UINT16",
                onnx.TensorProto.UINT32: "TYPE_UINT32", onnx.TensorProto.UINT64: "TYPE_UINT64",
                onnx.TensorProto.STRING: "TYPE_STRING"}


def model_tensors(values) -> list[tuple[str, str, list[int]]]:
    """(name, Triton type, dims with -1 for symbolic) of ONNX graph inputs/outputs."""
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        out.append((v.name, TRITON_TYPES[t.elem_type], dims))
    return out


def config_tensors(entries) -> list[tuple[str, str, list[int]]]:
    return [(e["name"][0], e["data_type"][0], e["dims"]) for e in entries]


def check_against_model(folder, name, max_batch_size):
    config = parse_pbtxt((folder / "config.pbtxt").read_text())
    proto = onnx.load(str(folder / "1" / "model.onnx"))
    assert config["name"] == [name]
    assert config["backend"] == ["onnxruntime"]
    assert config["max_batch_size"] == [max_batch_size]
    strip = (lambda dims: dims[1:]) if max_batch_size else (lambda dims: dims)
    for entries, values in ((config["input"], proto.graph.input), (config["output"], proto.graph.output)):
        assert config_tensors(entries) == [(n, t, strip(d)) for n, t, d in model_tensors(values)]
    return config, proto


@pytest.mark.parametrize("max_batch_size", [0, 16])
def test_config_matches_every_input_and_output(tmp_path, max_batch_size):
    folder = gc.deploy.triton(mixed_model(), tmp_path / "repo", "mixed", max_batch_size=max_batch_size)
    assert folder == tmp_path / "repo" / "mixed"
    config, _ = check_against_model(folder, "mixed", max_batch_size)
    assert config["instance_group"] == [{"count": [1], "kind": ["KIND_CPU"]}]
    assert "dynamic_batching" not in config
    if max_batch_size == 0:  # full shapes, the symbolic batch dim as -1
        assert config_tensors(config["input"])[0] == ("x", "TYPE_FP32", [-1, 4])


def test_unsigned_and_string_tensors_get_their_triton_types(tmp_path):
    from onnx import TensorProto, helper

    kinds = {"u16": TensorProto.UINT16, "u32": TensorProto.UINT32, "u64": TensorProto.UINT64,
             "text": TensorProto.STRING}
    graph = helper.make_graph([helper.make_node("Identity", [k], [f"{k}_out"]) for k in kinds], "kinds",
                              [helper.make_tensor_value_info(k, t, ["N", 2]) for k, t in kinds.items()],
                              [helper.make_tensor_value_info(f"{k}_out", t, ["N", 2]) for k, t in kinds.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = gc.deploy.triton(model, tmp_path, "kinds", max_batch_size=4)
    config, _ = check_against_model(folder, "kinds", 4)
    assert [t for _, t, _ in config_tensors(config["input"])] == ["TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
                                                                  "TYPE_STRING"]


def test_gpu_instances_and_dynamic_batching(tmp_path):
    folder = gc.deploy.triton(mixed_model(), tmp_path, "m", max_batch_size=8, instance="gpu", dynamic_batching=True)
    config = parse_pbtxt((folder / "config.pbtxt").read_text())
    assert config["instance_group"] == [{"count": [1], "kind": ["KIND_GPU"]}]
    assert config["dynamic_batching"] == [{}]


def test_rank1_tensor_with_batching_becomes_dims_1_reshaped(tmp_path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Neg", ["v"], ["w"])], "vec",
        [onnx.helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, ["N"])],
        [onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, ["N"])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    folder = gc.deploy.triton(model, tmp_path, "vec", max_batch_size=4)
    config = parse_pbtxt((folder / "config.pbtxt").read_text())
    assert config["input"][0]["dims"] == [1] and config["input"][0]["reshape"] == [{"shape": []}]


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(gc.GraphError, match=r"input x: float32\[2,3\] needs a symbolic leading \(batch\) dim.*max_batch_size=0"):
        gc.deploy.triton(fixed_model(), tmp_path, "fixed", max_batch_size=4)
    folder = gc.deploy.triton(fixed_model(), tmp_path, "fixed")  # no batching: fixed dims are fine
    assert parse_pbtxt((folder / "config.pbtxt").read_text())["input"][0]["dims"] == [2, 3]
    with pytest.raises(ValueError, match="dynamic_batching needs max_batch_size > 0"):
        gc.deploy.triton(mixed_model(), tmp_path, "m", dynamic_batching=True)
    with pytest.raises(ValueError, match="instance must be 'cpu' or 'gpu'"):
        gc.deploy.triton(mixed_model(), tmp_path, "m", instance="tpu")
    for bad in ("../escape", "a/b", ".hidden", "", "net\n", "x" * 129):
        with pytest.raises(ValueError, match="plain folder name"):
            gc.deploy.triton(mixed_model(), tmp_path, bad)
    assert not (tmp_path / "m").exists()


def ort_outputs(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("opset, written", [(None, 17), (21, 21)])
def test_servers_get_opset_17_ir_8_unless_asked(tmp_path, opset, written):
    folder = gc.deploy.triton(mixed_model(opset=21), tmp_path, "m", max_batch_size=8, opset=opset)
    proto = onnx.load(str(folder / "1" / "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    assert {o.domain: o.version for o in proto.opset_import}[""] == written
    assert proto.ir_version == onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", written)])
    if written == 17:
        assert proto.ir_version == 8
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param == "N"  # batch dim stays symbolic
    feeds = mixed_feeds(5)
    for got, want in zip(ort_outputs(folder / "1" / "model.onnx", feeds), gc.Session(mixed_model(21)).run(feeds).values()):
        np.testing.assert_array_equal(got, want)


def test_nodes_that_share_a_name_are_written_apart(tmp_path):
    """ONNX lets nodes share a name; the onnxruntime inside a server refuses such a model, so
    the deployed copy renames them (the model itself is not changed)."""
    model = mixed_model()
    for node in model.graph.node:
        node.name = "op"
    folder = gc.deploy.triton(model, tmp_path, "m")
    names = [n.name for n in onnx.load(str(folder / "1" / "model.onnx")).graph.node]
    assert len(set(names)) == len(names) == len(model.graph.node)
    feeds = mixed_feeds(3)
    for got, want in zip(ort_outputs(folder / "1" / "model.onnx", feeds), gc.Session(mixed_model()).run(feeds).values()):
        np.testing.assert_array_equal(got, want)
    assert {n.name for n in model.graph.node} == {"op"}


def test_lower_opset_models_are_not_upgraded(tmp_path):
    model = mixed_model(opset=13)
    folder = gc.deploy.triton(model, tmp_path, "m")
    assert onnx.load(str(folder / "1" / "model.onnx")).opset_import[0].version == 13


def test_external_data_lies_in_the_version_folder_readable_by_all(tmp_path):
    folder = gc.deploy.triton(mixed_model(), tmp_path, "m", external_data=True)
    data = folder / "1" / "model.onnx.data"
    assert data.is_file()
    for path in (data, folder / "1" / "model.onnx", folder / "config.pbtxt"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    feeds = mixed_feeds(3)
    got = gc.Session(folder / "1" / "model.onnx", backend="ort-cpu").run(feeds)
    np.testing.assert_array_equal(got["y"], gc.Session(mixed_model(), backend="ort-cpu").run(feeds)["y"])


def test_redeploy_adds_a_version_and_leaves_no_temporaries(tmp_path):
    gc.deploy.triton(mixed_model(), tmp_path, "m", external_data=True)
    folder = gc.deploy.triton(fixed_model(), tmp_path, "m")
    assert sorted(p.name for p in (folder / "1").iterdir()) == ["model.onnx", "model.onnx.data"]  # kept as it was
    assert sorted(p.name for p in (folder / "2").iterdir()) == ["model.onnx"]
    assert sorted(p.name for p in folder.iterdir()) == ["1", "2", "config.pbtxt"]
    assert parse_pbtxt((folder / "config.pbtxt").read_text())["input"][0]["name"] == ["x"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def graphc(*args) -> int:
    with pytest.raises(SystemExit) as done:
        main([str(a) for a in args])
    return done.value.code or 0


def test_cli_deploy_triton(tmp_path, capsys):
    onnx.save(mixed_model(), str(tmp_path / "mixed.onnx"))
    assert graphc("deploy", "triton", tmp_path / "mixed.onnx", "--repo", tmp_path / "repo", "--name", "mixed",
                  "--max-batch-size", 32, "--gpu", "--dynamic-batching") == 0
    assert "config.pbtxt" in capsys.readouterr().out
    config, _ = check_against_model(tmp_path / "repo" / "mixed", "mixed", 32)
    assert config["instance_group"][0]["kind"] == ["KIND_GPU"] and "dynamic_batching" in config
    onnx.save(fixed_model(), str(tmp_path / "fixed.onnx"))
    assert graphc("deploy", "triton", tmp_path / "fixed.onnx", "--repo", tmp_path / "repo", "--name", "f",
                  "--max-batch-size", 4) == 2
    assert "symbolic leading" in capsys.readouterr().err


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_models_go_to_opset_17_through_gelus_function_body(tmp_path, approximate):
    """Gelu exists from opset 20 only and the version converter cannot bring it down: it is
    replaced by onnx's own function body first, so a captured transformer deploys at 17."""
    def net(x):
        return gc.gelu(x, approximate=approximate) * 2.0

    model = gc.capture(net, x=gc.spec("float32", ("N", 5)), opset=21)
    assert "Gelu" in [n.op_type for n in model.proto.graph.node]
    folder = gc.deploy.triton(model, tmp_path, "gelu", max_batch_size=8)
    served = onnx.load(str(folder / "1" / "model.onnx"))
    assert served.opset_import[0].version == 17 and served.ir_version == 8
    assert "Gelu" not in [n.op_type for n in served.graph.node] and not served.functions
    onnx.checker.check_model(served, full_check=True)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    expected = gc.Session(model, backend="ort-cpu").run({"x": x})
    got = ort.InferenceSession(served.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], next(iter(expected.values())), rtol=1e-5, atol=1e-6)


def test_transformer_example_deploys_with_default_settings(tmp_path):
    from graphc.models import EXAMPLES

    factory, inputs = EXAMPLES["transformer"]
    model = gc.capture(factory(), **inputs())
    folder = gc.deploy.triton(model, tmp_path, "encoder", max_batch_size=8)
    check_against_model(folder, "encoder", 8)


def test_opset_23_function_ops_with_computed_axes_go_to_opset_17(tmp_path):
    """RMSNormalization (opset 23) and Mish (18): their bodies compute the reduce axes from the
    input's rank at run time; those are folded before the version converter needs them."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1)
    inits = [onnx.numpy_helper.from_array(rng.normal(size=(6, 8)).astype(np.float32), "W"),
             onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, size=8).astype(np.float32), "gamma")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Mish", ["h"], ["m"]),
             helper.make_node("RMSNormalization", ["m", "gamma"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "fn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    folder = gc.deploy.triton(model, tmp_path, "fn", max_batch_size=8)
    served = onnx.load(str(folder / "1" / "model.onnx"))
    assert served.opset_import[0].version == 17
    assert not {"Mish", "RMSNormalization"} & {n.op_type for n in served.graph.node}
    onnx.checker.check_model(served, full_check=True)
    x = rng.normal(size=(3, 6)).astype(np.float32)
    expected = gc.Session(model, backend="numpy").run({"x": x})["y"]
    got = ort.InferenceSession(served.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("noop", [0, 1])
def test_attributes_newer_than_the_server_opset_are_dropped_only_when_default(tmp_path, noop):
    """ReduceMean at 18 takes noop_with_empty_axes; onnx's converter keeps it going to 17, where
    the op has no such attribute. Its default (0) changes nothing and goes; 1 cannot be kept."""
    from onnx import TensorProto, helper

    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0,
                                                noop_with_empty_axes=noop)], "mean",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    if noop:
        with pytest.raises(gc.GraphError, match="noop_with_empty_axes"):
            gc.deploy.triton(model, tmp_path, "mean")
        return
    folder = gc.deploy.triton(model, tmp_path, "mean")
    served = onnx.load(str(folder / "1" / "model.onnx"))
    onnx.checker.check_model(served, full_check=True)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    got = ort.InferenceSession(served.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x.mean(axis=1), rtol=1e-6)


def _one_node_model(node, inputs, inits=(), opset=20):
    """``node`` as a model, its float outputs' shapes from onnx's inference."""
    from onnx import helper

    graph = helper.make_graph([node], "one", inputs, [], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model.graph.output.extend(inferred[o] for o in node.output)
    return model


def _run_served(folder, feeds):
    served = onnx.load(str(folder / "1" / "model.onnx"))
    assert served.opset_import[0].version == 17
    onnx.checker.check_model(served, full_check=True)
    session = ort.InferenceSession(served.SerializeToString(), providers=["CPUExecutionProvider"])
    return served, session.run(None, feeds)


@pytest.mark.parametrize("case", ["pad", "split_num_outputs", "grid_sample_linear", "constant_of_shape"])
def test_ops_onnx_converter_cannot_bring_down_deploy_at_opset_17(tmp_path, case):
    """onnx's version converter has no adapter to take Pad (18), Split with num_outputs (18),
    GridSample (20) or ConstantOfShape (20) below those opsets; graphc rewrites each to its
    older form (the same outputs on onnxruntime)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    feeds, inits = {"x": x}, []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])]
    if case == "pad":
        node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")
        inits = [onnx.numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "pads")]
    elif case == "split_num_outputs":
        node = helper.make_node("Split", ["x"], ["y", "z", "w"], axis=3, num_outputs=3)
    elif case == "grid_sample_linear":
        node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode="linear", padding_mode="border")
        feeds["grid"] = rng.uniform(-1.2, 1.2, (2, 3, 3, 2)).astype(np.float32)
        inputs.append(helper.make_tensor_value_info("grid", TensorProto.FLOAT, [2, 3, 3, 2]))
    else:
        node = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=onnx.numpy_helper.from_array(np.array([1.5], np.float32)))
        inits = [onnx.numpy_helper.from_array(np.array([2, 3], np.int64), "shape")]
    model = gc.load(_one_node_model(node, inputs, inits))
    before = model.proto.SerializeToString()
    expected = gc.Session(model, backend="ort-cpu").run(feeds)
    folder = gc.deploy.triton(model, tmp_path, case)
    assert model.proto.SerializeToString() == before, "the caller's model is left as it was"
    served, got = _run_served(folder, feeds)
    assert not served.domain and all(n.domain == "" for n in served.graph.node)
    for name, value in zip(node.output, got):
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case, message", [
    ("wrap", "pads in 'wrap' mode, which exists only from opset 19"),
    ("col2im", "ONNX has no Col2Im before opset 18 and no function body for it"),
])
def test_ops_with_no_older_form_are_refused_by_name(tmp_path, case, message):
    from onnx import TensorProto, helper

    if case == "wrap":
        node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")
        inits = [onnx.numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads")]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    else:
        node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"])
        inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("image", [3, 3]), ("block", [2, 2]))]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])]
    with pytest.raises(gc.GraphError, match=message):
        gc.deploy.triton(_one_node_model(node, inputs, inits), tmp_path, case)
    assert not (tmp_path / case).exists()


def test_deploy_to_opset_17_folds_axes_computed_from_constants(tmp_path):
    """torch.onnx's dynamo exporter with optimize=False writes ReduceMean's axes as
    Reshape(Constant); onnx's converter needs a constant there to make them an attribute."""
    from onnx import TensorProto, helper as oh, numpy_helper as nh

    nodes = [oh.make_node("Constant", [], ["axes_flat"], value=nh.from_array(np.array([[2, 3]], np.int64))),
             oh.make_node("Constant", [], ["shape"], value=nh.from_array(np.array([2], np.int64))),
             oh.make_node("Reshape", ["axes_flat", "shape"], ["axes"]),
             oh.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)]
    graph = oh.make_graph(nodes, "pool", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 5])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model = gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    served = gc.load(gc.deploy.triton(model, tmp_path, "pool") / "1" / "model.onnx")
    assert served.opset == 17
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(gc.Session(served, backend="ort-cpu").run({"x": x})["y"], x.mean((2, 3)), rtol=1e-6)
