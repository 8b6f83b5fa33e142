"""gc.parity bisect audit: a fault planted in one numpy kernel is found at its node, whatever the
value's kind (sequence, untyped, shapeless), and a model bisect cannot localise says so."""

from __future__ import annotations

import dataclasses

import onnx

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc as gc
from onnx_graphs import linear_relu, model, node, vi
from test_cli_run import graphc

X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


@pytest.fixture
def plant(monkeypatch):
    """plant(op, wrap): the numpy backend's kernel for ``op`` returns ``wrap(outputs)``, for one test."""
    from graphc.backends.numpy import kernels

    def planted(op_type, wrap):
        kernels.lookup(op_type, 21)  # load every family first, so the patch is not appended to
        versions = kernels.KERNELS[("", op_type)]
        faulty = [dataclasses.replace(k, fn=lambda *a, _fn=k.fn, **kw: wrap(_fn(*a, **kw))) for k in versions]
        monkeypatch.setitem(kernels.KERNELS, ("", op_type), faulty)
    return planted


def shifted(outputs):
    return tuple(np.asarray(o) + np.float32(0.25) for o in outputs)


def test_a_sequence_valued_node_is_compared_not_skipped(plant):
    # only tensor-typed values were exposed: the fault in SplitToSequence was blamed on its consumer
    plant("SplitToSequence", lambda outputs: tuple([p + np.float32(0.25) for p in seq] for seq in outputs))
    m = model([node("Relu", ["x"], ["r"], "relu", "net.py:1"),
               node("SplitToSequence", ["r"], ["seq"], "split", "net.py:2", axis=1),
               node("ConcatFromSequence", ["seq"], ["y"], "concat", "net.py:3", axis=1)],
              [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])])
    found = gc.parity.compare(m, {"x": X}, bisect=True).first_divergence
    assert (found.node, found.op_type, found.source, found.output) == ("split", "SplitToSequence", "net.py:2", "seq[0]")


def _loop(body_op: str = "Sigmoid"):
    """y = relu(loop 3 times: v = body_op(v)); onnx's inference leaves the Loop's output shapeless."""
    body = helper.make_graph(
        [helper.make_node(body_op, ["v"], ["v2"], name="step"), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v2", TensorProto.FLOAT, [3, 4])])
    loop = helper.make_node("Loop", ["n", "", "x"], ["lo"], name="loop", body=body)
    loop.metadata_props.add(key="graphc.source", value="net.py:9")
    return model([loop, node("Neg", ["lo"], ["y"], "neg", "net.py:10")],
                 [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])], {"n": np.int64(3)})


def test_a_value_without_an_inferred_shape_is_compared(plant):
    # exposing the Loop's shapeless output failed onnx's checker: bisect raised ModelLoadError
    report = gc.parity.compare(_loop(), {"x": X}, bisect=True)
    assert report.ok and report.first_divergence is None and report.compared_values == 2
    plant("Neg", shifted)
    found = gc.parity.compare(_loop(), {"x": X}, bisect=True).first_divergence
    assert (found.node, found.output) == ("neg", "y")


def test_outputs_that_differ_only_unbisected_are_not_called_agreeing(plant):
    # a fault the instrumented copy does not reproduce (a fusion that exposing values turns off, a
    # racy kernel) printed "parity MISMATCH" beside "no intermediate value differs"
    calls = []

    def first_call_only(outputs):
        calls.append(1)
        return shifted(outputs) if len(calls) == 1 else outputs
    plant("Sigmoid", first_call_only)
    m = model([node("Sigmoid", ["x"], ["s"], "sig", "net.py:1"), node("Neg", ["s"], ["y"], "neg", "net.py:2")],
              [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])])
    report = gc.parity.compare(m, {"x": X}, bisect=True)
    assert not report.ok and report.first_divergence is None
    assert "none found, yet the outputs differ" in str(report) and "agrees" not in report.bisect_summary()[:60]


def test_a_divergence_masked_downstream_is_reported_with_outputs_ok(plant):
    # Sigmoid's outputs are all in (0, 1): Sigmoid + 0.25 keeps every row's argmax
    plant("Sigmoid", shifted)
    m = model([node("Sigmoid", ["x"], ["s"], "sig", "net.py:1"), node("ArgMax", ["s"], ["y"], "am", "net.py:2", axis=1)],
              [vi("x", shape=[3, 4])], [vi("y", TensorProto.INT64, [3, 1])])
    report = gc.parity.compare(m, {"x": X}, bisect=True)
    assert report.ok and report.first_divergence.node == "sig"
    assert report.bisect_summary().endswith("masked downstream: the outputs agree")


def test_a_body_bisect_cannot_enter_names_the_calling_node_and_says_why(plant):
    # bisect enters bodies (tests/test_parity_bisect_inner.py) by feeding the reference's values, which a
    # sequence read from the outer scope is not; the Loop was named as if its own kernel differed
    plant("Sigmoid", shifted)
    body = helper.make_graph(
        [helper.make_node("SequenceAt", ["seq", "zero"], ["part"], name="pick"),
         helper.make_node("Sigmoid", ["part"], ["v2"], name="step"), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v2", TensorProto.FLOAT, [3, 4])])
    m = model([node("SplitToSequence", ["x"], ["seq"], "split", "net.py:1", axis=0, keepdims=1),
               node("ConcatFromSequence", ["seq"], ["xs"], "join", "net.py:2", axis=0),
               node("Loop", ["n", "", "xs"], ["y"], "loop", "net.py:3", body=body)],
              [vi("x", shape=[3, 4])], [vi("y", shape=[3, 4])], {"n": np.int64(2), "zero": np.int64(0)})
    found = gc.parity.compare(m, {"x": X}, bisect=True).first_divergence
    assert (found.node, found.inside, found.within) == ("loop", "subgraph body", [])
    assert str(found).endswith("bisect cannot enter its subgraph body: it reads 'seq', which is not a tensor")


def test_cli_bisects_a_model_with_external_data_and_exits_by_the_outcome(plant, tmp_path, capsys):
    onnx.save(linear_relu(), str(tmp_path / "net.onnx"), save_as_external_data=True, location="net.data",
              size_threshold=0)
    assert (tmp_path / "net.data").stat().st_size > 0
    assert graphc("parity", tmp_path / "net.onnx", "--bisect") == 0
    assert "none, every intermediate value agrees" in capsys.readouterr().out
    np.save(tmp_path / "x.npy", X[:, :3])
    assert graphc("parity", tmp_path / "net.onnx", "-i", f"x={tmp_path / 'x.npy'}") == 2  # b and w not given
    assert "missing input 'b'" in capsys.readouterr().err
    plant("Add", shifted)
    assert graphc("parity", tmp_path / "net.onnx", "--bisect") == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "node 'add_0' (Add) at net.py:11: output 'pre' differs on ort-cpu" in out and "parity MISMATCH" in out
