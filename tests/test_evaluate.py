"""The passes' compile-time evaluator: graphc's numpy kernels (injected by graphc) and onnx's
reference evaluator (without them) give the same values, and a value built from constants and
static shapes folds to what numpy computes."""

from __future__ import annotations

import importlib

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from graphc.passes import evaluate

CASES = [
    ("Add", [np.arange(6.0).reshape(2, 3), np.array([1.0, 2.0, 3.0])], {}),
    ("Resize", [np.arange(12.0).reshape(1, 1, 3, 4), None, np.array([1.0, 1.0, 2.0, 1.5])],
     {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}),
    ("AveragePool", [np.arange(25.0).reshape(1, 1, 5, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("Concat", [np.array([2, 3], np.int64), np.array([4], np.int64)], {"axis": 0}),
]


@pytest.fixture
def reference_engine():
    """The evaluator without injected kernels, restored to graphc's afterwards."""
    evaluate.use_kernels(None)
    yield
    evaluate.use_kernels(lambda: importlib.import_module("graphc.backends.numpy").run_node)


def _run_both(op_type, inputs, attrs):
    kernels = evaluate.run_node(op_type, inputs, attrs, 19)
    evaluate.use_kernels(None)
    try:
        reference = evaluate.run_node(op_type, inputs, attrs, 19)
    finally:
        evaluate.use_kernels(lambda: importlib.import_module("graphc.backends.numpy").run_node)
    return kernels, reference


@pytest.mark.parametrize("op_type, inputs, attrs", CASES, ids=[c[0] for c in CASES])
def test_kernels_and_reference_evaluator_agree(op_type, inputs, attrs):
    kernels, reference = _run_both(op_type, inputs, attrs)
    assert len(kernels) == len(reference) == 1
    np.testing.assert_allclose(kernels[0], reference[0], rtol=1e-12)
    assert kernels[0].dtype == reference[0].dtype


def test_reference_engine_names_a_node_it_cannot_evaluate(reference_engine):
    with pytest.raises(Exception, match="Add"):
        evaluate.run_node("Add", [np.zeros(2), np.zeros(3)], {}, 19)


def test_folded_array_of_a_shape_computation():
    """Reshape target built as Concat(Shape(x)[0:1], [-1]) from a static x: [4, -1]."""
    dims = [4, 3, 2]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Shape", ["x"], ["s"], end=1),
             helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [1], [-1])),
             helper.make_node("Concat", ["s", "m"], ["t"], axis=0),
             helper.make_node("Reshape", ["x", "t"], ["y"])]
    model = ir.serde.deserialize_model(helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                                                         opset_imports=[helper.make_opsetid("", 19)]))
    target = model.graph.node(3).inputs[1]
    folded = evaluate.folded_array(target)
    np.testing.assert_array_equal(folded, np.concatenate([np.array(dims)[0:1], [-1]]))
    assert np.arange(24).reshape(dims).reshape(folded).shape == (4, 6)
    assert evaluate.folded_array(model.graph.inputs[0]) is None  # a graph input is not known
