"""gc.Session: model sources, feed validation (every InputError path), options, errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from onnx_graphs import custom_op_model, linear_relu, reshape_model

RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal((4, 2)).astype(np.float32)
W = np.arange(6, dtype=np.float32).reshape(3, 2) / 6


def expected(x=X, b=B, w=W):
    return np.maximum(x @ w + b, 0)


@pytest.fixture(scope="module")
def sess():
    return gc.Session(linear_relu(), backend="ort-cpu")


@pytest.mark.parametrize("kind", ["model", "path", "bytes", "proto"])
def test_session_accepts_every_model_source(kind, tmp_path):
    proto = linear_relu()
    source = {"model": lambda: gc.load(proto), "proto": lambda: proto,
              "bytes": proto.SerializeToString, "path": lambda: _save(proto, tmp_path / "m.onnx")}[kind]()
    out = gc.Session(source, backend="ort-cpu").run({"x": X, "b": B})
    np.testing.assert_allclose(out["y"], expected(), rtol=1e-6)


def _save(proto, path):
    onnx.save(proto, str(path))
    return path


def test_session_describes_itself(sess):
    assert sess.backend == "ort-cpu"
    assert [s.name for s in sess.inputs] == ["x", "b", "w"]
    assert sess.inputs[0].shape == ("N", 3)
    assert [(s.name, s.dtype) for s in sess.outputs] == [("y", "float32")]
    assert sess.optional_inputs == {"w"}
    assert "ort-cpu" in repr(sess)


def test_auto_picks_an_available_backend():
    sess = gc.Session(linear_relu())
    available = [b.name for b in gc.backends() if b.available]
    assert sess.backend == available[0]


def test_initializer_backed_input_is_optional_and_overridable(sess):
    np.testing.assert_allclose(sess.run({"x": X, "b": B})["y"], expected(), rtol=1e-6)
    w2 = np.ones((3, 2), np.float32)
    np.testing.assert_allclose(sess.run({"x": X, "b": B, "w": w2})["y"], expected(w=w2), rtol=1e-6)


def test_python_lists_take_the_input_dtype(sess):
    out = sess.run({"x": X.tolist(), "b": B.tolist()})
    np.testing.assert_allclose(out["y"], expected(), rtol=1e-6)


def identity_of(dtype: int, value) -> onnx.ModelProto:
    """``y = Identity(k)``, ``k`` of ``dtype``: a scalar, or a vector where ``value`` is a list."""
    k, y = (onnx.helper.make_tensor_value_info(name, dtype, ["N"] if isinstance(value, list) else [])
            for name in "ky")
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["k"], ["y"])], "g", [k], [y])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype, value", [(onnx.TensorProto.UINT8, 300), (onnx.TensorProto.UINT8, [-1]),
                                          (onnx.TensorProto.INT32, [1, 2**40]), (onnx.TensorProto.INT64, 2**70)])
def test_python_int_out_of_the_input_dtype_is_an_input_error(dtype, value):
    # it raised numpy's bare OverflowError, naming no input
    model = identity_of(dtype, value)
    with pytest.raises(gc.InputError, match=r"input 'k': expected k: (uint8|int32|int64)\S*, got a value out of the "
                                            r"range of (uint8|int32|int64) \(Python int"):
        gc.Session(model, backend="numpy").run({"k": value})


@pytest.mark.parametrize("dtype, value", [(onnx.TensorProto.INT64, 1.5), (onnx.TensorProto.INT32, [1, 2.5]),
                                          (onnx.TensorProto.BOOL, 0.5)])
def test_python_float_an_integer_input_cannot_hold_is_an_input_error(dtype, value):
    # numpy truncated 1.5 to 1 (and made 0.5 True) without a word
    model = identity_of(dtype, value)
    session = gc.Session(model, backend="numpy")
    with pytest.raises(gc.InputError, match=r"input 'k': .* non-integral values, which (int64|int32|bool) cannot hold"):
        session.run({"k": value})
    whole = [1, 2.0] if isinstance(value, list) else 1.0  # integral floats still convert
    assert session.run({"k": whole})["y"].tolist() == ([1, 2] if isinstance(value, list) else True if
                                                         dtype == onnx.TensorProto.BOOL else 1)


def test_outputs_selects_and_unknown_output_is_an_input_error(sess):
    assert list(sess.run({"x": X, "b": B}, outputs=["y"])) == ["y"]
    with pytest.raises(gc.InputError, match=r"unknown output 'z'.*y: float32\[N,2\]"):
        sess.run({"x": X, "b": B}, outputs=["z"])


@pytest.mark.parametrize("feeds, message", [
    ({"x": X}, r"missing input 'b' \(expected b: float32\[N,2\]\)"),
    ({"x": X, "b": B, "q": X}, r"unknown input 'q'; the model's inputs are: x: float32\[N,3\]"),
    ({"x": X.astype(np.float64), "b": B}, r"input 'x': expected x: float32\[N,3\], got float64\[4,3\]"),
    ({"x": X[0], "b": B}, r"input 'x': expected x: float32\[N,3\], got float32\[3\] \(rank 1, expected rank 2\)"),
    ({"x": X[:, :2], "b": B}, r"input 'x'.*got float32\[4,2\] \(axis 1 has size 2, the model fixes it at 3\)"),
    ({"x": X, "b": B[:3]}, r"input 'b'.*dim 'N' is 3 here \(axis 0\) but 4 in input 'x' \(axis 0\)"),
    ({"x": X, "b": B, "w": np.ones((2, 3), np.float32)}, r"input 'w'.*axis 0 has size 2, the model fixes it at 3"),
    ({"x": object(), "b": B}, r"input 'x': expected x: float32\[N,3\], got a object"),
])
def test_feed_errors_name_the_input_and_the_expected_spec(sess, feeds, message):
    with pytest.raises(gc.InputError, match=message):
        sess.run(feeds)


def test_feeds_must_be_a_mapping(sess):
    with pytest.raises(gc.InputError, match="feeds must be a dict"):
        sess.run([X, B])


def test_feeds_are_checked_before_the_backend_runs(sess, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the backend ran")

    monkeypatch.setattr(sess.executable, "run", fail)
    with pytest.raises(gc.InputError):
        sess.run({"x": X})


def test_unknown_backend_and_option():
    with pytest.raises(gc.BackendUnavailable, match="unknown backend 'tpu'; choose one of auto, ort-cuda"):
        gc.Session(linear_relu(), backend="tpu")
    with pytest.raises(TypeError, match="unknown Session option 'thread'"):
        gc.Session(linear_relu(), backend="ort-cpu", thread=2)


def test_unavailable_backend_raises_with_reason_and_never_falls_back(monkeypatch):
    from graphc.backends import onnxruntime as ort_backend

    monkeypatch.setattr(ort_backend.CpuBackend, "_availability", lambda self: (False, "switched off by the test"))
    with pytest.raises(gc.BackendUnavailable, match="backend 'ort-cpu' is not available here: switched off by the test"):
        gc.Session(linear_relu(), backend="ort-cpu")


def test_unavailable_cuda_raises_with_the_probe_reason():
    info = next(b for b in gc.backends() if b.name == "ort-cuda")
    if info.available:
        pytest.skip("ort-cuda is available on this machine")
    with pytest.raises(gc.BackendUnavailable, match="ort-cuda") as err:
        gc.Session(linear_relu(), backend="ort-cuda")
    assert info.reason and info.reason in str(err.value)


def _available():
    return [b.name for b in gc.backends() if b.available]


@pytest.mark.parametrize("backend", _available())
def test_unsupported_op_fails_at_creation_naming_op_and_node(backend):
    with pytest.raises(gc.GraphcError, match=r"FancyOp") as err:
        gc.Session(custom_op_model(), backend=backend)
    assert "fancy_1" in str(err.value)


def test_runtime_error_names_node_op_and_source_line():
    sess = gc.Session(reshape_model(), backend="ort-cpu")
    x = np.zeros((2, 4), np.float32)
    assert sess.run({"x": x, "s": np.array([4, 2])})["y"].shape == (4, 2)
    with pytest.raises(gc.BackendError, match=r"node 'reshape_7' \(Reshape, at net.py:42\)"):
        sess.run({"x": x, "s": np.array([3, 5])})


def test_ort_errors_on_unnamed_nodes_name_the_index_and_op():
    # onnxruntime says "node with name ''" / "Name:''", which graphc passed on
    from onnx import TensorProto

    from onnx_graphs import model, node, vi

    # LRN has no double kernel in onnxruntime's CPU provider, nor a graphc write-out
    proto = model([node("Neg", ["x"], ["n"], "", "net.py:2"), node("LRN", ["n"], ["y"], "", "net.py:3", size=1)],
                  [vi("x", TensorProto.DOUBLE, [1, 2, 1])], [vi("y", TensorProto.DOUBLE, [1, 2, 1])])
    with pytest.raises(gc.BackendError, match=r"ort-cpu cannot load unnamed node #1 \(LRN, at net.py:3\): "
                                              r"NOT_IMPLEMENTED : Could not find an implementation"):
        gc.Session(proto, backend="ort-cpu")
    unnamed = reshape_model()
    unnamed.graph.node[0].name = ""
    with pytest.raises(gc.BackendError, match=r"ort-cpu failed while running unnamed node #0 \(Reshape, at net.py:42\): "):
        gc.Session(unnamed, backend="ort-cpu").run({"x": np.zeros((2, 4), np.float32), "s": np.array([3, 5])})
    custom = custom_op_model()
    custom.graph.node[0].name = ""
    with pytest.raises(gc.BackendError, match=r"\(unnamed node #0, at net.py:5\)"):
        gc.Session(custom, backend="ort-cpu")


def test_a_kernel_onnxruntime_lacks_is_named_at_creation():
    from onnx import TensorProto

    from onnx_graphs import model, node, vi

    proto = model([node("LRN", ["x"], ["y"], "lrn_3", "net.py:3", size=1)],
                  [vi("x", TensorProto.DOUBLE, [1, 2, 1])], [vi("y", TensorProto.DOUBLE, [1, 2, 1])])
    with pytest.raises(gc.BackendError, match=r"ort-cpu cannot load node 'lrn_3' \(LRN, at net.py:3\): "
                                              r"NOT_IMPLEMENTED : Could not find an implementation"):
        gc.Session(proto, backend="ort-cpu")
