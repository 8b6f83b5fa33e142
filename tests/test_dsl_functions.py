"""The torch-named DSL functions (issue 12): each captured, checked by the full ONNX checker and
run on the numpy and ort-cpu backends against a numpy formula; with torch installed, outputs and
``gc.grad`` gradients against torch's same call."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F
try:
    from dsl_util import softmax
    from torch_grad_util import TorchNS, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import softmax
    from tests.torch_grad_util import TorchNS, gc_grads, run_both

R = np.random.default_rng(5)
X = R.standard_normal((2, 3, 4)).astype(np.float32)
SQ = R.standard_normal((2, 4, 4)).astype(np.float32)
IMG = R.standard_normal((1, 2, 3, 4)).astype(np.float32)
IDX = np.array([[[0, 3], [1, 1], [2, 0]], [[3, 3], [0, 2], [1, 0]]], np.int64)
SEL = np.array([2, 0], np.int64)
Q = R.standard_normal((2, 2, 5, 4)).astype(np.float32)
MASK = R.random((5, 5)) > 0.3
np.fill_diagonal(MASK, True)
DEAD_ROW = MASK.copy()
DEAD_ROW[1] = False  # query 1 attends to no key: torch gives it zeros (and a zero gradient)
ZERO_ROW = X.copy()
ZERO_ROW[0, 1] = 0  # normalize's gradient there is finite in torch (1/eps), not nan
IMG_5X10 = np.random.default_rng(7).standard_normal((1, 2, 5, 10)).astype(np.float32)
NEG = np.zeros(X.shape, bool)
NEG[0, :, 1], NEG[1, 0] = True, True  # x[0, :, 1] all -inf: its logsumexp is -inf, as torch's


def _attention(q, k, v, mask):
    """Rows that attend to no key give zeros."""
    s = np.where(mask, q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]), -np.inf)
    with np.errstate(invalid="ignore"):
        return np.where(mask.any(-1)[:, None], softmax(s) @ v, 0)


def _scatter_add(x, i):
    out = x.copy()
    for a, b, c in np.ndindex(i.shape):
        out[a, b, i[a, b, c]] += x[a, b, c]
    return out


# (id, fn(M, x, *rest), x, rest (graph inputs, not differentiated), numpy reference or None)
CASES = [
    ("pad", lambda M, x: M.pad(x, (1, 2), value=0.5), X, {}, lambda x: np.pad(x, [(0, 0), (0, 0), (1, 2)],
                                                                              constant_values=0.5)),
    ("pad_reflect", lambda M, x: M.pad(x, (1, 1, 2, 0), mode="reflect"), X, {},
     lambda x: np.pad(x, [(0, 0), (2, 0), (1, 1)], mode="reflect")),
    ("pad_replicate", lambda M, x: M.pad(x, (2, 1), mode="replicate"), X, {},
     lambda x: np.pad(x, [(0, 0), (0, 0), (2, 1)], mode="edge")),
    ("pad_circular", lambda M, x: M.pad(x, (1, 2), mode="circular"), X, {},
     lambda x: np.pad(x, [(0, 0), (0, 0), (1, 2)], mode="wrap")),
    ("split", lambda M, x: M.split(x, 3, dim=2)[1], X, {}, lambda x: x[..., 3:]),
    ("split_sections", lambda M, x: M.split(x, [1, 2], dim=1)[1], X, {}, lambda x: x[:, 1:]),
    ("chunk", lambda M, x: M.chunk(x, 2, dim=-1)[0] * M.chunk(x, 2, dim=-1)[1], X, {},
     lambda x: x[..., :2] * x[..., 2:]),
    ("gather", lambda M, x, i: M.gather(x, 2, i), X, {"i": IDX}, lambda x, i: np.take_along_axis(x, i, 2)),
    ("index_select", lambda M, x, i: M.index_select(x, 1, i), X, {"i": SEL}, lambda x, i: x[:, i]),
    ("index_select_0d", lambda M, x, i: M.index_select(x, 1, i), X, {"i": np.array(2)}, lambda x, i: x[:, [i]]),
    ("scatter", lambda M, x, i: M.scatter(x, 2, i, 7.0), X, {"i": IDX}, None),
    ("scatter_add", lambda M, x, i: M.scatter(x, 2, i, x[..., :2], reduce="add"), X, {"i": IDX}, _scatter_add),
    ("cumsum", lambda M, x: M.cumsum(x, 1), X, {}, lambda x: np.cumsum(x, 1)),
    ("einsum", lambda M, x: M.einsum("bij,bkj->bik", x, x * 2.0), X, {}, lambda x: 2 * x @ x.swapaxes(1, 2)),
    ("topk", lambda M, x: M.topk(x, 2, dim=1)[0], X, {}, lambda x: -np.sort(-x, 1)[:, :2]),
    ("topk_smallest", lambda M, x: M.topk(x, 2, largest=False)[0], X, {}, lambda x: np.sort(x, -1)[..., :2]),
    ("masked_fill", lambda M, x: M.masked_fill(x, x > 0.5, -1.0), X, {}, lambda x: np.where(x > 0.5, -1, x)),
    ("expand", lambda M, x: M.expand(x[:, :1], -1, 3, -1) * x, X, {}, lambda x: x[:, :1] * x),
    ("repeat", lambda M, x: M.repeat(x, 1, 2, 1), X, {}, lambda x: np.tile(x, (1, 2, 1))),
    ("repeat_new_dim", lambda M, x: M.repeat(x, 2, 1, 1, 1), X, {}, lambda x: np.tile(x, (2, 1, 1, 1))),
    ("tile", lambda M, x: M.tile(x, (2,)), X, {}, lambda x: np.tile(x, 2)),
    ("triu", lambda M, x: M.triu(x, 1), X, {}, lambda x: np.triu(x, 1)),
    ("tril", lambda M, x: M.tril(x, -1), X, {}, lambda x: np.tril(x, -1)),
    ("flip", lambda M, x: M.flip(x, (0, 2)), X, {}, lambda x: x[::-1, :, ::-1]),
    ("roll", lambda M, x: M.roll(x, (1, -3), (1, 2)), X, {}, lambda x: np.roll(x, (1, -3), (1, 2))),
    ("roll_flat", lambda M, x: M.roll(x, 5), X, {}, lambda x: np.roll(x, 5)),
    ("logsumexp", lambda M, x: M.logsumexp(x * 30.0, 1), X, {},
     lambda x: np.log(np.exp(x * 30.0 - (x * 30).max(1, keepdims=True)).sum(1)) + (x * 30).max(1)),
    ("logsumexp_inf", lambda M, x, m: M.logsumexp(M.masked_fill(x, m, -np.inf), 1), X, {"m": NEG},
     lambda x, m: np.logaddexp.reduce(np.where(m, -np.inf, x), axis=1)),
    ("var", lambda M, x: M.var(x, (0, 2)), X, {}, lambda x: x.var((0, 2), ddof=1)),
    ("std", lambda M, x: M.std(x, 2, correction=0, keepdim=True), X, {}, lambda x: x.std(2, keepdims=True)),
    ("normalize", lambda M, x: M.normalize(x, dim=2), X, {},
     lambda x: x / np.linalg.norm(x, axis=2, keepdims=True)),
    ("normalize_zero_row", lambda M, x: M.normalize(x, dim=2), ZERO_ROW, {},
     lambda x: x / np.maximum(np.linalg.norm(x, axis=2, keepdims=True), 1e-12)),
    ("clamp", lambda M, x: M.clamp(x, -0.5, 0.5), X, {}, lambda x: np.clip(x, -0.5, 0.5)),
    ("clamp_min", lambda M, x: M.clamp(x, min=0.1), X, {}, lambda x: np.maximum(x, 0.1)),
    ("pow", lambda M, x: M.pow(x, 3), X, {}, lambda x: x ** 3),
    ("rsqrt", lambda M, x: M.rsqrt(x * x + 1.0), X, {}, lambda x: 1 / np.sqrt(x * x + 1)),
    ("sin", lambda M, x: M.sin(x), X, {}, np.sin),
    ("cos", lambda M, x: M.cos(x), X, {}, np.cos),
    ("erf", lambda M, x: M.erf(x), X, {}, lambda x: np.vectorize(math.erf)(x).astype(np.float32)),
    ("full_like", lambda M, x: x * M.full_like(x, 2.0) + M.ones_like(x) - M.zeros_like(x), X, {}, lambda x: 2 * x + 1),
    ("interpolate_nearest", lambda M, x: M.interpolate(x, scale_factor=2), IMG, {},
     lambda x: x.repeat(2, 2).repeat(2, 3)),
    ("interpolate_size", lambda M, x: M.interpolate(x, size=(6, 8), mode="nearest"), IMG, {},
     lambda x: x.repeat(2, 2).repeat(2, 3)),
    ("interpolate_bilinear", lambda M, x: M.interpolate(x, scale_factor=2, mode="bilinear"), IMG, {}, None),
    ("interpolate_align", lambda M, x: M.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True), IMG, {},
     None),
    ("interpolate_linear", lambda M, x: M.interpolate(x, size=7, mode="linear"), X, {}, None),
    # 5 * 1.4 and 10 * 0.7: float32 scales would floor to 6 (ONNX) where PyTorch gives 7
    *[(f"interpolate_{mode}_float32_scale_{sf}",
       lambda M, x, mode=mode, sf=sf: M.interpolate(x, scale_factor=sf, mode=mode), IMG_5X10, {}, None)
      for mode in ("nearest", "bilinear") for sf in (1.4, (1.4, 0.7))],
    ("sdpa", lambda M, q: M.scaled_dot_product_attention(q, q * 0.5, q), Q, {},
     lambda q: _attention(q, q * 0.5, q, np.ones((5, 5), bool))),
    ("sdpa_causal", lambda M, q: M.scaled_dot_product_attention(q, q, q, is_causal=True), Q, {},
     lambda q: _attention(q, q, q, np.tril(np.ones((5, 5), bool)))),
    ("sdpa_mask", lambda M, q, m: M.scaled_dot_product_attention(q, q, q, attn_mask=m), Q, {"m": MASK},
     lambda q, m: _attention(q, q, q, m)),
    ("sdpa_dead_row", lambda M, q, m: M.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=m), Q, {"m": DEAD_ROW},
     lambda q, m: _attention(q, q * 0.5, q, m)),
    ("sdpa_float_dead_row", lambda M, q, m: M.scaled_dot_product_attention(q, q, q, attn_mask=m), Q,
     {"m": np.where(DEAD_ROW, 0, -np.inf).astype(np.float32)}, lambda q, m: _attention(q, q, q, m == 0)),
    ("sdpa_scale", lambda M, q: M.scaled_dot_product_attention(q, q, q, scale=0.3), Q[0], {},
     lambda q: softmax(q @ q.swapaxes(-1, -2) * 0.3) @ q),
]
IDS = [c[0] for c in CASES]
NO_TORCH_GRAD = {"scatter_add"}  # torch has no derivative for scatter with a reduce


@pytest.mark.parametrize("name,fn,x,rest,ref", CASES, ids=IDS)
def test_function_matches_numpy(name, fn, x, rest, ref):
    model = gc.capture(lambda x, **kw: fn(F, x, **kw), x=gc.spec("float32", x.shape), **rest)
    onnx.checker.check_model(model.proto, full_check=True)
    out = run_both(model, {"x": x, **rest})["output"]
    if ref is None:
        torch = pytest.importorskip("torch")
        ref = lambda x, **kw: _torch(torch, fn, x, kw)[0]  # noqa: E731
    np.testing.assert_allclose(out, ref(x, **rest), rtol=1e-4, atol=1e-5)


def _torch(torch, fn, x, rest, c=None):
    xt = torch.tensor(x, requires_grad=True)
    out = fn(TorchNS(torch), xt, **{k: torch.from_numpy(np.asarray(v)) for k, v in rest.items()})
    if c is not None:
        (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), (None if xt.grad is None else xt.grad.numpy())


@pytest.mark.parametrize("name,fn,x,rest,ref", CASES, ids=IDS)
def test_function_and_gradient_match_torch(name, fn, x, rest, ref):
    torch = pytest.importorskip("torch")
    if name in NO_TORCH_GRAD:
        pytest.skip("torch cannot differentiate it")
    out, _ = _torch(torch, fn, x, rest)
    c = R.standard_normal(out.shape).astype(np.float32)
    expected, dx = _torch(torch, fn, x, rest, c)
    got = gc_grads(lambda M, x, **kw: fn(M, x, **kw), {"x": x}, rest, c)
    np.testing.assert_allclose(got["out"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["x"], dx, rtol=1e-4, atol=1e-4)


def test_integer_and_bool_results():
    def fn(x):
        i = F.argmax(x, 2)
        return {"argmax": i, "argmin": F.argmin(x, 1, keepdim=True), "argmax_all": F.argmax(x),
                "one_hot": F.one_hot(i, 5), "arange": F.arange(1, 7, 2), "farange": F.arange(0.0, 1.0, 0.25),
                "zeros": F.zeros(2, 3, dtype="int64"), "ones": F.ones((2,)), "full": F.full((2, 2), True),
                "masked": F.masked_fill(i, i > 1, -1), "cumsum": F.cumsum(i, 1), "topk": F.topk(x, 1)[1],
                "triu": F.triu(F.one_hot(i, 4)), "pow": F.pow(2.0, x), "one_hot_0d": F.one_hot(F.argmax(x), 30)}
    model = gc.capture(fn, x=gc.spec("float32", ("N", 3, 4)))
    onnx.checker.check_model(model.proto, full_check=True)
    out = run_both(model, {"x": X})
    i = X.argmax(2)
    expected = {"argmax": i, "argmin": X.argmin(1)[:, None], "argmax_all": np.int64(X.argmax()),
                "one_hot": np.eye(5, dtype=np.int64)[i], "arange": np.arange(1, 7, 2),
                "farange": np.arange(0, 1, 0.25, dtype=np.float32), "zeros": np.zeros((2, 3), np.int64),
                "ones": np.ones(2, np.float32), "full": np.ones((2, 2), bool), "masked": np.where(i > 1, -1, i),
                "cumsum": np.cumsum(i, 1), "topk": X.argmax(-1)[..., None], "triu": np.triu(np.eye(4, dtype=np.int64)[i]),
                "pow": 2.0 ** X, "one_hot_0d": np.eye(30, dtype=np.int64)[X.argmax()]}
    for k, v in expected.items():
        assert out[k].dtype == np.asarray(v).dtype, k
        np.testing.assert_allclose(out[k], v, rtol=1e-5, err_msg=k)


def test_symbolic_batch_dims():
    def fn(x):
        a, b = F.chunk(x, 2, dim=-1)
        return F.zeros_like(a) + F.expand(F.cumsum(b, 1)[:, :1], "N", 3, 2) + F.pad(a, (0, 0, 0, 0))
    model = gc.capture(fn, x=gc.spec("float32", ("N", 3, 4)))
    assert [d for d in model.outputs[0].shape] == ["N", 3, 2]
    out = run_both(model, {"x": X})["output"]
    np.testing.assert_allclose(out, np.broadcast_to(X[:, :1, 2:], (2, 3, 2)) + X[..., :2], rtol=1e-6)


def test_attention_op_from_opset_23():
    model = gc.capture(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), q=Q, opset=23)
    assert [n.op_type for n in model.ir.graph].count("Attention") == 1
    out = run_both(model, {"q": Q})["output"]
    np.testing.assert_allclose(out, _attention(Q, Q, Q, np.tril(np.ones((5, 5), bool))), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("call,message", [
    (lambda x: F.split(x, [1, 1], dim=1), "do not add up"),
    (lambda x: F.masked_fill(x, x, 0.0), "must be bool"),
    (lambda x: F.gather(x, 1, x), "index must be int64"),
    (lambda x: F.pad(x, (1,)), "pairs"),
    (lambda x: F.pad(x, (1, 1), mode="mirror"), "pad mode"),
    (lambda x: F.zeros("M", 3), r"size \('M', 3\): expected ints >= 0 or dim names of the captured inputs"),
    (lambda x: F.interpolate(x, size=2, scale_factor=2.0), "exactly one"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=gc.spec("float32", ("N", 3, 4)))
    assert "test_dsl_functions.py" in str(err.value)


def test_functional_takes_torch_signatures():
    """``F.softmax(x, dim=...)`` and the losses under ``torch.nn.functional``'s names."""
    labels = np.array([[0, 3, 1], [2, 2, 0]], np.int64)

    def fn(x, y):
        return {"softmax": F.softmax(x, dim=1), "log_softmax": F.log_softmax(x, dim=-1),
                "ce": F.cross_entropy(x.transpose(0, 2, 1), y, label_smoothing=0.1), "mse": F.mse_loss(x, x * 0.5)}
    out = run_both(gc.capture(fn, x=X[:, :, :4], y=labels), {"x": X, "y": labels})
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(out["softmax"], e / e.sum(1, keepdims=True), rtol=1e-5)
    lsm = X - X.max(-1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(-1, keepdims=True))
    np.testing.assert_allclose(out["log_softmax"], lsm, rtol=1e-5, atol=1e-6)
    picked = np.take_along_axis(lsm, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(out["ce"], np.mean(-0.9 * picked - 0.1 * lsm.mean(-1)), rtol=1e-5)
    np.testing.assert_allclose(out["mse"], np.mean((X * 0.5) ** 2), rtol=1e-5)


def test_torch_tensor_methods():
    def fn(x):
        b, t, c = x.size()
        y = x.view(b, t * c).view(b, t, c).permute(2, 0, 1).contiguous()
        assert (x.size(-1), x.dim()) == (4, 3)
        return {"y": y, "u": x.unsqueeze(1).squeeze(1).float().mean(1),
                "m": x.masked_fill(x > 0, 0.0).pow(2).clamp(max=1.0), "l": x.argmax(-1).long(),
                "s": gc.cat(x.split(2, dim=2)[::-1], dim=2), "c": x.chunk(2, 1)[0].tril().cumsum(1),
                "p": gc.permute(x, (1, 0, 2)), "f": F.unsqueeze(F.squeeze(x[:, :1], 1), 0)}
    out = run_both(gc.capture(fn, x=X), {"x": X})
    np.testing.assert_allclose(out["y"], X.transpose(2, 0, 1))
    np.testing.assert_allclose(out["u"], X.mean(1), rtol=1e-6)
    np.testing.assert_allclose(out["m"], np.minimum(np.where(X > 0, 0, X) ** 2, 1), rtol=1e-6)
    np.testing.assert_array_equal(out["l"], X.argmax(-1))
    np.testing.assert_allclose(out["s"], np.concatenate([X[..., 2:], X[..., :2]], 2))
    np.testing.assert_allclose(out["c"], np.cumsum(np.tril(X[:, :2]), 1), rtol=1e-6)
    np.testing.assert_allclose(out["p"], X.transpose(1, 0, 2))
    np.testing.assert_allclose(out["f"], X[None, :, 0])


def test_opset_23_ops_differentiate_as_their_decompositions():
    """``Attention`` and ``RMSNormalization`` (opset 23) against the ops they are written out in
    before: same outputs and same ``gc.grad`` gradients (autodiff expands their function bodies)."""
    w = R.standard_normal(4).astype(np.float32)
    cases = [(lambda M, q: M.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True), Q),
             (lambda M, x, w: M.rms_norm(x, 4, w, eps=1e-5), X)]
    for fn, x in cases:
        extra = {"w": w} if fn.__code__.co_argcount == 3 else {}
        c = R.standard_normal(x.shape).astype(np.float32)
        new, old = (gc_grads(fn, {"x": x, **extra}, {}, c, opset=opset) for opset in (23, 21))
        for k, v in old.items():
            np.testing.assert_allclose(new[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
