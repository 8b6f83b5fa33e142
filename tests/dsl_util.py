"""Helpers for DSL/capture tests: the full ONNX checker and onnxruntime CPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

import graphc as gc


def check(model: gc.Model) -> onnx.ModelProto:
    proto = model.proto
    onnx.checker.check_model(proto, full_check=True)
    return proto


def run_ort(model: gc.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def capture_run(fn, feeds: dict[str, np.ndarray], **kw) -> tuple[gc.Model, dict[str, np.ndarray]]:
    """Capture ``fn`` on specs made from ``feeds`` (dim 0 symbolic), check it, run it on ORT."""
    specs = {k: gc.spec(v.dtype, ("N", *v.shape[1:]) if v.ndim else ()) for k, v in feeds.items()}
    model = gc.capture(fn, **specs, **kw)
    check(model)
    return model, run_ort(model, feeds)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """numpy's softmax along ``axis`` (max subtracted): the tests' oracle."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)
