"""Gradients through sequences whose length is known only at run time (rules_sequence.py): a
sequence read twice sums its elements' gradients, checked against float64 finite differences
and onnxruntime; what cannot be built is a clear error."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.errors import GraphError
from graphc.passes.autodiff import gradient_model

RNG = np.random.default_rng(0)


def _chunks(opset: int = 17) -> onnx.ModelProto:
    """``torch.chunk`` with sizes fed at run time: loss = sum(a * c) + sum(tanh(b)) for
    a, b = SequenceAt(SplitToSequence(x, sizes), 0 and -1) (the sequence is read twice)."""
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
        helper.make_node("SequenceAt", ["parts", "zero"], ["a"]),
        helper.make_node("SequenceAt", ["parts", "last"], ["b"]),
        helper.make_node("Mul", ["a", "c"], ["ac"]),
        helper.make_node("ReduceSum", ["ac"], ["s0"], keepdims=0),
        helper.make_node("Tanh", ["b"], ["tb"]),
        helper.make_node("ReduceSum", ["tb"], ["s1"], keepdims=0),
        helper.make_node("Add", ["s0", "s1"], ["loss"]),
    ]
    inits = [onnx.numpy_helper.from_array(RNG.standard_normal((2, 5)), "x"),
             onnx.numpy_helper.from_array(RNG.standard_normal((2, 2)), "c"),
             onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
             onnx.numpy_helper.from_array(np.array(-1, np.int64), "last")]
    graph = helper.make_graph(nodes, "chunks", [helper.make_tensor_value_info("sizes", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(proto: onnx.ModelProto, feeds: dict, backend: str = "numpy") -> dict:
    return graphc.Session(graphc.load(proto), backend=backend).run(feeds)


def test_a_sequence_read_twice_sums_its_gradients():
    grads = graphc.Model(gradient_model(ir.serde.deserialize_model(_chunks()), "loss", ["x", "c"])).proto
    onnx.checker.check_model(grads, full_check=True)
    assert "SequenceMap" in {n.op_type for n in grads.graph.node}  # not lowered: the count is a run-time input
    feeds = {"sizes": np.array([2, 3], np.int64)}
    got = _run(grads, feeds)
    x = onnx.numpy_helper.to_array(next(t for t in grads.graph.initializer if t.name == "x"))
    t, eps = RNG.standard_normal(x.shape), 1e-6
    numeric = (_run(grads, {**feeds, "x": x + eps * t})["loss"] - _run(grads, {**feeds, "x": x - eps * t})["loss"]) / (2 * eps)
    np.testing.assert_allclose(np.sum(got["x_grad"] * t), numeric, rtol=1e-6)
    np.testing.assert_allclose(got["x_grad"][:, 2:], 1 - np.tanh(x[:, 2:]) ** 2)  # b's part only
    on_ort = _run(grads, feeds, "ort-cpu")
    np.testing.assert_allclose(on_ort["x_grad"], got["x_grad"], rtol=1e-9)


def test_before_opset_17_the_error_names_the_op_it_needs():
    """Summing two sequences' gradients element by element needs SequenceMap (opset 17)."""
    with pytest.raises(GraphError, match=r"SequenceMap.*opset 17"):
        gradient_model(ir.serde.deserialize_model(_chunks(opset=16)), "loss", ["x"])
