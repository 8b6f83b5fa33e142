"""graphc's cheaper stand-ins for onnx-ir library code (dead-node removal, reading back shape
inference) do exactly what the library code does: same model, byte for byte."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.passes.optimize.library import RemoveUnusedNodes
from graphc.passes.optimize.shape_inference import _read_back, _tensor_shape, _tensor_type


def _dead_code_model() -> onnx.ModelProto:
    """Dead chains, an unused initializer, unused optional outputs (Dropout's mask, MaxPool's
    indices, BatchNormalization's training outputs), a trailing empty input, a dead node inside
    an If branch, and an op without a schema."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    inits = [onnx.numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("s", "b", "m", "v")]
    inits.append(onnx.numpy_helper.from_array(np.ones(3, np.float32), "unused"))
    branch = lambda tag: helper.make_graph(  # noqa: E731
        [helper.make_node("Neg", ["x"], [f"dead_{tag}"]), helper.make_node("Abs", ["x"], [f"out_{tag}"])],
        f"branch_{tag}", [], [helper.make_tensor_value_info(f"out_{tag}", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Exp", ["r"], ["dead1"]),
        helper.make_node("Log", ["dead1"], ["dead2"]),  # a dead chain: both go in one sweep
        helper.make_node("Dropout", ["r"], ["d", "mask"]),
        helper.make_node("MaxPool", ["d"], ["p", "idx"], kernel_shape=[2, 2]),
        helper.make_node("Clip", ["p", "", ""], ["c"]),  # trailing empty inputs
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
        helper.make_node("Custom", ["bn"], ["custom"], domain="my.domain"),
        helper.make_node("If", ["cond"], ["branched"], then_branch=branch("t"), else_branch=branch("e")),
        helper.make_node("Add", ["custom", "branched"], ["y"]),
        helper.make_node("Sigmoid", ["x"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "g", [x, cond], [y, z], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 1)])


def test_remove_unused_nodes_matches_onnx_ir():
    proto = _dead_code_model()
    ours, theirs = ir.serde.deserialize_model(proto), ir.serde.deserialize_model(proto)
    assert RemoveUnusedNodes()(ours).modified
    assert common.RemoveUnusedNodesPass()(theirs).modified
    ours_proto, theirs_proto = ir.serde.serialize_model(ours), ir.serde.serialize_model(theirs)
    assert ours_proto.SerializeToString(deterministic=True) == theirs_proto.SerializeToString(deterministic=True)
    ops = [n.op_type for n in ours_proto.graph.node]
    assert "Exp" not in ops and "Log" not in ops
    assert [i.name for i in ours_proto.graph.initializer] == ["s", "b", "m", "v"]
    assert len(ours.graph.node(2).outputs) == 1  # MaxPool's indices trimmed (node order: Relu, Dropout, MaxPool)
    # a second sweep finds nothing, as onnx-ir's
    assert not RemoveUnusedNodes()(ours).modified


def test_tensor_type_and_shape_read_back_like_serde():
    dims = [3, "batch", None]
    info = helper.make_tensor_value_info("v", TensorProto.FLOAT16, dims)
    info.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    info.type.denotation = "TENSOR"
    no_shape = helper.make_tensor_value_info("w", TensorProto.INT64, None)
    scalar = helper.make_tensor_value_info("s", TensorProto.BOOL, [])
    for vi in (info, no_shape, scalar):
        expected_type = ir.serde.deserialize_type_proto_for_type(vi.type)
        assert _tensor_type(vi.type) == expected_type
        assert _tensor_type(vi.type).denotation == expected_type.denotation
        expected, got = ir.serde.deserialize_type_proto_for_shape(vi.type), _tensor_shape(vi.type)
        if expected is None:
            assert got is None
            continue
        assert got.dims == expected.dims and got.frozen == expected.frozen
        assert [got.get_denotation(i) for i in range(len(got))] == [expected.get_denotation(i) for i in range(len(expected))]


def test_read_back_shares_only_frozen_undenoted_shapes():
    plain = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, "n"]).type
    plain.denotation = "TENSOR"
    denoted = helper.make_tensor_value_info("b", TensorProto.INT64, [3]).type
    denoted.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    untyped = onnx.TypeProto()
    untyped.tensor_type.SetInParent()
    seen: dict = {}
    for proto in (plain, denoted, untyped):
        first, second = _read_back(proto, seen), _read_back(proto, seen)  # a miss, then a hit
        for type_, shape in (first, second):
            assert type_ == _tensor_type(proto) and getattr(type_, "denotation", None) == getattr(_tensor_type(proto), "denotation", None)
            expected = _tensor_shape(proto)
            assert shape == expected and (shape is None or shape.frozen)
        if first[0] is not None:
            assert first[0] is not second[0]  # Value.dtype's setter mutates a type in place
        if proto is plain:
            assert first[1] is second[1]  # frozen, no dim denotation: shared
        if proto is denoted:
            assert first[1] is not second[1] and second[1].get_denotation(0) == "DATA_BATCH"


def _output_model(kind: str) -> ir.Model:
    """Two equal Relus, or an Identity, whose outputs are graph outputs (the cases where CSE
    and identity elimination must keep output names)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("y", "z")]
    if kind == "cse":
        nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["z"])]
    else:
        nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"]),
                 helper.make_node("Neg", ["a"], ["z"])]
    return ir.serde.deserialize_model(helper.make_model(helper.make_graph(nodes, "g", [x], outs)))


@pytest.mark.parametrize("kind", ["cse", "identity"])
def test_cse_and_identity_elimination_same_as_onnx_ir(kind):
    from graphc.passes.optimize.library import CommonSubexpressionElimination, IdentityElimination

    ours, theirs = _output_model(kind), _output_model(kind)
    mine, library = ((CommonSubexpressionElimination(), common.CommonSubexpressionEliminationPass()) if kind == "cse"
                     else (IdentityElimination(), common.IdentityEliminationPass()))
    assert mine(ours).modified and library(theirs).modified
    assert (ir.serde.serialize_model(ours).SerializeToString(deterministic=True)
            == ir.serde.serialize_model(theirs).SerializeToString(deterministic=True))
    assert [v.name for v in ours.graph.outputs] == ["y", "z"]


@pytest.mark.parametrize("level", [1, 2, 3])
def test_two_dropouts_of_one_input_stay_two_draws(level):
    def two_masks(x):
        a, b = gc.dropout(x, 0.5, training=True), gc.dropout(x, 0.5, training=True)
        return {"diff": gc.abs(a - b).sum()}

    x = np.ones((64, 64), np.float32)
    model = gc.optimize(gc.capture(two_masks, x=x), level=level)
    assert sum(n.op_type == "Dropout" for n in model.proto.graph.node) == 2
    assert gc.Session(model, backend="numpy").run({"x": x})["diff"] > 0  # one merged mask gives 0


RANDOM_CASES = {  # op -> its nodes reading a float "c" into "draw"
    "Bernoulli": [helper.make_node("Bernoulli", ["c"], ["draw"])],
    "RandomUniformLike": [helper.make_node("RandomUniformLike", ["c"], ["draw"])],
    "Dropout": [helper.make_node("Constant", [], ["ratio"], value=onnx.numpy_helper.from_array(np.float32(0.5), "r")),
                helper.make_node("Constant", [], ["train"], value=onnx.numpy_helper.from_array(np.array(True), "t")),
                helper.make_node("Dropout", ["c", "ratio", "train"], ["draw"])],
}


def _random_model(op: str, twice: bool) -> onnx.ModelProto:
    """``y = x + draw`` where draw is ``op`` of a constant (every input known before run time);
    ``twice``: ``y = draw - draw'``, two equal nodes drawing from the same graph input c."""
    c = onnx.numpy_helper.from_array(np.full(256, 0.5, np.float32), "c")
    nodes = [*([] if twice else [helper.make_node("Constant", [], ["c"], value=c)]), *RANDOM_CASES[op]]
    if twice:
        nodes += [helper.make_node(n.op_type, n.input, ["draw2"], **{a.name: helper.get_attribute_value(a) for a in n.attribute})
                  for n in RANDOM_CASES[op][-1:]]
        nodes.append(helper.make_node("Sub", ["draw", "draw2"], ["y"]))
    else:
        nodes.append(helper.make_node("Add", ["x", "draw"], ["y"]))
    inputs = [helper.make_tensor_value_info("c" if twice else "x", TensorProto.FLOAT, [256])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("op", sorted(RANDOM_CASES))
def test_random_ops_are_never_folded(op, level):
    # every input is constant, but each run must draw anew: folding bakes one draw into the model
    out = gc.optimize(_random_model(op, twice=False), level=level)
    assert op in [n.op_type for n in out.proto.graph.node]
    session, x = gc.Session(out, backend="numpy"), {"x": np.zeros(256, np.float32)}
    assert not np.array_equal(session.run(x)["y"], session.run(x)["y"])


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("op", sorted(RANDOM_CASES))
def test_two_random_draws_of_one_input_stay_two(op, level):
    out = gc.optimize(_random_model(op, twice=True), level=level)
    assert [n.op_type for n in out.proto.graph.node].count(op) == 2
    c = {"c": np.full(256, 0.5, np.float32)}
    assert np.count_nonzero(gc.Session(out, backend="numpy").run(c)["y"])  # one merged draw gives 0


@pytest.mark.parametrize("level", [1, 2, 3])
def test_training_dropout_of_a_parameter_stays_random(level):
    # captured with training=True, a Dropout stays random at -O3 too (it was folded into one mask)
    class Noisy(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos, self.drop = gc.nn.Parameter(np.ones((16, 16), np.float32)), gc.nn.Dropout(0.5)

        def forward(self, x):
            return x + self.drop(self.pos)

    out = gc.optimize(gc.capture(Noisy(), x=gc.spec("float32", (16, 16)), training=True), level=level)
    session, x = gc.Session(out, backend="numpy"), {"x": np.zeros((16, 16), np.float32)}
    first, second = session.run(x)["output"], session.run(x)["output"]
    assert set(np.unique(first)) == {0.0, 2.0} and not np.array_equal(first, second)


def test_fold_constants_same_as_onnxscript():
    from onnxscript.optimizer import fold_constants_ir

    from graphc.passes.optimize.library import FoldConstants

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "c")),
             helper.make_node("Transpose", ["c"], ["ct"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Reshape", ["ct", "s"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"])]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    ours, theirs = ir.serde.deserialize_model(proto), ir.serde.deserialize_model(proto)
    assert FoldConstants(lambda node: None, 1024, 1024, size_gated=True)(ours).modified
    assert fold_constants_ir(theirs, input_size_limit=1024, output_size_limit=1024).modified
    assert (ir.serde.serialize_model(ours).SerializeToString(deterministic=True)
            == ir.serde.serialize_model(theirs).SerializeToString(deterministic=True))
    assert "Transpose" not in [n.op_type for n in ours.graph]


def _transpose_model(dead_use: bool) -> onnx.ModelProto:
    """A big constant (over the folder's input limit) transposed; with ``dead_use`` a dead Neg
    also reads it, which keeps the folder's size gate from folding the Transpose until the Neg
    is removed."""
    big = np.arange(100 * 100, dtype=np.float32).reshape(100, 100)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [100, 100])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [100, 100])
    nodes = [helper.make_node("Constant", [], ["w"], value=onnx.numpy_helper.from_array(big, "w")),
             helper.make_node("Transpose", ["w"], ["wt"]),
             helper.make_node("Add", ["x", "wt"], ["y"])]
    if dead_use:
        nodes.insert(1, helper.make_node("Neg", ["w"], ["unused"]))
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def test_fold_ignores_dead_node_removal_only_when_no_node_waits_on_its_size_gate():
    from graphc.passes.optimize.library import DEAD, DEDUP, fold_constants_pass

    for dead_use, expect_blocked in ((True, True), (False, False)):
        model = ir.serde.deserialize_model(_transpose_model(dead_use))
        fold = fold_constants_pass(level=2)
        fold(model)
        # blocked: the Transpose (all inputs constant) is left for a later round
        assert ("Transpose" in [n.op_type for n in model.graph]) == expect_blocked
        assert DEDUP in fold.ignores and (DEAD in fold.ignores) == (not expect_blocked)
    assert DEAD in fold_constants_pass(level=3).ignores  # no size gate at level 3


def test_dead_use_removed_then_transpose_folded_at_level_2():
    import graphc as gc

    out = gc.optimize(_transpose_model(dead_use=True), 2)
    assert [n.op_type for n in out.proto.graph.node] == ["Add"]


def test_graph_input_that_is_an_output_keeps_its_name_at_every_level(tmp_path):
    """OutputFix left a main-graph input that is also an output alone (onnx-ir's pass renamed
    the input to ``x_orig``, which the pipeline rejects); a trained model's export too."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    outputs = [x, helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])]
    weight = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], outputs,
                              [onnx.numpy_helper.from_array(weight, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    model, feed = gc.load(proto), {"x": np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)}
    for level in range(4):
        optimized = gc.optimize(model, level=level)
        assert ([v.name for v in optimized.inputs], [v.name for v in optimized.outputs]) == (["x"], ["x", "y"])
        out = gc.Session(optimized, backend="numpy").run(feed)
        np.testing.assert_array_equal(out["x"], feed["x"])
        np.testing.assert_allclose(out["y"], feed["x"] @ weight, rtol=1e-5)
    trainer = gc.Trainer(gc.training.generate(model, gc.losses.mse("y", label="t"), gc.optim.SGD(0.1)), backend="numpy")
    trainer.step({**feed, "t": np.zeros((2, 3), np.float32)})
    exported = gc.load(trainer.export_inference(tmp_path / "trained.onnx"))
    assert [v.name for v in exported.outputs] == ["x", "y"]
    np.testing.assert_array_equal(gc.Session(exported, backend="numpy").run(feed)["x"], feed["x"])
