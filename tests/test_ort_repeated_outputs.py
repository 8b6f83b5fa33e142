"""A subgraph that lists one value as two of its outputs (a Scan body's ``(h2, h2)``: the carry and
the scanned output; an If branch's ``(y, y)``): ONNX allows it, onnxruntime 1.31 runs it wrong
(a Scan's outputs up to 0.9 off, an If's second output uninitialised memory). The DSL's bodies give
each output a value of its own, ort sessions and server exports do the same for loaded models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.model.file import distinct_subgraph_outputs
from graphc.serving.deploy import for_server

R = np.random.default_rng(3)
F = TensorProto.FLOAT


def _body_outputs(model, op):
    node = next(n for n in model.proto.graph.node if n.op_type == op)
    return [[o.name for o in a.g.output] for a in node.attribute if a.HasField("g")]


def _both(model, feeds):
    want = gc.Session(model, backend="numpy").run(feeds)
    got = gc.Session(model, backend="ort-cpu").run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    return want


@pytest.mark.parametrize("steps", [5, 70])  # the gradient unrolled, and in reverse mode past 64 steps
def test_scan_returning_its_carry_as_output_runs_and_differentiates_alike(steps):
    x = R.standard_normal((steps, 2, 3)).astype(np.float32)
    h0 = R.standard_normal((2, 3)).astype(np.float32)

    def f(h0, x):
        def step(h, xt):
            h2 = gc.tanh(h * 0.5 + xt)
            return h2, h2
        h, ys = gc.scan(step, h0, x)
        return (h.sum() + (ys * ys).sum()).reshape([1])

    model = gc.capture(f, h0=h0, x=x)
    [outs] = _body_outputs(model, "Scan")
    assert len(set(outs)) == len(outs)
    _both(model, {"h0": h0, "x": x})
    _both(gc.grad(model, "output"), {"h0": h0, "x": x})


def test_cond_returning_one_value_twice_runs_alike():
    a = R.standard_normal((2, 3)).astype(np.float32)
    model = gc.capture(lambda p, a: gc.cond(p, lambda: (gc.sin(a),) * 2, lambda: (gc.cos(a),) * 2),
                       p=np.array(True), a=a)
    assert all(len(set(o)) == len(o) for o in _body_outputs(model, "If"))
    for p in (True, False):
        _both(model, {"p": np.array(p), "a": a})


def _loaded_if_with_a_repeated_output() -> onnx.ModelProto:
    def branch(op):
        return helper.make_graph([helper.make_node(op, ["a"], ["t"])], op, [],
                                 [helper.make_tensor_value_info("t", F, [2, 3])] * 2)

    graph = helper.make_graph(
        [helper.make_node("If", ["p"], ["o1", "o2"], then_branch=branch("Sin"), else_branch=branch("Cos"))], "g",
        [helper.make_tensor_value_info("p", TensorProto.BOOL, []), helper.make_tensor_value_info("a", F, [2, 3])],
        [helper.make_tensor_value_info("o1", F, [2, 3]), helper.make_tensor_value_info("o2", F, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_loaded_model_with_repeated_subgraph_outputs_runs_right_on_ort():
    proto = _loaded_if_with_a_repeated_output()
    a = R.standard_normal((2, 3)).astype(np.float32)
    for p in (True, False):
        out = _both(proto, {"p": np.array(p), "a": a})
        np.testing.assert_allclose(out["o2"], (np.sin if p else np.cos)(a), rtol=1e-6)


def test_distinct_subgraph_outputs_copies_only_where_needed():
    proto = _loaded_if_with_a_repeated_output()
    fixed = distinct_subgraph_outputs(proto)
    assert fixed is not proto and [o.name for o in proto.graph.node[0].attribute[0].g.output] == ["t", "t"]
    for attr in fixed.graph.node[0].attribute:
        names = [o.name for o in attr.g.output]
        assert names[0] == "t" and names[1] not in ("t", "a", "o1", "o2")
        assert attr.g.node[-1].op_type == "Identity" and list(attr.g.node[-1].output) == names[1:]
    onnx.checker.check_model(fixed, full_check=True)
    assert distinct_subgraph_outputs(fixed) is fixed


def test_server_export_makes_subgraph_outputs_distinct():
    served = for_server(gc.load(_loaded_if_with_a_repeated_output()))
    for attr in served.proto.graph.node[0].attribute:
        assert len({o.name for o in attr.g.output}) == 2
