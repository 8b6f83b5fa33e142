"""Shape arithmetic on static shapes folds (issue 14, item 3): an exporter's window padding
computed with Shape/Gather/Mod/Range/Div/Concat/Unsqueeze, whose Pad output ONNX shape
inference cannot see through, ends up constant after gc.optimize, which then trains through
gc.training.generate; and the PyTorch exports the optimizer is measured on come out no larger
than onnxsim's and onnxslim's, with equal outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import graphc as gc
from optimize_util import F, assert_close, assert_same_outputs, make_model, op_types, run_ort

I64 = np.int64
SHAPE_OPS = {"Shape", "Gather", "Mod", "Range", "Div", "Sub", "Concat", "Unsqueeze", "Cast", "ConstantOfShape"}


def _window_padding_model() -> gc.Model:
    """x[2, 7, 6] * W padded along axis 1 to a multiple of 4 (pads = (4 - H % 4) % 4 from
    Shape(x)); then H' = Shape(padded)[1] sets a second Pad ((H' / 4) % 3 more rows) and a
    Range(0, H' / 4) scale: every one of those values depends on the first Pad's output
    shape, which ONNX inference cannot know while the pads are a computed tensor."""
    n = helper.make_node
    nodes = [
        n("Mul", ["x", "W"], ["xw"]),
        n("Shape", ["x"], ["s"]), n("Gather", ["s", "one"], ["h"]), n("Mod", ["h", "four"], ["hm"]),
        n("Sub", ["four", "hm"], ["t"]), n("Mod", ["t", "four"], ["pad_h"]), n("Unsqueeze", ["pad_h", "axis0"], ["ph1"]),
        n("Concat", ["zeros4", "ph1", "zero1"], ["pads"], axis=0),
        n("Pad", ["xw", "pads"], ["p"]),
        n("Shape", ["p"], ["ps"]), n("Gather", ["ps", "one"], ["hp"]), n("Div", ["hp", "four"], ["nh"]),
        n("Mod", ["nh", "three"], ["extra"]), n("Unsqueeze", ["extra", "axis0"], ["e1"]),
        n("Concat", ["zeros4", "e1", "zero1"], ["pads2"], axis=0),
        n("Pad", ["p", "pads2"], ["q"]),
        n("Range", ["zero", "nh", "one"], ["r"]), n("Cast", ["r"], ["rf"], to=onnx.TensorProto.FLOAT),
        n("Unsqueeze", ["rf", "axes01"], ["rf3"]),
        n("Shape", ["q"], ["qs"]), n("Gather", ["qs", "one"], ["hq"]), n("Div", ["hq", "nh"], ["rows"]),
        n("Unsqueeze", ["nh", "axis0"], ["nh1"]), n("Unsqueeze", ["rows", "axis0"], ["rows1"]),
        n("Concat", ["two", "nh1", "rows1", "minus1"], ["shape"], axis=0),
        n("Reshape", ["q", "shape"], ["qr"]), n("Mul", ["qr", "rf3"], ["y0"]),
        n("ReduceSum", ["y0", "axes23"], ["y"], keepdims=0),
    ]
    inits = [("W", np.linspace(-1, 1, 6, dtype=np.float32)), ("one", np.array(1, I64)), ("four", np.array(4, I64)),
             ("three", np.array(3, I64)), ("zero", np.array(0, I64)), ("axis0", np.array([0], I64)),
             ("zeros4", np.zeros(4, I64)), ("zero1", np.zeros(1, I64)), ("two", np.array([2], I64)),
             ("minus1", np.array([-1], I64)), ("axes01", np.array([0, 2, 3], I64)), ("axes23", np.array([2, 3], I64))]
    return make_model(nodes, [("x", F, [2, 7, 6])], [("y", F, [2, 2])], inits, opset=18)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_shape_arithmetic_behind_a_computed_pad_folds(level):
    model = _window_padding_model()
    out = gc.optimize(model, level)
    assert not SHAPE_OPS & set(op_types(out)), op_types(out)
    assert op_types(out).count("Pad") == 2 and len(out.ir.graph) < len(model.ir.graph)
    assert_same_outputs(model, out, batches=(2,))
    pads = [n.inputs[1].const_value for n in out.ir.graph if n.op_type == "Pad"]
    assert [p.numpy().tolist() for p in pads] == [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 2, 0]]


def test_computed_pads_train_after_optimize():
    arts = gc.training.generate(gc.optimize(_window_padding_model(), 2), gc.losses.mse("y"), gc.optim.SGD(0.1))
    assert "W" in arts.state and not {"Mod", "Range"} & set(op_types(arts.train_step))


def test_symbolic_dims_are_never_fixed_by_reinference():
    # a value whose dim follows the batch symbol stays symbolic round after round
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]), helper.make_node("Concat", ["n1", "m1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [("x", F, ["N", 3, 4])], [("y", F, ["N", 12])],
                       [("zero", np.array(0, I64)), ("axis0", np.array([0], I64)), ("m1", np.array([-1], I64))])
    out = gc.optimize(model, 2)
    assert op_types(out) == ["Reshape"] and out.inputs[0].shape[0] == "N"
    assert_same_outputs(model, out, batches=(1, 3))


def test_dims_that_follow_an_input_symbol_are_not_reinferred():
    # Reshape(x[N, 5, 8], [-1, 8]) has an unknown dim that follows from N: once inferred, it and
    # everything computed from it are not worth another inference run in the next round
    from graphc.passes.optimize.pipeline import all_nodes
    from graphc.passes.optimize.shape_inference import ShapeInference, _pending

    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    model = make_model(nodes, [("x", F, ["N", 5, 8])], [("y", F, ["M", 8])], [("s", np.array([-1, 8], I64))]).ir
    assert "r" in _pending(all_nodes(model.graph), {"N"})  # no shape yet
    ShapeInference()(model)
    assert _pending(all_nodes(model.graph), {"N"}) == {}


def _fed_shape_model() -> gc.Model:
    """Shape(Reshape(x[12], shape)) where ``shape`` is a graph input whose initializer [2, 6]
    is only a default: a caller may feed another."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Shape", ["r"], ["s"])]
    return make_model(nodes, [("x", F, [12]), ("shape", onnx.TensorProto.INT64, [2])],
                      [("s", onnx.TensorProto.INT64, [2])], [("shape", np.array([2, 6], I64))], opset=17)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_default_a_caller_may_feed_is_not_folded(level):
    model = _fed_shape_model()
    out = gc.optimize(model, level)
    x = np.zeros(12, np.float32)
    for shape in ([3, 4], [2, 6], [12, 1]):
        fed = {"x": x, "shape": np.array(shape, I64)}
        assert_close(run_ort(model, fed), run_ort(out, fed), what=f"level {level} fed {shape}")
        assert run_ort(out, fed)["s"].tolist() == shape
    assert run_ort(out, {"x": x})["s"].tolist() == [2, 6]  # the default still applies


@pytest.mark.parametrize("source", [False, True])
def test_shape_inference_leaves_a_feedable_default_out(source):
    # both ways the pass calls onnx's inference: on the caller's proto, and on the IR model
    # serialized with its small initializers' data
    from graphc.passes.optimize.shape_inference import ShapeInference

    model = _fed_shape_model()
    reshaped = next(n for n in model.ir.graph if n.op_type == "Reshape").outputs[0]
    ShapeInference(model.proto if source else None)(model.ir)
    assert reshaped.shape is None or not reshaped.shape.is_static(), reshaped.shape
    assert model.ir.graph.initializers["shape"].const_value.numpy().tolist() == [2, 6]


torch = pytest.importorskip("torch")  # the tests below export PyTorch models
torch_blocks = pytest.importorskip("torch_blocks")


def _rival_nodes(proto: onnx.ModelProto) -> int:
    import onnxsim
    import onnxslim

    counts = []
    for simplify in (lambda p: onnxsim.simplify(p)[0], onnxslim.slim):
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        counts.append(len(simplify(copy).graph.node))
    return min(counts)


@pytest.mark.parametrize("name", ["window_block", "convnext_net", "transformer_encoder", "lstm"])
def test_torchscript_exports_no_larger_than_rivals(name):
    proto, feeds, expected = torch_blocks.export(name, dynamo=False)
    out = gc.optimize(proto, 3)
    assert_close({"y": expected}, run_ort(out, feeds), rtol=1e-4, atol=1e-5)
    assert len(out.proto.graph.node) <= _rival_nodes(proto)


def test_window_block_from_torchscript_trains_after_optimize():
    proto, feeds, expected = torch_blocks.export("window_block", dynamo=False)
    model = gc.optimize(proto, 2)
    assert not {"Shape", "Mod", "Range", "ScatterND"} & set(op_types(model))
    assert_close({"y": expected}, run_ort(model, feeds), rtol=1e-4, atol=1e-5)
    arts = gc.training.generate(model, gc.losses.mse("y"), gc.optim.SGD(0.05))
    trainer = gc.Trainer(arts, backend="ort-cpu")
    batch = {"x": feeds["x"], "label": np.zeros_like(expected)}
    losses = [float(trainer.step(batch)) for _ in range(3)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
