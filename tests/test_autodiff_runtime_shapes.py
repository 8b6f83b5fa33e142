"""Gradients through ops whose input's padded or tiled dims are symbolic (known only when the
graph runs): x = Reshape(w, shape) with ``shape`` fed, so the gradient graph cannot read x's dims
before run time. float64 finite differences on the numpy backend, and onnxruntime agreeing."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import graphc

try:
    from test_autodiff_rules import run_numpy, run_ort
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_rules import run_numpy, run_ort
from graphc.passes.autodiff import gradient_model

SHAPE = np.array([2, 3, 4], np.int64)


def _grad_model(op: str, inputs: list, attrs: dict, out_shape: tuple, dtype, opset: int) -> onnx.ModelProto:
    """loss = sum(op(Reshape(w, shape), *inputs) * c), w [24] differentiated, ``shape`` fed."""
    rng = np.random.default_rng(0)
    names = [f"k{i}" for i in range(len(inputs))]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(24).astype(dtype), "w"),
             onnx.numpy_helper.from_array(rng.standard_normal(out_shape).astype(dtype), "c"),
             *(onnx.numpy_helper.from_array(v, n) for v, n in zip(inputs, names))]
    nodes = [helper.make_node("Reshape", ["w", "shape"], ["x"]),
             helper.make_node(op, ["x", *names], ["y"], **attrs),
             helper.make_node("Mul", ["y", "c"], ["p"]),
             helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("loss", elem, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto = graphc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", ["w"])).proto
    onnx.checker.check_model(proto, full_check=True)
    return proto


CASES = {
    "pad_reflect": ("Pad", [np.array([0, 2, 1, 0, 1, 3], np.int64)], {"mode": "reflect"}, (2, 6, 8), 21),
    "pad_edge": ("Pad", [np.array([1, 0, 3, 0, 2, 1], np.int64)], {"mode": "edge"}, (3, 5, 8), 21),
    "pad_wrap_crop": ("Pad", [np.array([0, -1, 2, 0, 3, -2], np.int64)], {"mode": "wrap"}, (2, 5, 4), 21),
    "tile": ("Tile", [np.array([2, 1, 3], np.int64)], {}, (4, 3, 12), 21),
}


@pytest.mark.parametrize("name", CASES)
def test_gradient_with_symbolic_dims_matches_finite_differences(name):
    op, inputs, attrs, out_shape, opset = CASES[name]
    proto = _grad_model(op, inputs, attrs, out_shape, np.float64, opset)
    w = onnx.numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "w"))
    grad = run_numpy(proto, {"shape": SHAPE})["w_grad"]
    t, eps = np.random.default_rng(2).standard_normal(w.shape), 1e-6
    plus = run_numpy(proto, {"shape": SHAPE, "w": w + eps * t})["loss"]
    minus = run_numpy(proto, {"shape": SHAPE, "w": w - eps * t})["loss"]
    np.testing.assert_allclose(np.sum(grad * t), (plus - minus) / (2 * eps), rtol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_gradient_with_symbolic_dims_runs_on_onnxruntime(name):
    op, inputs, attrs, out_shape, opset = CASES[name]
    proto = _grad_model(op, inputs, attrs, out_shape, np.float32, opset)
    want, got = run_numpy(proto, {"shape": SHAPE}), run_ort(proto, {"shape": SHAPE})
    np.testing.assert_allclose(got["w_grad"], want["w_grad"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["GatherND", "ScatterND"])
def test_gradient_of_index_tuples_of_unknown_length_names_the_indices(op):
    """GatherND's and a reducing ScatterND's rules need the length of the index tuples (the
    indices' last dim) at build time; where it is symbolic the error names the op and the indices."""
    f = onnx.TensorProto.FLOAT
    inits = [onnx.numpy_helper.from_array(np.ones((3, 4), np.float32), "w")]
    inputs = [helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, [2, "K"])]
    if op == "ScatterND":
        inputs.append(helper.make_tensor_value_info("u", f, [2, 4]))
    scatter = {"reduction": "mul"} if op == "ScatterND" else {}  # a reducing ScatterND reads the tuples back
    nodes = [helper.make_node(op, ["w", "idx", *(["u"] if scatter else [])], ["y"], name="n", **scatter),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, op, inputs, [helper.make_tensor_value_info("loss", f, [])], initializer=inits)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    with pytest.raises(graphc.GraphError, match=rf"{op} 'n' needs the length of its index tuples .*'idx'"):
        gradient_model(model, "loss", ["w"])
