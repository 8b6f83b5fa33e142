"""Op semantics follow the node's opset version, not just its name.

BatchNormalization before opset 14 and Softmax/LogSoftmax before opset 13 behave differently
from later versions; the numpy backend agrees with onnxruntime on both, while onnx's own
ReferenceEvaluator (shown as a contrast) gets them wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from numpy_backend_util import feeds_of, node_model, numpy_vs_ort, run_numpy, run_ort

rng = np.random.default_rng(1)


def _bn_inputs():
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32) * 2 + 1
    scale, bias = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    return [x, scale, bias, mean, var]


@pytest.mark.parametrize("opset", [7, 9, 13])
def test_batchnorm_before_14_is_inference_with_one_output(opset):
    inputs = _bn_inputs()
    got, want = numpy_vs_ort("BatchNormalization", inputs, {"epsilon": 1e-5}, opset)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    x, scale, bias, mean, var = inputs
    expected = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-5)


def test_reference_evaluator_gets_batchnorm_9_wrong():
    """Contrast: onnx's ReferenceEvaluator blends in the batch statistics at opset 9-13."""
    inputs = _bn_inputs()
    model = node_model("BatchNormalization", inputs, {}, 9)
    feeds = feeds_of(model, inputs)
    ours, ort_out = run_numpy(model, feeds)[0], run_ort(model, feeds)[0]
    reference = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(ours, ort_out, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(reference - ort_out)) > 1e-2


def test_batchnorm_14_training_mode_updates_running_stats():
    x, scale, bias, mean, var = _bn_inputs()
    model = node_model("BatchNormalization", [x, scale, bias, mean, var],
                       {"training_mode": 1, "momentum": 0.8}, 15, n_outputs=3)
    y, running_mean, running_var = run_numpy(model, feeds_of(model, [x, scale, bias, mean, var]))
    batch_mean, batch_var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(running_mean, 0.8 * mean + 0.2 * batch_mean, rtol=1e-5)
    np.testing.assert_allclose(running_var, 0.8 * var + 0.2 * batch_var, rtol=1e-5)
    expected = ((x - batch_mean[:, None, None]) / np.sqrt(batch_var[:, None, None] + 1e-5)
                * scale[:, None, None] + bias[:, None, None])
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_batchnorm_15_training_mode_matches_onnxruntime():
    got, want = numpy_vs_ort("BatchNormalization", _bn_inputs(), {"training_mode": 1, "momentum": 0.8}, 15, 3)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_batchnorm_9_five_outputs_is_training_mode():
    x, scale, bias, mean, var = _bn_inputs()
    model = node_model("BatchNormalization", [x, scale, bias, mean, var], {"momentum": 0.5}, 9, n_outputs=5)
    y, r_mean, r_var, s_mean, s_var = run_numpy(model, feeds_of(model, [x, scale, bias, mean, var]))
    np.testing.assert_allclose(s_mean, x.mean(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(r_mean, 0.5 * mean + 0.5 * s_mean, rtol=1e-5)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_family_axis_semantics(op_type, opset):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    got, want = numpy_vs_ort(op_type, [x], {"axis": 1}, opset)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    if op_type == "Softmax":
        rows = got[0].reshape(2, -1).sum(axis=1) if opset < 13 else got[0].sum(axis=1)
        np.testing.assert_allclose(rows, 1.0, rtol=1e-5)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
def test_reference_evaluator_gets_softmax_11_wrong(op_type):
    """Contrast: ReferenceEvaluator normalizes along ``axis`` only, even at opset 11."""
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    model = node_model(op_type, [x], {"axis": 1}, 11)
    feeds = feeds_of(model, [x])
    ours, ort_out = run_numpy(model, feeds)[0], run_ort(model, feeds)[0]
    reference = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(ours, ort_out, rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(reference - ort_out)) > 1e-2


X34 = rng.standard_normal((3, 4, 5)).astype(np.float32)
AXES = np.array([1], np.int64)


@pytest.mark.parametrize(("op_type", "inputs", "attrs", "opset"), [
    ("ReduceSum", [X34], {"axes": [1]}, 11),            # axes attribute before 13
    ("ReduceSum", [X34, AXES], {}, 13),                 # axes input from 13
    ("ReduceSum", [X34], {"noop_with_empty_axes": 1}, 13),
    ("ReduceMean", [X34], {"axes": [1]}, 17),           # others: attribute until 18
    ("ReduceMean", [X34, AXES], {}, 18),
    ("ReduceMax", [X34, AXES], {"keepdims": 0}, 18),
    ("Split", [X34], {"axis": 1, "split": [1, 3]}, 11),  # split attribute before 13
    ("Split", [X34, np.array([3, 1], np.int64)], {"axis": 1}, 13),
    ("Squeeze", [X34[:, :1]], {"axes": [1]}, 11),
    ("Squeeze", [X34[:, :1], AXES], {}, 13),
    ("Unsqueeze", [X34], {"axes": [0, 3]}, 11),
    ("Unsqueeze", [X34, np.array([0, 3], np.int64)], {}, 13),
    ("Clip", [X34], {"min": -0.3, "max": 0.4}, 6),       # min/max attributes before 11
    ("Clip", [X34, np.array(-0.3, np.float32)], {}, 11),
    ("Pad", [X34], {"pads": [0, 1, 0, 0, 2, 1], "value": 0.5}, 2),  # attributes before 11
    ("Pad", [X34, np.array([0, 1, 0, 0, 2, 1], np.int64)], {"mode": "edge"}, 11),
    ("Upsample", [X34[None], np.array([1, 1, 2, 3], np.float32)], {"mode": "nearest"}, 9),
    ("Resize", [X34[None], np.array([1, 1, 2, 1.5], np.float32)], {"mode": "linear"}, 10),
    ("Dropout", [X34], {"ratio": 0.3}, 10),
])
def test_versioned_semantics_match_onnxruntime(op_type, inputs, attrs, opset):
    n_outputs = 2 if op_type == "Split" else 1
    got, want = numpy_vs_ort(op_type, inputs, attrs, opset, n_outputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
