"""Pools with auto_pad SAME_* and dilations on ort-cpu: onnxruntime leaves the dilations out of
SAME's pads (``backends/pools.py`` states them for its session), so its output had fewer positions
than ONNX's. Both backends against windows taken by hand, and the gradient graph on both."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper

import graphc as gc

X = np.random.default_rng(0).standard_normal((1, 2, 7, 6)).astype(np.float32)
KERNEL, DILATIONS, STRIDES = (3, 2), (2, 2), (1, 2)


def _by_hand(op: str, auto_pad: str) -> np.ndarray:
    """The pool of X over windows read position by position, SAME's pads as ONNX computes them."""
    out_dims = [-(-d // s) for d, s in zip(X.shape[2:], STRIDES)]
    begin = []
    for d, k, s, dil, o in zip(X.shape[2:], KERNEL, STRIDES, DILATIONS, out_dims):
        total = max(0, (o - 1) * s + (k - 1) * dil + 1 - d)
        begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    y = np.zeros((*X.shape[:2], *out_dims), np.float64)
    for i, j in itertools.product(*map(range, out_dims)):
        rows = [i * STRIDES[0] - begin[0] + a * DILATIONS[0] for a in range(KERNEL[0])]
        cols = [j * STRIDES[1] - begin[1] + b * DILATIONS[1] for b in range(KERNEL[1])]
        inside = X[:, :, [r for r in rows if 0 <= r < 7]][:, :, :, [c for c in cols if 0 <= c < 6]]
        flat = inside.reshape(*X.shape[:2], -1).astype(np.float64)
        y[:, :, i, j] = {"MaxPool": flat.max(-1), "AveragePool": flat.mean(-1),
                         "LpPool": np.sqrt((flat ** 2).sum(-1))}[op]
    return y


def _model(op: str, auto_pad: str) -> gc.Model:
    """y = op(x * w), loss = sum(y * c): w a [6] initializer to differentiate."""
    rng = np.random.default_rng(1)
    out = [1, 2, 7, 3]
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node(op, ["xw"], ["y"], kernel_shape=list(KERNEL), dilations=list(DILATIONS),
                              strides=list(STRIDES), auto_pad=auto_pad),
             helper.make_node("Mul", ["y", "c"], ["p"]), helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    inits = [onnx.numpy_helper.from_array(np.ones(6, np.float32), "w"),
             onnx.numpy_helper.from_array(rng.standard_normal(out).astype(np.float32), "c")]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out),
                               helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])], initializer=inits)
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_dilated_same_pool_runs_as_onnx_defines_it_on_both_backends(op, auto_pad):
    model, want = _model(op, auto_pad), _by_hand(op, auto_pad)
    for backend in ("numpy", "ort-cpu"):
        y = gc.Session(model, backend=backend).run({"x": X})["y"]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6, err_msg=backend)
    grads = gc.grad(model, "loss")
    ref, ort = (gc.Session(grads, backend=b).run({"x": X})["w_grad"] for b in ("numpy", "ort-cpu"))
    assert np.abs(ref).max() > 0
    np.testing.assert_allclose(ort, ref, rtol=1e-4, atol=1e-5)


def _pool_model(op: str, size: int, **attrs) -> gc.Model:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], op,
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 2, size, size))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None] * 4)])
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))


@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("op, extra", [("MaxPool", {}), ("AveragePool", {}), ("AveragePool", {"count_include_pad": 1}),
                                       ("LpPool", {})])
def test_a_pad_as_wide_as_the_kernel_runs_on_ort_as_on_numpy(op, extra, auto_pad, ceil_mode):
    # kernel 2 dilated by 3 on 7 (stride 1) pads 1 and 2: onnxruntime refused to load the pads backends/pools.py
    # states ("Pad should be smaller than kernel"); they now go into a Pad node in front (not fused back into it)
    x = np.random.default_rng(2).standard_normal((1, 2, 7, 7)).astype(np.float32)
    model = _pool_model(op, 7, kernel_shape=[2, 3], dilations=[3, 2], auto_pad=auto_pad, ceil_mode=ceil_mode, **extra)
    want = gc.Session(model, backend="numpy").run({"x": x})["y"]
    assert want.shape == (1, 2, 7, 7)
    np.testing.assert_allclose(gc.Session(model, backend="ort-cpu").run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_a_max_pool_with_indices_and_a_pad_as_wide_as_the_kernel_is_refused_clearly_on_ort():
    graph = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], dilations=[3, 3],
                                                auto_pad="SAME_UPPER")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 1, 7, 7))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None] * 4),
                               helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [None] * 4)])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
    with pytest.raises(gc.BackendError, match=r"MaxPool node .*refuses pads \[1, 1, 2, 2\] not smaller than the "
                                              r"kernel \[2, 2\], and its Indices output"):
        gc.Session(model, backend="ort-cpu")
