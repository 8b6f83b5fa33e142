"""MeanVarianceNormalization in float64 runs on ort-cpu (onnxruntime has no double kernel for it:
``backends/mvn.py`` writes it out for the session) and agrees with the numpy backend and with the
formula; its gradient, differentiated through ONNX's function body, runs on both backends too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import graphc as gc

X = np.random.default_rng(0).standard_normal((2, 3, 4, 5)) * 3 + 1


def _mvn(attrs: dict, opset: int) -> gc.Model:
    """y = MeanVarianceNormalization(x) in float64; loss = sum(y * w * c), w a [5] initializer."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("MeanVarianceNormalization", ["xw"], ["y"], **attrs),
             helper.make_node("Mul", ["y", "c"], ["p"]), helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    inits = [onnx.numpy_helper.from_array(rng.uniform(0.5, 2.0, 5), "w"),
             onnx.numpy_helper.from_array(rng.standard_normal(X.shape), "c")]
    graph = helper.make_graph(nodes, "mvn", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, X.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, X.shape),
                               helper.make_tensor_value_info("loss", onnx.TensorProto.DOUBLE, [])], initializer=inits)
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


@pytest.mark.parametrize(("attrs", "opset"), [({}, 21), ({"axes": [1, 3]}, 17)])
def test_float64_mean_variance_normalization_runs_on_both_backends(attrs, opset):
    model = _mvn(attrs, opset)
    axes = tuple(attrs.get("axes", (0, 2, 3)))
    xw = X * onnx.numpy_helper.to_array(next(t for t in model.proto.graph.initializer if t.name == "w"))
    want = (xw - xw.mean(axes, keepdims=True)) / (xw.std(axes, keepdims=True) + 1e-9)
    for backend in ("numpy", "ort-cpu"):
        y = gc.Session(model, backend=backend).run({"x": X})["y"]
        assert y.dtype == np.float64
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12, err_msg=backend)
    grads = gc.grad(model, "loss")
    w = onnx.numpy_helper.to_array(next(t for t in model.proto.graph.initializer if t.name == "w"))
    step = 1e-6 * np.random.default_rng(2).standard_normal(w.shape)
    for backend in ("numpy", "ort-cpu"):
        session = gc.Session(grads, backend=backend)
        plus, minus = (session.run({"x": X, "w": w + s})["loss"] for s in (step, -step))
        np.testing.assert_allclose(np.sum(session.run({"x": X, "w": w})["w_grad"] * step), (plus - minus) / 2,
                                   rtol=1e-6, err_msg=backend)
