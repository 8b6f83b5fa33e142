"""ceil_mode pools whose last window would start in the end padding, on both backends against
torch: the kernels drop that window, onnx's shape formula (which onnxruntime's optimizer folds
``Shape`` with) counts it, so ort-cpu's session copy states them as floor pools with end pads
(``backends/pools.py``). Values, the shape a graph reads back, and gradients."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import graphc as gc

torch = pytest.importorskip("torch")

# (op, torch function, spatial size, kernel, stride, padding, count_include_pad): each drops a last
# window on some axis; (5, 6) and (5, 6, 7) keep ceil's extra window on the others
CASES = [
    ("MaxPool", "max_pool2d", (5, 5), 2, 2, 1, None),
    ("MaxPool", "max_pool1d", (5,), 3, 3, 1, None),
    ("MaxPool", "max_pool2d", (5, 6), 3, 3, 1, None),
    ("MaxPool", "max_pool3d", (5, 6, 7), 3, 3, 1, None),
    ("AveragePool", "avg_pool1d", (5,), 3, 3, 1, 1),
    ("AveragePool", "avg_pool2d", (5, 6), 3, 3, 1, 1),
    ("AveragePool", "avg_pool2d", (5, 6), 3, 3, 1, 0),
    ("AveragePool", "avg_pool2d", (7, 8), 4, 3, 2, 1),
    ("AveragePool", "avg_pool3d", (5, 6, 7), 3, 3, 1, 1),
    ("AveragePool", "avg_pool3d", (5, 6, 7), 3, 3, 1, 0),
]
IDS = [f"{c[0]}-{'x'.join(map(str, c[2]))}-k{c[3]}s{c[4]}p{c[5]}-cip{c[6]}" for c in CASES]


def _torch_pool(case, x):
    _, fn, size, k, s, p, cip = case
    extra = {} if cip is None else {"count_include_pad": bool(cip)}
    return getattr(torch.nn.functional, fn)(x, k, s, p, ceil_mode=True, **extra)


def _pool_node(case, x: str, y: str) -> onnx.NodeProto:
    op, _, size, k, s, p, cip = case
    n = len(size)
    extra = {} if cip is None else {"count_include_pad": cip}
    return helper.make_node(op, [x], [y], "pool", kernel_shape=[k] * n, strides=[s] * n, pads=[p] * 2 * n,
                            ceil_mode=1, **extra)


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "ceil", inputs, outputs, list(initializers)),
                              opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_values_and_the_shape_a_graph_reads_are_torchs(case, backend):
    """``mean`` divides by the element count the graph reads from ``Shape(y)``, which onnxruntime
    folded to onnx's count."""
    shape = [2, 3, *case[2]]
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    nodes = [_pool_node(case, "x", "y"), helper.make_node("Shape", ["y"], ["shape"]),
             helper.make_node("ReduceProd", ["shape"], ["count"], keepdims=0),
             helper.make_node("Cast", ["count"], ["n"], to=onnx.TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0),
             helper.make_node("Div", ["total", "n"], ["mean"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                   [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [f"d{i}" for i in range(len(shape))]),
                    helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [len(shape)]),
                    helper.make_tensor_value_info("mean", onnx.TensorProto.FLOAT, [])])
    got = gc.Session(gc.load(model), backend=backend).run({"x": x})
    want = _torch_pool(case, torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got["y"], want, rtol=1e-6, atol=1e-6)
    assert got["shape"].tolist() == list(want.shape)
    np.testing.assert_allclose(got["mean"], want.mean(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_are_torchs(case, backend):
    rng = np.random.default_rng(6)
    x = rng.standard_normal([2, 3, *case[2]]).astype(np.float32)  # onnxruntime has no double AveragePool
    xt = torch.tensor(x, requires_grad=True)
    y = _torch_pool(case, xt)
    c = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    (want,) = torch.autograd.grad((y * torch.tensor(c)).sum(), xt)
    nodes = [_pool_node(case, "x", "y"), helper.make_node("Mul", ["y", "c"], ["p"]),
             helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    model = _model(nodes, [], [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                   [numpy_helper.from_array(x, "x"), numpy_helper.from_array(c, "c")])
    got = gc.Session(gc.grad(gc.load(model), "loss", ["x"]), backend=backend).run({})
    np.testing.assert_allclose(got["loss"], (y.detach().numpy() * c).sum(), rtol=1e-5)
    np.testing.assert_allclose(got["x_grad"], want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer", ["MaxPool2d(3, 3, padding=1, ceil_mode=True)",
                                   "AvgPool2d(3, 3, padding=1, ceil_mode=True)",
                                   "AvgPool2d(3, 3, padding=1, ceil_mode=True, count_include_pad=False)",
                                   "AvgPool2d(3, 2, padding=0, ceil_mode=True)"])
def test_a_captured_ceil_pool_dropping_a_window_on_one_axis_passes_the_checker_and_matches_torch(layer):
    # on 5 x 6 one axis drops ceil's last window while the other gains one: the DSL wrote ceil_mode=1, whose file
    # check_model(full_check=True) refused (onnx's formula counts the dropped window); it now writes floor windows
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 6)).astype(np.float32)
    ours, theirs = eval(f"gc.nn.{layer}", {"gc": gc}), eval(f"torch.nn.{layer}", {"torch": torch})  # noqa: S307
    model = gc.capture(lambda x: ours(x) * 1.0, x=gc.spec("float32", x.shape))
    onnx.checker.check_model(model.proto, full_check=True)
    xt = torch.from_numpy(x).requires_grad_()
    want = theirs(xt)
    c = np.random.default_rng(4).standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    grads = gc.grad(gc.capture(lambda x, c: (ours(x) * c).sum(), x=x, c=c), "output", wrt=["x"])
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], want.detach().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=backend)
        got = gc.Session(grads, backend=backend).run({"x": x, "c": c})
        np.testing.assert_allclose(got["x_grad"], xt.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=backend)
