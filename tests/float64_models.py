"""float64 models for the learning-rate tests (``test_float64_lr``) and the generator of their
fixture (``tests/data/float64_lr32``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh

import graphc as gc

D = onnx.TensorProto.DOUBLE


def _load(nodes, inputs, outputs, inits) -> gc.Model:
    graph = oh.make_graph(nodes, "float64", inputs, outputs, inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def mlp(seed: int = 0) -> gc.Model:
    """x [N, 4] -> Linear(4, 8) -> Tanh -> Linear(8, 2) -> out, all float64."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.normal(0, 0.5, (8, 4)), "fc1.weight"), nh.from_array(rng.normal(0, 0.1, 8), "fc1.bias"),
             nh.from_array(rng.normal(0, 0.5, (2, 8)), "fc2.weight"), nh.from_array(rng.normal(0, 0.1, 2), "fc2.bias")]
    nodes = [oh.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1), oh.make_node("Tanh", ["h"], ["a"]),
             oh.make_node("Gemm", ["a", "fc2.weight", "fc2.bias"], ["out"], transB=1)]
    return _load(nodes, [oh.make_tensor_value_info("x", D, ["N", 4])], [oh.make_tensor_value_info("out", D, ["N", 2])],
                 inits)


def mlp_batches(n: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(6, 4)), "y": rng.normal(size=(6, 2))} for _ in range(n)]


def linear_loss(seed: int = 0) -> gc.Model:
    """``loss = sum(w * x) + sum(b * z)`` (w [3, 4], b [4]): its gradients are the batch's ``x``
    and ``z`` themselves, in graphc as in torch, so two runs differ only by their optimizers."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.normal(size=(3, 4)), "w"), nh.from_array(rng.normal(size=4), "b")]
    nodes = [oh.make_node("Mul", ["w", "x"], ["wx"]), oh.make_node("ReduceSum", ["wx"], ["sw"], keepdims=0),
             oh.make_node("Mul", ["b", "z"], ["bz"]), oh.make_node("ReduceSum", ["bz"], ["sb"], keepdims=0),
             oh.make_node("Add", ["sw", "sb"], ["loss"])]
    return _load(nodes, [oh.make_tensor_value_info("x", D, [3, 4]), oh.make_tensor_value_info("z", D, [4])],
                 [oh.make_tensor_value_info("loss", D, [])], inits)
