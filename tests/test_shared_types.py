"""One shape inference per ort session build while no rewrite changes the model
(``graphc.model.inferred.SharedTypes``): before, each rewrite that reads types ran its own over the
whole model (a Relu and a Conv: doubles.lower_double, integers.lower, narrow_casts.lower and the
NCHWc check, four inferences of one model; the zoo's ResNet-50 and GPT train steps five each, now
two)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.model.file import tensor_types
from graphc.model.inferred import SharedTypes
from onnx_graphs import model, node, vi

RNG = np.random.default_rng(11)


@pytest.fixture
def inferences(monkeypatch) -> list[onnx.ModelProto]:
    """The models onnx's shape inference is run on from here on."""
    seen, real = [], onnx.shape_inference.infer_shapes

    def counted(proto, *args, **kwargs):
        seen.append(proto)
        return real(proto, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    return seen


def _relu_conv() -> onnx.ModelProto:
    """Relu then a Conv of a constant weight: doubles.lower_double, integers.lower, narrow_casts.lower and the
    NCHWc check all read its types, and none of them changes it (float nodes with kernels; an initializer
    weight stays NCHW)."""
    return model([node("Relu", ["x"], ["r"], "relu"), node("Conv", ["r", "w"], ["y"], "conv", pads=[1, 1, 1, 1])],
                 [vi("x", shape=[1, 8, 6, 6])], [vi("y", shape=[1, 8, 6, 6])],
                 {"w": RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)}, opset=17)


def _tan_relu_conv() -> onnx.ModelProto:
    """A double Tan, written out by doubles.lower_double (the model changes), beside ``_relu_conv``'s nodes,
    whose readers then read the written-out model's types."""
    relu_conv = _relu_conv()
    proto = model([node("Tan", ["d"], ["t"], "tan"), *relu_conv.graph.node],
                  [vi("d", TensorProto.DOUBLE, [5]), *relu_conv.graph.input],
                  [vi("t", TensorProto.DOUBLE, [5]), *relu_conv.graph.output], opset=17)
    proto.graph.initializer.extend(relu_conv.graph.initializer)
    return proto


def _run(proto: onnx.ModelProto, session: gc.Session, **feeds: np.ndarray) -> None:
    """``session`` (ort-cpu) gives the numpy backend's outputs on ``feeds``."""
    expected = gc.Session(gc.load(proto), backend="numpy").run(feeds)
    for name, got in session.run(feeds).items():
        np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-5)


def test_a_session_build_infers_shapes_once_while_no_rewrite_changes_the_model(inferences):
    proto = _relu_conv()
    session = gc.Session(gc.load(proto), backend="ort-cpu")
    assert len(inferences) == 1  # four before
    _run(proto, session, x=RNG.standard_normal((1, 8, 6, 6)).astype(np.float32))


def test_a_rewrite_that_changes_the_model_has_the_next_ones_read_the_new_model(inferences):
    proto = _tan_relu_conv()
    session = gc.Session(gc.load(proto), backend="ort-cpu")
    # doubles.lower_double reads the model as given; integers.lower, narrow_casts.lower and the NCHWc check
    # the written-out one (four inferences before)
    assert [[n.op_type for n in p.graph.node][-2:] for p in inferences] == [["Relu", "Conv"]] * 2
    assert "Tan" in {n.op_type for n in inferences[0].graph.node} - {n.op_type for n in inferences[1].graph.node}
    _run(proto, session, d=np.linspace(-1.4, 1.4, 5), x=RNG.standard_normal((1, 8, 6, 6)).astype(np.float32))


def _with_branch() -> onnx.ModelProto:
    """y = If(c) of a branch computing u = x + x inside (a value only the subgraph holds)."""
    branch = helper.make_graph([helper.make_node("Add", ["x", "x"], ["u"]), helper.make_node("Neg", ["u"], ["o"])],
                               "then", [], [vi("o", shape=None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["p"])], "else", [], [vi("p", shape=None)])
    return model([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)],
                 [vi("c", TensorProto.BOOL, []), vi("x", shape=[2, 3])], [vi("y", shape=[2, 3])], opset=17)


def test_shared_types_serves_both_forms_from_one_inference_per_model(inferences):
    proto = _with_branch()
    types_of = SharedTypes()
    main, every = types_of(proto), types_of(proto, subgraphs=True)
    assert types_of(proto) is main and len(inferences) == 1
    assert "u" not in main and every["u"] == (TensorProto.FLOAT, [2, 3]) and main["x"] == every["x"]
    assert (main, every) == (tensor_types(proto), tensor_types(proto, subgraphs=True))
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # another model (a rewrite's copy), even if equal: inferred anew
    assert types_of(copy) == main and len(inferences) == 4  # (2 for the tensor_types calls)
