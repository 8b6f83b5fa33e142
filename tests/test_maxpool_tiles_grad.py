"""MaxPool's gradient for windows that tile the input (the path the CNN examples take): no
Indices output, first maximum of each window in row-major order, like PyTorch."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc


def pooled_loss_model(x: np.ndarray, kernel: list[int]) -> gc.Model:
    pooled = [x.shape[0], x.shape[1]] + [d // k for d, k in zip(x.shape[2:], kernel)]
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, strides=kernel, name="pool"),
             helper.make_node("Mul", ["y", "w"], ["yw"], name="weigh"),
             helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0, name="total")]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("w", TensorProto.FLOAT, pooled)],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(x, "x")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return gc.load(model)


def first_max_grad(x: np.ndarray, w: np.ndarray, kernel: list[int]) -> np.ndarray:
    dx = np.zeros_like(x)
    kh, kw = kernel
    for n, c, i, j in np.ndindex(w.shape):
        window = x[n, c, i * kh:(i + 1) * kh, j * kw:(j + 1) * kw]
        a, b = np.unravel_index(np.argmax(window), window.shape)  # argmax: the first maximum
        dx[n, c, i * kh + a, j * kw + b] += w[n, c, i, j]
    return dx


@pytest.mark.parametrize("kernel", [[2, 2], [2, 3]])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_tiled_max_pool_gradient_goes_to_the_first_maximum(kernel, backend):
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((2, 3, 4, 6)), 0).astype(np.float32)  # ReLU'd: many ties at 0
    x[0, 0, :2, :kernel[1]] = 5.0  # a window that is all one value
    w = rng.standard_normal((2, 3, 2, 6 // kernel[1])).astype(np.float32)
    grads = gc.grad(pooled_loss_model(x, kernel), "loss", wrt=["x"])
    ops = [node.op_type for node in grads.proto.graph.node]
    assert "ScatterElements" not in ops
    assert all(len(n.output) == 1 for n in grads.proto.graph.node if n.op_type == "MaxPool")
    got = gc.Session(grads, backend=backend).run({"w": w})["x_grad"]
    np.testing.assert_array_equal(got, first_max_grad(x, w, kernel))


def test_tiled_max_pool_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = np.round(rng.standard_normal((2, 2, 6, 6)), 1).astype(np.float32)  # rounding makes ties
    w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.max_pool2d(xt, 2) * torch.tensor(w)).sum().backward()
    got = gc.Session(gc.grad(pooled_loss_model(x, [2, 2]), "loss", wrt=["x"]), backend="ort-cpu").run({"w": w})
    np.testing.assert_array_equal(got["x_grad"], xt.grad.numpy())


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_tiled_max_pool_window_with_nan_follows_the_forward_max(backend):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    w = rng.standard_normal((1, 2, 2, 2)).astype(np.float32)
    got = gc.Session(gc.grad(pooled_loss_model(x, [2, 2]), "loss", wrt=["x"]), backend=backend).run({"w": w})["x_grad"]
    if backend == "numpy":  # the forward's max is NaN there: no element matches it
        want = first_max_grad(x, w, [2, 2])
        want[0, 1, 2:, 2:] = 0
    else:  # onnxruntime's MaxPool skips NaN: the window's largest other value gets the gradient
        want = first_max_grad(np.nan_to_num(x, nan=-np.inf), w, [2, 2])
    np.testing.assert_array_equal(got, want)
