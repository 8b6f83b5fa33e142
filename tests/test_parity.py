"""gc.parity: dtype-aware comparison, reports, and bisect finding a planted kernel fault."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import graphc as gc
from graphc.runtime.parity import DEFAULT_TOLERANCES, diff, expose_intermediates
from onnx_graphs import linear_relu, model, node, vi

RNG = np.random.default_rng(2)
FEEDS = {"x": RNG.standard_normal((4, 3)).astype(np.float32), "b": RNG.standard_normal((4, 2)).astype(np.float32)}


# -- the comparison itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, small, large", [
    ("float64", 1e-12, 1e-6), ("float32", 1e-7, 1e-3), ("float16", 1e-4, 1e-1),
])
def test_tolerances_follow_the_dtype(dtype, small, large):
    ref = np.linspace(-2, 2, 11).astype(dtype)
    assert diff("y", "b", ref, (ref + small).astype(dtype)).ok
    far = diff("y", "b", ref, (ref + large).astype(dtype))
    assert not far.ok and far.mismatched == 11
    assert far.max_abs_err == pytest.approx(large, rel=0.1)
    assert (far.rtol, far.atol) == DEFAULT_TOLERANCES[dtype]


def test_float64_is_tighter_than_float32_and_explicit_tolerances_win():
    ref = np.ones(4)
    assert not diff("y", "b", ref, ref + 1e-6).ok
    assert diff("y", "b", ref.astype(np.float32), (ref + 1e-6).astype(np.float32)).ok
    assert diff("y", "b", ref, ref + 1e-6, rtol=1e-5).ok


def test_integers_and_booleans_compare_exactly():
    ref = np.arange(5)
    assert diff("i", "b", ref, ref.copy()).ok
    off = diff("i", "b", ref, ref + np.array([0, 0, 1, 0, 0]))
    assert not off.ok and off.mismatched == 1 and off.max_abs_err == 1
    assert not diff("m", "b", np.array([True, False]), np.array([True, True])).ok


def test_nans_agree_with_nans_but_not_with_numbers():
    ref = np.array([1.0, np.nan, np.inf], np.float32)
    assert diff("y", "b", ref, ref.copy()).ok
    bad = diff("y", "b", ref, np.array([1.0, 0.0, np.inf], np.float32))
    assert not bad.ok and bad.max_abs_err == np.inf


def test_shape_or_dtype_mismatch_is_reported():
    d = diff("y", "b", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert not d.ok and "got float32[3, 2], reference float32[2, 3]" in d.note
    assert not diff("y", "b", np.zeros(2, np.float32), np.zeros(2, np.float64)).ok


def test_relative_error_does_not_explode_near_zero():
    d = diff("y", "b", np.array([0.0, 1.0], np.float32), np.array([1e-6, 1.0], np.float32))
    assert d.ok and d.max_rel_err == pytest.approx(0.1, rel=1e-3)  # 1e-6 / atol 1e-5


@pytest.mark.parametrize("name, value", [("rtol", float("nan")), ("atol", float("nan")), ("rtol", -1e-3),
                                         ("atol", -1.0), ("rtol", float("inf")), ("atol", float("-inf"))])
def test_non_finite_or_negative_tolerances_are_refused(name, value):
    # a NaN tolerance made every comparison pass (and a negative one every comparison fail)
    ref = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=f"^{name} must be a finite number >= 0, got {value}"):
        diff("y", "b", ref, ref + 1, **{name: value})
    with pytest.raises(ValueError, match=f"^{name} must be"):
        gc.parity.compare(linear_relu(), FEEDS, backends=("ort-cpu", "ort-cpu"), **{name: value})
    assert diff("y", "b", ref, ref + 1, **{name: 0.0}).ok is False  # zero is a tolerance


# -- compare across backends -------------------------------------------------------------------------

def test_compare_ort_against_itself_at_two_optimization_levels():
    report = gc.parity.compare(linear_relu(), FEEDS, backends=("ort-cpu", "ort-cpu"), bisect=True)
    assert report.ok and report.reference == "ort-cpu"
    assert report.outputs["y"].max_abs_err == 0 and report.outputs["y"].max_rel_err == 0
    assert report.first_divergence is None and report.compared_values == 3
    assert "OK" in str(report) and "none, every intermediate value agrees" in str(report)
    assert gc.ParityReport.model_validate_json(report.model_dump_json()).ok


def test_compare_needs_two_backends_and_valid_feeds():
    with pytest.raises(ValueError, match="at least two backends"):
        gc.parity.compare(linear_relu(), FEEDS, backends=("ort-cpu",))
    with pytest.raises(gc.InputError, match="missing input 'b'"):
        gc.parity.compare(linear_relu(), {"x": FEEDS["x"]}, backends=("ort-cpu", "ort-cpu"))
    with pytest.raises(gc.BackendUnavailable):
        gc.parity.compare(linear_relu(), FEEDS, backends=("ort-cpu", "nope"))


def test_expose_intermediates_adds_typed_outputs_in_topological_order():
    instrumented, steps = expose_intermediates(gc.load(linear_relu()))
    assert [s.name for s in instrumented.outputs] == ["y", "xw", "pre"]
    assert all(s.dtype == "float32" for s in instrumented.outputs)
    assert [(n.name, names) for n, names in steps] == [("matmul_0", ["xw"]), ("add_0", ["pre"]), ("relu_0", ["y"])]


def test_numpy_and_onnxruntime_agree():
    report = gc.parity.compare(linear_relu(), FEEDS)
    assert report.ok, str(report)
    assert report.backends == ["numpy", "ort-cpu"]


def _chain():
    """x -> Mul(2) -> Relu -> Sigmoid -> Add(x): the Relu at net.py:21 gets the planted fault."""
    return model(
        [node("Mul", ["x", "two"], ["m"], "scale", "net.py:20"),
         node("Relu", ["m"], ["r"], "act", "net.py:21"),
         node("Sigmoid", ["r"], ["s"], "gate", "net.py:22"),
         node("Add", ["s", "x"], ["y"], "residual", "net.py:23")],
        [vi("x", shape=["N", 5])], [vi("y", shape=["N", 5])], {"two": np.float32(2.0)})


@pytest.fixture
def faulty_numpy_relu(monkeypatch):
    """Scoped to one test: the numpy backend's Relu adds 0.25 everywhere."""
    from graphc.backends.numpy import kernels

    kernels.lookup("Relu", 21)  # load every family first, so the patch is not appended to
    versions = kernels.KERNELS[("", "Relu")]
    faulty = [dataclasses.replace(k, fn=lambda x: (np.maximum(x, 0) + np.float32(0.25),)) for k in versions]
    monkeypatch.setitem(kernels.KERNELS, ("", "Relu"), faulty)


def test_bisect_names_the_node_with_the_planted_fault(faulty_numpy_relu):
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)}
    report = gc.parity.compare(_chain(), feeds, backends=("numpy", "ort-cpu"), bisect=True)
    assert not report.ok and not report.outputs["y"].ok
    found = report.first_divergence
    assert (found.node, found.op_type, found.source, found.output) == ("act", "Relu", "net.py:21", "r")
    assert found.backend == "ort-cpu" and found.max_abs_err == pytest.approx(0.25)
    assert "node 'act' (Relu) at net.py:21" in str(report)


def test_bisect_names_an_unnamed_node_by_index(faulty_numpy_relu):
    # it printed "node '' (Relu)"
    unnamed = _chain()
    unnamed.graph.node[1].name = ""
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)}
    found = gc.parity.compare(unnamed, feeds, backends=("numpy", "ort-cpu"), bisect=True).first_divergence
    assert str(found).startswith("unnamed node #1 (Relu) at net.py:21: output 'r' differs on ort-cpu")
    assert (found.node, found.index, found.op_type) == ("", 1, "Relu")


def test_the_planted_fault_does_not_outlive_its_test():
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)}
    assert gc.parity.compare(_chain(), feeds, bisect=True).first_divergence is None


def test_infinities_agree_only_with_themselves():
    ref = np.array([np.inf, -np.inf], np.float32)
    assert diff("y", "b", ref, ref.copy()).ok
    assert diff("y", "b", ref, np.array([np.inf, 1e30], np.float32)).mismatched == 1
    assert diff("y", "b", np.array([1.0], np.float32), np.array([np.inf], np.float32)).mismatched == 1


def test_sequence_outputs_are_compared_element_by_element_and_bisected():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("SplitToSequence", ["r", "split"], ["parts"], axis=1)], "seq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("split", TensorProto.INT64, [2])],
                              [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32),
             "split": np.array([2, 4], np.int64)}
    report = gc.parity.compare(model, feeds, bisect=True)
    assert report.ok and [(d.name, list(d.shape)) for d in report.details] == [("parts[0]", [2, 2]), ("parts[1]", [2, 4])]
    assert report.first_divergence is None and report.compared_values >= 2
