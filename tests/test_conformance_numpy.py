"""onnx's own node test cases on the numpy backend: every op it claims passes all its cases.

Deliberate exclusions live in ONE list, ``graphc.backends.conformance.EXCLUDED``, each with
its reason. ``_expanded`` cases (an op's function body in primitive ops) run whenever every op
in them is claimed.
"""

from __future__ import annotations

import functools

import pytest

from graphc.backends.conformance import EXCLUDED, backend_class, cases_by_op, excluded, run_case
from graphc.backends.numpy import claimed_ops

CLAIMED = claimed_ops()


@functools.lru_cache(maxsize=1)
def _cases_by_op() -> dict[str, list]:
    return cases_by_op(set(CLAIMED))


@pytest.mark.parametrize("op_type", CLAIMED)
def test_node_cases_pass(op_type):
    cases = _cases_by_op().get(op_type, [])
    if not cases:
        pytest.skip(f"onnx ships no runnable node case for {op_type}")
    backend = backend_class("numpy")
    bad = [r for r in (run_case(backend, c, op_type) for c in cases) if r.status != "pass"]
    assert not bad, "\n".join(f"{r.status} {r.name}: {r.message}" for r in bad)


def test_exclusions_have_reasons():
    assert EXCLUDED and all(pattern and len(reason) > 20 for pattern, reason, _ in EXCLUDED)


def test_int4_cases_run_on_numpy_and_are_skipped_on_onnxruntime_only():
    """int4/uint4 Cast, CastLike, QuantizeLinear and DequantizeLinear pass on numpy (ml_dtypes'
    int4); onnxruntime's Python API can hand no int4 tensor in or out."""
    names = [c.name for cases in _cases_by_op().values() for c in cases if "int4" in c.name.lower()]
    assert len(names) == 34 and {"test_quantizelinear_int4", "test_dequantizelinear_uint4"} <= set(names), names
    assert all(excluded(name, "ort-cpu") and excluded(name, "ort-cuda") and not excluded(name) for name in names)


def test_most_claimed_ops_are_covered_by_onnx_cases():
    covered = set(_cases_by_op())
    assert len(covered) >= 0.9 * len(CLAIMED), sorted(set(CLAIMED) - covered)
