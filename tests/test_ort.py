"""The onnxruntime backends: options, placement, IOBinding residency, the CUDA probe."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc as gc
from graphc.backends import onnxruntime as ort_backend
from backend_params import EXACT_CUDA, on_cuda
from onnx_graphs import linear_relu
from serve_util import bfloat16_model

X = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
B = np.zeros((5, 2), np.float32)
W = np.arange(6, dtype=np.float32).reshape(3, 2) / 6


# -- options and placement -------------------------------------------------------------------------

def test_cpu_placement_names_the_provider_of_every_node():
    sess = gc.Session(linear_relu(), backend="ort-cpu", graph_optimization_level="disable")
    assert sess.placement == {"matmul_0": "CPUExecutionProvider", "add_0": "CPUExecutionProvider",
                              "relu_0": "CPUExecutionProvider"}
    assert sess.copy_nodes == 0


def test_optimization_level_shows_in_placement():
    fused = gc.Session(linear_relu(), backend="ort-cpu", graph_optimization_level="all").placement
    assert set(fused.values()) == {"CPUExecutionProvider"}
    assert "matmul_0" not in fused  # MatMul + Add fused into one node by onnxruntime


@pytest.mark.parametrize("level", ["disable", "basic", "extended", "all", 0, 3])
def test_every_optimization_level_gives_the_same_answer(level):
    out = gc.Session(linear_relu(), backend="ort-cpu", graph_optimization_level=level, threads=1).run({"x": X, "b": B})
    np.testing.assert_allclose(out["y"], np.maximum(X @ W + B, 0), rtol=1e-6)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="graph_optimization_level must be one of disable, basic, extended, all"):
        gc.Session(linear_relu(), backend="ort-cpu", graph_optimization_level="max")
    with pytest.raises(ValueError, match="threads must be >= 0"):
        gc.Session(linear_relu(), backend="ort-cpu", threads=-1)


def test_threads_and_provider_options_reach_onnxruntime(monkeypatch):
    seen = {}
    real_session = ort.InferenceSession

    def spy(model, options=None, providers=None, **kwargs):
        seen["providers"] = providers
        return real_session(model, options, providers=providers, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    sess = gc.Session(linear_relu(), backend="ort-cpu", threads=2, providers_options={"use_arena": "0"})
    assert sess.executable.session.get_session_options().intra_op_num_threads == 2
    assert seen["providers"] == [("CPUExecutionProvider", {"use_arena": "0"})]


def test_profile_traces_every_run_of_the_prepared_session(tmp_path):
    """``profile``: onnxruntime's profiler on the session the backend builds (its rewrites
    included), one ``model_run`` per run and the nodes' kernel times in the trace."""
    import json

    executable = gc.backends.get_backend("ort-cpu").prepare(linear_relu(), graph_optimization_level="disable",
                                                            profile=str(tmp_path / "trace"))
    for _ in range(3):
        executable.run({"x": X, "b": B})
    trace = executable.end_profiling()
    assert trace.parent == tmp_path and trace.name.startswith("trace")
    events = json.loads(trace.read_text())
    assert sum(e["name"] == "model_run" for e in events) == 3
    kernels = {e["name"].removesuffix("_kernel_time") for e in events if e["name"].endswith("_kernel_time")}
    assert kernels == {"matmul_0", "add_0", "relu_0"}


def test_session_is_built_with_an_ir_version_onnxruntime_accepts():
    proto = linear_relu()
    proto.ir_version = 14  # what onnx.helper.make_model stamps; onnxruntime 1.31 refuses it
    backend = ort_backend.CpuBackend()
    assert backend.prepare(proto).run({"x": X, "b": B})["y"].shape == (5, 2)
    assert proto.ir_version == 14  # the caller's proto is left as it was


def test_nodes_that_share_a_name_run_and_train():
    """ONNX lets nodes share a name (onnx's full check passes); onnxruntime refuses such a
    model, so the session's copy gives each repeat a suffix. The caller's proto keeps its
    names, and the model trains on onnxruntime as on numpy."""
    proto = linear_relu()
    for n in proto.graph.node:
        n.name = "layer"
    onnx.checker.check_model(proto, full_check=True)
    sess = gc.Session(proto, backend="ort-cpu", graph_optimization_level="disable")
    np.testing.assert_allclose(sess.run({"x": X, "b": B})["y"], np.maximum(X @ W + B, 0), rtol=1e-6)
    assert set(sess.placement) == {"layer", "layer_1", "layer_2"}
    assert [n.name for n in proto.graph.node] == ["layer"] * 3
    arts = gc.training.generate(gc.load(proto), gc.losses.mse("y", label="t"), gc.optim.SGD(0.1))
    batch = {"x": X, "b": B, "t": np.ones((5, 2), np.float32)}
    trainers = {backend: gc.Trainer(arts, backend=backend) for backend in ("ort-cpu", "numpy")}
    losses = {backend: [trainer.step(batch) for _ in range(5)] for backend, trainer in trainers.items()}
    np.testing.assert_allclose(losses["ort-cpu"], losses["numpy"], rtol=1e-5)
    assert losses["ort-cpu"][-1] < losses["ort-cpu"][0]


def test_repeated_node_names_get_suffixes_no_node_has():
    """Subgraphs count too, and a suffix never takes a name another node already has."""
    from onnx import helper
    from graphc.model.file import unique_node_names

    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["z"], name="n")], "then", [],
                               [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["w"], name="n_1")], "else", [],
                              [helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="n"), helper.make_node("Neg", ["a"], ["b"], name="n"),
             helper.make_node("If", ["c"], ["y"], name="n_1", then_branch=branch, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    renamed = unique_node_names(proto)
    branches = {a.name: a.g.node[0].name for a in renamed.graph.node[2].attribute}
    assert [n.name for n in renamed.graph.node] == ["n", "n_2", "n_1"]
    assert {branches["then_branch"], branches["else_branch"]} == {"n_3", "n_1_1"}
    assert [n.name for n in proto.graph.node] == ["n", "n", "n_1"]
    assert unique_node_names(renamed) is renamed


def test_a_model_at_onnxs_newest_opset_runs_converted_down():
    """``onnx.helper.make_model`` stamps onnx's newest opset (28 with onnx 1.23), which
    onnxruntime 1.31 refused (it loads up to 26): the session's copy is converted down."""
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["g"]), helper.make_node("Relu", ["g"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5, 3])])
    proto = helper.make_model(graph)
    assert proto.opset_import[0].version == onnx.defs.onnx_opset_version()
    got = gc.Session(proto, backend="ort-cpu").run({"x": X})["y"]
    np.testing.assert_allclose(got, gc.Session(proto, backend="numpy").run({"x": X})["y"], rtol=1e-6, atol=1e-7)
    assert proto.opset_import[0].version == onnx.defs.onnx_opset_version()  # the caller's model as it was


def test_a_model_that_cannot_come_down_to_onnxruntimes_opsets_says_why(monkeypatch):
    from onnx import helper
    from graphc.backends import opsets

    monkeypatch.setattr(opsets, "newest_opset", lambda: 11)  # as if onnxruntime stopped at 11
    graph = helper.make_graph([helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,ij->i")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(gc.BackendError, match="imports ai.onnx opset 17, this onnxruntime runs opsets up to 11, and "
                                              "converting it down failed: .*Einsum"):
        gc.Session(proto, backend="ort-cpu")


# -- device residency (IOBinding) ---------------------------------------------------------------

def test_run_bound_keeps_device_outputs_as_handles_on_cpu():
    sess = gc.Session(linear_relu(), backend="ort-cpu")
    x_dev = sess.to_device(X)
    assert isinstance(x_dev, ort.OrtValue) and x_dev.device_name() == "cpu"
    host, dev = sess.run_bound({"x": x_dev, "b": B}, host_outputs=[], device_outputs=["y"])
    assert host == {} and isinstance(dev["y"], ort.OrtValue)
    expected = np.maximum(X @ W + B, 0)
    np.testing.assert_allclose(sess.to_host(dev["y"]), expected, rtol=1e-6)
    host, dev = sess.run_bound({"x": x_dev, "b": B}, host_outputs=["y"])
    assert dev == {} and isinstance(host["y"], np.ndarray)
    np.testing.assert_allclose(host["y"], expected, rtol=1e-6)


def test_to_device_copies_so_later_host_writes_do_not_leak():
    sess = gc.Session(linear_relu(), backend="ort-cpu")
    x = X.copy()
    handle = sess.to_device(x)
    x[:] = 0
    np.testing.assert_array_equal(sess.to_host(handle), X)


def test_a_device_output_feeds_the_next_run():
    # y has shape [N,2]; feed it back as b (same shape) and w stays an initializer.
    sess = gc.Session(linear_relu(), backend="ort-cpu")
    _, dev = sess.run_bound({"x": X, "b": B}, host_outputs=[], device_outputs=["y"])
    host, _ = sess.run_bound({"x": X, "b": dev["y"]}, host_outputs=["y"])
    y1 = np.maximum(X @ W + B, 0)
    np.testing.assert_allclose(host["y"], np.maximum(X @ W + y1, 0), rtol=1e-6)


def test_run_bound_checks_handles_like_arrays():
    sess = gc.Session(linear_relu(), backend="ort-cpu")
    wrong_dtype = ort.OrtValue.ortvalue_from_numpy(X.astype(np.float64))
    with pytest.raises(gc.InputError, match=r"input 'x': expected x: float32\[N,3\], got float64\[5,3\]"):
        sess.run_bound({"x": wrong_dtype, "b": B}, host_outputs=["y"])
    with pytest.raises(gc.InputError, match=r"dim 'N' is 4 here"):
        sess.run_bound({"x": sess.to_device(X), "b": B[:4]}, host_outputs=["y"])
    with pytest.raises(gc.InputError, match="unknown output 'z'"):
        sess.run_bound({"x": X, "b": B}, host_outputs=["z"])


def test_run_accepts_handles_too():
    sess = gc.Session(linear_relu(), backend="ort-cpu")
    out = sess.run({"x": sess.to_device(X), "b": B})
    np.testing.assert_allclose(out["y"], np.maximum(X @ W + B, 0), rtol=1e-6)


# -- the CUDA probe --------------------------------------------------------------------------------

@pytest.fixture
def fresh_probe():
    ort_backend.probe_cuda.cache_clear()
    yield
    ort_backend.probe_cuda.cache_clear()


def test_probe_reports_a_build_without_the_cuda_provider(monkeypatch, fresh_probe):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    info = ort_backend.CudaBackend().info()
    assert not info.available and info.device == "cuda"
    assert info.reason.startswith("no CUDA provider in this onnxruntime build")


def test_probe_does_not_trust_the_provider_list(monkeypatch, fresh_probe):
    """A session that silently fell back to CPU means CUDA is not available."""
    real_session = ort.InferenceSession

    def cpu_only(model, options=None, providers=None, **kwargs):
        return real_session(model, options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", cpu_only)
    available, reason = ort_backend.probe_cuda(0)
    assert not available and reason.startswith("CUDA provider failed to load")


def test_probe_is_quiet_and_cached(capfd, fresh_probe):
    first = ort_backend.probe_cuda(0)
    captured = capfd.readouterr()
    assert "onnxruntime" not in captured.err and "Failed to load" not in captured.out
    assert ort_backend.probe_cuda(0) is first
    if not first[0]:
        assert first[1].startswith(("no CUDA provider", "CUDA provider failed to load"))


@pytest.mark.parametrize("exact,given,expected", [(True, {}, "kSameAsRequested"), (False, {}, None),
                                                   (True, {"arena_extend_strategy": "kNextPowerOfTwo"}, "kNextPowerOfTwo")])
def test_exact_arena_on_cuda_is_the_provider_arena_strategy(monkeypatch, exact, given, expected):
    """``prepare(exact_arena=True)`` (the Trainer's train_step) asks the CUDA provider for an arena
    that grows by what is asked, unless the caller's providers_options name a strategy. The
    session itself is not built: this runs without a GPU."""
    seen = {}
    monkeypatch.setattr(ort_backend, "OrtExecutable", lambda backend, model, options, provider_options, *rest:
                        seen.update(provider_options))
    ort_backend.CudaBackend().prepare(linear_relu(), exact_arena=exact, providers_options=given)
    assert seen.get("arena_extend_strategy") == expected and seen["device_id"] == 0


# -- on a GPU ------------------------------------------------------------------------------------------

@on_cuda
def test_cuda_placement_and_answer():
    sess = gc.Session(linear_relu(), backend="ort-cuda", graph_optimization_level="disable", **EXACT_CUDA)
    assert sess.backend == "ort-cuda" and sess.device == "cuda"
    assert set(sess.placement.values()) == {"CUDAExecutionProvider"}
    out = sess.run({"x": X, "b": B})
    np.testing.assert_allclose(out["y"], np.maximum(X @ W + B, 0), rtol=1e-5, atol=1e-6)
    assert sess.copy_nodes >= 0


@on_cuda
def test_cuda_run_bound_keeps_outputs_on_the_device():
    sess = gc.Session(linear_relu(), backend="ort-cuda", device_id=0, **EXACT_CUDA)
    x_dev = sess.to_device(X)
    assert x_dev.device_name().lower() == "cuda"
    host, dev = sess.run_bound({"x": x_dev, "b": B}, host_outputs=[], device_outputs=["y"])
    assert dev["y"].device_name().lower() == "cuda"
    host, _ = sess.run_bound({"x": x_dev, "b": dev["y"]}, host_outputs=["y"])
    y1 = np.maximum(X @ W + B, 0)
    np.testing.assert_allclose(host["y"], np.maximum(X @ W + y1, 0), rtol=1e-5, atol=1e-6)


def test_scalar_feeds_and_outputs_stay_0d():
    from onnx_graphs import model, node, vi

    proto = model([node("Add", ["step", "one"], ["next"], "inc")], [vi("step", shape=[])],
                  [vi("next", shape=[])], {"one": np.float32(1)})
    sess = gc.Session(proto, backend="ort-cpu")
    assert sess.run({"step": np.float32(3)})["next"].shape == ()
    host, dev = sess.run_bound({"step": sess.to_device(np.float32(3))}, host_outputs=["next"])
    assert host["next"].shape == () and host["next"] == 4
    with pytest.raises(gc.InputError, match=r"rank 1, expected rank 0"):
        sess.run({"step": np.array([3], np.float32)})


def test_a_cuda_session_that_lands_on_cpu_is_refused(monkeypatch):
    """Even past the probe, a session without CUDAExecutionProvider is never returned."""
    real_session = ort.InferenceSession

    def cpu_only(model, options=None, providers=None, **kwargs):
        return real_session(model, options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(ort_backend.CudaBackend, "_availability", lambda self: (True, ""))
    monkeypatch.setattr(ort, "InferenceSession", cpu_only)
    with pytest.raises(gc.BackendUnavailable, match="ort-cuda: onnxruntime did not give the session CUDAExecutionProvider"):
        gc.Session(linear_relu(), backend="ort-cuda")


@pytest.mark.parametrize("n", [5, 0])
def test_bfloat16_feeds_and_results_cross_onnxruntimes_boundary(n):
    # onnxruntime's Python run() has no numpy type for bfloat16 ("Numpy_type 256 can't be converted")
    from graphc.model.dtypes import to_numpy

    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(n).astype(to_numpy("bfloat16")), "s": rng.standard_normal(n).astype(np.float32)}
    got = gc.Session(bfloat16_model(), backend="ort-cpu").run(feeds)
    want = gc.Session(bfloat16_model(), backend="numpy").run(feeds)
    for name in ("y", "z", "w"):
        assert got[name].dtype == to_numpy("bfloat16") and got[name].shape == (n,)
        np.testing.assert_array_equal(got[name].view(np.uint16), want[name].view(np.uint16))
    assert gc.Session(bfloat16_model(), backend="ort-cpu").run(feeds, outputs=["z"])["z"].tobytes() == feeds["x"].tobytes()


@pytest.mark.parametrize("opset,shape", [(15, (4, 3)), (21, (4, 3, 5, 2))])
@pytest.mark.parametrize("outputs", [("y",), ("y", "rm", "rv")])
def test_training_mode_batchnorm_uses_the_batch_statistics(opset, shape, outputs):
    """onnxruntime's optimized session got a fresh BatchNorm's output wrong where the running
    statistics are not read (``backends/batchnorm.py``); the session's copy writes it out."""
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    x = np.random.default_rng(2).normal(3, 2, shape).astype(np.float32)
    params = [onnx.numpy_helper.from_array(np.full(3, v, np.float32), n)
              for n, v in (("s", 1.0), ("b", 0.0), ("m", 0.0), ("v", 1.0))]  # a fresh BatchNorm's
    node = h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], "bn",
                       training_mode=1, momentum=0.9)
    graph = h.make_graph([node], "bn", [h.make_tensor_value_info("x", f, shape)],
                         [h.make_tensor_value_info(n, f, shape if n == "y" else [3]) for n in outputs], params)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    want = gc.Session(model, backend="numpy").run({"x": x})
    got = gc.Session(model, backend="ort-cpu").run({"x": x})
    axes = (0, *range(2, len(shape)))
    np.testing.assert_allclose(want["y"].mean(axes), 0, atol=1e-5)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_only_scans_of_a_length_not_known_nonzero_are_guarded_and_the_copy_is_valid():
    """backends/scans.py puts an If around a Scan whose length may be 0 (onnxruntime fails those);
    a Scan declared to have steps keeps running bare (the If costs a run about 9 us)."""
    from graphc.backends import scans

    def scan_model(length):
        return gc.capture(lambda h, x: gc.scan(lambda c, row: (c + row, c * row), h, x),
                          h=gc.spec("float32", (3,)), x=gc.spec("float32", (length, 3))).proto

    fixed = scan_model(4)
    assert scans.guard_empty(fixed) is fixed
    guarded = scans.guard_empty(scan_model("T"))
    assert [n.op_type for n in guarded.graph.node] == ["Constant", "Constant", "Shape", "Gather", "Equal", "If"]
    onnx.checker.check_model(guarded, full_check=True)
