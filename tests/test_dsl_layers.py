"""Every gc.nn layer: captured, full ONNX check, onnxruntime CPU vs a numpy formula with the
captured weights, and vs torch.nn with the same weights where torch is installed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
from graphc import nn
try:
    from dsl_util import check, rng, run_ort, softmax
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import check, rng, run_ort, softmax

R = rng(3)
X2 = R.standard_normal((4, 6)).astype(np.float32)
X3 = R.standard_normal((2, 5, 8)).astype(np.float32)
IMG = R.standard_normal((2, 3, 8, 8)).astype(np.float32)
VOL = R.standard_normal((2, 3, 3, 4, 4)).astype(np.float32)
TOK = np.array([[1, 4, 0], [9, 2, 2]], np.int64)


def _erf(x):
    return np.vectorize(math.erf)(x)


def _mha(x, p, heads):
    n, length, e = x.shape
    d = e // heads
    w, b = p["in_proj_weight"], p["in_proj_bias"]
    q, k, v = (x @ w[i * e:(i + 1) * e].T + b[i * e:(i + 1) * e] for i in range(3))
    split = lambda t: t.reshape(n, length, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    att = softmax(split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(d))
    out = (att @ split(v)).transpose(0, 2, 1, 3).reshape(n, length, e)
    return out @ p["out_proj.weight"].T + p["out_proj.bias"], att.mean(1)


def _bn(x, p):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((x - p["running_mean"].reshape(shape)) / np.sqrt(p["running_var"].reshape(shape) + 1e-5)
            * p["weight"].reshape(shape) + p["bias"].reshape(shape))


# (id, layer factory, input, numpy reference f(x, params), torch factory)
CASES = [
    ("Linear", lambda: nn.Linear(6, 3), X2, lambda x, p: x @ p["weight"].T + p["bias"], "Linear(6, 3)"),
    ("Linear3d", lambda: nn.Linear(8, 2, bias=False), X3, lambda x, p: x @ p["weight"].T, "Linear(8, 2, bias=False)"),
    ("Conv2d", lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), IMG, None, "Conv2d(3, 4, 3, stride=2, padding=1)"),
    ("Conv2dGroups", lambda: nn.Conv2d(3, 6, (3, 1), groups=3, bias=False), IMG, None,
     "Conv2d(3, 6, (3, 1), groups=3, bias=False)"),
    ("MaxPool2d", lambda: nn.MaxPool2d(2), IMG,
     lambda x, p: x.reshape(2, 3, 4, 2, 4, 2).max((3, 5)), "MaxPool2d(2)"),
    ("AvgPool2d", lambda: nn.AvgPool2d(2), IMG, lambda x, p: x.reshape(2, 3, 4, 2, 4, 2).mean((3, 5)), "AvgPool2d(2)"),
    ("AdaptiveAvgPool2d1", lambda: nn.AdaptiveAvgPool2d(1), IMG, lambda x, p: x.mean((2, 3), keepdims=True),
     "AdaptiveAvgPool2d(1)"),
    ("AdaptiveAvgPool2d2", lambda: nn.AdaptiveAvgPool2d((2, 4)), IMG,
     lambda x, p: x.reshape(2, 3, 2, 4, 4, 2).mean((3, 5)), "AdaptiveAvgPool2d((2, 4))"),
    ("AdaptiveAvgPool2dNone", lambda: nn.AdaptiveAvgPool2d((None, 2)), IMG,
     lambda x, p: x.reshape(2, 3, 8, 2, 4).mean(4), "AdaptiveAvgPool2d((None, 2))"),
    ("BatchNorm1d", lambda: nn.BatchNorm1d(6), X2, _bn, "BatchNorm1d(6)"),
    ("BatchNorm2d", lambda: nn.BatchNorm2d(3), IMG, _bn, "BatchNorm2d(3)"),
    ("BatchNorm3d", lambda: nn.BatchNorm3d(3), VOL, _bn, "BatchNorm3d(3)"),
    ("LayerNorm", lambda: nn.LayerNorm(8), X3,
     lambda x, p: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * p["weight"] + p["bias"],
     "LayerNorm(8)"),
    ("Dropout", lambda: nn.Dropout(0.5), X2, lambda x, p: x, "Dropout(0.5)"),
    ("Embedding", lambda: nn.Embedding(10, 4), TOK, lambda x, p: p["weight"][x], "Embedding(10, 4)"),
    ("ReLU", nn.ReLU, X2, lambda x, p: np.maximum(x, 0), "ReLU()"),
    ("GELU", nn.GELU, X2, lambda x, p: 0.5 * x * (1 + _erf(x / math.sqrt(2))), "GELU()"),
    ("Sigmoid", nn.Sigmoid, X2, lambda x, p: 1 / (1 + np.exp(-x)), "Sigmoid()"),
    ("Tanh", nn.Tanh, X2, lambda x, p: np.tanh(x), "Tanh()"),
    ("Softmax", lambda: nn.Softmax(dim=1), X2, lambda x, p: softmax(x, 1), "Softmax(dim=1)"),
    ("Flatten", nn.Flatten, IMG, lambda x, p: x.reshape(2, -1), "Flatten()"),
    ("Sequential", lambda: nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)), X2,
     lambda x, p: np.maximum(x @ p["0.weight"].T + p["0.bias"], 0) @ p["2.weight"].T + p["2.bias"],
     "Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))"),
    ("MultiheadAttention", lambda: _First(nn.MultiheadAttention(8, 2, batch_first=True)), X3,
     lambda x, p: _mha(x, {k.removeprefix("m."): v for k, v in p.items()}, 2)[0], None),
]


class _First(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x, x, x)[0]


def _capture(layer, x, **kw):
    spec = gc.spec(x.dtype, ("N", *x.shape[1:]))
    model = gc.capture(layer, x=spec, **kw)
    check(model)
    return model


@pytest.mark.parametrize("name,factory,x,ref,torch_ctor", CASES, ids=[c[0] for c in CASES])
def test_layer_matches_numpy(name, factory, x, ref, torch_ctor):
    layer = factory()
    if name.startswith("BatchNorm"):
        layer.running_mean.data = R.standard_normal(layer.num_features)
        layer.running_var.data = R.random(layer.num_features) + 0.5
        layer.weight.data = R.standard_normal(layer.num_features)
    model = _capture(layer, x, seed=7)
    out = run_ort(model, {"x": x})["output"]
    if ref is None:
        torch = pytest.importorskip("torch")
        ref = lambda x, p: _torch_layer(torch, torch_ctor, p)(torch.from_numpy(x)).detach().numpy()  # noqa: E731
    np.testing.assert_allclose(out, ref(x, model.params), rtol=1e-4, atol=1e-5)


def _torch_layer(torch, ctor, params):
    layer = eval(f"torch.nn.{ctor}" if not ctor.startswith("Sequential") else f"torch.nn.{ctor}")  # noqa: S307
    state = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}
    layer.load_state_dict(state, strict=False)
    return layer.eval()


@pytest.mark.parametrize("name,factory,x,ref,torch_ctor", [c for c in CASES if c[4]], ids=[c[0] for c in CASES if c[4]])
def test_layer_matches_torch(name, factory, x, ref, torch_ctor):
    torch = pytest.importorskip("torch")
    model = _capture(factory(), x, seed=1)
    layer = _torch_layer(torch, torch_ctor, model.params)
    # parameter names and layouts are PyTorch's
    torch_names = {k for k in layer.state_dict() if not k.endswith("num_batches_tracked")}
    assert set(model.ir.graph.initializers) == torch_names
    for k, v in layer.state_dict().items():
        if k in model.params:
            assert tuple(v.shape) == model.params[k].shape
    with torch.no_grad():
        expected = layer(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run_ort(model, {"x": x})["output"], expected, rtol=1e-4, atol=1e-5)


def test_ceil_mode_pools_declare_the_shape_onnxruntime_computes():
    """A ceil_mode pool drops a last window that would start in the right padding (7 wide,
    kernel 4, stride 3, pads 2: 3 windows; onnx 1.23's inference says 4): the declared shapes, a
    ``ones_like`` of the pool and a product with a tensor of the pooled shape (refused before)
    agree with what onnxruntime computes, also after ``gc.optimize``; the pools are written in
    floor mode (the same windows), so onnx's checker and onnxruntime's own inference, which keep
    that window, agree too (a Linear after the Flatten failed to load)."""
    x, y = R.standard_normal((1, 2, 7, 7)).astype(np.float32), np.ones((1, 2, 3, 3), np.float32)
    fc = nn.Linear(18, 5)

    def pools(x, y):
        avg, big = gc.avg_pool2d(x, 4, 3, 2, ceil_mode=True) * y, gc.max_pool2d(x, 4, 3, 2, ceil_mode=True)
        return {"avg": avg, "max": big, "ones": gc.ones_like(big), "fc": fc(big.flatten(1))}

    model = gc.capture(pools, x=gc.spec("float32", x.shape), y=gc.spec("float32", y.shape))
    check(model)
    for m in (model, gc.optimize(model, level=2)):
        out = run_ort(m, {"x": x, "y": y})
        assert {o.name: o.shape for o in m.outputs} == {k: v.shape for k, v in out.items()}
        assert out["ones"].shape == out["max"].shape == (1, 2, 3, 3) and out["fc"].shape == (1, 5)


def test_multihead_attention_matches_torch():
    torch = pytest.importorskip("torch")
    for batch_first in (True, False):
        layer = nn.MultiheadAttention(8, 2, batch_first=batch_first)

        class Both(nn.Module):
            def __init__(self):
                super().__init__()
                self.attn = layer

            def forward(self, q, k):
                return self.attn(q, k, k)

        q = X3 if batch_first else X3.transpose(1, 0, 2).copy()
        k = (X3[:, :3] * 2 if batch_first else (X3[:, :3] * 2).transpose(1, 0, 2)).copy()
        model = gc.capture(Both(), q=q, k=k, seed=3)
        check(model)
        out = run_ort(model, {"q": q, "k": k})
        tl = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)
        tl.load_state_dict({n.removeprefix("attn."): torch.from_numpy(v) for n, v in model.params.items()})
        with torch.no_grad():
            ref_out, ref_w = tl(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k))
        np.testing.assert_allclose(out["output_0"], ref_out.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["output_1"], ref_w.numpy(), rtol=1e-4, atol=1e-5)


def test_batchnorm_training_mode_node():
    for training in (False, True):
        model = _capture(nn.Sequential(nn.BatchNorm2d(3), nn.Dropout(0.2)), IMG, training=training)
        bn = next(n for n in model.ir.graph if n.op_type == "BatchNormalization")
        assert bn.attributes["training_mode"].value == int(training)
        assert len(bn.outputs) == (3 if training else 1)
        drop = next(n for n in model.ir.graph if n.op_type == "Dropout")
        assert drop.inputs[2].const_value is None  # a Constant node, not an initializer
        assert "graphc.buffers" in model.ir.metadata_props
        assert set(model.ir.metadata_props["graphc.buffers"].split(",")) == {"0.running_mean", "0.running_var"}


def test_batchnorm_captured_in_training_mode_runs_on_batch_statistics():
    bn = nn.BatchNorm2d(3)
    model = _capture(bn, IMG * 2 + 1, training=True)
    want = (IMG - IMG.mean((0, 2, 3), keepdims=True)) / np.sqrt(IMG.var((0, 2, 3), keepdims=True) + 1e-5)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": IMG * 2 + 1})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=backend)


def test_default_initialisation_follows_pytorch():
    net = nn.Sequential(nn.Linear(100, 50), nn.Conv2d(4, 8, 3), nn.Embedding(20, 6), nn.LayerNorm(5),
                        nn.BatchNorm2d(8))
    net.init_parameters(seed=0)
    sd = net.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "3.weight", "3.bias",
                        "4.weight", "4.bias", "4.running_mean", "4.running_var", "4.num_batches_tracked"]
    assert np.abs(sd["0.weight"]).max() <= 1 / math.sqrt(100) and np.abs(sd["0.weight"]).max() > 0.09
    assert np.abs(sd["0.bias"]).max() <= 1 / math.sqrt(100)
    assert np.abs(sd["1.weight"]).max() <= 1 / math.sqrt(36)
    assert 0.8 < sd["2.weight"].std() < 1.2
    assert (sd["3.weight"] == 1).all() and (sd["3.bias"] == 0).all()
    assert (sd["4.running_var"] == 1).all() and (sd["4.running_mean"] == 0).all()
    # the draws come from numpy.random.default_rng(seed) in definition order
    expected = np.random.default_rng(0).uniform(-0.1, 0.1, size=(50, 100)).astype(np.float32)
    np.testing.assert_array_equal(sd["0.weight"], expected)
    assert all(v.dtype == np.float32 for k, v in sd.items() if k != "4.num_batches_tracked")
    assert sd["4.num_batches_tracked"].dtype == np.int64 and sd["4.num_batches_tracked"].shape == ()


def test_seed_draws_a_fresh_modules_params_which_later_captures_and_user_values_keep():
    def fresh(seed, layer=None):
        layer = layer or nn.Linear(4, 3)
        return layer, gc.capture(layer, x=gc.spec("float32", ("N", 4)), seed=seed).params

    _, a = fresh(1)
    _, b = fresh(1)
    layer, c = fresh(2)
    np.testing.assert_array_equal(a["weight"], b["weight"])
    assert not np.array_equal(a["weight"], c["weight"])
    # the module holds what it drew: a recapture under another seed does not redraw it ...
    np.testing.assert_array_equal(fresh(3, layer)[1]["weight"], c["weight"])
    # ... nor what init_parameters drew (a capture at the default seed overwrote it before)
    layer.init_parameters(seed=1)
    np.testing.assert_array_equal(fresh(0, layer)[1]["weight"], a["weight"])
    layer.weight.data = np.ones((3, 4))
    np.testing.assert_array_equal(fresh(3, layer)[1]["weight"], np.ones((3, 4), np.float32))


def test_module_registration_and_names():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(np.full(3, 2.0, np.float32))
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(x) * self.scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.head = nn.Linear(3, 1)

        def forward(self, x):
            return self.head(self.block(x))

    net = Net()
    model = gc.capture(net, x=gc.spec("float32", ("N", 3)))
    check(model)
    assert set(model.ir.graph.initializers) == {"block.scale", "block.fc.weight", "block.fc.bias", "head.weight",
                                                "head.bias"}
    assert [n for n, _ in net.named_parameters()] == ["block.scale", "block.fc.weight", "block.fc.bias",
                                                      "head.weight", "head.bias"]
    assert [n.name for n in model.ir.graph][0].startswith("block.fc/")


def test_modules_a_function_closes_over_get_unique_names():
    fc1, fc2 = nn.Linear(4, 3), nn.Linear(3, 2)
    model = gc.capture(lambda x: fc2(gc.relu(fc1(x))), x=gc.spec("float32", ("N", 4)), seed=0)
    check(model)
    assert list(model.ir.graph.initializers) == ["linear.weight", "linear.bias", "linear.weight_1", "linear.bias_1"]
    p = model.params
    out = run_ort(model, {"x": X2[:, :4]})["output"]
    ref = np.maximum(X2[:, :4] @ p["linear.weight"].T + p["linear.bias"], 0) @ p["linear.weight_1"].T + p["linear.bias_1"]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_attention_layers_built_inside_forward():
    """As a Linear built there: MultiheadAttention (and the Transformer layers holding one) set
    its ``out_proj.bias`` init through an attribute that reads as a Tensor inside a capture."""
    spec = gc.spec("float32", X3.shape)
    model = gc.capture(lambda x: nn.MultiheadAttention(8, 2, batch_first=True)(x, x, x)[0], x=spec)
    check(model)
    p = {k.replace("multiheadattention.", "").replace("linear.", "out_proj."): v for k, v in model.params.items()}
    assert not p["out_proj.bias"].any() and not p["in_proj_bias"].any()  # PyTorch's zeros
    np.testing.assert_allclose(run_ort(model, {"x": X3})["output"], _mha(X3, p, 2)[0], rtol=1e-4, atol=1e-5)
    model = gc.capture(lambda x: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)(x), x=spec)
    out = run_ort(model, {"x": X3})["output"]
    np.testing.assert_allclose(out, gc.Session(model, backend="numpy").run({"x": X3})["output"], rtol=1e-4, atol=1e-5)
    assert out.shape == X3.shape


@pytest.mark.parametrize("layer,x,layout", [(nn.BatchNorm1d(3), IMG, r"\(N, C\) or \(N, C, L\)"),
                                            (nn.BatchNorm2d(3), VOL, r"\(N, C, H, W\)"),
                                            (nn.BatchNorm3d(3), IMG, r"\(N, C, D, H, W\)")])
def test_batchnorm_checks_the_rank_of_its_input(layer, x, layout):
    with pytest.raises(gc.GraphError, match=rf"{type(layer).__name__}.*expects a {layout} input, got rank {x.ndim}"):
        gc.capture(layer, x=x)

