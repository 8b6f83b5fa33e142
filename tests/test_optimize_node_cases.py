"""gc.optimize against onnx's own node cases: every case the numpy backend passes still passes,
with onnx's expected outputs, after optimizing its model at levels 1, 2 and 3.

An independent oracle for every pass at once (folding, CSE, shape folding, algebraic rewrites,
fusions, inference rewrites) over the whole operator set, not only over the ops graphc's own
models use; a pass that crashes on an unusual node (a library evaluator included) fails here too.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

import graphc as gc
from graphc.backends.conformance import backend_class, cases_by_op, run_case
from graphc.backends.numpy import claimed_ops

CLAIMED = claimed_ops()


@functools.lru_cache(maxsize=1)
def _cases() -> dict[str, list]:
    return cases_by_op(set(CLAIMED))


@pytest.mark.parametrize("op_type", CLAIMED)
def test_optimized_node_cases_keep_expected_outputs(op_type):
    cases = _cases().get(op_type, [])
    if not cases:
        pytest.skip(f"onnx ships no runnable node case for {op_type}")
    backend = backend_class("numpy")
    bad = []
    for case in cases:
        for level in (1, 2, 3):
            try:
                optimized = gc.optimize(case.model, level).proto
            except gc.GraphError as exc:
                bad.append(f"{case.name} -O{level}: {exc}")
                continue
            result = run_case(backend, dataclasses.replace(case, model=optimized), op_type)
            if result.status != "pass":
                bad.append(f"{case.name} -O{level}: {result.status} {result.message}")
    assert not bad, "\n".join(bad)
