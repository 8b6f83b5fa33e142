"""Every DSL function: captured, full ONNX check, run on onnxruntime CPU, compared to numpy
(and to torch where it is installed), in symbolic and eager capture."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
try:
    from dsl_util import capture_run, check, rng, run_ort, softmax
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import capture_run, check, rng, run_ort, softmax

R = rng(0)
X = R.standard_normal((3, 4)).astype(np.float32)
Y = R.standard_normal((3, 4)).astype(np.float32)
P = (R.random((3, 4)) + 0.1).astype(np.float32)  # positive
M = R.standard_normal((4, 5)).astype(np.float32)
IMG = R.standard_normal((2, 3, 8, 8)).astype(np.float32)
W = (R.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32)
B4 = R.standard_normal(4).astype(np.float32)
C = R.random((3, 4)) > 0.5


def _erf(x):
    return np.vectorize(math.erf)(x).astype(x.dtype)


def _conv(x, w, b, stride=1, pad=0):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return (out + b[None, :, None, None]).astype(np.float32)


def _pool(x, k, reduce):
    n, c, h, w = x.shape
    return reduce(x.reshape(n, c, h // k, k, w // k, k), axis=(3, 5))


# (id, function of gc Tensors, feeds, numpy reference)
CASES = [
    ("relu", lambda x: gc.relu(x), {"x": X}, lambda x: np.maximum(x, 0)),
    ("gelu", lambda x: gc.gelu(x), {"x": X}, lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    ("gelu_tanh", lambda x: gc.gelu(x, approximate="tanh"), {"x": X},
     lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    ("sigmoid", lambda x: gc.sigmoid(x), {"x": X}, lambda x: 1 / (1 + np.exp(-x))),
    ("tanh", lambda x: gc.tanh(x), {"x": X}, np.tanh),
    ("exp", lambda x: gc.exp(x), {"x": X}, np.exp),
    ("log", lambda x: gc.log(x), {"x": P}, np.log),
    ("sqrt", lambda x: gc.sqrt(x), {"x": P}, np.sqrt),
    ("abs", lambda x: gc.abs(x), {"x": X}, np.abs),
    ("softmax", lambda x: gc.softmax(x, axis=-1), {"x": X}, softmax),
    ("log_softmax", lambda x: gc.log_softmax(x, axis=1), {"x": X}, lambda x: np.log(softmax(x))),
    ("matmul", lambda x, m: gc.matmul(x, m), {"x": X, "m": M[None].repeat(3, 0)}, np.matmul),
    ("matmul_op", lambda x: x @ M, {"x": X}, lambda x: x @ M),
    ("concat", lambda x, y: gc.concat([x, y], axis=1), {"x": X, "y": Y}, lambda x, y: np.concatenate([x, y], 1)),
    ("stack", lambda x, y: gc.stack([x, y], axis=1), {"x": X, "y": Y}, lambda x, y: np.stack([x, y], 1)),
    ("reshape", lambda x: gc.reshape(x, [x.shape[0], 2, 2]), {"x": X}, lambda x: x.reshape(-1, 2, 2)),
    ("reshape_flat", lambda x: x.reshape(-1), {"x": X}, lambda x: x.reshape(-1)),
    ("transpose", lambda x: gc.transpose(x, [1, 0]), {"x": X}, lambda x: x.T),
    ("T", lambda x: x.T, {"x": X}, lambda x: x.T),
    ("where", lambda c, x, y: gc.where(c, x, y), {"c": C, "x": X, "y": Y}, np.where),
    ("maximum", lambda x, y: gc.maximum(x, y), {"x": X, "y": Y}, np.maximum),
    ("minimum", lambda x, y: gc.minimum(x, y), {"x": X, "y": Y}, np.minimum),
    ("clip", lambda x: gc.clip(x, -0.5, 0.5), {"x": X}, lambda x: np.clip(x, -0.5, 0.5)),
    ("sum_all", lambda x: gc.sum(x), {"x": X}, lambda x: np.sum(x)),
    ("sum_axis", lambda x: gc.sum(x, axis=1, keepdims=True), {"x": X}, lambda x: x.sum(1, keepdims=True)),
    ("mean", lambda x: gc.mean(x, axis=0), {"x": X}, lambda x: x.mean(0)),
    ("max", lambda x: gc.max(x, axis=-1), {"x": X}, lambda x: x.max(-1)),
    ("min", lambda x: gc.min(x, axis=(0, 1)), {"x": X}, lambda x: x.min((0, 1))),
    ("conv2d", lambda x: gc.conv2d(x, W, B4, stride=1, padding=1), {"x": IMG},
     lambda x: _conv(x, W, B4, 1, 1)),
    ("conv2d_stride", lambda x: gc.conv2d(x, W, B4, stride=2), {"x": IMG}, lambda x: _conv(x, W, B4, 2, 0)),
    ("max_pool2d", lambda x: gc.max_pool2d(x, 2), {"x": IMG}, lambda x: _pool(x, 2, np.max)),
    ("avg_pool2d", lambda x: gc.avg_pool2d(x, 2), {"x": IMG}, lambda x: _pool(x, 2, np.mean)),
    ("batch_norm", lambda x: gc.batch_norm(x, B4[:3] ** 2, P[0, :3], P[1, :3], B4[1:]),
     {"x": IMG}, lambda x: ((x - (B4[:3] ** 2)[:, None, None]) / np.sqrt(P[0, :3][:, None, None] + 1e-5)
                            * P[1, :3][:, None, None] + B4[1:][:, None, None])),
    ("layer_norm", lambda x: gc.layer_norm(x, 4, P[0], B4), {"x": X},
     lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * P[0] + B4),
    ("dropout_eval", lambda x: gc.dropout(x, 0.3, training=False), {"x": X}, lambda x: x),
    ("embedding", lambda i: gc.embedding(i, M), {"i": np.array([[0, 3], [2, 1]], np.int64)}, lambda i: M[i]),
    ("cast", lambda x: gc.cast(x, gc.int64), {"x": X * 3}, lambda x: x.astype(np.int64)),
    ("astype", lambda x: (x > 0).astype("float32"), {"x": X}, lambda x: (x > 0).astype(np.float32)),
]


@pytest.mark.parametrize("name,fn,feeds,ref", CASES, ids=[c[0] for c in CASES])
def test_op_symbolic_capture_matches_numpy(name, fn, feeds, ref):
    model, out = capture_run(fn, feeds)
    expected = ref(*feeds.values())
    np.testing.assert_allclose(out["output"], expected, rtol=1e-4, atol=1e-5)
    assert model.outputs[0].dtype == gc.TensorSpec(dtype=out["output"].dtype).dtype  # inferred = actual


@pytest.mark.parametrize("name,fn,feeds,ref", CASES, ids=[c[0] for c in CASES])
def test_op_eager_capture_values(name, fn, feeds, ref):
    seen = {}

    def probe(*args):
        out = fn(*args)
        seen["value"] = out.numpy()
        return out

    model = gc.capture(probe, **feeds)
    check(model)
    np.testing.assert_allclose(seen["value"], ref(*feeds.values()), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run_ort(model, feeds)["output"], seen["value"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [17, 18, 20, 21, 23])
def test_opsets_are_honoured(opset):
    def f(x):
        return {"g": gc.gelu(x), "m": x.mean(axis=1), "s": x.sum(axis=0), "mx": x.max(axis=1, keepdims=True),
                "ln": gc.layer_norm(x, 4)}

    model, out = capture_run(f, {"x": X}, opset=opset)
    ops = {n.op_type for n in model.ir.graph}
    assert model.opset == opset
    assert ("Gelu" in ops) == (opset >= 20)
    mean_node = next(n for n in model.ir.graph if n.op_type == "ReduceMean")
    assert (len(mean_node.inputs) == 2) == (opset >= 18)
    np.testing.assert_allclose(out["g"], 0.5 * X * (1 + _erf(X / np.sqrt(2))), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["m"], X.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["mx"], X.max(1, keepdims=True))


def test_operators_and_scalar_promotion():
    def f(x, y):
        return (2 * x + y - 1) / (abs(y) + 1) - x ** 2 + (-x), (x < y), (x >= 0.5) & (y != 0), 3 - x

    model, out = capture_run(f, {"x": X, "y": Y})
    np.testing.assert_allclose(out["output_0"], (2 * X + Y - 1) / (np.abs(Y) + 1) - X ** 2 - X, rtol=1e-5)
    np.testing.assert_array_equal(out["output_1"], X < Y)
    np.testing.assert_array_equal(out["output_2"], (X >= 0.5) & (Y != 0))
    np.testing.assert_allclose(out["output_3"], 3 - X)
    assert [o.dtype for o in model.outputs] == ["float32", "bool", "bool", "float32"]


def test_int_tensor_scalar_promotion():
    model, out = capture_run(lambda i: i * 2 + 1, {"i": np.arange(6, dtype=np.int32).reshape(3, 2)})
    assert model.outputs[0].dtype == "int32"
    np.testing.assert_array_equal(out["output"], np.arange(6).reshape(3, 2) * 2 + 1)


@pytest.mark.parametrize("index", [
    (slice(None), 1), (0,), (slice(1, 3),), (Ellipsis, -1), (None, slice(None), slice(None, None, -1)),
    (slice(None), None, slice(0, 4, 2)), (-1, slice(1, None)),
], ids=str)
def test_indexing(index):
    x = rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    model, out = capture_run(lambda x: x[index], {"x": x})
    np.testing.assert_array_equal(out["output"], x[index])


def test_tensor_methods():
    def f(x):
        return {"r": x.reshape(2, 6), "t": x.transpose(), "t2": x.transpose(0, 1), "s": x.sum(), "m": x.mean(0),
                "mx": x.max(axis=1, keepdims=True), "mn": x.min(), "f": x.flatten()}

    model = gc.capture(f, x=X)
    out = run_ort(check(model) and model, {"x": X})
    np.testing.assert_allclose(out["r"], X.reshape(2, 6))
    np.testing.assert_allclose(out["t"], X.T)
    np.testing.assert_allclose(out["t2"], X.T)
    np.testing.assert_allclose(out["s"], X.sum(), rtol=1e-5)
    np.testing.assert_allclose(out["m"], X.mean(0), rtol=1e-5)
    np.testing.assert_allclose(out["mx"], X.max(1, keepdims=True))
    np.testing.assert_allclose(out["mn"], X.min())
    np.testing.assert_allclose(out["f"], X.reshape(-1))
    assert model.inputs[0].shape == (3, 4)


def test_shape_and_dtype_properties():
    seen = {}

    def f(x):
        seen["shape"], seen["dtype"], seen["T"] = x.shape, x.dtype, x.T.shape
        return x.reshape("N", 2, -1)

    model = gc.capture(f, x=gc.spec("float32", ("N", 8)))
    assert seen == {"shape": ("N", 8), "dtype": "float32", "T": (8, "N")}
    assert model.outputs[0].shape == ("N", 2, 4)


def test_torch_functional_parity():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    pairs = [
        (lambda x: gc.gelu(x), lambda t: F.gelu(t)),
        (lambda x: gc.log_softmax(x, 1), lambda t: F.log_softmax(t, 1)),
        (lambda x: gc.conv2d(x, W, B4, padding=1), lambda t: F.conv2d(t, torch.from_numpy(W), torch.from_numpy(B4),
                                                                      padding=1)),
        (lambda x: gc.max_pool2d(x, 3, stride=2, padding=1), lambda t: F.max_pool2d(t, 3, 2, 1)),
        (lambda x: gc.avg_pool2d(x, 2), lambda t: F.avg_pool2d(t, 2)),
        (lambda x: gc.layer_norm(x, (8,)), lambda t: F.layer_norm(t, (8,))),
    ]
    for fn, tfn in pairs:
        model, out = capture_run(fn, {"x": IMG})
        np.testing.assert_allclose(out["output"], tfn(torch.from_numpy(IMG)).numpy(), rtol=1e-4, atol=1e-5)


def _torch_refs(torch):
    F = torch.nn.functional
    t = torch.from_numpy
    return {
        "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
        "abs": torch.abs, "softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: F.log_softmax(x, 1),
        "matmul": torch.matmul, "matmul_op": lambda x: x @ t(M), "concat": lambda x, y: torch.cat([x, y], 1),
        "stack": lambda x, y: torch.stack([x, y], 1), "reshape": lambda x: x.reshape(-1, 2, 2),
        "reshape_flat": lambda x: x.reshape(-1), "transpose": lambda x: x.T, "T": lambda x: x.T,
        "where": torch.where, "maximum": torch.maximum, "minimum": torch.minimum,
        "clip": lambda x: torch.clamp(x, -0.5, 0.5), "sum_all": torch.sum,
        "sum_axis": lambda x: x.sum(1, keepdim=True), "mean": lambda x: x.mean(0),
        "max": lambda x: x.max(-1).values, "min": lambda x: x.amin((0, 1)),
        "conv2d": lambda x: F.conv2d(x, t(W), t(B4), padding=1), "conv2d_stride": lambda x: F.conv2d(x, t(W), t(B4), stride=2),
        "max_pool2d": lambda x: F.max_pool2d(x, 2), "avg_pool2d": lambda x: F.avg_pool2d(x, 2),
        "batch_norm": lambda x: F.batch_norm(x, t(B4[:3] ** 2), t(P[0, :3]), t(P[1, :3]), t(B4[1:])),
        "layer_norm": lambda x: F.layer_norm(x, (4,), t(P[0]), t(B4)),
        "dropout_eval": lambda x: F.dropout(x, 0.3, training=False), "embedding": lambda i: F.embedding(i, t(M)),
        "cast": lambda x: x.to(torch.int64), "astype": lambda x: (x > 0).to(torch.float32),
    }


@pytest.mark.parametrize("name,fn,feeds,ref", CASES, ids=[c[0] for c in CASES])
def test_op_matches_torch(name, fn, feeds, ref):
    torch = pytest.importorskip("torch")
    model, out = capture_run(fn, feeds)
    with torch.no_grad():
        expected = _torch_refs(torch)[name](*(torch.from_numpy(v) for v in feeds.values()))
    np.testing.assert_allclose(out["output"], expected.numpy(), rtol=1e-4, atol=1e-5)


def test_dropout_drops_by_default_as_torchs():
    """``F.dropout(x, p)`` is torch's ``training=True``: about p of the values become 0, the rest 1/(1-p)."""
    x = np.ones((100, 100), np.float32)
    for fn in (gc.dropout, gc.nn.functional.dropout):
        out = gc.Session(gc.capture(lambda x: fn(x, 0.5), x=x), backend="numpy").run({"x": x})["output"]
        assert 0.4 < (out == 0).mean() < 0.6 and set(np.unique(out)) == {0.0, 2.0}


def test_squeeze_of_a_dim_that_is_not_1_keeps_it_as_torch():
    x = X.reshape(3, 1, 4)
    model = gc.capture(lambda x: {"kept": x.squeeze(2), "one": x.squeeze(1), "f": gc.nn.functional.squeeze(x, [0, 1])},
                       x=x)
    out = run_ort(model, {"x": x})
    assert out["kept"].shape == (3, 1, 4) and out["one"].shape == (3, 4) and out["f"].shape == (3, 4)


def test_sum_of_bools_counts_as_int64_as_torch():
    model = gc.capture(lambda x: {"all": (x > 0).sum(), "rows": gc.sum(x > 0, 1)}, x=X)
    out = run_ort(model, {"x": X})
    assert out["all"].dtype == np.int64 and out["all"] == (X > 0).sum()
    np.testing.assert_array_equal(out["rows"], (X > 0).sum(1))


def test_example_values_that_overflow_capture_without_warnings():
    """inf and NaN on example values are ONNX results, as in a Session's run: no RuntimeWarning
    (which ``-W error`` made a CaptureError) and the same values."""
    import warnings

    x = np.array([1000.0, 0.0, -1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = gc.capture(lambda x: gc.exp(x) / x, x=x)
    got = gc.Session(model, backend="numpy").run({"x": x})["output"]
    np.testing.assert_array_equal(got[:2], [np.inf, np.inf])  # overflow, division by zero
    np.testing.assert_allclose(got[2], -np.exp(-1.0), rtol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda M, x: M.cat([x[:, 4:].reshape(0, 3), x[:2, 1:]], 0),  # a 0 in the shape is a size, not ONNX's copy
    lambda M, x: M.cat([x[:0, :, None, None].flatten(-2), x[:, :, None]], 0),  # flattening an empty tensor: no -1
    lambda M, x: M.cat([x[:0].flatten(1), x[1:].flatten(1)], 0),
], ids=["reshape_to_0", "flatten_empty_last", "flatten_empty_first"])
def test_empty_tensors_reshape_and_flatten_as_torch(fn):
    """Found by the grad fuzz: Reshape of a [3, 0] to (0, 3) copied x's 3, and flatten of a [0, 4, 1, 1] asked
    Reshape for (0, 4, -1); the values and gradients against torch, on numpy and ort-cpu."""
    from torch_grad_util import assert_input_grad_matches_torch

    pytest.importorskip("torch")
    assert_input_grad_matches_torch(fn, np.random.default_rng(0).standard_normal((3, 4)), {}, np.random.default_rng(1))
