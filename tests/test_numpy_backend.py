"""The numpy backend as a whole: planning errors, runtime errors with source lines, intermediate
outputs, control flow with outer-scope values, seeded dropout, run_node, device residency."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.backends.numpy import NumpyBackend, claimed_ops, run_node
from graphc.model import ir_version_for
from numpy_backend_util import run_ort


def _model(nodes, inputs, outputs, initializers=(), opset=21):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version_for({"": opset})
    return model


def _vi(name, dtype=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def _mlp():
    w = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Neg", ["r"], ["n"], name="neg"),
             helper.make_node("ReduceSum", ["n"], ["y"], name="sum", keepdims=0)]
    return _model(nodes, [_vi("x", shape=["N", 4])], [_vi("y", shape=[])], [w])


def test_info_and_placement():
    backend = NumpyBackend()
    assert backend.info().available and backend.name == "numpy" and backend.device == "cpu"
    exe = backend.prepare(_mlp())
    assert exe.placement == {"mm": "numpy:cpu", "relu": "numpy:cpu", "neg": "numpy:cpu", "sum": "numpy:cpu"}
    assert exe.input_names == ["x"] and exe.output_names == ["y"]
    assert gc.backends.get_backend("numpy").name == "numpy"


def test_intermediate_outputs_by_name():
    exe = NumpyBackend().prepare(_mlp())
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    out = exe.run({"x": x}, outputs=["h", "r", "y"])
    np.testing.assert_allclose(out["h"], x @ (np.arange(12).reshape(4, 3) / 10), rtol=1e-6)
    np.testing.assert_array_equal(out["r"], np.maximum(out["h"], 0))
    np.testing.assert_allclose(out["y"], -out["r"].sum(), rtol=1e-6)
    assert set(exe.run({"x": x}, outputs=["r"])) == {"r"}  # runs only what "r" needs
    with pytest.raises(gc.GraphError, match="nope"):
        exe.run({"x": x}, outputs=["nope"])


def test_intermediates_are_freed_after_last_use():
    exe = NumpyBackend().prepare(_mlp())
    schedule = exe.plan.schedule(("y",))
    freed = [name for *_, frees, _step in schedule for name in frees]
    assert {"h", "r", "n"} <= set(freed)
    assert all("y" not in frees for *_, frees, _step in schedule)


def test_initializer_outputs_are_copies():
    w = onnx.numpy_helper.from_array(np.ones(3, np.float32), "w")
    model = _model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y")], [w])
    exe = NumpyBackend().prepare(model)
    exe.run({})["y"][:] = 5
    np.testing.assert_array_equal(exe.run({})["y"], np.ones(3))


def test_unsupported_op_fails_at_prepare_naming_op_node_and_domain():
    model = _model([helper.make_node("FancyOp", ["x"], ["y"], name="fancy_1", domain="com.example")],
                   [_vi("x")], [_vi("y")])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(gc.GraphError, match=r"FancyOp.*com\.example.*fancy_1"):
        NumpyBackend().prepare(model)
    # MaxRoiPool: a standard ai.onnx op the numpy backend has no kernel for.
    model = _model([helper.make_node("MaxRoiPool", ["x", "x"], ["y"], name="roi", pooled_shape=[2, 2])],
                   [_vi("x")], [_vi("y")])
    with pytest.raises(gc.GraphError, match=r"'MaxRoiPool'.*ai\.onnx.*'roi'"):
        NumpyBackend().prepare(model)


def test_unknown_attribute_fails_at_prepare():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r", bogus=1)], [_vi("x")], [_vi("y")])
    with pytest.raises(gc.GraphError, match="bogus"):
        NumpyBackend().prepare(model)


def test_runtime_failure_names_node_op_and_source_line():
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")
    node.metadata_props.add(key="graphc.source", value="models/mine.py:42")
    shape = onnx.numpy_helper.from_array(np.array([7, -1], np.int64), "s")
    exe = NumpyBackend().prepare(_model([node], [_vi("x", shape=[2, 3])], [_vi("y")], [shape]))
    with pytest.raises(gc.BackendError, match=r"bad_reshape.*Reshape.*models/mine\.py:42"):
        exe.run({"x": np.zeros((2, 3), np.float32)})


def test_missing_feed_is_an_input_error():
    with pytest.raises(gc.InputError, match="x"):
        NumpyBackend().prepare(_mlp()).run({})


def test_device_residency_is_trivial():
    exe = NumpyBackend().prepare(_mlp())
    x = np.ones((2, 4), np.float32)
    handle = exe.to_device(x)
    host, device = exe.run_bound({"x": handle}, ["y"], ["h"])
    np.testing.assert_allclose(exe.to_host(device["h"]), exe.run({"x": x}, ["h"])["h"])
    assert set(host) == {"y"}


# -- control flow ---------------------------------------------------------------------------------
def _if_model():
    outer = helper.make_node("Mul", ["x", "x"], ["sq"])  # read by both branches (outer scope)
    then_g = helper.make_graph([helper.make_node("Add", ["sq", "x"], ["t"])], "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Sub", ["sq", "x"], ["e"])], "else", [], [_vi("e")])
    cond = helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)
    pos = helper.make_node("Greater", ["s", "zero"], ["c"])
    node_if = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    zero = onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")
    return _model([outer, cond, pos, node_if], [_vi("x", shape=[3])], [_vi("y", shape=[3])], [zero])


@pytest.mark.parametrize("sign", [1, -1])
def test_if_reads_outer_scope(sign):
    model = _if_model()
    x = sign * np.array([1.0, 2.0, 3.0], np.float32)
    got = NumpyBackend().prepare(model).run({"x": x})["y"]
    np.testing.assert_allclose(got, run_ort(model, {"x": x})[0])


def _loop_model():
    # for i in range(n): acc = acc * scale + i; also scan out acc each step
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["acc_in", "scale"], ["scaled"]),
         helper.make_node("Add", ["scaled", "fi"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan_out"])],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("acc_in", shape=[2])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out", shape=[2]), _vi("scan_out", shape=[2])])
    loop = helper.make_node("Loop", ["n", "", "acc0"], ["acc", "trace"], body=body)
    return _model([loop], [_vi("n", TensorProto.INT64, []), _vi("acc0", shape=[2]), _vi("scale", shape=[2])],
                  [_vi("acc", shape=[2]), _vi("trace")])


@pytest.mark.parametrize("trips", [4, 0])
def test_loop_with_scan_outputs_and_outer_scope(trips):
    # no trips: the scan output is empty in the body output's shape, [0, 2] (it was [0])
    model = _loop_model()
    feeds = {"n": np.array(trips, np.int64), "acc0": np.array([1.0, -1.0], np.float32),
             "scale": np.array([0.5, 2.0], np.float32)}
    got = NumpyBackend().prepare(model).run(feeds)
    want = run_ort(model, feeds)
    assert [(a.shape, a.dtype) for a in (got["acc"], got["trace"])] == [(a.shape, a.dtype) for a in want]
    np.testing.assert_allclose(got["acc"], want[0])
    np.testing.assert_allclose(got["trace"], want[1])


def test_scan_cumulative_sum():
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
                             [_vi("s_in", shape=[2]), _vi("x_t", shape=[2])], [_vi("s_out", shape=[2]), _vi("y_t", shape=[2])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[1])
    model = _model([scan], [_vi("s0", shape=[2]), _vi("xs", shape=[5, 2])], [_vi("s", shape=[2]), _vi("ys", shape=[5, 2])])
    feeds = {"s0": np.zeros(2, np.float32), "xs": np.arange(10, dtype=np.float32).reshape(5, 2)}
    got = NumpyBackend().prepare(model).run(feeds)
    want = run_ort(model, feeds)
    np.testing.assert_allclose(got["ys"], want[1])
    np.testing.assert_allclose(got["s"], want[0])


# -- dropout and the seeded RNG -----------------------------------------------------------------
def _dropout_model():
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"])
    ratio = onnx.numpy_helper.from_array(np.array(0.25, np.float32), "ratio")
    training = onnx.numpy_helper.from_array(np.array(True), "training")
    return _model([node], [_vi("x")], [_vi("y"), _vi("mask", TensorProto.BOOL)], [ratio, training])


def test_training_dropout_is_seeded_and_scaled():
    x = np.ones((200, 50), np.float32)
    first = NumpyBackend().prepare(_dropout_model(), seed=3).run({"x": x})
    again = NumpyBackend().prepare(_dropout_model(), seed=3).run({"x": x})
    other = NumpyBackend().prepare(_dropout_model(), seed=4).run({"x": x})
    np.testing.assert_array_equal(first["mask"], again["mask"])
    assert not np.array_equal(first["mask"], other["mask"])
    assert abs(first["mask"].mean() - 0.75) < 0.02
    np.testing.assert_allclose(first["y"], first["mask"] / 0.75, rtol=1e-6)


# -- run_node -----------------------------------------------------------------------------------
def test_run_node_basic_and_errors():
    a, b = np.arange(6.0).reshape(2, 3), np.ones(3)
    (y,) = run_node("Add", [a, b], {}, opset=21)
    np.testing.assert_array_equal(y, a + 1)
    (y,) = run_node("Softmax", [a], {"axis": 0}, opset=11)  # coerced to 2-D at axis 0: whole tensor
    np.testing.assert_allclose(y.sum(), 1.0)
    vals, idx = run_node("MaxPool", [np.arange(16.0).reshape(1, 1, 4, 4)], {"kernel_shape": [2, 2], "strides": [2, 2]},
                         opset=21, num_outputs=2)
    np.testing.assert_array_equal(idx.ravel(), [5, 7, 13, 15])
    with pytest.raises(gc.GraphError, match="NoSuchOp"):
        run_node("NoSuchOp", [a], {}, opset=21)
    with pytest.raises(gc.BackendError, match="MatMul"):
        run_node("MatMul", [a, a], {}, opset=21)


def test_run_node_with_graph_attribute_and_scope():
    then_g = helper.make_graph([helper.make_node("Add", ["outer", "outer"], ["t"])], "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["outer"], ["e"])], "else", [], [_vi("e")])
    outer = np.array([1.0, 2.0], np.float32)
    (y,) = run_node("If", [np.array(True)], {"then_branch": then_g, "else_branch": else_g}, opset=21,
                    scope={"outer": outer})
    np.testing.assert_array_equal(y, 2 * outer)


def test_claims_the_ops_graphc_emits():
    emitted = ("Add Sub Mul Div Pow Neg MatMul Gemm Relu Gelu Erf Sigmoid Tanh Exp Log Sqrt Abs Softmax "
               "LogSoftmax Concat Reshape Transpose Where Max Min Clip ReduceSum ReduceMean ReduceMax "
               "ReduceMin Conv MaxPool AveragePool GlobalAveragePool BatchNormalization "
               "LayerNormalization Dropout Gather Cast Equal Less Greater Not And Or Identity Constant "
               "Shape Slice Unsqueeze Squeeze Expand Flatten ScatterElements ScatterND ConvTranspose "
               "Tile Range ConstantOfShape OneHot Sign Reciprocal GatherElements Pad Resize Split TopK "
               "ArgMax ArgMin LeakyRelu HardSigmoid HardSwish PRelu Elu Selu Softplus LRN "
               "InstanceNormalization LSTM GRU CumSum Einsum Mod Floor Ceil Round Sin Cos If Loop Scan").split()
    assert set(emitted) <= set(claimed_ops())


def test_model_local_functions_run_with_bound_attributes():
    body = [helper.make_node("Mul", ["a", "a"], ["sq"]),
            helper.make_node("Neg", ["sq"], ["neg"]),
            helper.make_node("LeakyRelu", ["neg"], ["out"], alpha=0.0)]
    body[2].attribute[0].ref_attr_name = "slope"  # alpha comes from the call's "slope"
    function = helper.make_function("local", "SquareAct", ["a"], ["out"], body,
                                    [helper.make_opsetid("", 21)], attributes=["slope"])
    call = helper.make_node("SquareAct", ["x"], ["y"], domain="local", slope=0.5)
    neg = helper.make_node("Neg", ["y"], ["z"])
    model = _model([call, neg], [_vi("x")], [_vi("z")])
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(function)
    x = np.array([-2.0, 3.0], np.float32)
    np.testing.assert_allclose(NumpyBackend().prepare(model).run({"x": x})["z"], 0.5 * x * x)


def test_random_ops_draw_from_the_seeded_generator():
    nodes = [helper.make_node("RandomNormal", [], ["n"], shape=[2000], mean=1.0, scale=2.0),
             helper.make_node("RandomUniformLike", ["n"], ["u"], low=-1.0, high=1.0)]
    model = _model(nodes, [], [_vi("n"), _vi("u")])
    first = NumpyBackend().prepare(model, seed=7).run({})
    np.testing.assert_array_equal(first["n"], NumpyBackend().prepare(model, seed=7).run({})["n"])
    assert abs(first["n"].mean() - 1.0) < 0.2 and abs(first["n"].std() - 2.0) < 0.2
    assert first["u"].min() >= -1 and first["u"].max() <= 1 and first["u"].dtype == np.float32


def test_inf_and_nan_results_are_values_not_warnings():
    """A fully masked softmax row (all -inf) is NaN in ONNX, as onnxruntime computes it; the
    numpy backend returns the same without numpy's RuntimeWarnings."""
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1), helper.make_node("Log", ["x"], ["l"])],
                   [_vi("x", shape=[2, 3])], [_vi("y", shape=[2, 3]), _vi("l", shape=[2, 3])])
    x = np.array([[-np.inf] * 3, [0.0, -1.0, -2.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = NumpyBackend().prepare(model).run({"x": x})
    expected = run_ort(model, {"x": x})
    np.testing.assert_allclose(got["y"], expected[0], rtol=1e-6)
    np.testing.assert_allclose(got["l"], expected[1], rtol=1e-6)
    assert np.isnan(got["y"][0]).all() and np.isnan(got["l"][1, 1:]).all()


@pytest.mark.parametrize("auto_pad", ["SAME_LOWER", "SAME_UPPER"])
def test_dilated_same_max_pool_matches_onnx_reference(auto_pad):
    # SAME keeps ceil(5 / 1) x ceil(6 / 1) and pads for the dilated extent 3 (the spec's formula);
    # onnxruntime 1.31 pads for the undilated kernel and gives [1, 2, 4, 5], so it is not the oracle.
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).standard_normal((1, 2, 5, 6)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2], auto_pad=auto_pad)
    model = _model([node], [_vi("x", shape=x.shape)], [_vi("y")])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    got = NumpyBackend().prepare(model).run({"x": x})["y"]
    assert got.shape == want.shape == (1, 2, 5, 6)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "asymmetric", "pytorch_half_pixel"])
@pytest.mark.parametrize(("n", "scale"), [(5, 1.4), (10, 0.7), (10, 1.3), (10, 0.9)])
def test_resize_size_from_a_float32_scale_matches_onnx_reference(n, scale, mode, coordinates):
    # output = floor(n * scale) with the float32 scale multiplied in double, as onnx's shape
    # inference and reference have it: 5 * 1.4f = 6.99999988 -> 6. onnxruntime 1.31 multiplies in
    # float32 (5 * 1.4f rounds to 7.0 -> 7), so it is not the oracle for these sizes.
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).standard_normal((1, 2, 3, n)).astype(np.float32)
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 1, scale])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coordinates)
    model = _model([node], [_vi("x", shape=x.shape)], [_vi("y")], [scales], opset=19)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type.shape
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    got = NumpyBackend().prepare(model).run({"x": x})["y"]
    assert got.shape == want.shape == tuple(d.dim_value for d in inferred.dim) == (1, 2, 3, round(n * scale) - 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
