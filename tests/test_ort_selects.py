"""A Where of a one-element condition runs as an If that copies one branch in an ort-cpu session
(backends/selects.py): onnxruntime's CPU kernel returned a -0.0 taken from X as +0.0."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.backends import selects
from onnx_graphs import model, vi

RNG = np.random.default_rng(5)


def _where(cond_shape: list[int], x_shape: list[int], dtype=np.float32) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out = np.broadcast_shapes(tuple(cond_shape), tuple(x_shape), (4, 3))
    proto = model([helper.make_node("Where", ["c", "x", "y"], ["out"])],
                  [vi("c", TensorProto.BOOL, cond_shape), vi("x", elem, x_shape), vi("y", elem, [4, 3])],
                  [vi("out", elem, list(out))])
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("cond_shape", [[], [1, 1]])
def test_a_scalar_condition_selects_every_bit(dtype, cond_shape):
    """-0.0, NaN, inf and subnormals come back from either branch as they went in, as on numpy."""
    specials = np.array([-0.0, 0.0, np.nan, -np.inf, np.finfo(dtype).smallest_subnormal, -1.5], dtype)
    x, y = (np.resize(np.roll(specials, k), (4, 3)).astype(dtype) for k in (0, 3))
    for cond in (True, False):
        feeds = {"c": np.full(cond_shape, cond), "x": x, "y": y}
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(gc.load(_where(cond_shape, [4, 3], dtype)), backend=backend).run(feeds)["out"]
            np.testing.assert_array_equal(_bits(got), _bits(x if cond else y), err_msg=f"{backend} {cond}")


def test_the_session_copy_holds_an_if_and_the_model_is_unchanged():
    proto = _where([], [4, 3])
    written = selects.as_ifs(proto)
    assert [n.op_type for n in written.graph.node] == ["If"]
    onnx.checker.check_model(written, full_check=True)
    assert [n.op_type for n in proto.graph.node] == ["Where"]


@pytest.mark.parametrize("cond_shape,x_shape", [([4, 3], [4, 3]), ([], [1, 3]), ([], [])])
def test_a_where_that_broadcasts_or_selects_per_element_is_left(cond_shape, x_shape):
    """An elementwise condition, or an X that broadcasts to the output, is not one whole tensor."""
    proto = _where(cond_shape, x_shape)
    assert selects.as_ifs(proto) is proto
    feeds = {"c": RNG.random(cond_shape) < 0.5, "x": RNG.standard_normal(x_shape).astype(np.float32),
             "y": RNG.standard_normal((4, 3)).astype(np.float32)}
    got = gc.Session(gc.load(proto), backend="ort-cpu").run(feeds)["out"]
    np.testing.assert_array_equal(got, np.where(feeds["c"], feeds["x"], feeds["y"]))
