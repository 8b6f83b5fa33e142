"""An Expand of a Reshape's output to a shape with a 0 on onnxruntime (backends/fusions.py): its
ExpandElimination drops it, keeping an entry where there is none, so a session whose model may
expand to an empty dim runs without that elimination; other models keep it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
from graphc.backends import fusions


def _reshape_then_expand(shape: list[int]) -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["x", "r"], ["x2"]), helper.make_node("Expand", ["x2", "s"], ["e"]),
             helper.make_node("Neg", ["e"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1, -1]), "r"), numpy_helper.from_array(np.array(shape), "s")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("shape", [[0, 1], [1, 0], [0, 3], [2, 3]])
def test_an_expand_to_a_shape_with_a_zero_gives_that_shape_on_ort_cpu(shape):
    x = np.ones(1, np.float32)
    out = gc.Session(gc.load(_reshape_then_expand(shape)), backend="ort-cpu").run({"x": x})["y"]
    assert out.shape == tuple(shape)
    assert ("ExpandElimination" in fusions.fusion_refused(_reshape_then_expand(shape))) == (0 in shape)


def test_cartesian_prod_and_meshgrid_with_an_empty_vector_on_ort_cpu():
    torch = pytest.importorskip("torch")
    a, b = np.zeros(0, np.int64), np.array([4, 5], np.int64)
    model = gc.capture(lambda a, b: {"prod": gc.cartesian_prod(b[:1], a), "grid": gc.meshgrid(a, b[:1])[1]}, a=a, b=b)
    out = gc.Session(model, backend="ort-cpu").run({"a": a, "b": b})
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert out["prod"].shape == tuple(torch.cartesian_prod(tb[:1], ta).shape) == (0, 2)
    assert out["grid"].shape == tuple(torch.meshgrid(ta, tb[:1], indexing="ij")[1].shape) == (0, 1)
