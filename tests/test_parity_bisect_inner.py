"""gc.parity bisect enters If branches, Loop/Scan bodies (per iteration) and local functions: a fault
planted in one numpy kernel there is named at its inner node, with the nodes entered on the way;
the node found is run alone to tell a faulty kernel from differences it only amplifies."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc as gc
from onnx_graphs import model, node, vi
from test_parity_audit import X, _loop, plant, shifted  # noqa: F401 - plant is a fixture

FLOAT = TensorProto.FLOAT


def nonzero_shifted(outputs):
    """``shifted`` for an output that is not all zeros: a kernel wrong from some iteration on."""
    return shifted(outputs) if np.any(outputs[0]) else outputs


def _tensor(name, elem=FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _iterating_loop():
    """y = loop 3 times: v = sigmoid(v * float(i) + w), w = relu(x) read from the main graph."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], name="cast", to=FLOAT),
         node("Mul", ["v", "fi"], ["t"], "scale", "net.py:21"),
         helper.make_node("Add", ["t", "w"], ["u"], name="shift"),
         helper.make_node("Sigmoid", ["u"], ["v2"], name="squash"),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [_tensor("i", TensorProto.INT64, []), _tensor("cond", TensorProto.BOOL, []), _tensor("v", shape=[3, 4])],
        [_tensor("cond_out", TensorProto.BOOL, []), _tensor("v2", shape=[3, 4])])
    return model([node("Relu", ["x"], ["w"], "prep", "net.py:19"),
                  node("Loop", ["n", "", "x"], ["y"], "loop", "net.py:20", body=body)],
                 [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])], {"n": np.int64(3)})


def test_a_fault_from_the_second_iteration_on_is_named_with_its_iteration(plant):
    # Mul's output is all zeros at iteration 0 (i == 0), so the planted fault starts at iteration 1
    plant("Mul", nonzero_shifted)
    found = gc.parity.compare(_iterating_loop(), {"x": X}, bisect=True).first_divergence
    assert (found.node, found.op_type, found.source, found.output) == ("scale", "Mul", "net.py:21", "t")
    assert [str(s) for s in found.within] == ["node 'loop' (Loop) at net.py:20, body, iteration 1"]
    assert found.differs_alone is True and found.inside == ""
    assert str(found).startswith("node 'loop' (Loop) at net.py:20, body, iteration 1 > node 'scale' (Mul) at net.py:21")


def test_a_loop_whose_every_iteration_agrees_is_blamed_itself(plant):
    plant("Loop", shifted)
    found = gc.parity.compare(_loop(), {"x": X}, bisect=True).first_divergence
    assert (found.node, found.within, found.differs_alone) == ("loop", [], None)
    assert found.note.startswith("each of its 3 iterations agrees run alone on the reference's carries")


def test_a_scan_is_entered_per_step_in_its_direction(plant):
    # m = acc * row is zero at step 0 (acc starts at zeros), so the fault shows from step 1
    plant("Mul", nonzero_shifted)
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "row"], ["acc2"], name="sum"),
         node("Mul", ["acc", "row"], ["m"], "prod", "net.py:31")],
        "body", [_tensor("acc", shape=[4]), _tensor("row", shape=[4])],
        [_tensor("acc2", shape=[4]), _tensor("m", shape=[4])])
    m = model([node("Scan", ["zero", "x"], ["total", "ms"], "scan", "net.py:30", body=body, num_scan_inputs=1,
                    scan_input_directions=[1])],
              [vi("x", shape=[3, 4])], [vi("total", shape=[4]), vi("ms", shape=[3, 4])],
              {"zero": np.zeros(4, np.float32)})
    report = gc.parity.compare(m, {"x": X}, bisect=True)
    found = report.first_divergence
    assert (found.node, found.output, [s.entered for s in found.within]) == ("prod", "m", ["body, iteration 1"])
    assert report.outputs["total"].ok  # the states agree: only the scanned-out product differs


def _branchy(then_nodes, then_out="t"):
    then_branch = helper.make_graph(then_nodes, "then", [], [_tensor(then_out, shape=[3, 4])])
    else_branch = helper.make_graph([helper.make_node("Tanh", ["x"], ["e"], name="other")], "else", [],
                                    [_tensor("e", shape=[3, 4])])
    return model([node("Relu", ["x"], ["w"], "prep", "net.py:1"), node("Identity", ["c"], ["c2"], "id", "net.py:2"),
                  node("If", ["c2"], ["y"], "cond", "net.py:3", then_branch=then_branch, else_branch=else_branch)],
                 [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])], {"c": np.array(True)})


def test_the_taken_branch_is_entered_with_the_outer_values_it_reads(plant):
    plant("Sigmoid", shifted)
    m = _branchy([helper.make_node("Add", ["x", "w"], ["s"], name="mix"),
                  node("Sigmoid", ["s"], ["t"], "inner", "net.py:4")])
    found = gc.parity.compare(m, {"x": X}, bisect=True).first_divergence
    assert (found.node, found.source, found.differs_alone) == ("inner", "net.py:4", True)
    assert [str(s) for s in found.within] == ["node 'cond' (If) at net.py:3, then_branch (cond True)"]


def test_a_backend_that_takes_the_other_branch_is_named(monkeypatch):
    from graphc.backends.numpy import kernels

    kernels.lookup("If", 21)
    wrong = [dataclasses.replace(k, fn=lambda ctx, cond, _fn=k.fn, **kw: _fn(ctx, ~np.asarray(cond), **kw))
             for k in kernels.KERNELS[("", "If")]]
    monkeypatch.setitem(kernels.KERNELS, ("", "If"), wrong)
    found = gc.parity.compare(_branchy([helper.make_node("Sigmoid", ["x"], ["t"])]), {"x": X},
                              bisect=True).first_divergence
    assert (found.node, found.within) == ("cond", [])
    assert found.note == "numpy took else_branch although cond is True: its output is what else_branch gives"


def _gate(nodes, name="Gate", inputs=("a",)):
    return helper.make_function("local", name, list(inputs), ["b"], nodes,
                                [helper.make_opsetid("", 21), helper.make_opsetid("local", 1)])


def test_a_function_is_entered_inlined_and_named_as_the_user_wrote_it(plant):
    plant("Sigmoid", shifted)
    gate = _gate([helper.make_node("Neg", ["a"], ["n"], name="flip"), node("Sigmoid", ["n"], ["b"], "", "gates.py:7")])
    m = model([node("Gate", ["x"], ["y"], "gate", "net.py:3", domain="local")],
              [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])], extra_opsets=[helper.make_opsetid("local", 1)])
    m.functions.append(gate)
    found = gc.parity.compare(m, {"x": X}, bisect=True).first_divergence
    # the unnamed Sigmoid: node #1 of Gate, output 'b' (inlining renames both)
    assert (found.node, found.index, found.source, found.output) == ("", 1, "gates.py:7", "b")
    assert str(found).startswith("node 'gate' (Gate) at net.py:3, function local.Gate > unnamed node #1 (Sigmoid)")



def test_nested_functions_are_entered_one_level_at_a_time(plant):
    plant("Tanh", shifted)
    gate = _gate([node("Tanh", ["a"], ["b"], "th", "gates.py:7")])
    outer = _gate([helper.make_node("Relu", ["a"], ["r"], name="pos"),
                   node("Gate", ["r"], ["b"], "inner_call", "gates.py:12", domain="local")], "Outer")
    m = model([node("Outer", ["x"], ["y"], "outer", "net.py:4", domain="local")],
              [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])], extra_opsets=[helper.make_opsetid("local", 1)])
    m.functions.extend([gate, outer])
    found = gc.parity.compare(m, {"x": X}, bisect=True).first_divergence
    assert (found.node, found.source, found.output) == ("th", "gates.py:7", "b")
    assert [str(s) for s in found.within] == ["node 'outer' (Outer) at net.py:4, function local.Outer",
                                              "node 'inner_call' (Gate) at gates.py:12, function local.Gate"]


def test_a_node_that_only_amplifies_differences_within_tolerance_agrees_alone(plant):
    # Sigmoid off by 3e-6 (inside float32's atol 1e-5); Sub cancels to ~0, Mul by 1e3 makes it 3e-3
    plant("Sigmoid", lambda outputs: tuple(np.asarray(o) + np.float32(3e-6) for o in outputs))
    exact = (1 / (1 + np.exp(-X.astype(np.float64)))).astype(np.float32)
    m = model([node("Sigmoid", ["x"], ["s"], "sig", "net.py:1"), node("Sub", ["s", "t"], ["d"], "sub", "net.py:2"),
               node("Mul", ["d", "k"], ["y"], "amplify", "net.py:3")],
              [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])], {"t": exact, "k": np.float32(1e3)})
    found = gc.parity.compare(m, {"x": X}, bisect=True).first_divergence
    assert (found.node, found.differs_alone) == ("amplify", False)
    assert "run alone on the reference's inputs it agrees" in str(found)
