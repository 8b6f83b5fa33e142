"""numpy meets graphc: numpy functions on a traced Tensor are refused with the user's line and
the gc.* function to use (numpy's operators still build nodes), and a numpy kernel's MemoryError
or ValueError comes out of the numpy backend as BackendError naming node, op and shapes."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc as gc


def _line_of(fn, text: str) -> str:
    """``test_numpy_interop_errors.py:LINE`` of the line of ``fn`` holding ``text``."""
    lines, start = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"test_numpy_interop_errors.py:{start + offset}"


def with_tanh(x):
    return np.tanh(x) * 2


def with_sum(x):
    return np.sum(x, axis=0)


def with_concatenate(x):
    return np.concatenate([x, x])


def with_unwrap(x):
    return np.unwrap(x)


def with_asarray(x):
    return np.asarray(x) + 1


@pytest.mark.parametrize("fn, call, hint", [
    (with_tanh, "np.tanh(x)", "use gc.tanh(...)"),
    (with_sum, "np.sum(x", "use gc.sum(...)"),
    (with_concatenate, "np.concatenate(", "use gc.concat(...)"),
    (with_unwrap, "np.unwrap(x)", "graphc has no function of that name"),
    (with_asarray, "np.asarray(x)", "cannot become a numpy array"),
])
@pytest.mark.parametrize("eager", [False, True])
def test_numpy_functions_on_a_traced_tensor_are_refused_with_a_hint(fn, call, hint, eager):
    x = np.ones((2, 3), np.float32) if eager else gc.spec("float32", [2, 3])
    with pytest.raises(gc.GraphError) as err:
        gc.capture(fn, x=x)
    message = str(err.value)
    assert hint in message and _line_of(fn, call) in message and "x: float32[2,3]" in message


def with_numpy_operands(x):
    a = np.arange(3, dtype=np.float32)
    return {"sum": a + x, "diff": a - x, "prod": np.float32(2) * x, "quot": a / (x + 1), "pow": a ** x,
            "ufunc": np.add(a, x), "neg": np.negative(x), "lt": (a < x).astype("float32"),
            "eq": (a == x).astype("float32"), "mm": np.eye(3, dtype=np.float32) @ x}


def test_numpy_operators_with_a_traced_tensor_build_graph_ops():
    model = gc.capture(with_numpy_operands, x=gc.spec("float32", [3]))
    x = np.array([2.0, 1.0, 0.5], np.float32)
    got = gc.Session(model, backend="numpy").run({"x": x})
    a = np.arange(3, dtype=np.float32)
    want = {"sum": a + x, "diff": a - x, "prod": 2 * x, "quot": a / (x + 1), "pow": a ** x, "ufunc": a + x,
            "neg": -x, "lt": (a < x).astype(np.float32), "eq": (a == x).astype(np.float32), "mm": x}
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, err_msg=name)


def _expand_then_relu():
    nodes = [helper.make_node("Expand", ["x", "shape"], ["big"], name="expand_big"),
             helper.make_node("Relu", ["big"], ["y"], name="relu_after")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
                                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("big", TensorProto.FLOAT, ["A", "B"]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, ["A", "B"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return gc.Session(model, backend="numpy")


def test_a_huge_expand_is_a_backend_error_naming_node_op_and_shape():
    session = _expand_then_relu()
    feeds = {"x": np.ones(1, np.float32), "shape": np.array([10**6, 10**8])}
    with pytest.raises(gc.BackendError, match=r"node 'expand_big' \(Expand\).*float32\[1000000,100000000\].*MemoryError"):
        session.run(feeds, outputs=["big"])  # the broadcast view is copied when handed out
    with pytest.raises(gc.BackendError, match=r"node 'relu_after' \(Relu\).*float32\[1000000,100000000\].*MemoryError"):
        session.run(feeds, outputs=["y"])  # the next kernel allocates
    small = session.run({"x": np.full(1, -2.0, np.float32), "shape": np.array([2, 3])})
    np.testing.assert_array_equal(small["y"], np.zeros((2, 3), np.float32))


def test_a_kernel_value_error_names_the_input_shapes():
    with pytest.raises(gc.BackendError, match=r"node 'expand_big' \(Expand\).*inputs \(float32\[1\], int64\[2\]\).*ValueError"):
        _expand_then_relu().run({"x": np.ones(1, np.float32), "shape": np.array([-5, 3])})



def _conv_transpose(strides, output_shape, backend):
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up_ct", strides=strides, output_shape=output_shape)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", "W"]),
                                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 1, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "A", "B"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return gc.Session(model, backend=backend)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_conv_transpose_output_shape_past_the_inputs_reach_is_refused(backend):
    # [3, 3] input, 3x3 kernel, strides 2: the output reaches 7x7, and onnxruntime grows it by up to
    # strides - 1 at the end; 5x9 asks past that on the second axis (the numpy kernel handed back [1, 1, 5, 1])
    session = _conv_transpose([2, 2], [5, 9], backend)
    w = np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(gc.BackendError, match=r"up_ct.*(output_shape \[5, 9\] is past what this input reaches, "
                                              r"\[7, 7\] plus strides - 1|output_shape is inconsistent)"):
        session.run({"x": np.ones((1, 1, 3, 3), np.float32), "w": w})
    y = session.run({"x": np.ones((1, 1, 4, 4), np.float32), "w": w})["y"]  # reaches 9x9: cropped to 5x9
    assert y.shape == (1, 1, 5, 9)


@pytest.mark.parametrize("output_shape", [[8, 11], [11, 10], [5, 9]])
def test_a_conv_transpose_output_shape_within_strides_of_the_reach_matches_onnxruntime(output_shape):
    # strides 3 on [3, 3] reach 9x9; 10 and 11 add zero rows at the end, where the numpy kernel's
    # crop began at -1 for 11 and handed back one row
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 1, 3, 3)).astype(np.float32),
             "w": rng.standard_normal((1, 1, 3, 3)).astype(np.float32)}
    want = _conv_transpose([3, 3], output_shape, "ort-cpu").run(feeds)["y"]
    assert want.shape == (2, 1, *output_shape)
    np.testing.assert_allclose(_conv_transpose([3, 3], output_shape, "numpy").run(feeds)["y"], want, rtol=1e-5, atol=1e-6)


_SUGGESTED = re.compile(r"use gc\.(\w+)\(\.\.\.\) instead|use the Tensor method \.(\w+)\(\.\.\.\) instead")


def _suggestion(message: str) -> str | None:
    """What a refusal suggests: ``gc.NAME`` or ``Tensor.NAME``, checked to exist; None when it
    says graphc has nothing."""
    match = _SUGGESTED.search(message)
    if match is None:
        assert "graphc has no function of that name" in message, message
        return None
    function, method = match.groups()
    assert hasattr(gc, function) if function else hasattr(gc.Tensor, method), f"no such name: {match.group(0)}"
    return f"gc.{function}" if function else f"Tensor.{method}"


@pytest.mark.parametrize("call, suggested", [
    (lambda x: np.squeeze(x), "gc.squeeze"), (lambda x: np.expand_dims(x, 0), "gc.unsqueeze"),
    (lambda x: np.moveaxis(x, 0, 1), "gc.movedim"), (lambda x: np.repeat(x, 2), "gc.repeat_interleave"),
    (lambda x: np.around(x), "gc.round"), (lambda x: np.ravel(x), "gc.flatten"), (lambda x: np.cumsum(x), "gc.cumsum"),
    (lambda x: np.clip(x, 0, 1), "gc.clip"), (lambda x: np.sort(x), "gc.sort"), (lambda x: np.spacing(x), None),
    (lambda x: np.sinc(x), "gc.sinc"), (lambda x: np.unwrap(x), None),
])
def test_a_refused_numpy_function_suggests_a_name_graphc_has(call, suggested):
    with pytest.raises(gc.GraphError) as err:
        gc.capture(call, x=gc.spec("float32", [2, 3]))
    assert _suggestion(str(err.value)) == suggested


def test_every_numpy_function_refused_suggests_only_names_graphc_has():
    from graphc.dsl.methods import _numpy_refused

    names = [n for n in dir(np) if not n.startswith("_") and callable(getattr(np, n))]
    suggested = {}

    def refuse_all(x):
        for name in names:
            suggested[name] = _suggestion(str(_numpy_refused(f"np.{name}", name, x)))
        return x

    gc.capture(refuse_all, x=gc.spec("float32", [2, 3]))
    assert suggested["tanh"] == "gc.tanh" and suggested["concatenate"] == "gc.concat"
