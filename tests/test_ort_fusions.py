"""onnxruntime rewrites that get some models wrong (backends/fusions.py): a session of a model that
holds one's pattern runs without that rewrite, and matches numpy or torch; other models keep it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
import graphc.nn.functional as F
from graphc.backends import fusions, pad_axes
from onnx_graphs import model, vi

R = np.random.default_rng(11)


def _built(nodes, feeds: dict[str, np.ndarray], inits=None, opset: int = 21) -> onnx.ModelProto:
    """A checked model of ``nodes`` whose inputs are ``feeds``' and whose output is ``y``, typed by
    onnx's shape inference."""
    inputs = [vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in feeds.items()]
    bare = model(nodes, inputs, [], inits or {}, opset=opset)
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(bare, strict_mode=True).graph.value_info}
    proto = model(nodes, inputs, [typed["y"]], inits or {}, opset=opset)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _ort(proto_or_model, feeds) -> np.ndarray:
    return gc.Session(gc.load(proto_or_model) if isinstance(proto_or_model, onnx.ModelProto) else proto_or_model,
                      backend="ort-cpu").run(feeds)["y" if isinstance(proto_or_model, onnx.ModelProto) else "output"]


def _reciprocal_times(one: np.ndarray, x: np.ndarray, y: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("Div", ["one", "x"], ["r"]), helper.make_node("Mul", ["r", "v"], ["y"])]
    return _built(nodes, {"x": x, "v": y}, {"one": one})


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_an_integer_one_over_x_times_y_matches_numpy(dtype):
    x, y = np.array([1, 2, 3, -4], dtype), np.array([5, 6, -7, 8], dtype)
    out = _ort(_reciprocal_times(np.array(1, dtype), x, y), {"x": x, "v": y})
    np.testing.assert_array_equal(out, np.trunc(1 / x).astype(dtype) * y)  # [5, 0, 0, 0], not y / x


def test_a_one_of_higher_rank_keeps_broadcasting_the_product_up():
    x, y = R.uniform(1, 2, 4).astype(np.float32), R.uniform(1, 2, 4).astype(np.float32)
    out = _ort(_reciprocal_times(np.ones((1, 1), np.float32), x, y), {"x": x, "v": y})
    assert out.shape == (1, 4)
    np.testing.assert_allclose(out, (1 / x * y)[None], rtol=1e-6)


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_the_dsl_truncated_reciprocal_times_a_tensor_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    m = gc.capture(lambda x, y: gc.div(1, x, rounding_mode="trunc") * y, x=gc.spec(dtype, (4,)), y=gc.spec(dtype, (4,)))
    x, y = np.array([1, 2, -1, 3], dtype), np.array([5, 6, 7, -8], dtype)
    want = (torch.div(1, torch.from_numpy(x), rounding_mode="trunc") * torch.from_numpy(y)).numpy()
    np.testing.assert_array_equal(_ort(m, {"x": x, "y": y}), want)


def test_the_dsl_ones_matrix_over_a_vector_times_a_vector_keeps_its_shape():
    torch = pytest.importorskip("torch")
    m = gc.capture(lambda x, y: gc.ones((1, 1), dtype="float64") / x * y, x=gc.spec("float64", (4,)),
                   y=gc.spec("float64", (4,)))
    x, y = R.uniform(1, 2, 4), R.uniform(1, 2, 4)
    want = (torch.ones(1, 1, dtype=torch.float64) / torch.from_numpy(x) * torch.from_numpy(y)).numpy()
    out = _ort(m, {"x": x, "y": y})
    assert out.shape == want.shape == (1, 4)
    np.testing.assert_allclose(out, want, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_a_clip_of_a_relu_with_a_constant_min_loads_and_matches_numpy(dtype):
    x = np.array([-3, -1, 0, 1, 5], dtype)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", "lo", "hi"], ["y"])]
    proto = _built(nodes, {"x": x}, {"lo": np.array(-1, dtype), "hi": np.array(2, dtype)})
    np.testing.assert_array_equal(_ort(proto, {"x": x}), np.clip(np.maximum(x, 0), -1, 2))


def test_the_dsl_relu_clamped_in_float64_matches_torch():
    torch = pytest.importorskip("torch")
    m = gc.capture(lambda x: F.relu(x).clamp(-1.0, 0.5), x=gc.spec("float64", (3, 8)))
    x = R.standard_normal((3, 8))
    np.testing.assert_allclose(_ort(m, {"x": x}), torch.relu(torch.from_numpy(x)).clamp(-1.0, 0.5).numpy(), rtol=0)


@pytest.mark.parametrize("cast", [False, True])
@pytest.mark.parametrize("value", [None, 0.0])
def test_a_max_pool_of_a_zero_padded_input_matches_torch(cast, value):
    torch = pytest.importorskip("torch")
    x = -R.uniform(1, 3, (1, 2, 5, 5)).astype(np.float32)  # negative: the pad's zeros are the windows' max
    nodes = [helper.make_node("Pad", ["x", "pads"] + (["value"] if value is not None else []), ["xp"])]
    inits = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), **({"value": np.float32(value)} if value is not None
                                                                     else {})}
    if cast:
        nodes.append(helper.make_node("Cast", ["xp"], ["xc"], to=TensorProto.DOUBLE))
    nodes.append(helper.make_node("MaxPool", ["xc" if cast else "xp"], ["y"], kernel_shape=[2, 2]))
    want = torch.nn.functional.max_pool2d(torch.nn.functional.pad(torch.from_numpy(x), (1, 1, 1, 1)), 2, 1).numpy()
    np.testing.assert_array_equal(_ort(_built(nodes, {"x": x}, inits), {"x": x}), want)


def _central_power_norm(x: np.ndarray, exponent: float, eps: float, g: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    """(x - mean) / sqrt(mean((x - mean) ** exponent) + eps) * g + b over the last axis."""
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"]), helper.make_node("Sub", ["x", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "p"], ["dp"]), helper.make_node("ReduceMean", ["dp", "axes"], ["m"]),
             helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y"])]
    inits = {"axes": np.array([-1], np.int64), "p": np.array(exponent, x.dtype), "eps": np.array(eps, x.dtype),
             "g": g, "b": b}
    return _built(nodes, {"x": x}, inits)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_layer_norm_pattern_of_another_exponent_matches_numpy(dtype):
    x, g, b = (R.standard_normal(shape).astype(dtype) for shape in ((2, 3, 8), 8, 8))
    d = x.astype(np.float64) - x.mean(-1, keepdims=True, dtype=np.float64)
    want = d / np.sqrt((d ** 3).mean(-1, keepdims=True) + 4) * g + b
    out = _ort(_central_power_norm(x, 3.0, 4.0, g, b), {"x": x})
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_a_float64_rms_norm_keeps_its_epsilon():
    torch = pytest.importorskip("torch")
    m = gc.capture(lambda x, w: x / (x.pow(2).mean(-1, keepdim=True) + 0.5).sqrt() * w, x=gc.spec("float64", (3, 8)),
                   w=gc.spec("float64", (8,)))
    x, w = R.standard_normal((3, 8)), R.standard_normal(8)
    want = torch.nn.functional.rms_norm(torch.from_numpy(x), (8,), torch.from_numpy(w), eps=0.5).numpy()
    np.testing.assert_allclose(_ort(m, {"x": x, "w": w}), want, rtol=1e-12)


def test_unseeded_bernoullis_of_one_input_draw_apart():
    p = np.full(256, 0.5, np.float32)
    nodes = [helper.make_node("Bernoulli", ["p"], ["a"]), helper.make_node("Bernoulli", ["p"], ["b"]),
             helper.make_node("Sub", ["a", "b"], ["y"])]  # merged (CSE spares nodes of graph outputs): all 0
    y = _ort(_built(nodes, {"p": p}), {"p": p})
    assert set(np.unique(y)) <= {-1.0, 0.0, 1.0} and np.any(y)  # all 0 by chance: 2 ** -256


def _nodes_model(nodes, inits, inputs=("x",), elem=TensorProto.FLOAT, shape=(2, 8)) -> onnx.ModelProto:
    return model(nodes, [vi(n, elem, list(shape)) for n in inputs], [vi("y", elem)], inits)


@pytest.mark.parametrize("proto,refused", [
    (_nodes_model([helper.make_node("Div", ["one", "x"], ["r"]), helper.make_node("Mul", ["r", "x"], ["y"])],
                  {"one": np.float32(1)}), ()),
    (_nodes_model([helper.make_node("Div", ["one", "x"], ["r"]), helper.make_node("Mul", ["r", "x"], ["y"])],
                  {"one": np.ones(1, np.float32)}), ("DivMulFusion",)),
    (_nodes_model([helper.make_node("Div", ["one", "x"], ["y"])], {"one": np.int64(1)}, elem=TensorProto.INT64), ()),
    (_nodes_model([helper.make_node("Div", ["one", "x"], ["r"]), helper.make_node("Mul", ["r", "x"], ["y"])],
                  {"one": np.int64(1)}, elem=TensorProto.INT64), ("DivMulFusion",)),
    (_nodes_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", "lo"], ["y"])],
                  {"lo": np.float32(-1)}), ()),
    (_nodes_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", "lo"], ["y"])],
                  {"lo": np.float64(-1)}, elem=TensorProto.DOUBLE), ("FuseReluClip",)),
    (_nodes_model([helper.make_node("Pad", ["x", "pads", "v"], ["p"]), helper.make_node("MaxPool", ["p"], ["y"],
                                                                                         kernel_shape=[2])],
                  {"pads": np.array([0, 0, 1, 0, 0, 1], np.int64), "v": np.float32(-np.inf)}, shape=(1, 2, 8)), ()),
    (model([helper.make_node("Pad", ["x", "pads", "v"], ["p"]),
            helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[2])],
           [vi("x", shape=[1, 2, 8]), vi("v", shape=[])], [vi("y")], {"pads": np.array([0, 0, 1, 0, 0, 1], np.int64)}),
     ()),  # a fed pad value is not folded
    (_nodes_model([helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("AveragePool", ["p"], ["y"],
                                                                                  kernel_shape=[2])],
                  {"pads": np.array([0, 0, 1, 0, 0, 1], np.int64)}, shape=(1, 2, 8)), ()),
    (_nodes_model([helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("MaxPool", ["p"], ["y"],
                                                                                  kernel_shape=[2])],
                  {"pads": np.array([0, 0, 1, 0, 0, 1], np.int64)}, shape=(1, 2, 8)), ("Pad_Fusion",)),
    (_nodes_model([helper.make_node("Bernoulli", ["x"], ["a"], seed=1.0), helper.make_node("Bernoulli", ["x"], ["b"]),
                   helper.make_node("Add", ["a", "b"], ["y"])], {}), ()),
])
def test_only_models_holding_a_pattern_turn_its_rewrite_off(proto, refused):
    assert fusions.fusion_refused(proto) == refused


@pytest.mark.parametrize("dtype,exponent,refused", [
    (np.float32, 2.0, ()), (np.float32, 3.0, ("LayerNormFusionL1",)), (np.float64, 2.0, ("SimplifiedLayerNormFusion",)),
])
def test_layer_norm_rewrites_are_off_only_for_their_patterns(dtype, exponent, refused):
    x, g = np.ones((2, 8), dtype), np.ones(8, dtype)
    assert fusions.fusion_refused(_central_power_norm(x, exponent, 1e-5, g, g)) == refused


def _scaled_product(scale: np.ndarray, x: np.ndarray, w: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Mul", ["p", "s"], ["y"])]
    return _built(nodes, {"x": x, "w": w}, {"s": scale})


@pytest.mark.parametrize("scale,refused", [
    (np.float64(1 / np.sqrt(3)), ("MatMulScaleFusion",)), (np.float64(0.5), ()), (np.float32(1 / np.sqrt(3)), ()),
])
def test_a_float64_scale_of_a_product_keeps_its_digits(scale, refused):
    x, w = R.standard_normal((3, 3)).astype(scale.dtype), R.standard_normal((3, 3)).astype(scale.dtype)
    proto = _scaled_product(scale, x, w)
    assert fusions.fusion_refused(proto) == refused
    tol = 1e-15 if scale.dtype == np.float64 else 1e-6
    np.testing.assert_allclose(_ort(proto, {"x": x, "w": w}), (x @ w) * scale, rtol=tol, atol=tol)


def test_float64_attention_matches_torch_on_ort():
    """The attention scores' ``q * (1 / sqrt(head_dim))``: a FusedMatMul's float alpha made it 5e-9 off."""
    torch = pytest.importorskip("torch")
    m = gc.nn.MultiheadAttention(6, 2, dtype="float64").init_parameters(seed=1)
    t = torch.nn.MultiheadAttention(6, 2, dtype=torch.float64)
    t.load_state_dict({k: torch.from_numpy(v) for k, v in m.state_dict().items()})
    q = R.standard_normal((4, 3, 6))
    want = t(*(torch.from_numpy(q),) * 3)[0].detach().numpy()
    got = _ort(gc.capture(lambda q: m(q, q, q)[0], q=q), {"q": q})
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_a_training_graph_keeps_every_rewrite():
    net = gc.nn.Sequential(gc.nn.Linear(4, 8), gc.nn.ReLU(), gc.nn.Linear(8, 3))
    mlp = gc.capture(net, x=gc.spec("float32", ("N", 4)))
    arts = gc.training.generate(mlp, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    assert fusions.fusion_refused(arts.train_step.proto) == ()
    assert fusions.fusion_refused(mlp.proto) == ()


@pytest.mark.parametrize("axes", [[1], [-1], [0, 2], [2, -3]])
@pytest.mark.parametrize("mode,value", [("constant", None), ("constant", 1.5), ("edge", None)])
def test_a_pad_given_axes_between_transposes_matches_numpy(axes, mode, value):
    x = R.standard_normal((2, 3, 4)).astype(np.float32)
    before, after = [1] * len(axes), [2] * len(axes)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Pad", ["t", "pads", "value" if value is not None else "", "axes"], ["p"], mode=mode),
             helper.make_node("Transpose", ["p"], ["y"], perm=[1, 0, 2])]
    inits = {"pads": np.array(before + after, np.int64), "axes": np.array(axes, np.int64),
             **({"value": np.float32(value)} if value is not None else {})}
    widths = [(0, 0)] * 3
    for axis, b, a in zip(axes, before, after):
        widths[axis % 3] = (b, a)
    fill = {"constant_values": value or 0} if mode == "constant" else {}
    t = np.pad(x.transpose(1, 0, 2), widths, mode=mode, **fill)
    np.testing.assert_array_equal(_ort(_built(nodes, {"x": x}, inits), {"x": x}), t.transpose(1, 0, 2))


def test_only_pads_given_constant_axes_of_a_known_rank_are_written_out():
    pad = helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"])
    inits = {"pads": np.array([1, 2], np.int64), "axes": np.array([-1], np.int64)}
    plain = model([helper.make_node("Pad", ["x", "pads"], ["y"])], [vi("x", shape=[2, 3])], [vi("y")],
                  {"pads": np.array([0, 1, 0, 2], np.int64)})
    unranked = model([pad], [vi("x")], [vi("y")], inits)
    assert pad_axes.without_axes(plain) is plain and pad_axes.without_axes(unranked) is unranked
    written = pad_axes.without_axes(model([pad], [vi("x", shape=[2, 3])], [vi("y")], inits))
    assert [n.op_type for n in written.graph.node] == ["Constant", "Pad"]
    assert len(written.graph.node[1].input) == 2
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(written.graph.node[0].attribute[0].t), [0, 1, 0, 2])
