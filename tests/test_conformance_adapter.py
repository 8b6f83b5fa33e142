"""The onnx Backend adapter works for any graphc backend, and the scripts built on it run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import graphc as gc
from graphc.backends.conformance import backend_class, load_node_cases, run_case, runtime_model

ROOT = Path(__file__).resolve().parents[1]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ort_available():
    return gc.backends.get_backend("ort-cpu") if any(b.name == "ort-cpu" and b.available for b in gc.backends()) else None


def test_runtime_model_lowers_the_ir_version():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("y", 1, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert model.ir_version > 10
    assert runtime_model(model).ir_version == 10 and model.ir_version > 10  # a copy


@pytest.mark.parametrize("name", ["numpy", "ort-cpu"])
def test_backend_class_runs_models_and_named_feeds(name):
    if name == "ort-cpu" and not _ort_available():
        pytest.skip("onnxruntime CPU backend unavailable")
    backend = backend_class(name)
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    node = helper.make_node("Add", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, 1, [3]) for n in "ab"],
                              [helper.make_tensor_value_info("y", 1, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    a, b = np.ones(3, np.float32), np.arange(3, dtype=np.float32)
    (y,) = backend.run_model(model, [a, b])
    np.testing.assert_array_equal(y, a + b)
    (y,) = backend.prepare(model).run({"a": a, "b": b})
    np.testing.assert_array_equal(y, a + b)


@pytest.mark.parametrize("op_type", ["Relu", "Conv", "Softmax", "Gemm"])
def test_onnxruntime_passes_node_cases_through_the_adapter(op_type):
    if not _ort_available():
        pytest.skip("onnxruntime CPU backend unavailable")
    cases = [c for c in load_node_cases()
             if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type == op_type]
    results = [run_case(backend_class("ort-cpu"), c, op_type) for c in cases]
    assert results and all(r.status == "pass" for r in results), [r for r in results if r.status != "pass"]


def test_node_suite_script_prints_the_table(capsys):
    assert _script("node_suite").main(["numpy", "--op", "Relu", "--op", "Softmax"]) == 0
    out = capsys.readouterr().out
    assert "Relu" in out and "Softmax" in out and "TOTAL" in out and "run cases pass" in out


def test_bench_script_runs_one_cell():
    row = _script("bench_backends").bench_model("two_layer_net", 2, budget=0.01, with_reference=True)
    assert row["numpy"] > 0 and row["reference"] > 0 and row["ort"] > 0 and row["hand"] > 0
    assert row["max_err_vs_ort"] < 1e-4 and row["hand_err"] < 1e-4
