"""gc.optimize against onnx's own node cases: every case the numpy backend passes still passes,
with onnx's expected outputs, after optimizing its model at levels 1, 2 and 3 -- and again with
every input dim made symbolic, so no pass may rely on a size it cannot know.

An independent oracle for every pass at once (folding, CSE, shape folding, algebraic rewrites,
fusions, inference rewrites) over the whole operator set, not only over the ops graphc's own
models use; a pass that crashes on an unusual node (a library evaluator included) fails here too.
"""

from __future__ import annotations

import dataclasses
import functools

import onnx

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
    bad = [problem for case in cases for level in (1, 2, 3) if (problem := _check(case, case.model, level, op_type))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("op_type", CLAIMED)
def test_optimized_node_cases_with_symbolic_dims(op_type):
    backend = backend_class("numpy")
    bad = []
    for case in _cases().get(op_type, []):
        model = _symbolic(case.model)
        if model is None or run_case(backend, dataclasses.replace(case, model=model), op_type).status != "pass":
            continue  # no static dim to hide, or the op needs one known (e.g. a shape input's length)
        bad += [problem for level in (2, 3) if (problem := _check(case, model, level, op_type))]
    assert not bad, "\n".join(bad)


def _check(case, model: onnx.ModelProto, level: int, op_type: str) -> str | None:
    try:
        optimized = gc.optimize(model, level).proto
    except gc.GraphError as exc:
        return f"{case.name} -O{level}: {exc}"
    result = run_case(backend_class("numpy"), dataclasses.replace(case, model=optimized), op_type)
    return None if result.status == "pass" else f"{case.name} -O{level}: {result.status} {result.message}"


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy whose graph inputs have a distinct symbol for every static dim (None: none had one)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    changed = False
    for k, value in enumerate(copy.graph.input):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            for j, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.HasField("dim_value"):
                    dim.dim_param = f"d{k}_{j}"
                    changed = True
    return copy if changed else None
