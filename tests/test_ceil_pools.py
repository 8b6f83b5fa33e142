"""Gradients of ceil_mode pools whose last window would start past the input (onnx's shape
formula counts it, the kernels drop it) on numpy and onnxruntime against torch."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import graphc as gc
from graphc.backends.numpy import NumpyBackend
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


def run_ort(proto) -> dict[str, np.ndarray]:
    """With onnxruntime's default graph optimizations, under which it refused the old gradient
    graph (with them all disabled, it loaded it)."""
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {})))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_max_pool_ceil_mode_gradient_loads_in_onnxruntime_and_matches_torch(dtype):
    # width 6, kernel 2, stride 3: ceil counts 3 windows, the third starting at 6, past the input
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 6)).astype(dtype)
    xt = torch.tensor(x, requires_grad=True)
    y = torch.nn.functional.max_pool2d(xt, (3, 2), (2, 3), ceil_mode=True)
    c = rng.standard_normal(tuple(y.shape)).astype(dtype)
    (want,) = torch.autograd.grad((y * torch.tensor(c)).sum(), xt)
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1),
             helper.make_node("Mul", ["y", "c"], ["p"]), helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    loss = helper.make_tensor_value_info("loss", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [])
    graph = helper.make_graph(nodes, "g", [], [loss], [numpy_helper.from_array(x, "x"), numpy_helper.from_array(c, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    proto = gc.grad(gc.load(model), "loss", ["x"]).proto
    tol = {"rtol": 1e-12} if dtype == np.float64 else {"rtol": 1e-6}
    for got in (NumpyBackend().prepare(proto).run({}), run_ort(proto)):
        np.testing.assert_allclose(got["loss"], (y.detach().numpy() * c).sum(), **tol)
        np.testing.assert_allclose(got["x_grad"], want.numpy(), **tol)
