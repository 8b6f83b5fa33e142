"""Op semantics follow the opset: numpy backend and onnxruntime agree where versions differ."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from onnx_graphs import model, node, vi

X = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)


def numpy_output(proto):
    return gc.Session(proto, backend="numpy").run({"x": X})["y"]


@pytest.mark.parametrize("opset", [11, 12, 13, 21])
@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 1])
def test_softmax_family_follows_its_opset(op_type, opset, axis):
    """Before opset 13 the input is coerced to 2-D at ``axis`` (default 1); from 13 on the op
    works along one axis (default -1)."""
    attrs = {} if axis is None else {"axis": axis}
    proto = model([node(op_type, ["x"], ["y"], "sm", **attrs)], [vi("x", shape=[2, 3, 4])],
                  [vi("y", shape=[2, 3, 4])], opset=opset)
    proto.ir_version = 7
    report = gc.parity.compare(proto, {"x": X})
    assert report.ok, str(report)
    if op_type == "Softmax":
        y = numpy_output(proto)
        sums = y.reshape(2, -1).sum(axis=1) if opset < 13 else y.sum(axis=-1 if axis is None else axis)
        np.testing.assert_allclose(sums, 1.0, rtol=1e-5)


@pytest.mark.parametrize("opset", [9, 13, 14, 15, 21])
def test_batch_normalization_inference_follows_its_opset(opset):
    rng = np.random.default_rng(opset)
    params = {"scale": rng.standard_normal(3).astype(np.float32), "bias": rng.standard_normal(3).astype(np.float32),
              "mean": rng.standard_normal(3).astype(np.float32), "var": rng.random(3).astype(np.float32) + 0.5}
    proto = model([node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], "bn", epsilon=1e-3)],
                  [vi("x", shape=[2, 3, 4])], [vi("y", shape=[2, 3, 4])], params, opset=opset)
    proto.ir_version = 7
    report = gc.parity.compare(proto, {"x": X})
    assert report.ok, str(report)
    p = {k: v[None, :, None] for k, v in params.items()}
    expected = (X - p["mean"]) / np.sqrt(p["var"] + 1e-3) * p["scale"] + p["bias"]
    np.testing.assert_allclose(numpy_output(proto), expected, rtol=1e-5, atol=1e-6)
