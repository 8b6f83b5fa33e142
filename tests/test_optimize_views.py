"""The view rewrites (zero Pad, allowzero Reshape, Transpose of size-1 axes, Slice of a Slice),
Reshapes around an elementwise region, and level 3's scale folded into a linear layer: each
fires (op types, fewer nodes), outputs equal the original's on onnxruntime (and numpy), and a
second run changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import graphc as gc
from optimize_util import F, assert_same_outputs, make_model, op_types

rng = np.random.default_rng(1)
I64 = np.int64


def w(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def check(model, level, expected_ops, fewer=True):
    out = gc.optimize(model, level)
    assert op_types(out) == expected_ops
    assert len(out.ir.graph) < len(model.ir.graph) or not fewer
    assert_same_outputs(model, out, batches=(2,))
    assert op_types(gc.optimize(out, level)) == expected_ops
    return out


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_zero_pad_removed(mode):
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode=mode), helper.make_node("Relu", ["p"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 3, 4])], [("y", F, ["N", 3, 4])], [("pads", np.zeros(6, I64))])
    check(m, 2, ["Relu"])


def test_nonzero_pad_kept():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 3])], [("y", F, ["N", 4])], [("pads", np.array([0, 0, 0, 1], I64))])
    assert op_types(gc.optimize(m, 2)) == ["Pad"]


def test_allowzero_reshape_without_zero_merges_like_a_plain_one():
    # dynamo writes Reshape(allowzero=1); with no 0 in the shape it is a plain Reshape, which then
    # absorbs the Unsqueeze after it
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"], allowzero=1),
             helper.make_node("Unsqueeze", ["r", "axes"], ["y"])]
    m = make_model(nodes, [("x", F, [2, 12])], [("y", F, [1, 2, 3, 4])],
                   [("s", np.array([2, 3, 4], I64)), ("axes", np.array([0], I64))])
    check(m, 2, ["Reshape"])


def test_allowzero_reshape_with_zero_kept():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"], allowzero=1), helper.make_node("Relu", ["r"], ["y"])]
    m = make_model(nodes, [("x", F, [0, 4])], [("y", F, [0, 2, 2])], [("s", np.array([0, 2, 2], I64))])
    out = gc.optimize(m, 2)
    assert next(iter(out.ir.graph)).attributes.get_int("allowzero", 0) == 1


@pytest.mark.parametrize("perm, expected", [
    ([0, 2, 1, 3], ["Reshape"]),     # moves the size-1 axis only: a re-view, merged with the Reshape
    ([2, 0, 1, 3], ["Transpose", "Reshape"]),  # reorders axes 0 and 2 (sizes 5 and 2)
])
def test_transpose_of_size1_axes_becomes_reshape(perm, expected):
    # an LSTM's [T, 1, B, H] output, transposed to [T, B, 1, H] and reshaped to [T, B, H]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm), helper.make_node("Reshape", ["t", "s"], ["y"])]
    out_shape = [[5, 1, 2, 8][a] for a in perm]
    m = make_model(nodes, [("x", F, [5, 1, 2, 8])], [("y", F, [out_shape[0], out_shape[1] * out_shape[2], 8])],
                   [("s", np.array([out_shape[0], -1, 8], I64))])
    if expected == ["Reshape"]:
        check(m, 2, expected)
    else:
        assert op_types(gc.optimize(m, 2)) == expected


def test_slice_of_slice_on_other_axes_merges():
    # Swin's patch merging: x[..., 0::2, 0::2, :] exported as two Slices; the inner one has
    # two readers, each merges on its own and the inner one dies
    nodes = [helper.make_node("Slice", ["x", "z", "big", "a1", "two"], ["s1"]),
             helper.make_node("Slice", ["s1", "z", "big", "a2", "two"], ["y1"]),
             helper.make_node("Slice", ["s1", "one", "big", "a2", "two"], ["y2"])]
    inits = [("z", np.array([0], I64)), ("one", np.array([1], I64)), ("two", np.array([2], I64)),
             ("big", np.array([2**62], I64)), ("a1", np.array([1], I64)), ("a2", np.array([-2], I64))]
    m = make_model(nodes, [("x", F, ["N", 6, 5, 3])], [("y1", F, ["N", 3, 3, 3]), ("y2", F, ["N", 3, 2, 3])], inits)
    check(m, 2, ["Slice", "Slice"])


def test_slice_of_slice_on_the_same_axis_kept():
    nodes = [helper.make_node("Slice", ["x", "one", "big"], ["s1"]), helper.make_node("Slice", ["s1", "one", "big"], ["y"])]
    m = make_model(nodes, [("x", F, [6, 2])], [("y", F, [4, 2])], [("one", np.array([1], I64)), ("big", np.array([99], I64))])
    assert op_types(gc.optimize(m, 2)) == ["Slice", "Slice"]


def _gelu_between_linears(scale: bool):
    """x[2, 4, 4, 8] -> Linear -> exported erf-GELU (x read twice) -> Linear (-> * gamma)."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h"]),
             helper.make_node("Div", ["h", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["g0"]),
             helper.make_node("Mul", ["g0", "half"], ["g"]), helper.make_node("MatMul", ["g", "W2"], ["k"]),
             helper.make_node("Add", ["k", "b2"], ["y" if not scale else "z"])]
    inits = [("W1", w(8, 16)), ("b1", w(16)), ("W2", w(16, 8)), ("b2", w(8)), ("sqrt2", np.float32(np.sqrt(2))),
             ("one", np.float32(1.0)), ("half", np.float32(0.5))]
    if scale:
        nodes.append(helper.make_node("Mul", ["z", "gamma"], ["y"]))
        inits.append(("gamma", w(8)))
    return make_model(nodes, [("x", F, [2, 4, 4, 8])], [("y", F, [2, 4, 4, 8])], inits, opset=18)


def test_reshapes_around_a_branching_elementwise_region_cancel():
    # BatchedMatMulAddToGemm puts each Linear on rows: the GELU between them reads its input
    # twice (Div and Mul), and the Reshapes around it still cancel: 2 Reshapes instead of 4 (the
    # model's 9 nodes stay 9, with two Gemms for two MatMul+Add)
    out = check(_gelu_between_linears(False), 2,
                ["Reshape", "Gemm", "Div", "Erf", "Add", "Mul", "Mul", "Gemm", "Reshape"], fewer=False)
    assert [len(v.shape) for v in (n.outputs[0] for n in out.ir.graph) if v.shape is not None][2:7] == [2] * 5


def test_layer_scale_folded_into_linear_at_level3_only():
    model = _gelu_between_linears(True)
    assert op_types(gc.optimize(model, 2))[-1] == "Mul"  # a parameter: training moves it
    check(model, 3, ["Reshape", "Gemm", "Div", "Erf", "Add", "Mul", "Mul", "Gemm", "Reshape"])


@pytest.mark.parametrize("scale_shape, folds", [((8,), True), ((1, 8), True), ((1,), True),
                                                ((4, 1), False),      # scales rows, not columns
                                                ((1, 1, 8), False)])  # broadcasts the product to rank 3
def test_scale_into_linear_only_along_the_last_axis(scale_shape, folds):
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], transB=1), helper.make_node("Mul", ["h", "c"], ["y"])]
    rank = max(2, len(scale_shape))
    x_shape, y_shape = [4, 6], [1] * (rank - 2) + [4, 8]
    m = make_model(nodes, [("x", F, x_shape)], [("y", F, y_shape)],
                   [("W", w(8, 6)), ("b", w(8)), ("c", w(*scale_shape))])
    if folds:
        check(m, 3, ["Gemm"])
    else:
        assert "Mul" in op_types(gc.optimize(m, 3))


def test_no_initializer_left_unread():
    # a linear layer whose output is only reshaped: BatchedMatMulAddToGemm reshapes the Gemm's
    # rows straight to the target and drops its own Reshape back, with that Reshape's shape
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Reshape", ["hb", "s"], ["y"])]
    m = make_model(nodes, [("x", F, [2, 4, 8])], [("y", F, [2, 4, 3, 4])],
                   [("W", w(8, 12)), ("b", w(12)), ("s", np.array([2, 4, 3, 4], I64))])
    out = gc.optimize(m, 2)
    assert op_types(out) == ["Reshape", "Gemm", "Reshape"]
    read = {v.name for n in out.ir.graph for v in n.inputs if v is not None}
    assert set(out.ir.graph.initializers) <= read
    assert_same_outputs(m, out, batches=(2,))
