"""``Session.run(..., cancel=token)``: another thread's ``token.cancel()`` stops a run that would
go on for hours (a Loop's trip count, a long Scan) within a fraction of a second on the numpy
interpreter and on onnxruntime, with ``RunCancelled``; the session runs normally afterwards."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.backends import loop_bodies
from graphc.backends.cancel import CancelToken
from graphc.errors import RunCancelled
from graphc.model.file import model_graphs
from serve_util import loop_model
from stuck_loops import LONG_TRIPS, STUCK

BACKENDS = ["numpy", "ort-cpu"]
ENDLESS = {"n": np.array(10**12, np.int64), "x": np.zeros(1, np.float32)}


def _model(graph):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def scan_sum():
    """s = the sum of xs[t] over t, by a Scan of one Add per step."""
    info = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("Add", ["acc", "xt"], ["acc2"]),
                              helper.make_node("Identity", ["acc2"], ["out"])], "body",
                             [info("acc", TensorProto.FLOAT, [1]), info("xt", TensorProto.FLOAT, [1])],
                             [info("acc2", TensorProto.FLOAT, [1]), info("out", TensorProto.FLOAT, [1])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["s", "steps"], body=body, num_scan_inputs=1)
    return _model(helper.make_graph([scan], "scan", [info("s0", TensorProto.FLOAT, [1]),
                                                     info("xs", TensorProto.FLOAT, ["T", 1])],
                                    [info("s", TensorProto.FLOAT, [1]), info("steps", TensorProto.FLOAT, ["T", 1])]))


def cancelled_after(session, feeds, seconds=0.2):
    """Seconds ``session.run(feeds)`` took when cancelled ``seconds`` after it started."""
    token = CancelToken()
    timer = threading.Timer(seconds, token.cancel)
    start = time.monotonic()
    timer.start()
    with pytest.raises(RunCancelled, match="cancelled|terminated"):
        session.run(feeds, cancel=token)
    return time.monotonic() - start


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [loop_model, *STUCK.values()], ids=["loop", *STUCK])
def test_a_cancelled_loop_stops_and_the_session_runs_on(backend, make):
    model = make()
    onnx.checker.check_model(model, full_check=True)
    session = gc.Session(model, backend=backend)
    assert cancelled_after(session, {**ENDLESS, "n": np.array(LONG_TRIPS, np.int64)}) < 2.0
    x = np.array([1.5], np.float32)
    want = x + 7 if make is loop_model else x
    np.testing.assert_array_equal(session.run({"n": np.array(7, np.int64), "x": x})["y"], want)
    np.testing.assert_array_equal(session.run({"n": np.array(7, np.int64), "x": x}, cancel=CancelToken())["y"], want)


@pytest.mark.parametrize("make", STUCK.values(), ids=STUCK)
def test_onnxruntimes_copy_gives_each_stuck_loop_body_a_node_and_leaves_the_model(make):
    """Each stuck body's condition becomes And(condition, condition input) in the session's copy
    only; a body that computes an output from an input (loop_model's) is left as it is."""
    model = make()
    before = model.SerializeToString()
    copy = loop_bodies.terminable(model)
    assert model.SerializeToString() == before and copy is not model
    onnx.checker.check_model(copy, full_check=True)
    ands = [n for g in model_graphs(copy) for n in g.node if n.op_type == "And"]
    assert len(ands) == 1 and ands[0].input[1].endswith("c"), ands
    plain = loop_model()
    assert loop_bodies.terminable(plain) is plain


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancelled_scan_stops(backend):
    session = gc.Session(scan_sum(), backend=backend)
    xs = np.ones((5_000_000, 1), np.float32)
    feeds = {"s0": np.zeros(1, np.float32), "xs": xs}
    assert cancelled_after(session, feeds) < 2.0
    out = session.run({"s0": np.zeros(1, np.float32), "xs": xs[:10]}, cancel=CancelToken())
    np.testing.assert_array_equal(out["s"], [10.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_cancelled_before_the_run_stops_it_at_once(backend):
    session = gc.Session(loop_model(), backend=backend)
    token = CancelToken()
    token.cancel()
    start = time.monotonic()
    with pytest.raises(RunCancelled):
        session.run(ENDLESS, cancel=token)
    assert time.monotonic() - start < 0.5
