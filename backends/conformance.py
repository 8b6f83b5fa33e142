"""Any graphc backend as an ``onnx.backend.base.Backend``, and a runner for onnx's node cases.

``backend_class("numpy")`` (or ``"ort-cpu"``, ``"ort-cuda"``) returns a class that
``onnx.backend.test.BackendTest`` accepts. ``run_case`` runs one of onnx's generated node
cases (``onnx.backend.test.loader.load_model_tests(kind="node")``) and says how it went.
Models are handed over with the lowest IR version their opsets need: onnx's ``make_model``
stamps the newest IR version, which released runtimes may refuse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from graphc.backends.registry import get_backend
from graphc.model import ir_version_for
from graphc.model.file import all_graphs


def runtime_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` stamped with the lowest IR version its opsets need."""
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    opsets = {o.domain: o.version for o in model.opset_import}
    lowered.ir_version = min(model.ir_version, ir_version_for(opsets)) if model.ir_version else ir_version_for(opsets)
    return lowered


class GraphcBackendRep(BackendRep):
    def __init__(self, executable, feed_names: list[str]):
        self.executable = executable
        self.feed_names = feed_names

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = dict(zip(self.feed_names, inputs))
        out = self.executable.run(feeds)
        return tuple(out[n] for n in self.executable.output_names)


def backend_class(name: str, **options: Any) -> type[Backend]:
    """An ``onnx.backend.base.Backend`` subclass running graphc's backend ``name``."""

    class GraphcBackend(Backend):
        backend_name = name

        @classmethod
        def supports_device(cls, device: str) -> bool:
            return device.upper().startswith("CUDA") if name.endswith("cuda") else device.upper() == "CPU"

        @classmethod
        def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> GraphcBackendRep:
            super().prepare(model, device, **kwargs)
            executable = get_backend(name).prepare(runtime_model(model), **{**options, **kwargs})
            inits = {t.name for t in model.graph.initializer}
            feeds = [v.name for v in model.graph.input if v.name not in inits]
            return GraphcBackendRep(executable, feeds)

        @classmethod
        def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
            return cls.prepare(model, device, **kwargs).run(inputs)

    GraphcBackend.__name__ = f"GraphcBackend[{name}]"
    return GraphcBackend


# -- onnx's node cases --------------------------------------------------------------------------
# Cases graphc deliberately does not run, as (regex on the case name, reason, the backends that
# skip it: () for every one). The ONE list: the node suite reports them as "skip" and the
# conformance tests leave them out.
ORT_BACKENDS = ("ort-cpu", "ort-cuda")
EXCLUDED: list[tuple[str, str, tuple[str, ...]]] = [
    (r"FLOAT8|FLOAT4|E8M0|INT2|UINT2|_fp8|_e4m3|_e5m2|float4e2m1",
     "exotic dtypes (float8/float4/int2): numpy has no arithmetic for them and graphc never emits them", ()),
    (r"INT4", "int4/uint4 tensors (Cast, CastLike, QuantizeLinear, DequantizeLinear: 34 cases, all passing on numpy): "
     "onnxruntime's Python API takes and gives none ('Numpy_type 270 can't be converted to MLDataType')",
     ORT_BACKENDS),
    (r"^test_training_dropout",
     "random op: training-mode Dropout draws its mask from graphc's seeded numpy Generator, "
     "so the mask cannot equal the one onnx generated", ()),
    (r"^test_(bernoulli|random_)", "random op: values depend on the generator", ()),
    (r"string|_STRING|regex|tfidf|strnormalizer", "string tensors: outside graphc's numeric dtypes", ()),
    (r"^test_(adagrad|adam|momentum|nesterov_momentum)",
     "training-only ops of the ai.onnx.preview.training domain: graphc's optimizers emit standard ops", ()),
    (r"^test_flexattention", "FlexAttention lives in the experimental ai.onnx.preview domain, not ai.onnx", ()),
    (r"^test_ai_onnx_ml_", "the ai.onnx.ml domain (classical ML: trees, label encoders): not graphc's", ()),
    (r"^test_image_decoder", "ImageDecoder decodes JPEG/PNG/... bytes: needs image codecs, not numpy", ()),
    (r"^test_resize_downsample_scales_(linear|cubic)_align_corners$",
     "align_corners with scales whose output length is floored (4 * 0.6 -> 2): onnx's expected values divide by "
     "the unfloored length (2.4 - 1); graphc divides by the output's own length, as onnxruntime and PyTorch do", ()),
]


def excluded(name: str, backend: str = "numpy") -> str | None:
    """The reason case ``name`` is deliberately skipped on ``backend``, or None."""
    for pattern, reason, backends in EXCLUDED:
        if (not backends or backend in backends) and re.search(pattern, name, flags=re.IGNORECASE):
            return reason
    return None


@dataclass
class CaseResult:
    name: str
    op_type: str
    status: str  # "pass" | "fail" (wrong values) | "error" (raised)
    message: str = ""


def load_node_cases():
    """onnx's node test cases (generated in memory; nothing is read from disk)."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return load_model_tests(kind="node")


def case_op_types(cases) -> dict[str, str]:
    """Case name -> the op it tests: its node's op type; an ``_expanded`` case (the op's
    function body in primitive ops) counts for the op it expands."""
    ops = {c.name: c.model.graph.node[0].op_type for c in cases
           if "_expanded" not in c.name and len(c.model.graph.node) == 1}
    for c in cases:
        if c.name not in ops:
            base = c.name.split("_expanded")[0]
            ops[c.name] = ops.get(base, c.model.graph.node[-1].op_type if c.model.graph.node else "?")
    return ops


def cases_by_op(claimed: set[str]) -> dict[str, list]:
    """The node cases a backend that implements the ops ``claimed`` can run, by the op each
    tests: excluded cases left out, and ``_expanded`` ones only when every op in them is claimed."""
    cases = load_node_cases()
    ops = case_op_types(cases)
    by_op: dict[str, list] = {}
    for case in cases:
        op = ops[case.name]
        if op not in claimed or excluded(case.name):
            continue
        if "_expanded" in case.name and not graph_op_types(case.model.graph) <= claimed:
            continue  # the expansion uses an op outside the claimed set
        by_op.setdefault(op, []).append(case)
    return by_op


def graph_op_types(graph: onnx.GraphProto) -> set[str]:
    """Every op type in ``graph`` and its subgraphs."""
    return {node.op_type for g in all_graphs(graph) for node in g.node}


def _compare(expected, got, rtol: float, atol: float) -> None:
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(got):
            raise AssertionError(f"sequence length {len(got)} != expected {len(expected)}")
        for e, g in zip(expected, got):
            _compare(e, g, rtol, atol)
        return
    if expected is None:
        if got is not None:
            raise AssertionError("expected an empty optional")
        return
    expected = np.asarray(expected)
    got = np.asarray(got)
    if expected.dtype != got.dtype and not (expected.dtype == object or got.dtype == object):
        raise AssertionError(f"dtype {got.dtype} != expected {expected.dtype}")
    if expected.dtype == object:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)


def _as_value(value):
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, onnx.SequenceProto):
        return onnx.numpy_helper.to_list(value)
    if isinstance(value, onnx.OptionalProto):
        return onnx.numpy_helper.to_optional(value)
    return value


def run_case(backend: type[Backend], case, op_type: str = "") -> CaseResult:
    try:
        rep = backend.prepare(case.model, "CPU")
        for inputs, expected in case.data_sets:
            inputs = [_as_value(v) for v in inputs]
            expected = [_as_value(v) for v in expected]
            with np.errstate(all="ignore"):
                outputs = rep.run(inputs)
            if len(outputs) < len(expected):
                raise AssertionError(f"{len(outputs)} outputs, expected {len(expected)}")
            for e, g in zip(expected, outputs):
                _compare(e, g, case.rtol, case.atol)
    except AssertionError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        keep = [ln for ln in lines if ln.startswith(("Not equal", "Max abs", "Max rel", "(shapes"))]
        return CaseResult(case.name, op_type, "fail", "; ".join(keep or lines[:1] or ["mismatch"])[:300])
    except Exception as exc:  # noqa: BLE001 - a conformance runner reports every failure
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return CaseResult(case.name, op_type, "error", f"{type(exc).__name__}: {first}"[:300])
    return CaseResult(case.name, op_type, "pass")
