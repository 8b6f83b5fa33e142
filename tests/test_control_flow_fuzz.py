"""Differential fuzz of control flow (tests/control_flow_models.py): random models of Scan, Loop
and If, nested, agree on the numpy backend and onnxruntime at graph_optimization_level "all" and
"disable"; random ``gc.scan`` / ``gc.cond`` / ``gc.fori_loop`` programs agree with the same program
run as Python loops in float64 on both backends, and ``gc.grad``'s gradients with central
differences of it. A few seconds here; ``GRAPHC_CONTROL_FLOW_FUZZ=N`` runs N examples of each."""

from __future__ import annotations

import os

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from control_flow_models import (
        DslCase,
        GraphcControl,
        HypothesisDraw,
        NumpyControl,
        differences,
        outputs,
        random_model,
    )
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.control_flow_models import (
        DslCase,
        GraphcControl,
        HypothesisDraw,
        NumpyControl,
        differences,
        outputs,
        random_model,
    )
    from tests.torch_grad_util import gc_grads

EXAMPLES = int(os.environ.get("GRAPHC_CONTROL_FLOW_FUZZ", "0"))
FUZZ = {"deadline": None, "derandomize": True, "database": None,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


@settings(max_examples=EXAMPLES or 40, **FUZZ)
@given(st.data())
def test_numpy_and_onnxruntime_agree_on_random_control_flow(data):
    proto, feeds, features = random_model(HypothesisDraw(data))
    onnx.checker.check_model(proto, full_check=True)
    want = outputs(proto, feeds, "numpy")
    for run in ("ort-all", "ort-disable"):
        found = differences(want, outputs(proto, feeds, run))
        assert not found, f"{run}: {found}\n{features}\n{onnx.printer.to_text(proto)}"


@settings(max_examples=EXAMPLES or 15, **FUZZ)
@given(st.data())
def test_dsl_control_flow_and_its_gradients_match_python_loops(data):
    case = DslCase.draw(HypothesisDraw(data))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    w, x = rng.standard_normal(case.size), rng.standard_normal((case.length, case.size))
    want = case.fn(NumpyControl, w, x)
    c, t, eps = rng.standard_normal(np.shape(want)), rng.standard_normal(case.size), 1e-6
    slope = (np.sum(case.fn(NumpyControl, w + eps * t, x) * c) - np.sum(case.fn(NumpyControl, w - eps * t, x) * c)) / (2 * eps)
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, w, x: case.fn(GraphcControl(), w, x), {"w": w}, {"x": x}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want, rtol=1e-10, atol=1e-12, err_msg=f"{backend} {case}")
        np.testing.assert_allclose(np.sum(got["w"] * t), slope, rtol=1e-6, atol=1e-8, err_msg=f"{backend} {case}")
