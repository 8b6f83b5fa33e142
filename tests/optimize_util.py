"""Helpers for the optimizer tests: tiny hand-built models and output comparisons."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
from graphc.runtime import feeds

F = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, initializers=(), opset=21) -> gc.Model:
    """A checked model from helper-made nodes; ``inputs``/``outputs`` are (name, elem, shape)."""
    graph = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
        [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8 if opset <= 18 else 10
    return gc.load(proto)


def op_types(model: gc.Model) -> list[str]:
    return [n.op_type for n in model.ir.graph]


def random_feeds(model: gc.Model, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded feeds for the inputs without a default; symbolic/unknown dims get ``batch``."""
    return feeds.random_feeds(feeds.required_specs(model), seed=seed, default_dim=batch, int_high=2)


def run_ort(model: gc.Model, feeds) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # params with defaults warn on every session
    sess = ort.InferenceSession(model.proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def numpy_available() -> bool:
    try:
        return any(b.name == "numpy" and b.available for b in gc.backends())
    except Exception:  # the numpy backend is another engineer's and may not be importable yet
        return False


def run_numpy(model: gc.Model, feeds) -> dict[str, np.ndarray]:
    return gc.Session(model, backend="numpy").run(feeds)


def assert_close(expected: dict, actual: dict, rtol=1e-4, atol=1e-5, what="") -> None:
    assert expected.keys() == actual.keys(), what
    for name in expected:
        e, a = np.asarray(expected[name]), np.asarray(actual[name])
        assert e.dtype == a.dtype and e.shape == a.shape, f"{what} {name}: {e.dtype}{e.shape} vs {a.dtype}{a.shape}"
        if np.issubdtype(e.dtype, np.floating):
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"{what} {name}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{what} {name}")


def assert_same_outputs(original: gc.Model, optimized: gc.Model, batches=(1, 3), numpy=True,
                        rtol=1e-4, atol=1e-5) -> None:
    """Original vs optimized, each backend against itself: onnxruntime, and the numpy backend
    when it is available (so a backend's own deviation from the other is not blamed on a pass)."""
    for batch in batches:
        feeds = random_feeds(original, batch, seed=batch)
        assert_close(run_ort(original, feeds), run_ort(optimized, feeds), rtol, atol, f"ort batch {batch}")
        if numpy and numpy_available():
            assert_close(run_numpy(original, feeds), run_numpy(optimized, feeds), rtol, atol,
                         f"numpy batch {batch}")


def assert_levels_sound(model: gc.Model, levels, batches, fixed: dict[str, np.ndarray] | None = None) -> None:
    """Optimize at each level: a valid model with the same interface, no more nodes, and the same
    outputs as the original at each batch size on onnxruntime and (where it runs the original)
    on the numpy backend. The original's outputs are computed once. ``fixed`` feeds replace the
    random ones (e.g. variances that must not be negative)."""
    use_numpy = numpy_available()
    refs = []
    for batch in batches:
        feeds = {**random_feeds(model, batch, seed=batch), **(fixed or {})}
        expected_np = None
        if use_numpy:
            try:
                expected_np = run_numpy(model, feeds)
            except gc.GraphcError:  # an op the numpy backend lacks: compare on onnxruntime only
                use_numpy = False
        refs.append((batch, feeds, run_ort(model, feeds), expected_np))
    for level in levels:
        out = gc.optimize(model, level)
        onnx.checker.check_model(out.proto)
        assert interface(out) == interface(model), f"level {level} changed the interface"
        assert len(out.ir.graph) <= len(model.ir.graph)
        for batch, feeds, expected, expected_np in refs:
            assert_close(expected, run_ort(out, feeds), what=f"level {level} ort batch {batch}")
            if use_numpy and expected_np is not None:
                assert_close(expected_np, run_numpy(out, feeds), what=f"level {level} numpy batch {batch}")


def interface(model: gc.Model) -> list[tuple]:
    """Names, dtypes and shapes (symbolic dims by name) of every graph input and output."""
    proto = model.proto.graph

    def dims(v):
        return tuple(d.dim_param if d.HasField("dim_param") else d.dim_value for d in v.type.tensor_type.shape.dim)

    return [(v.name, v.type.tensor_type.elem_type, dims(v)) for v in [*proto.input, *proto.output]]
