"""Whole-model gradients: a symbolic batch dim, fan-out, frozen params, missing rules, errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.passes.autodiff import backward, gradient_model
try:
    from test_autodiff_rules import run_numpy, run_ort
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_rules import run_numpy, run_ort


def mlp_model(dtype=np.float64, batch="N") -> onnx.ModelProto:
    """x[N,4] -> MatMul W1 + b1 -> Relu -> Gemm(W2^T, b2) -> LogSoftmax -> mean(-picked) (+ W1 reused)."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype(dtype), "fc1.weight"),
        numpy_helper.from_array(rng.standard_normal(8).astype(dtype), "fc1.bias"),
        numpy_helper.from_array(rng.standard_normal((3, 8)).astype(dtype), "fc2.weight"),
        numpy_helper.from_array(rng.standard_normal(3).astype(dtype), "fc2.bias"),
        numpy_helper.from_array(np.array([-1, 3], dtype=np.int64), "flat"),
        numpy_helper.from_array(np.array(0.01, dtype=dtype), "l2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "fc1.bias"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("Gemm", ["h2", "fc2.weight", "fc2.bias"], ["logits"], transB=1, name="fc2"),
        helper.make_node("LogSoftmax", ["logits"], ["logp"], axis=1, name="logsoftmax"),
        # shape arithmetic on the batch: no gradient flows through it
        helper.make_node("Shape", ["logp"], ["shape"], name="shape"),
        helper.make_node("Reshape", ["logp", "flat"], ["logp2"], name="reshape"),
        helper.make_node("Mul", ["logp2", "onehot"], ["picked"], name="pick"),
        helper.make_node("ReduceSum", ["picked"], ["total"], keepdims=0, name="sum"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0, name="batch"),
        helper.make_node("Cast", ["n"], ["nf"], to=elem, name="nf"),
        helper.make_node("Div", ["total", "nf"], ["nll"], name="mean"),
        helper.make_node("Neg", ["nll"], ["ce"], name="neg"),
        # fan-out: fc1.weight also feeds an L2 penalty
        helper.make_node("Mul", ["fc1.weight", "fc1.weight"], ["w2"], name="sq"),
        helper.make_node("ReduceSum", ["w2"], ["wsum"], keepdims=0, name="wsum"),
        helper.make_node("Mul", ["wsum", "l2"], ["pen"], name="pen"),
        helper.make_node("Add", ["ce", "pen"], ["loss"], name="loss"),
    ]
    inits.append(numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", elem, [batch, 4]),
         helper.make_tensor_value_info("onehot", elem, [batch, 3])],
        [helper.make_tensor_value_info("loss", elem, []),
         helper.make_tensor_value_info("logits", elem, [batch, 3])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def feeds_for(n: int, dtype=np.float64) -> dict:
    rng = np.random.default_rng(n)
    labels = rng.integers(0, 3, n)
    return {"x": rng.standard_normal((n, 4)).astype(dtype), "onehot": np.eye(3, dtype=dtype)[labels]}


def numeric_grad(proto, feeds, name, p, eps=1e-6):
    out = np.zeros_like(p)
    for i in np.ndindex(p.shape):
        d = np.zeros_like(p)
        d[i] = eps
        plus = run_numpy(proto, {**feeds, name: p + d})["loss"]
        minus = run_numpy(proto, {**feeds, name: p - d})["loss"]
        out[i] = (plus - minus) / (2 * eps)
    return out


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_symbolic_batch_gradient_at_any_batch_size(batch):
    model = graphc.grad(graphc.load(mlp_model()), "loss")
    proto = model.proto
    assert [o.name for o in proto.graph.output] == [
        "loss", "logits", "fc1.weight_grad", "fc1.bias_grad", "fc2.weight_grad", "fc2.bias_grad", "l2_grad"]
    feeds = feeds_for(batch)
    out = run_numpy(proto, feeds)
    params = graphc.load(mlp_model()).params
    for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "l2"):
        np.testing.assert_allclose(out[f"{name}_grad"], numeric_grad(proto, feeds, name, params[name]),
                                   rtol=1e-5, atol=1e-7, err_msg=name)
    ort_out = run_ort(proto, feeds)
    for name, value in out.items():
        np.testing.assert_allclose(ort_out[name], value, rtol=1e-9, atol=1e-10, err_msg=name)


def test_grad_api_inputs_outputs_and_defaults():
    base = graphc.load(mlp_model())
    model = graphc.grad(base, "loss", wrt=["fc2.weight"])
    assert isinstance(model, graphc.Model)
    assert [i.name for i in model.inputs] == ["x", "onehot", "fc2.weight"]
    assert [o.name for o in model.outputs] == ["loss", "logits", "fc2.weight_grad"]
    assert model.outputs[-1].shape == (3, 8)
    # the param's initializer is the input's default: leaving it out uses the stored weights
    feeds = feeds_for(3)
    a = run_numpy(model.proto, feeds)
    b = run_numpy(model.proto, {**feeds, "fc2.weight": base.params["fc2.weight"]})
    np.testing.assert_array_equal(a["fc2.weight_grad"], b["fc2.weight_grad"])
    c = run_numpy(model.proto, {**feeds, "fc2.weight": 2 * base.params["fc2.weight"]})
    assert not np.allclose(a["loss"], c["loss"])
    # the input model is untouched
    assert [o.name for o in base.outputs] == ["loss", "logits"]
    onnx.checker.check_model(model.proto, full_check=True)


def test_grad_default_wrt_is_every_float_initializer():
    model = graphc.grad(graphc.load(mlp_model()), "loss")
    grads = [o.name for o in model.outputs if o.name.endswith("_grad")]
    assert grads == ["fc1.weight_grad", "fc1.bias_grad", "fc2.weight_grad", "fc2.bias_grad", "l2_grad"]


def test_unconnected_param_gets_zeros():
    proto = mlp_model()
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((2, 2)), "unused"))
    out = run_numpy(graphc.grad(graphc.load(proto), "loss", wrt=["unused"]).proto, feeds_for(2))
    np.testing.assert_array_equal(out["unused_grad"], np.zeros((2, 2)))


def test_bad_loss_and_wrt_raise_graph_error():
    base = graphc.load(mlp_model())
    with pytest.raises(graphc.GraphError, match="not an output"):
        graphc.grad(base, "nope")
    with pytest.raises(graphc.GraphError, match="must be a scalar"):
        graphc.grad(base, "logits")
    with pytest.raises(graphc.GraphError, match="no initializer or input"):
        graphc.grad(base, "loss", wrt=["fc9.weight"])
    with pytest.raises(graphc.GraphError, match="not floating-point"):
        graphc.grad(base, "loss", wrt=["flat"])


def test_missing_rule_names_op_node_and_source_line():
    proto = mlp_model()
    relu = next(n for n in proto.graph.node if n.name == "relu")
    relu.op_type = "EyeLike"  # no rule, no function body to go through, and the shape Relu had
    relu.metadata_props.add(key="graphc.source", value="models/mlp.py:12")
    with pytest.raises(graphc.GraphError, match=r"'EyeLike' \(node 'relu' \(defined at models/mlp.py:12\)"):
        graphc.grad(graphc.load(proto), "loss")
    # a frozen path through the op is fine
    graphc.grad(graphc.load(proto), "loss", wrt=["fc2.bias"])


def test_backward_in_place_returns_values_by_name():
    model = ir.serde.deserialize_model(mlp_model())
    from graphc.passes.autodiff.model import infer_shapes

    model = infer_shapes(model)
    graph = model.graph
    loss = next(v for v in graph.outputs if v.name == "loss")
    w = graph.initializers["fc1.weight"]
    n_before = len(graph)
    grads = backward(graph, loss, [w])
    assert set(grads) == {"fc1.weight"} and len(graph) > n_before
    assert all(n.domain in ("", "ai.onnx") for n in graph)


def test_gradient_graph_is_deterministic():
    a = gradient_model(graphc.load(mlp_model()).ir, "loss")
    b = gradient_model(graphc.load(mlp_model()).ir, "loss")
    assert ir.serde.serialize_model(a).SerializeToString() == ir.serde.serialize_model(b).SerializeToString()


def test_float32_model_trains_on_onnxruntime():
    proto = graphc.grad(graphc.load(mlp_model(np.float32)), "loss").proto
    feeds = feeds_for(5, np.float32)
    got = run_ort(proto, feeds)
    ref = run_numpy(proto, feeds)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5)
    assert got["fc1.weight_grad"].dtype == np.float32


def dynamic_broadcast_model() -> onnx.ModelProto:
    """loss = sum((a[N,3] * b[K,3] + w[3]) * reshape(x, s)) with K = 1 at run time: which axes
    were broadcast is only known when the graph runs (Shape-based sum_to)."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["ab", "w"], ["abw"]),
        helper.make_node("Reshape", ["x", "s"], ["xr"]),  # shape only known at run time
        helper.make_node("Mul", ["abw", "xr"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "dyn",
        [helper.make_tensor_value_info("a", TensorProto.DOUBLE, ["N", 3]),
         helper.make_tensor_value_info("b", TensorProto.DOUBLE, ["K", 3]),
         helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["M"]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])],
        initializer=[numpy_helper.from_array(rng.standard_normal(3), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("n,k", [(4, 1), (1, 4), (3, 3)])
def test_symbolic_broadcast_is_undone_at_run_time(n, k):
    model = graphc.grad(graphc.load(dynamic_broadcast_model()), "loss", wrt=["a", "b", "w"])
    rng = np.random.default_rng(n * 10 + k)
    m = max(n, k)
    feeds = {"a": rng.standard_normal((n, 3)), "b": rng.standard_normal((k, 3)),
             "x": rng.standard_normal(3 * m), "s": np.array([m, 3])}
    out = run_numpy(model.proto, feeds)
    x = feeds["x"].reshape(m, 3)
    a, b = feeds["a"], feeds["b"]
    np.testing.assert_allclose(out["a_grad"], np.broadcast_to(b * x, (m, 3)).sum(0, keepdims=True)
                               if n == 1 else b * x)
    np.testing.assert_allclose(out["b_grad"], np.broadcast_to(a * x, (m, 3)).sum(0, keepdims=True)
                               if k == 1 else a * x)
    np.testing.assert_allclose(out["w_grad"], x.sum(0))
    ort_out = run_ort(model.proto, feeds)
    for name in ("a_grad", "b_grad", "w_grad"):
        np.testing.assert_allclose(ort_out[name], out[name], rtol=1e-12)


class _Recurrent(graphc.nn.Module):
    """A DSL model with gc.scan (an RNN over time), gc.fori_loop and gc.cond on a parameter path."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.w = graphc.nn.Parameter(rng.standard_normal((3, 3)) * 0.5, dtype="float64")
        self.u = graphc.nn.Parameter(rng.standard_normal((2, 3)) * 0.5, dtype="float64")

    def forward(self, x, flag):
        def step(h, xt):
            h2 = graphc.tanh(h @ self.w + xt @ self.u)
            return h2, h2 * h2

        h, ys = graphc.scan(step, graphc.sum(x, axis=0) @ self.u * 0.0, x)
        h = graphc.fori_loop(0, 3, lambda i, c: graphc.tanh(c @ self.w), h)
        h = graphc.cond(flag, lambda a: a * 2.0, lambda a: graphc.exp(a), h)
        return {"loss": graphc.sum(h) + graphc.sum(ys)}


@pytest.mark.parametrize("length", [5, "T"])  # a symbolic length: reverse mode instead of unrolling
@pytest.mark.parametrize("flag", [True, False])
def test_dsl_control_flow_gradient(flag, length):
    model = graphc.capture(_Recurrent(), x=graphc.spec("float64", (length, 4, 2)), flag=graphc.spec("bool", ()))
    grad_model = graphc.grad(model, "loss")
    x = np.random.default_rng(1).standard_normal((5, 4, 2))
    feeds = {"x": x, "flag": np.array(flag)}
    out = run_numpy(grad_model.proto, feeds)
    for name, p in model.params.items():
        np.testing.assert_allclose(out[f"{name}_grad"], numeric_grad(grad_model.proto, feeds, name, p),
                                   rtol=1e-6, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("training,ratio", [(False, 0.5), (True, 0.0), (True, 0.25)])
def test_dropout_with_run_time_flag_and_ratio(training, ratio):
    """Dropout(x, ratio, training_mode) with both fed at run time: the gradient is the mask
    (the node's own mask output, added to it) scaled by 1 / (1 - ratio) in training, else 1."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Dropout", ["xw", "ratio", "training"], ["y"], seed=3),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "drop",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 4]),
         helper.make_tensor_value_info("ratio", TensorProto.DOUBLE, []),
         helper.make_tensor_value_info("training", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []),
         helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 4])],
        initializer=[numpy_helper.from_array(np.full(4, 2.0), "w")])
    model = graphc.grad(graphc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])),
                        "loss", wrt=["w"])
    assert sum(n.op_type == "Dropout" for n in model.proto.graph.node) == 1
    x = np.random.default_rng(0).standard_normal((64, 4))
    out = run_numpy(model.proto, {"x": x, "ratio": np.array(ratio), "training": np.array(training)})
    kept = out["y"] != 0  # x * w is never exactly 0 here, so the mask is where y survives
    scale = 1 / (1 - ratio) if training else 1.0
    np.testing.assert_allclose(out["w_grad"], (x * kept * scale).sum(0))
    if not training or ratio == 0.0:
        assert kept.all()


def test_old_opset_is_upgraded_by_grad_and_named_by_the_pass():
    """Gather's gradient needs ScatterND with reduction (opset 16): the pass says so on an
    opset-13 model; gc.grad upgrades the model to opset 17 first, as training does."""
    import onnx_ir as ir

    from graphc.passes.autodiff import gradient_model

    node = helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0)
    tail = helper.make_node("ReduceSum", ["rows"], ["loss"], keepdims=0)
    graph = helper.make_graph(
        [node, tail], "emb", [helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(np.ones((5, 2), np.float32), "table")])
    model = graphc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    with pytest.raises(graphc.GraphError, match="from opset 16; the model has opset 13"):
        gradient_model(ir.serde.deserialize_model(model.proto), "loss")
    grads = graphc.grad(model, "loss")
    assert grads.opset == 17
    got = graphc.Session(grads, backend="numpy").run({"idx": np.array([4, 1, 4])})["table_grad"]
    np.testing.assert_array_equal(got, [[0, 0], [1, 1], [0, 0], [0, 0], [2, 2]])


def test_concat_of_symbolic_parts_splits_at_run_time():
    nodes = [helper.make_node("Concat", ["a", "b"], ["ab"], axis=0),
             helper.make_node("Mul", ["ab", "ab"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "cat",
        [helper.make_tensor_value_info("a", TensorProto.DOUBLE, ["N", 3]),
         helper.make_tensor_value_info("b", TensorProto.DOUBLE, ["M", 3])],
        [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])])
    model = graphc.grad(graphc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])),
                        "loss", wrt=["a", "b"])
    rng = np.random.default_rng(0)
    for n, m in [(1, 4), (3, 2)]:
        a, b = rng.standard_normal((n, 3)), rng.standard_normal((m, 3))
        out = run_numpy(model.proto, {"a": a, "b": b})
        np.testing.assert_allclose(out["a_grad"], 2 * a)
        np.testing.assert_allclose(out["b_grad"], 2 * b)


def test_settings_computed_from_constants_and_static_shapes_are_folded():
    """Pad's pads built the way torch.onnx builds them (Shape of a constant, Sub, ConstantOfShape,
    Concat: no initializer holds them) and Resize scales from Concat of constants: the rules see
    through the chains (``folded_array``), with a symbolic batch, and the gradient matches
    central differences."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((2, 2, 1, 1)), "w")
    consts = [numpy_helper.from_array(np.array([1, 2], np.int64), "given"),
              numpy_helper.from_array(np.array([4], np.int64), "rank2"),
              numpy_helper.from_array(np.array([1.0, 1.0], np.float32), "ones"),
              numpy_helper.from_array(np.array([2.0, 2.0], np.float32), "twos")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Shape", ["given"], ["n"]), helper.make_node("Sub", ["rank2", "n"], ["rest"]),
             helper.make_node("ConstantOfShape", ["rest"], ["zeros"], value=numpy_helper.from_array(np.array([0], np.int64))),
             helper.make_node("Concat", ["zeros", "given", "zeros", "given"], ["pads8"], axis=0),
             helper.make_node("Concat", ["ones", "twos"], ["scales"], axis=0),
             helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="linear"),
             helper.make_node("Pad", ["r", "pads8"], ["p"], mode="constant"),
             helper.make_node("ReduceSumSquare", ["p"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "settings", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 2, 3, 3])],
                              [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])], [w, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    grads = graphc.grad(model, "loss", wrt=["w"])
    x = rng.standard_normal((2, 2, 3, 3))
    analytic = run_numpy(grads.proto, {"x": x})["w_grad"]
    direction, eps = rng.standard_normal((2, 2, 1, 1)), 1e-6
    base = numpy_helper.to_array(w)
    plus = run_numpy(grads.proto, {"x": x, "w": base + eps * direction})["loss"]
    minus = run_numpy(grads.proto, {"x": x, "w": base - eps * direction})["loss"]
    np.testing.assert_allclose(np.sum(analytic * direction), (plus - minus) / (2 * eps), rtol=1e-6)



def _resize_sizes_model(sizes_nodes: list, inputs: list, **resize_attrs) -> onnx.ModelProto:
    """loss = sum(Resize(x * w, sizes)^2), double, x [N, 2, 3, 4]; ``sizes_nodes`` make "sizes"."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1, 2, 3, 4)), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["c"]), *sizes_nodes,
             helper.make_node("Resize", ["c", "", "", "sizes"], ["r"], mode="linear", name="up", **resize_attrs),
             helper.make_node("ReduceSumSquare", ["r"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 2, 3, 4]),
                                                *inputs],
                              [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])],
                              [w, numpy_helper.from_array(np.array([7], np.int64), "seven")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_resize_sizes_from_shape_inference_follow_the_axes():
    """Resize sizes computed at run time for axes [0, 3] (the batch, from Shape(x), and 7):
    shape inference knows the output's last dim is 7, and the gradient reads it for axis 3, not
    the third dim of the output (which broke the rule: 'inner dimensions differ (7 vs 2)')."""
    sizes = [helper.make_node("Shape", ["x"], ["n"], start=0, end=1),
             helper.make_node("Concat", ["n", "seven"], ["sizes"], axis=0)]
    grads = graphc.grad(_resize_sizes_model(sizes, [], axes=[0, 3]), "loss", wrt=["w"])
    rng = np.random.default_rng(1)
    x, w, direction, eps = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((1, 2, 3, 4)), \
        rng.standard_normal((1, 2, 3, 4)), 1e-6
    analytic = run_numpy(grads.proto, {"x": x, "w": w})["w_grad"]
    plus = run_numpy(grads.proto, {"x": x, "w": w + eps * direction})["loss"]
    minus = run_numpy(grads.proto, {"x": x, "w": w - eps * direction})["loss"]
    np.testing.assert_allclose(np.sum(analytic * direction), (plus - minus) / (2 * eps), rtol=1e-6)


def test_resize_sizes_fed_at_run_time_are_a_clear_error():
    """Sizes fed as a graph input: shape inference cannot tell the resized dims, so the rule
    cannot build its interpolation matrices. It says so, naming the node, where it took the
    unknown dims for unchanged ones and returned dy as the gradient (of the output's shape)."""
    model = _resize_sizes_model([], [helper.make_tensor_value_info("sizes", TensorProto.INT64, [4])])
    with pytest.raises(graphc.AutodiffError, match=r"rule of Resize \(node 'up'\) failed: .* known before run time"):
        graphc.grad(model, "loss", wrt=["w"])

def test_imported_ceil_mode_pool_is_recorded_with_the_windows_it_has():
    """A ceil_mode MaxPool whose last window would start past the input (6 wide, kernel 2, stride
    3): onnx 1.23's inference counts 3 windows, every runtime 2. The gradient and training graphs
    record the pool's output as graphc's rule counts it (the numpy run and torch's max_pool2d)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1),
             helper.make_node("Mul", ["p", "w"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 6])],
                              [helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])],
                              [numpy_helper.from_array(rng.standard_normal((1, 2, 2, 2)).astype(np.float32), "w")])
    model = graphc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    want = run_numpy(model.proto, {"x": x})["y"].shape
    assert want == (1, 2, 2, 2)
    torch = pytest.importorskip("torch")
    assert tuple(torch.nn.functional.max_pool2d(torch.from_numpy(x), (3, 2), (2, 3), ceil_mode=True).shape) == want

    def recorded(proto):
        infos = {v.name: v for v in [*proto.graph.value_info, *proto.graph.output]}
        return tuple(d.dim_value for d in infos["p"].type.tensor_type.shape.dim)

    assert recorded(graphc.grad(model, "total", ["w"]).proto) == want
    arts = graphc.training.generate(model, graphc.losses.mse("y", label="t"), graphc.optim.SGD(0.1))
    assert recorded(arts.train_step.proto) == want


def test_clip6_bounds_take_the_input_dtype_when_upgraded():
    """Clip-6 keeps min/max as attributes; onnx's version converter makes them float32 Constants
    whatever x's dtype. A double model's gradient (and training graphs) build, with the bounds
    in double, and the gradient is dy where -0.5 <= x <= 0.5 (float64 finite differences)."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Clip", ["xw"], ["y"], min=-0.5, max=0.5),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)]
    graph = helper.make_graph(nodes, "clip6", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3, 4])],
                              [helper.make_tensor_value_info("total", TensorProto.DOUBLE, []),
                               helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3, 4])],
                              [numpy_helper.from_array(np.full(4, 1.5), "w")])
    model = graphc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)]))
    grads = graphc.grad(model, "total", ["w"])
    x = np.random.default_rng(0).standard_normal((3, 4))
    analytic, eps = run_numpy(grads.proto, {"x": x})["w_grad"], 1e-6
    numeric = [(run_numpy(grads.proto, {"x": x, "w": w + eps * d})["total"]
                - run_numpy(grads.proto, {"x": x, "w": w - eps * d})["total"]) / (2 * eps)
               for w, d in zip([np.full(4, 1.5)] * 4, np.eye(4))]
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)
    run_ort(grads.proto, {"x": x})  # onnxruntime loads it: one dtype per Clip
    graphc.training.generate(model, graphc.losses.mse("y", label="t"), graphc.optim.SGD(0.1))



def _mvn_model(dtype) -> onnx.ModelProto:
    """total = sum(MeanVarianceNormalization(x * w) * c), all in ``dtype``."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("MeanVarianceNormalization", ["xw"], ["y"]),
             helper.make_node("Mul", ["y", "c"], ["yc"]), helper.make_node("ReduceSum", ["yc"], ["total"], keepdims=0)]
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, (3, 4, 1)).astype(dtype), "w"),
             numpy_helper.from_array(rng.standard_normal((2, 3, 4, 1)).astype(dtype), "c")]
    graph = helper.make_graph(nodes, "mvn", [helper.make_tensor_value_info("x", elem, [2, 3, 4, 1])],
                              [helper.make_tensor_value_info("total", elem, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_mean_variance_normalization_gradient_is_typed_by_its_input(dtype):
    """MeanVarianceNormalization has no rule: autodiff goes through onnx's function body, whose
    epsilon is a float32 Constant whatever x's type. The expansion takes x's type, so the double
    and float16 gradients are valid ONNX, run on onnxruntime and keep the param's dtype; the
    double one matches float64 central differences, the float16 one the double one."""
    model = graphc.load(_mvn_model(dtype))
    grads = graphc.grad(model, "total", ["w"])
    onnx.checker.check_model(grads.proto, full_check=True)
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 1))
    analytic = run_numpy(grads.proto, {"x": x.astype(dtype)})["w_grad"]
    assert analytic.dtype == dtype
    np.testing.assert_allclose(run_ort(grads.proto, {"x": x.astype(dtype)})["w_grad"], analytic,
                               **({"rtol": 1e-9, "atol": 1e-12} if dtype == np.float64 else {"rtol": 0.05, "atol": 0.02}))
    exact = graphc.grad(graphc.load(_mvn_model(np.float64)), "total", ["w"]).proto
    w, eps = model.params["w"].astype(np.float64), 1e-6
    numeric = np.array([(run_numpy(exact, {"x": x, "w": w + eps * d})["total"]
                         - run_numpy(exact, {"x": x, "w": w - eps * d})["total"]) / (2 * eps)
                        for d in np.eye(w.size).reshape(w.size, *w.shape)]).reshape(w.shape)
    np.testing.assert_allclose(analytic, numeric, **({"rtol": 1e-6, "atol": 1e-8} if dtype == np.float64
                                                     else {"rtol": 0.05, "atol": 0.02}))

def _branch_tile_model(axes_as: str) -> onnx.ModelProto:
    """loss = sum(y^2), y = If(sum(x) > 0, tile(unsqueeze(x * w, axes), reps), tile(unsqueeze(x - w,
    axes), reps)): the branches read ``axes`` and ``reps`` from the main graph (``axes`` a Constant
    node or an initializer), as exporters write them; onnx's inference sees no data across scopes."""
    D = TensorProto.DOUBLE

    def branch(name, op):
        return helper.make_graph([helper.make_node(op, ["x", "w"], [f"{name}_v"]),
                                  helper.make_node("Unsqueeze", [f"{name}_v", "axes"], [f"{name}_u"]),
                                  helper.make_node("Tile", [f"{name}_u", "reps"], [f"{name}_t"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_t", D, None)])

    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    inits = [numpy_helper.from_array(np.linspace(-1, 1, 6).reshape(2, 3), "w"),
             numpy_helper.from_array(np.array([2, 1, 1], np.int64), "reps")] + ([axes] if axes_as == "initializer" else [])
    nodes = ([helper.make_node("Constant", [], ["axes"], value=axes)] if axes_as == "constant" else []) + [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0.0))),
        helper.make_node("Greater", ["s", "zero"], ["p"]),
        helper.make_node("If", ["p"], ["y"], then_branch=branch("a", "Mul"), else_branch=branch("b", "Sub")),
        helper.make_node("Mul", ["y", "y"], ["yy"]), helper.make_node("ReduceSum", ["yy"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "branch_tile", [helper.make_tensor_value_info("x", D, [2, 3])],
                              [helper.make_tensor_value_info("loss", D, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("axes_as", ["constant", "initializer"])
def test_tile_in_a_branch_on_main_graph_axes_gets_gradients_and_trains(axes_as):
    """Tile's rule needs its input's static shape; inside the branch that shape comes from an
    Unsqueeze by a main-graph constant, which the branches now see (float64 central differences)."""
    model = _branch_tile_model(axes_as)
    grads = graphc.grad(model, "loss", wrt=["w"])
    onnx.checker.check_model(grads.proto, full_check=True)
    w = numpy_helper.to_array(model.graph.initializer[0])
    gradients = graphc.training.generate(graphc.load(model), "loss", graphc.optim.SGD(0.1), trainable=["w"]).gradients
    for x in (np.full((2, 3), 0.5), np.full((2, 3), -0.5)):  # each branch
        numeric = numeric_grad(grads.proto, {"x": x}, "w", w)
        for backend in ("numpy", "ort-cpu"):
            np.testing.assert_allclose(graphc.Session(grads, backend=backend).run({"x": x})["w_grad"], numeric,
                                       rtol=1e-6, atol=1e-9, err_msg=backend)
        np.testing.assert_allclose(graphc.Session(gradients, backend="ort-cpu").run({"x": x})["w_grad"], numeric,
                                   rtol=1e-6, atol=1e-9)
