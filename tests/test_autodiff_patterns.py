"""Gradients written for a pattern rather than node by node, checked against float64 finite
differences and numpy vs onnxruntime: SiLU and exact GELU (as torch.onnx writes it) through the
Mul rule (only where their inner values are read by that chain alone), and a pooled gradient that
joins a sum by broadcasting instead of Expand."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import graphc
from graphc.passes.autodiff import gradient_model

try:
    from test_autodiff_rules import run_numpy, run_ort
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_rules import run_numpy, run_ort

RNG = np.random.default_rng(0)
X = 3 * RNG.standard_normal((2, 3, 4, 4))
C = RNG.standard_normal((2, 3, 4, 4))  # the loss is sum(out * C)


def silu_model(order: str, extra_use: bool) -> ir.Model:
    """loss = sum((x * Sigmoid(x)) * C) (``order`` "xs" or "sx"); ``extra_use`` adds
    sum(Sigmoid(x)) to the loss, so the gate has a second reader."""
    mul_in = ["x", "s"] if order == "xs" else ["s", "x"]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="gate"), helper.make_node("Mul", mul_in, ["y"], name="silu"),
             helper.make_node("Mul", ["y", "c"], ["p"]), helper.make_node("ReduceSum", ["p"], ["l0"], keepdims=0)]
    if extra_use:
        nodes += [helper.make_node("ReduceSum", ["s"], ["l1"], keepdims=0), helper.make_node("Add", ["l0", "l1"], ["loss"])]
    else:
        nodes.append(helper.make_node("Identity", ["l0"], ["loss"]))
    graph = helper.make_graph(nodes, "silu", [], [helper.make_tensor_value_info("loss", 11, [])],
                              initializer=[numpy_helper.from_array(X, "x"), numpy_helper.from_array(C, "c")])
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


def loss_at(x: np.ndarray, extra_use: bool) -> float:
    s = 1 / (1 + np.exp(-x))
    return float(np.sum(x * s * C) + (np.sum(s) if extra_use else 0.0))


@pytest.mark.parametrize("order", ["xs", "sx"])
@pytest.mark.parametrize("extra_use", [False, True], ids=["gate-read-once", "gate-read-twice"])
def test_silu_gradient_matches_finite_differences(order, extra_use):
    grads = gradient_model(silu_model(order, extra_use), "loss", ["x"])
    proto = graphc.Model(grads).proto
    got = run_numpy(proto, {})["x_grad"]
    eps, t = 1e-6, RNG.standard_normal(X.shape)
    numeric = (loss_at(X + eps * t, extra_use) - loss_at(X - eps * t, extra_use)) / (2 * eps)
    np.testing.assert_allclose(np.sum(got * t), numeric, rtol=1e-7)
    np.testing.assert_allclose(run_ort(proto, {})["x_grad"], got, rtol=1e-10)
    # the fused form sends nothing through the gate's own rule; a gate read twice keeps it
    assert any(n.name.startswith("silu/grad/") for n in proto.graph.node)
    assert any(n.name.startswith("gate/grad/") for n in proto.graph.node) == extra_use


CLOSINGS = {"mul-half": ("Mul", 0.5, 0.5), "div-two": ("Div", 2.0, 0.5), "mul-other": ("Mul", 0.7, 0.7)}


def gelu_model(order: str, scale: str, extra_use: bool, dtype=np.float64, closing: str = "mul-half") -> ir.Model:
    """loss = sum(GELU(x) * C), GELU written x * (1 + Erf(x / sqrt2)) * 0.5 (``scale`` "div"; "mul":
    x * (1/sqrt2)), the Mul's operands in ``order``; ``extra_use`` adds sum(1 + erf) to the loss;
    ``closing`` the last node (``CLOSINGS``: "div-two" as / 2, "mul-other" a scale that is not
    GELU's). (onnxruntime has no float64 Erf: float32 for it.)"""
    mul_in = ["x", "a"] if order == "xa" else ["a", "x"]
    scaled = (helper.make_node("Div", ["x", "r2"], ["u"]) if scale == "div" else helper.make_node("Mul", ["ir2", "x"], ["u"]))
    op, operand, _ = CLOSINGS[closing]
    nodes = [scaled, helper.make_node("Erf", ["u"], ["e"], name="erf"), helper.make_node("Add", ["one", "e"], ["a"]),
             helper.make_node("Mul", mul_in, ["m"], name="gelu"), helper.make_node(op, ["m", "half"], ["y"]),
             helper.make_node("Mul", ["y", "c"], ["p"]), helper.make_node("ReduceSum", ["p"], ["l0"], keepdims=0)]
    if extra_use:
        nodes += [helper.make_node("ReduceSum", ["a"], ["l1"], keepdims=0), helper.make_node("Add", ["l0", "l1"], ["loss"])]
    else:
        nodes.append(helper.make_node("Identity", ["l0"], ["loss"]))
    consts = {"r2": np.sqrt(2.0), "ir2": 1 / np.sqrt(2.0), "one": 1.0, "half": operand}
    nodes[:0] = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.array(v, dtype), k))
                 for k, v in consts.items()]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, "gelu", [], [helper.make_tensor_value_info("loss", elem, [])],
                              initializer=[numpy_helper.from_array(X.astype(dtype), "x"),
                                           numpy_helper.from_array(C.astype(dtype), "c")])
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


def gelu_loss_at(x: np.ndarray, extra_use: bool, factor: float = 0.5) -> float:
    from math import erf

    a = 1 + np.vectorize(erf)(x / np.sqrt(2))
    return float(np.sum(factor * x * a * C) + (np.sum(a) if extra_use else 0.0))


@pytest.mark.parametrize("order", ["xa", "ax"])
@pytest.mark.parametrize("scale", ["div", "mul"])
@pytest.mark.parametrize("extra_use", [False, True], ids=["erf-read-once", "erf-read-twice"])
@pytest.mark.parametrize("closing", list(CLOSINGS))
def test_gelu_gradient_matches_finite_differences(order, scale, extra_use, closing):
    proto = graphc.Model(gradient_model(gelu_model(order, scale, extra_use, closing=closing), "loss", ["x"])).proto
    got = run_numpy(proto, {})["x_grad"]
    eps, t, factor = 1e-6, RNG.standard_normal(X.shape), CLOSINGS[closing][2]
    numeric = (gelu_loss_at(X + eps * t, extra_use, factor) - gelu_loss_at(X - eps * t, extra_use, factor)) / (2 * eps)
    np.testing.assert_allclose(np.sum(got * t), numeric, rtol=1e-7)
    single = gradient_model(gelu_model(order, scale, extra_use, np.float32, closing), "loss", ["x"])
    single = graphc.Model(single).proto
    np.testing.assert_allclose(run_ort(single, {})["x_grad"], run_numpy(single, {})["x_grad"], rtol=1e-5, atol=1e-6)
    # the whole gradient comes from x: the Erf rule runs only for a second reader of 1 + erf
    assert any(n.name.startswith("gelu/grad/") for n in proto.graph.node)
    assert any(n.name.startswith("erf/grad/") for n in proto.graph.node) == extra_use
    # GELU's own closing * 0.5 (or / 2): the rule reads the output's gradient, not half of it
    pattern = not extra_use and closing != "mul-other"
    assert any(n.op_type == "HardSigmoid" for n in proto.graph.node) == pattern
    assert any("half" in n.input for n in proto.graph.node if "/grad/" in n.name) != pattern


@pytest.mark.parametrize("backend", ["numpy", "ort"])
def test_gelu_gradient_far_out(backend):
    """Past |x| ~ 13 exp(x^2/2) overflows float32: the slope there is still 0 or 1, never NaN."""
    x = np.array([-200.0, -40.0, -13.5, -9.0, -1e-3, 0.0, 1e-3, 2.5, 9.0, 13.5, 40.0, 200.0], np.float32)
    for op in ("Gelu", "torch"):
        if op == "Gelu":
            nodes = [helper.make_node("Gelu", ["x"], ["y"])]
        else:
            nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.array(v, np.float32), k))
                     for k, v in {"r2": np.sqrt(2.0), "one": 1.0, "half": 0.5}.items()]
            nodes += [helper.make_node("Div", ["x", "r2"], ["u"]), helper.make_node("Erf", ["u"], ["e"]),
                      helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"], name="gelu"),
                      helper.make_node("Mul", ["m", "half"], ["y"])]
        nodes.append(helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0))
        graph = helper.make_graph(nodes, "far", [], [helper.make_tensor_value_info("loss", 1, [])],
                                  initializer=[numpy_helper.from_array(x, "x")])
        model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
        proto = graphc.Model(gradient_model(model, "loss", ["x"])).proto
        got = (run_numpy if backend == "numpy" else run_ort)(proto, {})["x_grad"]
        from math import erf, exp, pi, sqrt

        want = [0.5 * (1 + erf(v / sqrt(2))) + v * exp(-v * v / 2) / sqrt(2 * pi) for v in x.astype(float)]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=op)


def squeeze_excite_model(symbolic: bool, dtype=np.float64) -> tuple[ir.Model, np.ndarray]:
    """loss = sum(x * Sigmoid(GlobalAveragePool(x)) * C) + sum(ReduceMean(x, [2, 3]) * D): x's
    gradient sums full-size parts and pooled parts."""
    d = np.random.default_rng(1).standard_normal((2, 3, 1, 1))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="pool"), helper.make_node("Sigmoid", ["pooled"], ["gate"]),
             helper.make_node("Mul", ["x", "gate"], ["y"]), helper.make_node("Mul", ["y", "c"], ["p"]),
             helper.make_node("ReduceSum", ["p"], ["l0"], keepdims=0),
             helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1, name="mean"), helper.make_node("Mul", ["m", "d"], ["q"]),
             helper.make_node("ReduceSum", ["q"], ["l1"], keepdims=0), helper.make_node("Add", ["l0", "l1"], ["loss"])]
    dims = ["N", 3, 4, 4] if symbolic else list(X.shape)
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", elem, dims)],
                              [helper.make_tensor_value_info("loss", elem, [])],
                              initializer=[numpy_helper.from_array(C.astype(dtype), "c"),
                                           numpy_helper.from_array(d.astype(dtype), "d"),
                                           numpy_helper.from_array(np.array([2, 3], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    from onnx import shape_inference

    return ir.serde.deserialize_model(shape_inference.infer_shapes(model)), d


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic-batch"])
def test_pooled_gradient_joins_the_sum_by_broadcasting(symbolic):
    model, d = squeeze_excite_model(symbolic)
    proto = graphc.Model(gradient_model(model, "loss", ["x"])).proto
    assert not [n.name for n in proto.graph.node if n.op_type == "Expand" and n.name.startswith(("pool/", "mean/"))]

    def loss(x):
        gate = 1 / (1 + np.exp(-x.mean(axis=(2, 3), keepdims=True)))
        return float(np.sum(x * gate * C) + np.sum(x.mean(axis=(2, 3), keepdims=True) * d))

    got = run_numpy(proto, {"x": X})["x_grad"]
    eps, t = 1e-6, RNG.standard_normal(X.shape)
    np.testing.assert_allclose(np.sum(got * t), (loss(X + eps * t) - loss(X - eps * t)) / (2 * eps), rtol=1e-7)
    proto32 = graphc.Model(gradient_model(squeeze_excite_model(symbolic, np.float32)[0], "loss", ["x"])).proto
    x32 = {"x": X.astype(np.float32)}
    np.testing.assert_allclose(run_ort(proto32, x32)["x_grad"], run_numpy(proto32, x32)["x_grad"], rtol=1e-5, atol=1e-6)


def test_a_summed_gradient_times_a_constant_mask_stays_unexpanded():
    """loss = sum(ReduceSum(mask * LogSoftmax(z), axis 1) * w), the mask a constant: z's gradient
    reads the row sums' gradient broadcast by the Mul, not written out full-size by Expand."""
    z, mask = RNG.standard_normal((5, 7)), (RNG.random((5, 7)) < 0.3).astype(np.float64)
    w = RNG.standard_normal(5)
    nodes = [helper.make_node("LogSoftmax", ["z"], ["ls"], axis=1), helper.make_node("Mul", ["mask", "ls"], ["p"], name="pick"),
             helper.make_node("ReduceSum", ["p", "one"], ["r"], keepdims=0, name="rows"),
             helper.make_node("Mul", ["r", "w"], ["q"]), helper.make_node("ReduceSum", ["q"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "xent", [helper.make_tensor_value_info("z", 11, [5, 7])],
                              [helper.make_tensor_value_info("loss", 11, [])],
                              initializer=[numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(w, "w"),
                                           numpy_helper.from_array(np.array([1], np.int64), "one")])
    from onnx import shape_inference

    model = ir.serde.deserialize_model(shape_inference.infer_shapes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21)])))
    proto = graphc.Model(gradient_model(model, "loss", ["z"])).proto
    assert not [n.name for n in proto.graph.node if n.op_type == "Expand"]

    def loss(v):
        ls = v - np.log(np.exp(v).sum(axis=1, keepdims=True))
        return float(np.sum((mask * ls).sum(axis=1) * w))

    got = run_numpy(proto, {"z": z})["z_grad"]
    eps, t = 1e-6, RNG.standard_normal(z.shape)
    np.testing.assert_allclose(np.sum(got * t), (loss(z + eps * t) - loss(z - eps * t)) / (2 * eps), rtol=1e-7)
    np.testing.assert_allclose(run_ort(proto, {"z": z})["z_grad"], got, rtol=1e-10)


def test_hardswish_slope_at_its_kinks_follows_pytorch():
    """PyTorch's hardswish_backward: 0 below -3, x/3 + 1/2 on [-3, 3] (both ends included), 1
    above; the rule writes it as HardSigmoid plus a masked x/6, on both backends."""
    x = np.array([-4.0, -3.0001, -3.0, -1.5, 0.0, 2.0, 3.0, 3.0001, 5.0], np.float32)
    nodes = [helper.make_node("HardSwish", ["x"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", 1, [len(x)])],
                              [helper.make_tensor_value_info("loss", 1, [])])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    proto = graphc.Model(gradient_model(model, "loss", ["x"])).proto
    expected = np.where(x < -3, 0.0, np.where(x > 3, 1.0, x / 3 + 0.5)).astype(np.float32)
    np.testing.assert_allclose(run_numpy(proto, {"x": x})["x_grad"], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(run_ort(proto, {"x": x})["x_grad"], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mean_read", [False, True], ids=["y-only", "mean-read"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm_backward_reads_the_forward_statistics_in_float32(axis, mean_read):
    """A float32 LayerNormalization gets Mean and InvStdDev outputs its backward reads (float64
    ones recompute them): the gradients match the float64 rule's, on numpy and onnxruntime. With
    ``mean_read`` the node already has a Mean output, read by the loss too."""
    x = RNG.standard_normal((3, 4, 5)) * 2 + 0.5
    c = RNG.standard_normal((3, 4, 5))
    scale = RNG.standard_normal((4, 5) if axis == 1 else (5,))
    bias = RNG.standard_normal(scale.shape)

    def grads(dtype):
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "m"] if mean_read else ["y"], axis=axis,
                                  name="ln"),
                 helper.make_node("Mul", ["y", "c"], ["p"]), helper.make_node("ReduceSum", ["p"], ["l0"], keepdims=0)]
        if mean_read:  # Mean is float32 (stash_type 1) whatever x's dtype
            nodes += [helper.make_node("Cast", ["m"], ["mc"], to=elem), helper.make_node("ReduceSum", ["mc"], ["l1"], keepdims=0),
                      helper.make_node("Add", ["l0", "l1"], ["loss"])]
        else:
            nodes.append(helper.make_node("Identity", ["l0"], ["loss"]))
        graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", elem, list(x.shape))],
                                  [helper.make_tensor_value_info("loss", elem, [])],
                                  initializer=[numpy_helper.from_array(v.astype(dtype), k)
                                               for k, v in {"s": scale, "b": bias, "c": c}.items()])
        from onnx import shape_inference

        model = ir.serde.deserialize_model(shape_inference.infer_shapes(
            helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
        return graphc.Model(gradient_model(model, "loss", ["x", "s", "b"])).proto

    single, double = grads(np.float32), grads(np.float64)
    assert [len(n.output) for n in single.graph.node if n.op_type == "LayerNormalization"] == [3]
    assert [len(n.output) for n in double.graph.node if n.op_type == "LayerNormalization"] == [2 if mean_read else 1]
    want = run_numpy(double, {"x": x})
    for backend in (run_numpy, run_ort):
        got = backend(single, {"x": x.astype(np.float32)})
        for name in ("x_grad", "s_grad", "b_grad"):
            np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-5, err_msg=f"{backend.__name__} {name}")


def bias_model(batch, rest=(5, 6), bias=(6,)) -> ir.Model:
    """loss = sum((x + b) * C) for x [batch, *rest] (float32) and b ``bias``: b's gradient sums
    x's leading axes."""
    c = RNG.standard_normal((3, *rest)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "b"], ["y"], name="bias"), helper.make_node("Mul", ["y", "c"], ["p"]),
             helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "bias", [helper.make_tensor_value_info("x", 1, [batch, *rest])],
                              [helper.make_tensor_value_info("loss", 1, [])],
                              initializer=[numpy_helper.from_array(np.zeros(bias, np.float32), "b"),
                                           numpy_helper.from_array(c, "c")])
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


@pytest.mark.parametrize("batch", [3, "N"], ids=["static", "symbolic-batch"])
@pytest.mark.parametrize(("rest", "bias"), [((5, 6), (6,)), ((6,), (6,)), ((5,), ()), ((5, 6), (5, 6))],
                         ids=["rows-of-3d", "rows-of-2d", "all-to-scalar", "batch-only"])
def test_bias_gradient_over_leading_axes_is_a_gemv_on_the_cpu(batch, rest, bias):
    from graphc.passes.autodiff.core import backward
    from graphc.passes.autodiff.model import infer_shapes

    model = bias_model(batch, rest, bias)
    proto = graphc.Model(gradient_model(model, "loss", ["b"])).proto
    bias_grad = [n.op_type for n in proto.graph.node if n.name.startswith("bias/grad/")]
    assert "MatMul" in bias_grad and "ReduceSum" not in bias_grad
    x = RNG.standard_normal((3, *rest)).astype(np.float32)
    c = model.graph.initializers["c"].const_value.numpy()
    want = c.sum(tuple(range(c.ndim - len(bias))))
    for run in (run_numpy, run_ort):
        got = run(proto, {"x": x})["b_grad"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # on CUDA (unmeasured there) the ReduceSum stays
    graph = infer_shapes(bias_model(batch, rest, bias)).graph
    backward(graph, graph.outputs[0], [graph.initializers["b"]], device="cuda")
    assert [n.op_type for n in graph if n.name.startswith("bias/grad/") and n.op_type != "Constant"] == ["ReduceSum"]


@pytest.mark.parametrize("opset", [21, 22])
def test_bfloat16_gelu_gradient_stays_in_its_opset(opset):
    """HardSigmoid takes bfloat16 only from opset 22: below it the cdf is Mul and Add."""
    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)],
                              "bf16", [helper.make_tensor_value_info("x", onnx.TensorProto.BFLOAT16, [4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.BFLOAT16, [])],
                              initializer=[helper.make_tensor("w", onnx.TensorProto.BFLOAT16, [4], [1, 2, 3, 4])])
    graph.node[0].input[0] = "w"
    del graph.input[:]
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    proto = graphc.Model(gradient_model(model, "loss", ["w"])).proto
    onnx.checker.check_model(proto, full_check=True)
    assert any(n.op_type == "HardSigmoid" for n in proto.graph.node) == (opset >= 22)


@pytest.mark.parametrize(("dtype", "reverse"), [(np.float64, "MatMul"), (np.float32, "MatMul"), (np.float16, "Slice")])
def test_flipped_conv_input_gradient_reverses_the_taps(dtype, reverse):
    """A grouped stride-1 Conv's dx is a Conv of dy by the weight reversed in space, each group's
    channel axes swapped: in float32 and float64 the reversal is a product by the anti-identity,
    in other dtypes a Slice of step -1. dx against a direct sum (the loss is linear in x)."""
    rng = np.random.default_rng(11)
    x, w, r = rng.normal(size=(8, 4, 4, 4)), rng.normal(size=(4, 2, 3, 3)), rng.normal(size=(8, 4, 4, 4))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1]),
         helper.make_node("Mul", ["y", "r"], ["yr"]), helper.make_node("ReduceSum", ["yr"], ["loss"], keepdims=0)],
        "flipped", [], [helper.make_tensor_value_info("loss", elem, [])],
        initializer=[numpy_helper.from_array(v.astype(dtype), k) for k, v in (("x", x), ("w", w), ("r", r))])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    proto = graphc.Model(gradient_model(model, "loss", ["x"])).proto
    assert reverse in {n.op_type for n in proto.graph.node if "/grad/" in n.name}
    got = run_numpy(proto, {})["x_grad"]
    want = np.zeros_like(x)  # dx[n, c] = sum over its group's outputs o and taps of r[n, o, i+1-a, j+1-b] w[o, c', a, b]
    padded = np.pad(r, [(0, 0), (0, 0), (1, 1), (1, 1)])
    for c in range(4):
        for o in range(2 * (c // 2), 2 * (c // 2) + 2):
            for a in range(3):
                for b in range(3):
                    want[:, c] += padded[:, o, 2 - a:6 - a, 2 - b:6 - b] * w[o, c % 2, a, b]
    np.testing.assert_allclose(got, want, rtol=2e-2 if dtype == np.float16 else 1e-5, atol=5e-2 if dtype == np.float16 else 1e-5)


def shared_weight_model(rows: list[tuple[int, ...]]) -> tuple[ir.Model, list[np.ndarray], list[np.ndarray], np.ndarray]:
    """loss = sum_i sum((x_i @ w) * c_i), float64: one weight w [3, 5] read by a MatMul per x_i
    (shapes ``rows``, each ending in 3); (model, xs, cs, w)."""
    w = RNG.standard_normal((3, 5))
    xs = [RNG.standard_normal(shape) for shape in rows]
    cs = [RNG.standard_normal((*shape[:-1], 5)) for shape in rows]
    nodes, inits = [], [numpy_helper.from_array(w, "w")]
    for i, (x, c) in enumerate(zip(xs, cs)):
        inits += [numpy_helper.from_array(x, f"x{i}"), numpy_helper.from_array(c, f"c{i}")]
        nodes += [helper.make_node("MatMul", [f"x{i}", "w"], [f"y{i}"], name=f"read{i}"),
                  helper.make_node("Mul", [f"y{i}", f"c{i}"], [f"p{i}"]),
                  helper.make_node("ReduceSum", [f"p{i}"], [f"l{i}"], keepdims=0)]
    nodes.append(helper.make_node("Sum", [f"l{i}" for i in range(len(rows))], ["loss"]))
    graph = helper.make_graph(nodes, "shared", [], [helper.make_tensor_value_info("loss", 11, [])], initializer=inits)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    return model, xs, cs, w


@pytest.mark.parametrize("rows", [[(2, 3), (4, 3)], [(2, 3), (1, 3), (4, 3)], [(2, 2, 3), (3, 3), (1, 4, 3)]],
                         ids=["two-reads", "three-reads", "batched-reads"])
def test_a_weight_read_by_several_matmuls_gets_one_gemm_over_the_stacked_rows(rows):
    """Each read's gradient is x_i^T @ dy_i; their sum is one Gemm of the stacked rows
    (Concat(x_i)^T @ Concat(dy_i), as an unrolled RNN's recurrence weight takes it), no Sum or Add
    of per-read products; it equals sum_i x_i^T c_i (float64) on numpy and onnxruntime."""
    model, xs, cs, _ = shared_weight_model(rows)
    proto = graphc.Model(gradient_model(model, "loss", ["w"])).proto
    want = sum(x.reshape(-1, 3).T @ c.reshape(-1, 5) for x, c in zip(xs, cs))
    for run in (run_numpy, run_ort):
        np.testing.assert_allclose(run(proto, {})["w_grad"], want, rtol=1e-10, atol=1e-12, err_msg=run.__name__)
    products = [n for n in proto.graph.node if n.op_type == "Gemm"]
    gradient_ops = [n.op_type for n in proto.graph.node if "grad/" in n.name]
    assert len(products) == 1 and not {"Sum", "Add", "Transpose"} & set(gradient_ops), gradient_ops
    made_by = {o: n.op_type for n in proto.graph.node for o in n.output}
    assert [made_by[v] for v in products[0].input] == ["Concat", "Concat"]


def block_concat_model(shape: tuple[int, ...], axis: int, blocks: list[tuple], extra_use: bool):
    """loss = sum(Concat(x[block] for block in blocks, axis) * c) (+ sum(x[blocks[0]]) with ``extra_use``),
    float64: each block a Slice of x by (starts, ends, axes); (model, x, the exact gradient of x)."""
    x = RNG.standard_normal(shape)
    parts = [x[_region(len(shape), *b)] for b in blocks]
    c = RNG.standard_normal(np.concatenate(parts, axis).shape)
    want, offset = np.zeros_like(x), 0
    for b, part in zip(blocks, parts):
        want[_region(len(shape), *b)] += np.take(c, range(offset, offset + part.shape[axis]), axis)
        offset += part.shape[axis]
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(c, "c")]
    nodes = []
    for i, (starts, ends, axes) in enumerate(blocks):
        inits += [numpy_helper.from_array(np.array(v, np.int64), f"{k}{i}") for k, v in zip("sea", (starts, ends, axes))]
        nodes.append(helper.make_node("Slice", ["x", f"s{i}", f"e{i}", f"a{i}"], [f"b{i}"]))
    nodes += [helper.make_node("Concat", [f"b{i}" for i in range(len(blocks))], ["y"], axis=axis, name="reorder"),
              helper.make_node("Mul", ["y", "c"], ["p"]), helper.make_node("ReduceSum", ["p"], ["l0"], keepdims=0)]
    if extra_use:
        want[_region(len(shape), *blocks[0])] += 1
        nodes += [helper.make_node("ReduceSum", ["b0"], ["l1"], keepdims=0), helper.make_node("Add", ["l0", "l1"], ["loss"])]
    else:
        nodes.append(helper.make_node("Identity", ["l0"], ["loss"]))
    graph = helper.make_graph(nodes, "blocks", [], [helper.make_tensor_value_info("loss", 11, [])], initializer=inits)
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])), want


def _region(rank: int, starts, ends, axes) -> tuple[slice, ...]:
    region = [slice(None)] * rank
    for s, e, a in zip(starts, ends, axes):
        region[a] = slice(s, e)
    return tuple(region)


# (x shape, Concat axis, blocks as Slice (starts, ends, axes), whether they permute x's blocks along the axis)
BLOCKS = {
    "gates-rows": ((12, 3), 0, [([4], [8], [0]), ([0], [4], [0]), ([8], [12], [0])], True),
    "negative-bounds-last-axis": ((2, 7), 1, [([-3], [2 ** 62], [-1]), ([0], [-3], [1])], True),
    "overlap": ((6, 2), 0, [([0], [4], [0]), ([2], [6], [0])], False),
    "gap": ((6, 2), 0, [([4], [6], [0]), ([0], [3], [0])], False),
    "cut-on-another-axis": ((4, 4), 0, [([2, 0], [4, 3], [0, 1]), ([0, 0], [2, 3], [0, 1])], False),
}


@pytest.mark.parametrize("extra_use", [False, True], ids=["blocks-read-once", "first-block-read-twice"])
@pytest.mark.parametrize("case", list(BLOCKS))
def test_a_concat_of_permuted_slices_gets_the_inverse_permutation(case, extra_use):
    """Slices of one x along the Concat's axis that tile it (an RNN's gate reorder) send dy's blocks
    back in x's order, one Split and Concat, no Pad per Slice nor Sum; overlapping, partial or
    otherwise cut blocks keep the Pads. Exact on numpy and onnxruntime, a second read included."""
    shape, axis, blocks, permuted = BLOCKS[case]
    model, want = block_concat_model(shape, axis, blocks, extra_use)
    proto = graphc.Model(gradient_model(model, "loss", ["x"])).proto
    for run in (run_numpy, run_ort):
        np.testing.assert_allclose(run(proto, {})["x_grad"], want, rtol=1e-12, atol=1e-12, err_msg=run.__name__)
    pads = sum(n.op_type == "Pad" for n in proto.graph.node)
    assert pads == (extra_use if permuted else len(blocks)), [n.op_type for n in proto.graph.node]


@pytest.mark.parametrize("loss", ["sum", "mean", "scaled", "swapped"])
@pytest.mark.parametrize("batch", [None, 4])
def test_a_sums_gradient_handed_to_two_products_of_one_param(loss, batch):
    """loss = reduce(a*x + a*(x+1)): the Add hands the reduction's broadcast gradient to both Muls,
    and the first reads it unexpanded. The Expand stays for the second (it was removed at once, and
    the second Mul read a value no node made); x as [3] (a's shape) or [4, 3]."""
    reduce = {"sum": lambda t: t.sum(), "mean": lambda t: t.mean(), "scaled": lambda t: t.sum() * 2,
              "swapped": lambda t: t.sum()}[loss]

    class Twice(graphc.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = graphc.nn.Parameter(graphc.tensor(RNG.standard_normal(3)))

        def forward(self, x):
            return reduce(self.a * x + ((x + 1) * self.a if loss == "swapped" else self.a * (x + 1)))

    x = RNG.standard_normal((3,) if batch is None else (batch, 3))
    model = graphc.capture(Twice(), x=x)
    proto = graphc.grad(model, "output").proto
    got = run_numpy(proto, {"x": x})["a_grad"]
    ref = {"sum": 1.0, "mean": 1 / x.size, "scaled": 2.0, "swapped": 1.0}[loss] * (2 * x + 1)
    np.testing.assert_allclose(got, ref.reshape(-1, 3).sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(run_ort(proto, {"x": x})["a_grad"], got, rtol=1e-12)


@pytest.mark.parametrize("other", ["matmul", "square"])
def test_a_sums_gradient_that_is_one_params_whole_gradient_and_part_of_anothers(other):
    """loss = f(w) + (w + v).sum(): the Add hands the sum's broadcast gradient to w and v; w's two
    terms are added reading it unexpanded, and v's gradient is that Expand itself, read only once the
    walk has returned it (it was removed at the walk's end: 'p_grad/Identity' read a value no node
    made). Found by tests/test_grad_fuzz.py."""
    x = RNG.standard_normal((3, 4))

    class Shared(graphc.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = graphc.nn.Parameter(graphc.tensor(RNG.standard_normal((4, 2))))
            self.v = graphc.nn.Parameter(graphc.tensor(RNG.standard_normal((4, 2))))

        def forward(self, x):
            first = (x @ self.w).mean() if other == "matmul" else (self.w * self.w).sum()
            return first + (self.w + self.v).sum()

    model = graphc.capture(Shared(), x=x)
    w = model.params["w"]
    proto = graphc.grad(model, "output").proto
    first = np.repeat(x.sum(axis=0)[:, None] / 6, 2, axis=1) if other == "matmul" else 2 * w
    for run in (run_numpy, run_ort):
        got = run(proto, {"x": x})
        np.testing.assert_allclose(got["w_grad"], first + 1, rtol=1e-12, err_msg=run.__name__)
        np.testing.assert_allclose(got["v_grad"], np.ones((4, 2)), rtol=1e-12, err_msg=run.__name__)
