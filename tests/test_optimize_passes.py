"""Each optimization rewrite on a tiny model: it fires (op types), outputs match, and a second
run changes nothing."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from optimize_util import F, assert_same_outputs, interface, make_model, op_types, run_ort

rng = np.random.default_rng(0)


def w(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value), name))


def check(model, level, expected_ops, batches=(1, 3), **tol):
    out, report = gc.optimize(model, level, report=True)
    assert op_types(out) == expected_ops, str(report)
    assert interface(out) == interface(model)
    assert_same_outputs(model, out, batches=batches, **tol)
    again = gc.optimize(out, level)
    assert op_types(again) == expected_ops  # fixed point: nothing left to do
    return out


def test_level0_copies_unchanged():
    m = make_model([helper.make_node("Identity", ["x"], ["y"])], [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    out = gc.optimize(m, 0)
    assert out is not m and out.ir is not m.ir
    assert op_types(out) == ["Identity"]


def test_fold_constants_identity_cse_dead_nodes():
    nodes = [
        const("a", np.float32(2.0)), const("b", np.float32(3.0)),
        helper.make_node("Mul", ["a", "b"], ["ab"]),            # folds to 6
        helper.make_node("Identity", ["x"], ["xi"]),             # identity elimination
        helper.make_node("Relu", ["xi"], ["r1"]),
        helper.make_node("Relu", ["x"], ["r2"]),                 # CSE with r1
        helper.make_node("Exp", ["x"], ["dead"]),                # unused
        helper.make_node("Add", ["r1", "r2"], ["s"]),
        helper.make_node("Mul", ["s", "ab"], ["y"]),
    ]
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    check(m, 1, ["Relu", "Add", "Mul"])


def test_algebraic_identities_removed():
    nodes = [
        const("one", np.float32(1.0)), const("zero", np.float32(0.0)),
        helper.make_node("Mul", ["x", "one"], ["a"]),
        helper.make_node("Add", ["zero", "a"], ["b"]),
        helper.make_node("Sub", ["b", "zero"], ["c"]),
        helper.make_node("Div", ["c", "one"], ["d"]),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    check(m, 2, ["Relu"])
    assert op_types(gc.optimize(m, 1)) == ["Mul", "Add", "Sub", "Div", "Relu"]  # level 1 keeps them


def test_transpose_reshape_chains():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]),
        const("s1", np.array([-1, 12], np.int64)), const("s2", np.array([-1, 3, 4], np.int64)),
        helper.make_node("Reshape", ["t2", "s1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "s2"], ["r2"]),
        helper.make_node("Relu", ["r2"], ["y"]),
    ]
    m = make_model(nodes, [("x", F, ["N", 3, 4])], [("y", F, ["N", 3, 4])])
    out = check(m, 2, ["Reshape", "Relu"])
    assert interface(out)[0][2] == ("N", 3, 4)


@pytest.mark.parametrize("mid, removed", [(TensorProto.DOUBLE, True), (TensorProto.FLOAT16, False)])
def test_cast_chain_only_when_lossless(mid, removed):
    nodes = [helper.make_node("Cast", ["x"], ["c1"], to=mid), helper.make_node("Cast", ["c1"], ["c2"], to=F),
             helper.make_node("Relu", ["c2"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    check(m, 2, ["Relu"] if removed else ["Cast", "Cast", "Relu"], rtol=0, atol=0)


def test_matmul_add_to_gemm_with_transposed_weight():
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "Wt"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["y"])]
    # W is a graph input with a default (a training graph's parameter): nothing may fold it.
    m = make_model(nodes, [("x", F, ["N", 8]), ("W", F, [5, 8])], [("y", F, ["N", 5])],
                   [("W", w(5, 8)), ("b", w(5))])
    out = check(m, 2, ["Gemm"])
    gemm = next(iter(out.ir.graph))
    assert gemm.attributes.get_int("transB", 0) == 1 and gemm.inputs[1].name == "W"


def _linear(x_shape, w_shape, b_shape, y_shape):
    return make_model([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["b", "h"], ["y"])],
                      [("x", F, x_shape)], [("y", F, y_shape)], [("W", w(*w_shape)), ("b", w(*b_shape))])


def test_gemm_not_formed_when_bias_broadcasts():
    check(_linear([1, 8], [8, 5], [4, 5], [4, 5]), 2, ["MatMul", "Add"], batches=(1,))


@pytest.mark.parametrize("x_shape", [["N", 8], ["N", 2, 8]])
def test_integer_linear_layers_stay_matmul_add(x_shape):
    # onnxruntime's CPU provider has no integer Gemm: the rewritten model would not load there
    ints = lambda *shape: rng.integers(-3, 4, shape).astype(np.int64)  # noqa: E731
    m = make_model([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["b", "h"], ["y"])],
                   [("x", TensorProto.INT64, x_shape)], [("y", TensorProto.INT64, [*x_shape[:-1], 5])],
                   [("W", ints(8, 5)), ("b", ints(5))])
    check(m, 2, ["MatMul", "Add"])


@pytest.mark.parametrize("x_shape, b_shape", [(["N", 2, 8], [5]), ([3, "N", 8], [1, 5]), (["N", 2, 3, 8], [])])
def test_batched_linear_becomes_reshape_gemm_reshape(x_shape, b_shape):
    # one symbolic leading dim becomes the -1 of both Reshapes, so it stays symbolic (``check``
    # compares the interfaces and runs batch 1 and 3)
    out = check(_linear(x_shape, [8, 5], b_shape, [*x_shape[:-1], 5]), 2, ["Reshape", "Gemm", "Reshape"])
    assert out.ir.graph.outputs[0].shape[x_shape.index("N")].value == "N"


def test_batched_linear_merges_with_the_reshapes_around_it():
    # x[N,5*8] -> Reshape[0,5,8] -> x @ Transpose(W) + b -> Reshape[0,0,2,3] (a head split, 0s
    # copying dims): one Reshape in, Gemm(transB=1), one Reshape out
    nodes = [helper.make_node("Reshape", ["x", "s_in"], ["x3"]), helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x3", "Wt"], ["h"]), helper.make_node("Add", ["h", "b"], ["h1"]),
             helper.make_node("Reshape", ["h1", "s_out"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 40])], [("y", F, ["N", 5, 2, 3])],
                   [("s_in", np.array([0, 5, 8])), ("W", w(6, 8)), ("b", w(6)), ("s_out", np.array([0, 0, 2, 3]))])
    out = check(m, 2, ["Reshape", "Gemm", "Reshape"])
    gemm = list(out.ir.graph)[1]
    assert gemm.attributes.get_int("transB", 0) == 1 and gemm.inputs[1].name == "W"
    assert list(out.ir.graph)[0].inputs[0].name == "x"


@pytest.mark.parametrize("x_shape, w_shape, b_shape", [
    (["N", "S", 8], [8, 5], [5]),     # two symbolic dims: no single -1 spells the rows
    (["N", 2, 8], [8, 5], [2, 5]),    # the bias varies along a leading axis
    (["N", 2, 8], [1, 8, 5], [5]),    # a batched right operand
    ([0, 2, 8], [8, 5], [5]),         # an empty batch: -1 is ambiguous next to a 0
])
def test_batched_linear_kept_when_rows_cannot_be_flattened(x_shape, w_shape, b_shape):
    y_shape = [*x_shape[:-1], 5]
    check(_linear(x_shape, w_shape, b_shape, y_shape), 2, ["MatMul", "Add"], batches=(1,) if 0 in x_shape else (1, 3))


def test_two_linear_layers_around_gelu_share_the_flattened_rows():
    # x[N,5,8] -> Linear -> Gelu * 0.5 -> Linear: after both become Reshape/Gemm/Reshape, the
    # Reshapes between the Gemms move through Gelu and the scalar Mul and cancel out
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Gelu", ["h1"], ["g"]), helper.make_node("Mul", ["half", "g"], ["gh"]),
             helper.make_node("MatMul", ["gh", "W2"], ["k"]), helper.make_node("Add", ["k", "b2"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 5, 8])], [("y", F, ["N", 5, 3])],
                   [("W1", w(8, 6)), ("b1", w(6)), ("half", np.float32(0.5)), ("W2", w(6, 3)), ("b2", w(3))])
    out = check(m, 2, ["Reshape", "Gemm", "Gelu", "Mul", "Gemm", "Reshape"], atol=1e-5)
    assert out.ir.graph.outputs[0].shape[0].value == "N"


@pytest.mark.parametrize("middle, keep", [
    ([helper.make_node("Relu", ["r"], ["e"])], False),
    ([helper.make_node("Relu", ["r"], ["e"]), helper.make_node("Add", ["e", "bias"], ["e2"])], True),  # [6] operand
    ([helper.make_node("Softmax", ["r"], ["e"], axis=-1)], True),                                   # an axis op
])
def test_reshape_moves_through_elementwise_ops_only(middle, keep):
    # x[N,6] -> Reshape[-1,2,3] -> middle -> Reshape[-1,6]: the Reshapes cancel when each middle
    # op maps elements one by one (an operand of more than one element, or an axis, stops it)
    last = middle[-1].output[0]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]), *middle, helper.make_node("Reshape", [last, "s2"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 6])], [("y", F, ["N", 6])],
                   [("s1", np.array([-1, 2, 3])), ("s2", np.array([-1, 6])), ("bias", w(3))])
    expected = [n.op_type for n in nodes] if keep else [n.op_type for n in middle]
    check(m, 2, expected)


@pytest.mark.parametrize("one_shape, expected", [((1,), ["Add", "Reshape"]), ((), ["Add"])])
def test_reshapes_around_an_elementwise_op_on_a_scalar_keep_its_rank(one_shape, expected):
    # Reshape(x[], [1]) -> Add(., one) -> Reshape(., []): Add(x, one[1]) is of rank 1, not x's 0,
    # so the last Reshape stays (-O2 and -O3 raised PassError, the output's rank changed); with a
    # scalar one both Reshapes go
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]), helper.make_node("Add", ["r", "one"], ["a"]),
             helper.make_node("Reshape", ["a", "s0"], ["y"])]
    m = make_model(nodes, [("x", F, [])], [("y", F, [])],
                   [("s1", np.array([1])), ("s0", np.array([], np.int64)), ("one", np.ones(one_shape, np.float32))])
    for level in (2, 3):
        check(m, level, expected, batches=(1,))


def test_transpose_folded_into_gemm_attribute():
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("Gemm", ["xt", "W", "b"], ["y"])]
    m = make_model(nodes, [("x", F, [8, "N"])], [("y", F, ["N", 5])], [("W", w(8, 5)), ("b", w(5))])
    out = check(m, 2, ["Gemm"])
    assert next(iter(out.ir.graph)).attributes.get_int("transA", 0) == 1


def test_shape_arithmetic_folded_by_shape_folding():
    # attention-style head split: y = reshape(x, [shape(x)[0], heads, shape(x)[1] * shape(x)[2] //
    # heads]) with heads = shape(x)[1] - 1: ShapeFolding evaluates the Sub, Mul and Div of static
    # dims itself, so the Reshape gets its constant shape in the same walk (without waiting for a
    # constant-folder round to turn them into constants first).
    from graphc.passes.optimize.shape_folding import ShapeFolding

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"]), helper.make_node("Gather", ["s", "i1"], ["d1"]),
        helper.make_node("Gather", ["s", "i2"], ["d2"]), helper.make_node("Sub", ["d1", "one"], ["heads"]),
        helper.make_node("Mul", ["d1", "d2"], ["d12"]), helper.make_node("Div", ["d12", "heads"], ["head_dim"]),
        helper.make_node("Concat", ["d0", "heads", "head_dim"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    indices = [(f"i{i}", np.array([i], np.int64)) for i in range(3)] + [("one", np.array([1], np.int64))]
    m = make_model(nodes, [("x", F, ["N", 3, 8])], [("y", F, ["N", 2, 12])], indices)
    copy = gc.load(m.proto).ir
    assert ShapeFolding()(copy).modified
    reshape = next(n for n in copy.graph if n.op_type == "Reshape")
    assert reshape.inputs[1].const_value.numpy().tolist() in ([-1, 2, 12], [0, 2, 12])
    check(m, 2, ["Reshape"])


@pytest.mark.parametrize(("a", "b"), [(7, 2), (-7, 2), (7, -2), (-7, -2), (6, 3), (0, 5)])
def test_shape_arithmetic_division_truncates_like_onnx(a, b):
    # ONNX integer Div truncates toward zero (onnxruntime: -7 / 2 == -3), not Python's floor
    from graphc.passes.optimize.shape_folding import shape_value

    nodes = [helper.make_node("Div", ["a", "b"], ["q"])]
    m = make_model(nodes, [], [("q", TensorProto.INT64, [1])],
                   [("a", np.array([a], np.int64)), ("b", np.array([b], np.int64))])
    expected = run_ort(m, {})["q"].tolist()
    assert shape_value(m.ir.graph.outputs[0]) == expected


def test_shape_subgraph_folded_under_symbolic_batch():
    # y = reshape(x, [shape(x)[0], shape(x)[1] * shape(x)[2]]): dims 1 and 2 are static.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        const("i0", np.array([0], np.int64)), const("i1", np.array([1], np.int64)), const("i2", np.array([2], np.int64)),
        helper.make_node("Gather", ["s", "i0"], ["d0"]), helper.make_node("Gather", ["s", "i1"], ["d1"]),
        helper.make_node("Gather", ["s", "i2"], ["d2"]), helper.make_node("Mul", ["d1", "d2"], ["d12"]),
        helper.make_node("Concat", ["d0", "d12"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    m = make_model(nodes, [("x", F, ["N", 3, 4])], [("y", F, ["N", 12])])
    out = check(m, 2, ["Reshape"])
    shape = out.ir.graph.node(0).inputs[1].const_value.numpy()
    assert list(shape) in ([-1, 12], [0, 12])  # the batch dim stays symbolic
    assert interface(out) == [("x", F, ("N", 3, 4)), ("y", F, ("N", 12))]


def _gelu_nodes(x="x"):
    return [const("s2", np.float32(np.sqrt(2.0))), const("half", np.float32(0.5)), const("one", np.float32(1.0)),
            helper.make_node("Div", [x, "s2"], ["xd"]), helper.make_node("Erf", ["xd"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["cdf"]), helper.make_node("Mul", [x, "half"], ["xh"]),
            helper.make_node("Mul", ["xh", "cdf"], ["y"])]


@pytest.mark.parametrize("opset, fused", [(20, True), (19, False)])
def test_gelu_fusion_needs_opset_20(opset, fused):
    m = make_model(_gelu_nodes(), [("x", F, ["N", 6])], [("y", F, ["N", 6])], opset=opset)
    check(m, 2, ["Gelu"] if fused else ["Div", "Erf", "Add", "Mul", "Mul"])


def _gelu_variant(form):
    """The other associations: (x*cdf)*0.5, (x*cdf)/2, x*(0.5*cdf), with erf(x * 1/sqrt2)."""
    nodes = [const("r2", np.float32(1 / np.sqrt(2.0))), const("half", np.float32(0.5)), const("one", np.float32(1.0)),
             const("two", np.float32(2.0)), helper.make_node("Mul", ["r2", "x"], ["xd"]),
             helper.make_node("Erf", ["xd"], ["e"]), helper.make_node("Add", ["one", "e"], ["cdf"])]
    if form == "mul_half_last":
        nodes += [helper.make_node("Mul", ["cdf", "x"], ["xc"]), helper.make_node("Mul", ["half", "xc"], ["y"])]
    elif form == "div_two":
        nodes += [helper.make_node("Mul", ["x", "cdf"], ["xc"]), helper.make_node("Div", ["xc", "two"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["cdf", "half"], ["hc"]), helper.make_node("Mul", ["x", "hc"], ["y"])]
    return nodes


@pytest.mark.parametrize("form", ["mul_half_last", "div_two", "half_cdf"])
def test_gelu_fusion_association_forms(form):
    m = make_model(_gelu_variant(form), [("x", F, ["N", 6])], [("y", F, ["N", 6])])
    check(m, 2, ["Gelu"])


def test_gelu_not_fused_when_intermediate_is_reused():
    nodes = _gelu_nodes() + [helper.make_node("Add", ["y", "cdf"], ["z"])]
    m = make_model(nodes, [("x", F, ["N", 6])], [("z", F, ["N", 6])])
    assert "Gelu" not in op_types(gc.optimize(m, 2))


def _layer_norm_nodes(opset):
    def mean(src, dst):
        if opset >= 18:
            return helper.make_node("ReduceMean", [src, "axes"], [dst])
        return helper.make_node("ReduceMean", [src], [dst], axes=[-1])

    return [const("axes", np.array([-1], np.int64)), const("two", np.float32(2.0)), const("eps", np.float32(1e-5)),
            mean("x", "m"), helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Pow", ["d", "two"], ["d2"]),
            mean("d2", "v"), helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
            helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["ns"]),
            helper.make_node("Add", ["ns", "beta"], ["y"])]


@pytest.mark.parametrize("opset, fused", [(17, True), (21, True), (16, False)])
def test_layer_norm_fusion(opset, fused):
    m = make_model(_layer_norm_nodes(opset), [("x", F, ["N", 3, 8])], [("y", F, ["N", 3, 8])],
                   [("gamma", w(8)), ("beta", w(8))], opset=opset)
    out = gc.optimize(m, 2)
    if fused:
        assert op_types(out) == ["LayerNormalization"]
        ln = next(iter(out.ir.graph))
        assert [v.name for v in ln.inputs] == ["x", "gamma", "beta"]
    else:
        assert "LayerNormalization" not in op_types(out)
    assert_same_outputs(m, out)


def _conv_bn(training_mode: int = 0):
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["y"], epsilon=1e-5,
                              training_mode=training_mode),
             ]
    inits = [("W", w(4, 3, 3, 3)), ("B", w(4)), ("g", w(4)), ("b", w(4)), ("mu", w(4)),
             ("var", np.abs(w(4)) + 0.5)]
    return make_model(nodes, [("x", F, ["N", 3, 6, 6])], [("y", F, ["N", 4, 6, 6])], inits)


def test_conv_batchnorm_folded_at_level3_only():
    m = _conv_bn()
    assert op_types(gc.optimize(m, 2)) == ["Conv", "BatchNormalization"]
    check(m, 3, ["Conv"])


def test_batchnorm_folded_into_a_conv_whose_weights_another_conv_shares():
    """A block applied twice (ShuffleNet's branch): both Convs read W and B, one BN after each
    (the second with its own statistics). Each Conv gets folded copies of its own; the other
    reader never sees a changed W, so the outputs are unchanged."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["y"]),
             helper.make_node("Conv", ["y", "W", "B"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "g", "b", "mu2", "var"], ["z"]),
             helper.make_node("Conv", ["z", "W"], ["out"], pads=[1, 1, 1, 1])]
    inits = [("W", w(4, 4, 3, 3) * 0.2), ("B", w(4)), ("g", w(4)), ("b", w(4)), ("mu", w(4)), ("mu2", w(4)),
             ("var", np.abs(w(4)) + 0.5)]
    m = make_model(nodes, [("x", F, ["N", 4, 5, 5])], [("out", F, ["N", 4, 5, 5])], inits)
    out = check(m, 3, ["Conv", "Conv", "Conv"], atol=1e-4)
    weights = [n.inputs[1] for n in out.ir.graph]
    assert weights[0].name != "W" and weights[2].name == "W"  # (equal folded copies merged)
    np.testing.assert_array_equal(weights[2].const_value.numpy(), dict(inits)["W"])


@pytest.mark.parametrize("op_type", ["Conv", "ConvTranspose"])
def test_channel_constant_added_after_a_conv_folds_into_its_bias_at_level3(op_type):
    """Paddle's exports: Conv without bias, Add of a [1, M, 1, 1] Constant, BatchNorm, Relu;
    everything folds into the Conv (ConvTranspose: M = W.shape[1] * group). A scalar added to
    a Conv output read twice (hardswish's x + 3) stays: the Conv's output must not change."""
    channels, c_in = (4, 3) if op_type == "Conv" else (3, 4)  # W [4, 3, 3, 3]: Conv [M, C], ConvTranspose [C, M]
    nodes = [const("W", w(4, 3, 3, 3)), const("shift", w(1, channels, 1, 1)), const("three", np.float32(3.0)),
             helper.make_node(op_type, ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "shift"], ["a"]),
             helper.make_node("BatchNormalization", ["a", "g", "b", "mu", "var"], ["bn"]),
             helper.make_node("Add", ["bn", "three"], ["h"]),
             helper.make_node("Mul", ["bn", "h"], ["y"])]
    inits = [("g", w(channels)), ("b", w(channels)), ("mu", w(channels)), ("var", np.abs(w(channels)) + 0.5)]
    m = make_model(nodes, [("x", F, ["N", c_in, 5, 5])], [("y", F, ["N", channels, 5, 5])], inits)
    assert op_types(gc.optimize(m, 2)) == [op_type, "Add", "BatchNormalization", "Add", "Mul"]
    check(m, 3, [op_type, "Add", "Mul"], atol=1e-4)


def test_a_constant_that_varies_over_space_is_not_a_bias():
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"]), helper.make_node("Add", ["c", "shift"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 3, 4, 4])], [("y", F, ["N", 2, 2, 2])],
                   [("W", w(2, 3, 3, 3)), ("B", w(2)), ("shift", w(1, 1, 2, 2))])
    assert op_types(gc.optimize(m, 3)) == ["Conv", "Add"]


def test_flatten_through_an_int32_shape_becomes_a_constant_reshape():
    """Paddle's flatten: Reshape(x, Concat(Cast(Slice(Cast(Shape(x), int32), 0, 1), int64), [C],
    axis=-1)). The batch dim passes the int32 round trip as itself (dims below 2**31), so the
    target is [0, C] and the shape chain dies."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
             helper.make_node("Slice", ["s32", "zero", "one"], ["n32"]),
             helper.make_node("Cast", ["n32"], ["n"], to=TensorProto.INT64),
             helper.make_node("Concat", ["n", "c"], ["target"], axis=-1),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [("zero", np.array([0])), ("one", np.array([1])), ("c", np.array([12]))]
    m = make_model(nodes, [("x", F, ["N", 12, 1, 1])], [("y", F, ["N", 12])], inits)
    check(m, 2, ["Reshape"])


def test_training_mode_batchnorm_never_folded():
    m = _conv_bn(training_mode=1)
    for level in (2, 3):
        assert op_types(gc.optimize(m, level)) == ["Conv", "BatchNormalization"]


def test_dropout_removed_at_level3_only_in_inference_mode():
    old = make_model([helper.make_node("Dropout", ["x"], ["d"], ratio=0.3), helper.make_node("Relu", ["d"], ["y"])],
                     [("x", F, ["N", 4])], [("y", F, ["N", 4])], opset=10)
    assert op_types(gc.optimize(old, 2)) == ["Dropout", "Relu"]
    check(old, 3, ["Relu"])
    nodes = [const("ratio", np.float32(0.3)), const("train", np.array(True)),
             helper.make_node("Dropout", ["x", "ratio", "train"], ["d"], seed=0), helper.make_node("Relu", ["d"], ["y"])]
    training = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    for level in (1, 2, 3):
        assert op_types(gc.optimize(training, level)) == ["Dropout", "Relu"]


def test_shared_constant_weight_transpose_preapplied_at_level3():
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "Wt"], ["h"]), helper.make_node("MatMul", ["h", "W"], ["y"])]
    big = w(128, 96)  # over the level-1 folding limit, and shared: only level 3 pre-applies it
    m = make_model(nodes, [("x", F, ["N", 96])], [("y", F, ["N", 96])], [("W", big)])
    assert op_types(gc.optimize(m, 2)) == ["Transpose", "MatMul", "MatMul"]
    check(m, 3, ["MatMul", "MatMul"], rtol=1e-4, atol=1e-3)


def test_source_metadata_kept_on_fused_node():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 8])], [("y", F, ["N", 5])], [("W", w(8, 5)), ("b", w(5))])
    for node, line in zip(m.ir.graph, ("net.py:3", "net.py:4")):
        node.metadata_props["graphc.source"] = line
    out = gc.optimize(m, 2)
    (gemm,) = list(out.ir.graph)
    # the anchor is the pattern's root: the node whose output the fused node now produces
    assert gemm.op_type == "Gemm" and gemm.metadata_props.get("graphc.source") == "net.py:4"
    assert set(gemm.metadata_props) == {"graphc.source"}
    conv_bn = _conv_bn()
    for node, line in zip(conv_bn.ir.graph, ("net.py:7", "net.py:8")):
        node.metadata_props["graphc.source"] = line
    assert [dict(n.metadata_props) for n in gc.optimize(conv_bn, 3).ir.graph] == [{"graphc.source": "net.py:8"}]
    gelu = make_model(_gelu_nodes(), [("x", F, ["N", 6])], [("y", F, ["N", 6])])
    for k, node in enumerate(gelu.ir.graph):
        node.metadata_props["graphc.source"] = f"act.py:{k}"
    assert [dict(n.metadata_props) for n in gc.optimize(gelu, 2).ir.graph] == [{"graphc.source": "act.py:7"}]


def test_caller_model_untouched_and_report():
    m = make_model(_gelu_nodes(), [("x", F, ["N", 6])], [("y", F, ["N", 6])])
    before = m.proto.SerializeToString()
    out, report = gc.optimize(m, 2, report=True)
    assert m.proto.SerializeToString() == before
    assert report.nodes_before == 8 and report.nodes_after == 1 == len(out.ir.graph)
    names = [row["pass"] for row in report.by_pass()]
    assert names[:3] == ["ShapeInference", "CommonSubexpressionElimination", "FoldConstants"]
    assert "GeluFusion" in names
    assert all(r.seconds >= 0 for r in report.records)


@pytest.mark.parametrize("level", [-1, 4, "2", True])
def test_bad_level_rejected(level):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["N"])], [("y", F, ["N"])])
    with pytest.raises(gc.GraphError, match="level must be one of"):
        gc.optimize(m, level)


def test_equal_parameters_stay_distinct_below_level3():
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]), helper.make_node("Gemm", ["h", "W2", "b2"], ["y"])]
    zeros = np.zeros(4, np.float32)
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])],
                   [("W1", w(4, 4)), ("b1", zeros), ("W2", w(4, 4)), ("b2", zeros)])
    for level in (1, 2):
        assert set(gc.optimize(m, level).params) == {"W1", "b1", "W2", "b2"}  # names a state dict uses
    assert set(gc.optimize(m, 3).params) == {"W1", "b1", "W2"}  # inference export: merged


def test_two_outputs_identity_of_one_value_keep_both_names():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["a"]),
             helper.make_node("Identity", ["r"], ["b"])]
    m = make_model(nodes, [("x", F, ["N", 4])], [("a", F, ["N", 4]), ("b", F, ["N", 4])])
    out = check(m, 2, ["Relu", "Identity"])
    assert [v.name for v in out.ir.graph.outputs] == ["a", "b"]


def test_branch_returning_an_outer_value_keeps_its_identity():
    # else: y = Identity(r) with r computed outside the If. Eliminating the Identity would make
    # the branch return a value it does not compute (invalid ONNX) and rename the outer r.
    def branch(name, body):
        return helper.make_graph(body, name, [], [helper.make_tensor_value_info(f"{name}_out", F, ["N", 4])])

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             const("zero", np.float32(0.0)), helper.make_node("Greater", ["s", "zero"], ["pred"]),
             helper.make_node("If", ["pred"], ["y"],
                              then_branch=branch("then", [helper.make_node("Neg", ["r"], ["then_out"])]),
                              else_branch=branch("else", [helper.make_node("Identity", ["r"], ["else_out"])]))]
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    out = check(m, 2, ["Relu", "ReduceSum", "Greater", "If"])
    onnx.checker.check_model(out.proto, full_check=True)
    assert [n.op_type for n in out.ir.graph.node(3).attributes["else_branch"].value] == ["Identity"]


def test_unsqueeze_and_squeeze_of_a_reshape_become_one_reshape():
    # x [N, 12] -> Reshape [0, 3, 4] -> Unsqueeze(0) -> [1, N, 3, 4]: one Reshape to [1, -1, 3, 4]
    # (the copied symbolic dim becomes the -1); then Squeeze(0) of a Reshape to [1, -1, 12]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"]), helper.make_node("Unsqueeze", ["r1", "a0"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"]),
             helper.make_node("Reshape", ["x", "s2"], ["r2"]), helper.make_node("Squeeze", ["r2", "a0"], ["z"])]
    inits = [("s1", np.array([0, 3, 4], np.int64)), ("s2", np.array([1, -1, 12], np.int64)),
             ("a0", np.array([0], np.int64))]
    m = make_model(nodes, [("x", F, ["N", 12])], [("y", F, [1, "N", 3, 4]), ("z", F, ["N", 12])], inits)
    out = check(m, 2, ["Reshape", "Relu", "Reshape"])
    shapes = sorted(n.inputs[1].const_value.numpy().tolist() for n in out.ir.graph if n.op_type == "Reshape")
    assert shapes == [[-1, 12], [1, -1, 3, 4]]


def test_reshape_with_other_uses_or_two_copied_dims_keeps_its_unsqueeze():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Unsqueeze", ["r", "a0"], ["y"]),
             helper.make_node("Relu", ["r"], ["z"])]
    inits = [("s", np.array([0, 0, 4], np.int64)), ("a0", np.array([0], np.int64))]
    m = make_model(nodes, [("x", F, ["N", "M", 4])], [("y", F, [1, "N", "M", 4]), ("z", F, ["N", "M", 4])], inits)
    assert op_types(gc.optimize(m, 2)).count("Unsqueeze") == 1


def test_neutral_tensor_operands_and_parameters():
    nodes = [const("zeros", np.zeros((1, 4), np.float32)), helper.make_node("Add", ["x", "zeros"], ["a"]),
             helper.make_node("Mul", ["ones", "a"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])],
                   [("ones", np.ones(4, np.float32)), ("bias", np.zeros(4, np.float32))])
    # level 2: the Constant zeros go; `ones` and `bias` are parameters (initializers) and stay
    assert op_types(gc.optimize(m, 2)) == ["Mul", "Add"]
    check(m, 3, ["Identity"])  # inference: parameters are constants; y = x


def test_neutral_operand_that_broadcasts_is_kept():
    nodes = [const("zeros", np.zeros((3, 1), np.float32)), helper.make_node("Add", ["x", "zeros"], ["y"])]
    m = make_model(nodes, [("x", F, [1, 4])], [("y", F, [3, 4])])
    check(m, 3, ["Add"], batches=(1,))


def test_parameters_not_folded_below_level3():
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "Wt"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 3, 8])], [("y", F, ["N", 3, 5])], [("W", w(5, 8))])
    assert op_types(gc.optimize(m, 2)) == ["Transpose", "MatMul"] and "W" in gc.optimize(m, 2).params
    check(m, 3, ["MatMul"])


def test_reshape_with_one_computed_dim_becomes_minus_one():
    # y = reshape(x, [shape(x)[0] * shape(x)[1], 4]): N*3 is only known at run time -> -1
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        const("i0", np.array(0, np.int64)), const("i1", np.array(1, np.int64)), const("ax", np.array([0], np.int64)),
        const("four", np.array([4], np.int64)),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0), helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
        helper.make_node("Mul", ["d0", "d1"], ["d01"]), helper.make_node("Unsqueeze", ["d01", "ax"], ["d01u"]),
        helper.make_node("Concat", ["d01u", "four"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Shape", ["r"], ["rs"], start=-1), helper.make_node("Cast", ["rs"], ["rsf"], to=F),
        helper.make_node("Mul", ["r", "rsf"], ["y"]),  # the static last dim of r folds too
    ]
    m = make_model(nodes, [("x", F, ["N", 3, 4])], [("y", F, ["N3", 4])])
    out = check(m, 2, ["Reshape", "Mul"])
    assert list(out.ir.graph.node(0).inputs[1].const_value.numpy()) == [-1, 4]


def test_expand_to_operand_shape_dropped_before_broadcasting_op():
    # g = Expand(scale, Shape(x)) * x  ->  scale * x (a reduction's gradient times its input)
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1), helper.make_node("Shape", ["x"], ["sx"]),
             helper.make_node("Expand", ["s", "sx"], ["e"]), helper.make_node("Mul", ["e", "x"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    check(m, 2, ["ReduceSum", "Mul"])


def test_expand_kept_when_operand_shape_differs():
    nodes = [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Expand", ["b", "sx"], ["e"]),
             helper.make_node("Mul", ["e", "c"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 4]), ("b", F, [1, 4]), ("c", F, [1, 4])], [("y", F, ["N", 4])])
    check(m, 2, ["Shape", "Expand", "Mul"])


def test_small_constant_of_shape_folded():
    nodes = [const("shape", np.array([3], np.int64)),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=onnx.numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Add", ["x", "ones"], ["y"])]
    m = make_model(nodes, [("x", F, ["N", 3])], [("y", F, ["N", 3])])
    check(m, 1, ["Add"])


def test_subgraphs_are_optimized_and_outputs_match():
    def branch(name, op):
        one = helper.make_node("Constant", [], [f"{name}_one"], value=onnx.numpy_helper.from_array(np.float32(1.0)))
        nodes = [one, helper.make_node("Mul", ["x", f"{name}_one"], [f"{name}_m"]),  # x*1 inside the body
                 helper.make_node(op, [f"{name}_m"], [f"{name}_out"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", F, ["N", 4])])

    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), const("zero", np.float32(0.0)),
             helper.make_node("Greater", ["s", "zero"], ["pred"]),
             helper.make_node("If", ["pred"], ["y"], then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg"))]
    m = make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])])
    out = check(m, 2, ["ReduceSum", "Greater", "If"])
    then_ops = [n.op_type for n in out.ir.graph.node(2).attributes["then_branch"].value]
    assert then_ops == ["Relu"]
