"""A model file nobody here made (PaddleOCR's classifier from the rapidocr-onnxruntime wheel,
tests/data/third_party): Paddle2ONNX writes every weight as a Constant, declares the input
[-1, 3, -1, -1] and adds each Conv's bias with an Add. It loads, runs equally on numpy and
onnxruntime, and ``gc.optimize -O3`` keeps its outputs and is no larger than onnxslim's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import graphc as gc

CLS = Path(__file__).resolve().parent / "data" / "third_party" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def test_paddle_classifier_runs_and_optimizes_within_the_rival():
    model = gc.load(CLS)
    assert [d if isinstance(d, int) else None for d in model.inputs[0].shape] == [None, 3, None, None]
    x = np.random.default_rng(0).standard_normal((2, 3, 48, 192)).astype(np.float32)
    want = gc.Session(model, backend="ort-cpu").run({"x": x})
    for name, got in gc.Session(model, backend="numpy").run({"x": x}).items():
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-6)
    optimized = gc.optimize(model, 3)
    onnx.checker.check_model(optimized.proto, full_check=True)
    for name, got in gc.Session(optimized, backend="numpy").run({"x": x}).items():
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-6)
    assert "BatchNormalization" not in {n.op_type for n in optimized.proto.graph.node}
    onnxslim = pytest.importorskip("onnxslim")
    assert len(optimized.proto.graph.node) <= len(onnxslim.slim(onnx.load(CLS)).graph.node)
