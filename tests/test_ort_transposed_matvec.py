"""A Transpose's output times a vector on onnxruntime (backends/fusions.py): its MatmulTransposeFusion
turns the pair into a FusedMatMul that returns wrong numbers for a 1-D second input, so a session
whose model holds one runs without that fusion; models without one keep it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.backends import fusions

R = np.random.default_rng(5)


def _transposed_product(a_shape, perm, b_shape, b_initializer=False) -> onnx.ModelProto:
    nodes = [helper.make_node("Transpose", ["a"], ["at"], perm=perm), helper.make_node("MatMul", ["at", "b"], ["y"])]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    inits = []
    if b_initializer:
        inits = [helper.make_tensor("b", TensorProto.FLOAT, b_shape, R.standard_normal(b_shape).ravel().tolist())]
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape))
    y_shape = np.matmul(np.empty(a_shape).transpose(perm), np.empty(b_shape)).shape
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("a_shape,perm,b_shape", [([3, 4], [1, 0], [3]), ([2, 3, 4], [0, 2, 1], [3]),
                                                  ([3, 4], [1, 0], [3, 2]), ([5, 2, 4], [1, 0, 2], [4])])
def test_a_transposed_matrix_times_a_vector_matches_numpy_on_ort_cpu(a_shape, perm, b_shape):
    model = gc.load(_transposed_product(a_shape, perm, b_shape))
    a, b = R.standard_normal(a_shape).astype(np.float32), R.standard_normal(b_shape).astype(np.float32)
    out = gc.Session(model, backend="ort-cpu").run({"a": a, "b": b})["y"]
    np.testing.assert_allclose(out, np.matmul(a.transpose(perm), b), rtol=1e-5, atol=1e-5)


def test_the_dsl_product_of_a_transpose_and_a_vector_matches_numpy_on_ort_cpu():
    model = gc.capture(lambda a, v: gc.mv(a.t(), v) + a.T @ v, a=gc.spec("float32", ("N", 4)),
                       v=gc.spec("float32", ("N",)))
    for n in (3, 6):
        a, v = R.standard_normal((n, 4)).astype(np.float32), R.standard_normal(n).astype(np.float32)
        out = gc.Session(model, backend="ort-cpu").run({"a": a, "v": v})["output"]
        np.testing.assert_allclose(out, 2 * (a.T @ v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_shape,b_initializer,refused", [([3], False, True), ([3], True, True),
                                                           ([3, 2], False, False),
                                                           ([3, 2], True, False), (None, False, True)])
def test_only_a_product_that_may_take_a_vector_turns_the_fusion_off(b_shape, b_initializer, refused):
    model = _transposed_product([3, 4], [1, 0], b_shape or [3, 2], b_initializer)
    if b_shape is None:  # a second input whose rank cannot be told
        model.graph.input[1].type.tensor_type.ClearField("shape")
    assert fusions.fusion_refused(model) == (("MatmulTransposeFusion",) if refused else ())


def test_a_model_without_a_transposed_first_operand_keeps_the_fusion():
    mlp = gc.capture(gc.nn.Linear(4, 3), x=gc.spec("float32", ("N", 4)))
    arts = gc.training.generate(mlp, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    assert fusions.fusion_refused(arts.train_step.proto) == ()


def test_a_transposed_matrix_times_a_vector_in_a_local_function_matches_numpy_on_ort_cpu():
    """onnxruntime inlines local functions before its rewrites, so the product in one is fused too."""
    product = _transposed_product([3, 4], [1, 0], [3])
    fn = helper.make_function("local", "TransposedProduct", ["a", "b"], ["y"], list(product.graph.node),
                              [helper.make_opsetid("", 21)])
    graph = helper.make_graph([helper.make_node("TransposedProduct", ["a", "b"], ["y"], domain="local")], "g",
                              list(product.graph.input), list(product.graph.output))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)],
                              functions=[fn])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    assert fusions.fusion_refused(model) == ("MatmulTransposeFusion",)
    a, b = R.standard_normal((3, 4)).astype(np.float32), R.standard_normal(3).astype(np.float32)
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(gc.load(model), backend=backend).run({"a": a, "b": b})["y"]
        np.testing.assert_allclose(out, a.T @ b, rtol=1e-5, atol=1e-5, err_msg=backend)
