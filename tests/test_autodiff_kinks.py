"""Subgradients at kinks follow PyTorch, so parity tests are deterministic.

Each case evaluates one op at its kink and compares the gradient with the value PyTorch
gives (written down here, and checked against torch.autograd where torch is installed).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import graphc
from graphc.passes.autodiff import gradient_model

try:
    from test_autodiff_rules import run_numpy, run_ort
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_rules import run_numpy, run_ort


def grads_of(op, inputs: dict[str, np.ndarray], wrt, opset=21, **attrs) -> dict[str, np.ndarray]:
    """d sum(op(inputs)) / d wrt, on the numpy backend (and the same on onnxruntime)."""
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    tail = [helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    inits = [numpy_helper.from_array(v, k) for k, v in inputs.items()]
    graph = helper.make_graph([node, *tail], "kink", [], [helper.make_tensor_value_info("loss", 11, [])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto = graphc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", wrt)).proto
    out = run_numpy(proto, {})
    try:
        ort_out = run_ort(proto, {})
    except Exception as exc:  # noqa: BLE001  (onnxruntime lacks some float64 kernels)
        if "NOT_IMPLEMENTED" not in str(exc):
            raise
        ort_out = out
    for name in wrt:
        np.testing.assert_allclose(ort_out[f"{name}_grad"], out[f"{name}_grad"], rtol=1e-12)
    return {name: out[f"{name}_grad"] for name in wrt}


KINKS = [
    # (op, inputs, attrs, wrt, expected gradients, torch function of the inputs)
    ("Relu", {"x": np.array([-1.0, 0.0, 2.0])}, {}, {"x": [0.0, 0.0, 1.0]},
     lambda t, x: t.relu(x)),
    ("LeakyRelu", {"x": np.array([-1.0, 0.0, 2.0])}, {"alpha": 0.1}, {"x": [0.1, 0.1, 1.0]},
     lambda t, x: t.nn.functional.leaky_relu(x, 0.1)),
    ("Abs", {"x": np.array([-1.0, 0.0, 2.0])}, {}, {"x": [-1.0, 0.0, 1.0]},
     lambda t, x: t.abs(x)),
    ("Clip", {"x": np.array([-2.0, -1.0, 0.0, 1.0, 2.0]), "lo": np.array(-1.0), "hi": np.array(1.0)}, {},
     {"x": [0.0, 1.0, 1.0, 1.0, 0.0], "lo": 1.0, "hi": 1.0},
     lambda t, x, lo, hi: t.clamp(x, lo, hi)),
    ("Max", {"a": np.array([1.0, 2.0, 3.0]), "b": np.array([1.0, 3.0, 2.0])}, {},
     {"a": [0.5, 0.0, 1.0], "b": [0.5, 1.0, 0.0]},
     lambda t, a, b: t.maximum(a, b)),
    ("Min", {"a": np.array([1.0, 2.0, 3.0]), "b": np.array([1.0, 3.0, 2.0])}, {},
     {"a": [0.5, 1.0, 0.0], "b": [0.5, 0.0, 1.0]},
     lambda t, a, b: t.minimum(a, b)),
    ("ReduceMax", {"x": np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]]), "axes": np.array([1])}, {"keepdims": 0},
     {"x": [[0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]},
     lambda t, x, axes: t.amax(x, dim=1)),
    ("MaxPool", {"x": np.array([[[[1.0, 1.0], [1.0, 0.0]]]])}, {"kernel_shape": [2, 2]},
     {"x": [[[[1.0, 0.0], [0.0, 0.0]]]]},
     lambda t, x: t.nn.functional.max_pool2d(x, 2)),
    ("Pow", {"a": np.array([0.0, 2.0]), "b": np.array([2.0, 0.5])}, {},
     {"b": [0.0, 2.0 ** 0.5 * np.log(2.0)]},
     lambda t, a, b: t.pow(a, b)),
]


@pytest.mark.parametrize("op,inputs,attrs,expected,torch_fn", KINKS, ids=[k[0] for k in KINKS])
def test_kink_gradients_follow_pytorch(op, inputs, attrs, expected, torch_fn):
    got = grads_of(op, inputs, list(expected), **attrs)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], np.asarray(value, dtype=np.float64), err_msg=name)


@pytest.mark.parametrize("op,inputs,attrs,expected,torch_fn", KINKS, ids=[k[0] for k in KINKS])
def test_kink_conventions_match_torch(op, inputs, attrs, expected, torch_fn):
    torch = pytest.importorskip("torch")
    ts = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in inputs.items()}
    torch_fn(torch, *ts.values()).sum().backward()
    for name, value in expected.items():
        np.testing.assert_allclose(ts[name].grad.numpy(), np.asarray(value, dtype=np.float64), err_msg=name)


def test_unused_output_of_multi_output_op():
    # Split with one output unused: its gradient slot is zeros, the used one passes through.
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2)
    tail = [helper.make_node("ReduceSum", ["b"], ["loss"], keepdims=0)]
    graph = helper.make_graph([node, *tail], "split", [], [helper.make_tensor_value_info("loss", 11, [])],
                              initializer=[numpy_helper.from_array(np.arange(4.0), "x")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    out = run_numpy(graphc.grad(graphc.load(model), "loss").proto, {})
    np.testing.assert_array_equal(out["x_grad"], [0.0, 0.0, 1.0, 1.0])
