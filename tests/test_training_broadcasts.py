"""``broadcasts.rank_scalars``: a scalar meeting a tensor whose last dim is 1 gets that tensor's
rank (onnxruntime's slow broadcast), shapes and values unchanged; and no train_step keeps one."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper as oh
from onnx import numpy_helper as nh

import graphc as gc
from graphc.passes.training import broadcasts

RNG = np.random.default_rng(0)


def pairs_model() -> ir.Model:
    """Ops on x [2, 3, 1, 1] with a constant scalar (both sides; an initializer and a Constant
    node's), a fed scalar, a [1] constant, a
    comparison and a Where with a scalar branch; and ops rank_scalars must leave: a [2, 3] tensor
    with a scalar, x with a same-rank [1, 1, 1, 1]."""
    f = onnx.TensorProto.FLOAT
    nodes = [oh.make_node("Constant", [], ["one"], value=nh.from_array(np.array(1.0, np.float32))),
             oh.make_node("Div", ["x", "four"], ["a"]), oh.make_node("Sub", ["one", "x"], ["b"]),
             oh.make_node("Mul", ["x", "s"], ["c"]), oh.make_node("Add", ["x", "vec1"], ["d"]),
             oh.make_node("Greater", ["x", "one"], ["gt"]), oh.make_node("Where", ["gt", "four", "x"], ["h"]),
             oh.make_node("Mul", ["m", "four"], ["e"]), oh.make_node("Mul", ["x", "ones4"], ["g"])]
    inits = [nh.from_array(np.array(4.0, np.float32), "four"), nh.from_array(np.array([2.0], np.float32), "vec1"), nh.from_array(np.ones((1, 1, 1, 1), np.float32), "ones4")]
    graph = oh.make_graph(nodes, "pairs", [oh.make_tensor_value_info("x", f, [2, 3, 1, 1]), oh.make_tensor_value_info("s", f, []),
                                            oh.make_tensor_value_info("m", f, [2, 3])],
                          [oh.make_tensor_value_info(n, f, None) for n in "abcdhg"] +
                          [oh.make_tensor_value_info("gt", onnx.TensorProto.BOOL, None), oh.make_tensor_value_info("e", f, None)],
                          inits)
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])))


def run(model: ir.Model, feeds: dict) -> dict:
    ort = pytest.importorskip("onnxruntime")
    proto = ir.serde.serialize_model(model)
    proto.ir_version = 8
    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def test_scalars_meeting_a_trailing_one_get_its_rank():
    model = pairs_model()
    feeds = {"x": RNG.standard_normal((2, 3, 1, 1)).astype(np.float32), "s": np.array(1.5, np.float32),
             "m": RNG.standard_normal((2, 3)).astype(np.float32)}
    before = run(model, feeds)
    assert broadcasts.rank_scalars(model.graph, 17) == 6
    by_output = {n.outputs[0].name: n for n in model.graph}
    for name in ("a", "b", "c", "d", "gt", "h"):  # each scalar operand now [1, 1, 1, 1]
        assert [[int(d) for d in v.shape] for v in by_output[name].inputs if v.name not in ("x", "gt")] == [[1, 1, 1, 1]]
    assert by_output["c"].inputs[1].producer().op_type == "Reshape"  # fed: reshaped, not rewritten
    assert by_output["b"].inputs[0].producer().op_type == "Constant"  # a Constant node's: rewritten
    assert by_output["e"].inputs[1].name == "four" and by_output["g"].inputs[1].name == "ones4"  # left
    model.graph.sort()
    after = run(model, feeds)
    for name in before:
        assert after[name].shape == before[name].shape
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def se_model() -> gc.Model:
    """A squeeze-excite block: x [N, 8, 4, 4] * HardSigmoid(conv1x1(SiLU(conv1x1(GlobalAveragePool(x))))),
    then BatchNorm: [N, C, 1, 1] gradients everywhere."""
    f = onnx.TensorProto.FLOAT
    inits = [nh.from_array(RNG.standard_normal((2, 8, 1, 1)).astype(np.float32), "r.weight"),
             nh.from_array(RNG.standard_normal((8, 2, 1, 1)).astype(np.float32), "e.weight"),
             nh.from_array(np.ones(8, np.float32), "bn.weight"), nh.from_array(np.zeros(8, np.float32), "bn.bias"),
             nh.from_array(np.zeros(8, np.float32), "bn.running_mean"), nh.from_array(np.ones(8, np.float32), "bn.running_var")]
    nodes = [oh.make_node("GlobalAveragePool", ["x"], ["p"]), oh.make_node("Conv", ["p", "r.weight"], ["r"]),
             oh.make_node("Sigmoid", ["r"], ["rs"]), oh.make_node("Mul", ["r", "rs"], ["a"]),
             oh.make_node("Conv", ["a", "e.weight"], ["e"]), oh.make_node("HardSigmoid", ["e"], ["gate"], alpha=1 / 6),
             oh.make_node("Mul", ["x", "gate"], ["gated"]),
             oh.make_node("BatchNormalization", ["gated", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"], ["out"])]
    graph = oh.make_graph(nodes, "se", [oh.make_tensor_value_info("x", f, ["N", 8, 4, 4])],
                          [oh.make_tensor_value_info("out", f, ["N", 8, 4, 4])], inits)
    return gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))


def slow_pairs(proto: onnx.ModelProto) -> list[str]:
    graph = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(proto)).graph
    found = []
    for n in graph:
        rank = broadcasts._trailing_one_rank(n) if n.op_type in broadcasts._OPS else None
        if rank is not None and any(broadcasts._lower_rank_scalar(v, rank) for v in n.inputs):
            found.append(n.name)
    return found


def test_no_train_step_keeps_a_slow_scalar_broadcast(monkeypatch):
    def generate():
        return gc.training.generate(se_model(), gc.losses.mse("out", label="y"), gc.optim.AdamW(1e-2, weight_decay=0.1))

    arts = generate()
    for key in ("train_step", "gradients", "eval"):
        assert slow_pairs(getattr(arts, key).proto) == [], key
    monkeypatch.setattr(broadcasts, "rank_scalars", lambda graph, opset: 0)  # what the graphs have without it
    assert slow_pairs(generate().train_step.proto)


def test_the_update_model_ranks_its_decay_too():
    """The data-parallel update alone (``update_model``): a 1x1 conv weight's decoupled decay."""
    arts = gc.training.generate(se_model(), gc.losses.mse("out", label="y"), gc.optim.AdamW(1e-2, weight_decay=0.1))
    update = gc.training.update_model(arts.manifest)
    assert slow_pairs(update.proto) == []
