"""Losses vs closed numpy forms and torch.nn.functional: as DSL functions on Tensors
(gc.losses.* inside gc.capture) and as loss specs spliced into a model by gc.training.generate."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import graphc as gc
from backend_params import CUDA_MARKS, ORT, options as backend_options
from dsl_util import softmax
from graphc.passes.values import ancestors

RNG = np.random.default_rng(0)


# -- references (closed forms, PyTorch's definitions) ------------------------------------------
def _reduce(x, reduction):
    return x.mean() if reduction == "mean" else x.sum()


def ref_mse(p, t, reduction="mean"):
    return _reduce((p - t) ** 2, reduction)


def ref_l1(p, t, reduction="mean"):
    return _reduce(np.abs(p - t), reduction)


def ref_huber(p, t, reduction="mean", delta=1.0):
    d = np.abs(p - t)
    return _reduce(np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


def ref_bce_with_logits(x, y, reduction="mean"):
    return _reduce(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))), reduction)


def ref_cross_entropy(logits, labels, reduction="mean", label_smoothing=0.0, ignore_index=-100):
    x = logits.astype(np.float64)
    lsm = x - x.max(axis=1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    keep = labels != ignore_index
    safe = np.where(keep, labels, 0)
    nll = -np.take_along_axis(lsm, np.expand_dims(safe, 1), axis=1).squeeze(1)
    smooth = -lsm.mean(axis=1)
    elem = ((1 - label_smoothing) * nll + label_smoothing * smooth) * keep
    return elem.sum() / keep.sum() if reduction == "mean" else elem.sum()


REFS = {"mse": ref_mse, "l1": ref_l1, "huber": ref_huber, "bce_with_logits": ref_bce_with_logits,
        "cross_entropy": ref_cross_entropy}


def _torch_loss(kind, a, b, **opts):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    ta = torch.from_numpy(a.astype(np.float64))
    tb = torch.from_numpy(b) if kind == "cross_entropy" else torch.from_numpy(b.astype(np.float64))
    fn = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.huber_loss,
          "bce_with_logits": F.binary_cross_entropy_with_logits, "cross_entropy": F.cross_entropy}[kind]
    return float(fn(ta, tb, **opts))


# -- cases -------------------------------------------------------------------------------------
def _regression(shape=(6, 5)):
    return RNG.normal(size=shape).astype(np.float32), RNG.normal(size=shape).astype(np.float32)


def _classes(shape=(8, 5), extra=()):
    logits = RNG.normal(scale=3, size=(shape[0], shape[1], *extra)).astype(np.float32)
    labels = RNG.integers(0, shape[1], size=(shape[0], *extra)).astype(np.int64)
    return logits, labels


def _ignored():
    logits, labels = _classes()
    labels[[1, 4]] = -100
    return logits, labels


def _ignore_class_zero():
    logits, labels = _classes()
    labels[:3] = 0
    return logits, labels


def _bce_extreme():
    x = np.array([[100.0, -100.0, 0.0, 3.0], [-100.0, 100.0, -2.0, 50.0]], np.float32)
    y = np.array([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.5, 1.0]], np.float32)
    return x, y


CASES = [
    ("mse", _regression, {}),
    ("mse", _regression, {"reduction": "sum"}),
    ("l1", _regression, {}),
    ("huber", _regression, {}),
    ("huber", _regression, {"delta": 0.5}),
    ("huber", _regression, {"delta": 2.0, "reduction": "sum"}),
    ("bce_with_logits", lambda: (RNG.normal(size=(6, 3)).astype(np.float32),
                                 RNG.integers(0, 2, (6, 3)).astype(np.float32)), {}),
    ("bce_with_logits", _bce_extreme, {}),
    ("cross_entropy", _classes, {}),
    ("cross_entropy", _classes, {"reduction": "sum"}),
    ("cross_entropy", _classes, {"label_smoothing": 0.1}),
    ("cross_entropy", _ignored, {}),
    ("cross_entropy", _ignored, {"label_smoothing": 0.2}),
    ("cross_entropy", _ignore_class_zero, {"ignore_index": 0}),
    ("cross_entropy", lambda: _classes((3, 4), extra=(2, 3)), {}),
    ("cross_entropy", lambda: _classes((3, 4), extra=(2, 3)), {"label_smoothing": 0.1}),
]
IDS = [f"{kind}-{i}" for i, (kind, _, _) in enumerate(CASES)]


def _loss_eval_graph(kind, a, b, options, symbolic_classes=False) -> gc.Model:
    """The eval graph of ``out = pred * w`` (w = [1.0], a param) with the loss spec on ``out``:
    it computes the loss of ``pred`` against the new ``label`` input."""
    dims = ["N", "C" if symbolic_classes else a.shape[1], *a.shape[2:]]
    graph = oh.make_graph([oh.make_node("Mul", ["pred", "w"], ["out"])], "identity",
                          [oh.make_tensor_value_info("pred", onnx.TensorProto.FLOAT, dims)],
                          [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, dims)],
                          [onnx.numpy_helper.from_array(np.ones(1, np.float32), "w")])
    model = gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)]))
    spec = getattr(gc.losses, kind)("out", label="label", **options)
    arts = gc.training.generate(model, spec, gc.optim.SGD(0.1))
    onnx.checker.check_model(arts.eval.proto, full_check=True)
    return arts.eval


@pytest.mark.parametrize("kind,make,options", CASES, ids=IDS)
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_loss_spec_matches_closed_form(kind, make, options, backend):
    a, b = make()
    got = gc.Session(_loss_eval_graph(kind, a, b, options), backend=backend).run({"pred": a, "label": b})["loss"]
    expected = REFS[kind](a.astype(np.float64), b if kind == "cross_entropy" else b.astype(np.float64), **options)
    assert np.isfinite(got)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("make,options", [(_classes, {"label_smoothing": 0.1}),
                                          (lambda: _classes((3, 4), extra=(2, 3)), {}),
                                          (_ignored, {"label_smoothing": 0.2})])
def test_cross_entropy_with_symbolic_class_count(make, options):
    logits, labels = make()
    model = _loss_eval_graph("cross_entropy", logits, labels, options, symbolic_classes=True)
    got = gc.Session(model, backend="numpy").run({"pred": logits, "label": labels})["loss"]
    np.testing.assert_allclose(got, ref_cross_entropy(logits, labels, **options), rtol=2e-5)


@pytest.mark.parametrize("kind,make,options", CASES, ids=IDS)
def test_closed_forms_match_torch(kind, make, options):
    a, b = make()
    torch_opts = dict(options)
    if kind == "huber":
        torch_opts.setdefault("delta", 1.0)
    expected = _torch_loss(kind, a, b, **torch_opts)
    got = REFS[kind](a.astype(np.float64), b if kind == "cross_entropy" else b.astype(np.float64), **options)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind,make,options", CASES, ids=IDS)
def test_dsl_loss_on_tensors(kind, make, options):
    a, b = make()
    fn = getattr(gc.losses, kind)
    model = gc.capture(lambda p, t: fn(p, t, **options), p=gc.spec("float32", ("N", *a.shape[1:])),
                       t=gc.spec(b.dtype.name, ("N", *b.shape[1:])))
    got = gc.Session(model, backend="numpy").run({"p": a, "t": b})["output"]
    expected = REFS[kind](a.astype(np.float64), b if kind == "cross_entropy" else b.astype(np.float64), **options)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)


def _with_input_gradient(model: gc.Model, dtype=ir.DataType.FLOAT, shape=None) -> tuple[gc.Model, ir.Value]:
    """``model`` with d(output 0)/d(input 0) as an extra output (``shape``: input 0's if None)."""
    from graphc.passes.autodiff.core import backward

    g = model.ir.graph
    dx = backward(g, g.outputs[0], [g.inputs[0]])[g.inputs[0].name]
    dx.dtype, dx.shape = dtype, ir.Shape(list(shape) if shape is not None else list(g.inputs[0].shape))
    g.outputs.append(dx)
    return gc.Model(model.ir), dx


def _run_on(backend: str, model: gc.Model, feeds: dict, dx: ir.Value) -> np.ndarray:
    """``dx`` computed on ``backend``; on ort-cuda its scatters must run there, not fall back (the
    graph left unoptimized, so that the placement names them)."""
    cuda = {"graph_optimization_level": "disable"} if backend == "ort-cuda" else {}
    sess = gc.Session(model, backend=backend, **backend_options(backend), **cuda)
    if backend == "ort-cuda":
        scatters = {n.name for n in ancestors([dx]) if n.op_type.startswith("Scatter")}
        assert {sess.placement[name] for name in scatters} == {"CUDAExecutionProvider"}
    return sess.run(feeds)[dx.name]


def test_bce_with_logits_gradient_is_finite_at_100():
    """The stable form keeps d(loss)/dx finite and equal to (sigmoid(x) - y)/n at |x| = 100 and
    at the kink x = 0."""
    x, y = _bce_extreme()
    model, dx = _with_input_gradient(gc.capture(lambda p, t: gc.losses.bce_with_logits(p, t), p=x, t=y))
    out = gc.Session(model, backend="numpy").run({"p": x, "t": y})
    expected = (1 / (1 + np.exp(-x.astype(np.float64))) - y) / x.size
    np.testing.assert_allclose(out[dx.name], expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("make,options", [(_classes, {}), (_ignored, {}),
                                          (_ignore_class_zero, {"ignore_index": 0, "reduction": "sum"}),
                                          (lambda: _classes((3, 4), extra=(2, 3)), {}),
                                          (_ignored, {"label_smoothing": 0.2})])
@pytest.mark.parametrize("backend,label_dtype", [("numpy", "int64"), ("ort-cpu", "int64"), ("ort-cpu", "int32"),
                                                 pytest.param("ort-cuda", "int64", marks=CUDA_MARKS, id="ort-cuda-int64")])
def test_cross_entropy_gradient_matches_closed_form(make, options, backend, label_dtype):
    """d(loss)/d(logits) = ((1-eps) * hit * (softmax - onehot) + eps * (softmax - 1/C)) * keep / n:
    the labels' log-probabilities picked by GatherElements, and without smoothing LogSoftmax's
    gradient kept sparse (the picked values scattered onto -softmax * their sum, no [N, C]
    one-hot, subtraction or row sum of zeros)."""
    logits, labels = make()
    labels = labels.astype(label_dtype)
    eps, reduction = options.get("label_smoothing", 0.0), options.get("reduction", "mean")
    model, dx = _with_input_gradient(gc.capture(
        lambda x, y: gc.losses.cross_entropy(x, y, **options),
        x=gc.spec("float32", ("N", *logits.shape[1:])), y=gc.spec(label_dtype, ("N", *labels.shape[1:]))))
    used = ancestors([dx])
    assert all(n.inputs[0] is model.ir.graph.inputs[1] for n in used if n.op_type == "Equal")  # only ignore_index's
    if not eps:
        scatters = [n for n in used if n.op_type == "ScatterElements"]
        assert "Sub" not in [n.op_type for n in used] and len(scatters) == 1
        assert scatters[0].inputs[0].producer().op_type == "Mul"  # onto -softmax * sum, not zeros
    got = _run_on(backend, model, {"x": logits, "y": labels}, dx)

    x, c = logits.astype(np.float64), logits.shape[1]
    p = softmax(x, axis=1)
    hit = (labels >= 0) & (labels < c)
    onehot = np.expand_dims(np.where(hit, labels, 0), 1) == np.arange(c).reshape(c, *[1] * (labels.ndim - 1))
    keep = np.expand_dims(labels != options.get("ignore_index", -100), 1)
    d = ((1 - eps) * np.expand_dims(hit, 1) * (p - onehot) + eps * (p - 1 / c)) * keep
    expected = d / keep.sum() if reduction == "mean" else d
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("backend", ["numpy", *ORT])
def test_log_softmax_gradient_of_repeated_picks(axis, backend):
    """sum(w * gather(log_softmax(x, 1), axis, idx)) with indices repeated within a row: dx is
    the weights summed into their positions minus softmax times each row's weight sum. Along
    axis 1 the LogSoftmax gradient takes the scattered weights as they are; along axis 0 (picks
    across rows) it gets them as a dense dy."""
    from graphc.dsl import ops, ops_array

    x = RNG.normal(size=(4, 6))
    idx = np.array([[0, 2, 2], [5, 5, 5], [1, 0, 3], [4, 4, 0]]) if axis == 1 else np.array([[0, 3, 3, 1, 0, 2]] * 2)
    w = RNG.normal(size=idx.shape)
    model, dx = _with_input_gradient(gc.capture(
        lambda t: ops.sum(ops_array.gather(ops.log_softmax(t, axis=1), axis, idx) * w), t=x), ir.DataType.DOUBLE)
    got = _run_on(backend, model, {"t": x}, dx)
    picked = np.zeros_like(x)
    rows = np.broadcast_to(np.arange(idx.shape[0])[:, None], idx.shape)
    cols = np.broadcast_to(np.arange(idx.shape[1]), idx.shape)
    np.add.at(picked, (rows, idx) if axis == 1 else (idx, cols), w)
    p = softmax(x, axis=1)
    # onnxruntime's CUDA (Log)Softmax in float64 is float32-accurate (measured on an H200 against
    # its CPU kernel: 9e-8 relative; Exp and ReduceSum 1e-16), so CUDA is held to that
    tol = {"rtol": 1e-6, "atol": 1e-7} if backend == "ort-cuda" else {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(got, picked - p * picked.sum(axis=1, keepdims=True), **tol)


@pytest.mark.parametrize("backend", ORT)
@pytest.mark.parametrize("fused", [True, False])
def test_exported_cross_entropy_gradient_builds_no_one_hot(fused, backend):
    """torch.onnx's cross-entropy, fused (SoftmaxCrossEntropyLoss) or as LogSoftmax then
    NegativeLogLikelihoodLoss: the gradient scatters each label's value, no OneHot, and the
    unfused LogSoftmax's gradient takes the NLL's scatter as it is (no Sub, no zeros scattered
    into); values equal the closed form (softmax - onehot) * keep / n."""
    logits, labels = _ignored()
    nodes = [oh.make_node("SoftmaxCrossEntropyLoss", ["x", "y"], ["loss"], ignore_index=-100)] if fused else [
        oh.make_node("LogSoftmax", ["x"], ["lp"], axis=1),
        oh.make_node("NegativeLogLikelihoodLoss", ["lp", "y"], ["loss"], ignore_index=-100)]
    graph = oh.make_graph(nodes, "ce", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 5]),
                                        oh.make_tensor_value_info("y", onnx.TensorProto.INT64, ["N"])],
                          [oh.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                          value_info=[oh.make_tensor_value_info("lp", onnx.TensorProto.FLOAT, ["N", 5])])
    model, dx = _with_input_gradient(gc.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])))
    ops = [n.op_type for n in ancestors([dx])]
    assert "OneHot" not in ops and ops.count("ScatterElements") == 1
    if not fused:
        assert "Sub" not in ops and dx.producer().inputs[0].producer().op_type == "Mul"
    got = _run_on(backend, model, {"x": logits, "y": labels}, dx)
    x = logits.astype(np.float64)
    p = softmax(x, axis=1)
    keep = (labels != -100)[:, None]
    onehot = np.where(keep[:, 0], labels, 0)[:, None] == np.arange(5)
    np.testing.assert_allclose(got, (p - onehot) * keep / keep.sum(), rtol=1e-5, atol=1e-7)


def test_loss_spec_binds_output_to_label():
    spec = gc.losses.cross_entropy("logits", label="y", label_smoothing=0.1)
    assert isinstance(spec, gc.losses.LossSpec)
    assert (spec.kind, spec.output, spec.label) == ("cross_entropy", "logits", "y")
    assert spec.resolved_options() == {"reduction": "mean", "label_smoothing": 0.1, "ignore_index": -100}
    assert gc.losses.LossSpec.model_validate_json(spec.model_dump_json()) == spec
    assert gc.losses.huber("out", label="t", delta=2.0).resolved_options()["delta"] == 2.0


def test_loss_spec_errors():
    with pytest.raises(ValueError, match="no option"):
        gc.losses.LossSpec(kind="mse", output="o", options={"delta": 1.0}).resolved_options()
    with pytest.raises(ValueError, match="reduction"):
        gc.losses.mse("out", label="y", reduction="none")
    with pytest.raises(TypeError, match="label="):
        gc.losses.mse("out", "y")
