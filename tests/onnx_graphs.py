"""Small hand-built ONNX models for the Session, backend and parity tests (no DSL needed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SOURCE_KEY = "graphc.source"


def node(op_type: str, inputs: list[str], outputs: list[str], name: str, source: str | None = None,
         domain: str = "", **attrs) -> onnx.NodeProto:
    n = helper.make_node(op_type, inputs, outputs, name=name, domain=domain, **attrs)
    if source:
        n.metadata_props.add(key=SOURCE_KEY, value=source)
    return n


def model(nodes, inputs, outputs, initializers=(), opset: int = 21, extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])
    proto.ir_version = 10  # onnx 1.23 stamps 14, which onnxruntime 1.31 refuses
    return proto


def vi(name: str, elem=TensorProto.FLOAT, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def linear_relu(weight: np.ndarray | None = None) -> onnx.ModelProto:
    """y = relu(x @ w + b): x float32[N,3], b float32[N,2] (same N), w an initializer input."""
    w = np.arange(6, dtype=np.float32).reshape(3, 2) / 6 if weight is None else weight
    return model(
        [node("MatMul", ["x", "w"], ["xw"], "matmul_0", "net.py:10"),
         node("Add", ["xw", "b"], ["pre"], "add_0", "net.py:11"),
         node("Relu", ["pre"], ["y"], "relu_0", "net.py:12")],
        [vi("x", shape=["N", 3]), vi("b", shape=["N", 2]), vi("w", shape=[3, 2])],
        [vi("y", shape=["N", 2])],
        {"w": w},
    )


def reshape_model() -> onnx.ModelProto:
    """y = reshape(x, s): a runtime failure when s does not fit x."""
    return model([node("Reshape", ["x", "s"], ["y"], "reshape_7", "net.py:42")],
                 [vi("x", shape=["N", 4]), vi("s", TensorProto.INT64, [2])], [vi("y", shape=["A", "B"])])


def custom_op_model() -> onnx.ModelProto:
    """A node in a domain no backend knows."""
    return model([node("FancyOp", ["x"], ["y"], "fancy_1", "net.py:5", domain="example.custom")],
                 [vi("x", shape=[2])], [vi("y", shape=[2])],
                 extra_opsets=[helper.make_opsetid("example.custom", 1)])
