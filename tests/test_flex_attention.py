"""``gc.nn.attention.flex_attention`` against torch 2.13's in float64, on the numpy backend and ort-cpu:
masks (causal, sliding window, prefix-LM, a document mask read from a captured tensor, a fully masked row),
score_mods (ALiBi, soft-capping, a learned relative bias), grouped KV heads, the logsumexp; values from
torch's ``flex_attention``, gradients from torch.autograd through its eager reference ``math_attention``
(torch's CPU flex_attention has no backward); symbolic lengths; ``create_mask``; a block trained 3
Trainer steps like torch; the refusals."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.nn.attention.flex_attention import (and_masks, create_block_mask, create_mask, flex_attention, noop_mask,
                                                or_masks)

torch = pytest.importorskip("torch")
from torch.nn.attention import flex_attention as tflex  # noqa: E402

RNG = np.random.default_rng(0)
B, H, Q, KV, E = 2, 4, 5, 6, 3
DOCS = np.array([0, 0, 1, 1, 1, 2])


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def window(b, h, q_idx, kv_idx):
    return q_idx - kv_idx <= 2


def prefix(b, h, q_idx, kv_idx):
    return kv_idx < 2


def no_row_2(b, h, q_idx, kv_idx):
    return (q_idx != 2) & (kv_idx >= b)


def soft_cap(score, b, h, q_idx, kv_idx):
    return (score / 2).tanh() * 2


def alibi(score, b, h, q_idx, kv_idx):
    slope = (h + 1).float() * -0.25  # float32 and the float64 score do not promote in graphc: the user's cast
    return score + slope.to(score.dtype) * (q_idx - kv_idx).to(score.dtype)


def relative_position(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx)  # torch's example: the int64 offsets promote to the score's float dtype


def _document(ids):
    def document(b, h, q_idx, kv_idx):
        return ids[q_idx] == ids[kv_idx]
    return document


def _relative(bias):
    def relative(score, b, h, q_idx, kv_idx):
        return score + bias[q_idx - kv_idx + (KV - 1)]
    return relative


# name -> (score_mod, mask_mod, key heads, whether the loss reads the logsumexp)
CASES = {
    "causal": (None, causal, H, True),
    "sliding_window": (None, "window", H, True),
    "prefix_lm": (None, "prefix", H, True),
    "document": (None, "document", H, True),
    "fully_masked_row": (None, no_row_2, H, False),
    "alibi_causal": (alibi, causal, H, True),
    "soft_cap": (soft_cap, None, H, True),
    "relative_position": (relative_position, causal, H, True),
    "learned_bias": ("relative", None, H, True),
    "gqa": (soft_cap, causal, 2, True),
}


def _mods(case, ns, bias, ids):
    """The case's score_mod and mask_mod, with the learned bias and document ids of ``ns`` (torch or graphc)."""
    score_mod, mask_mod, _, _ = CASES[case]
    masks = {"window": ns_and(ns)(causal, window), "prefix": ns_or(ns)(causal, prefix), "document": _document(ids)}
    return (_relative(bias) if score_mod == "relative" else score_mod), masks.get(mask_mod, mask_mod)


def ns_and(ns):
    return tflex.and_masks if ns is torch else and_masks


def ns_or(ns):
    return tflex.or_masks if ns is torch else or_masks


def _torch_case(case, q, k, v, bias, c, cl):
    """torch's output and logsumexp from flex_attention, and the gradients of ``sum(out c) [+ sum(lse cl)]``
    through torch's eager reference (``math_attention``) with respect to q, k, v and the bias."""
    hop = sys.modules["torch._higher_order_ops.flex_attention"]
    tq, tk, tv, tb = (torch.tensor(a, requires_grad=True) for a in (q, k, v, bias))
    ids = torch.from_numpy(DOCS)
    score_mod, mask_mod = _mods(case, torch, tb, ids)
    gqa = k.shape[1] != q.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # runs unfused without torch.compile
        block = None if mask_mod is None else tflex.create_block_mask(mask_mod, B, H, Q, KV, device="cpu")
        out, lse = tflex.flex_attention(*map(torch.from_numpy, (q, k, v)), block_mask=block, enable_gqa=gqa,
                                        score_mod=_mods(case, torch, tb.detach(), ids)[0], return_lse=True)
    block = tflex.create_block_mask(mask_mod or tflex.noop_mask, B, H, Q, KV, device="cpu")
    ref, lse2, _ = hop.math_attention(tq, tk, tv, score_mod or (lambda s, *_: s), block.as_tuple(), E ** -0.5, {})
    lse2 = lse2 * np.log(2)
    np.testing.assert_allclose(ref.detach().numpy(), out.numpy(), rtol=1e-12, atol=1e-14)
    loss = (ref * torch.from_numpy(c)).sum()
    if CASES[case][3]:
        loss = loss + (lse2 * torch.from_numpy(cl)).sum()
    loss.backward()
    grads = {n: t.grad.numpy() for n, t in zip("qkvb", (tq, tk, tv, tb)) if t.grad is not None}
    return out.numpy(), lse.numpy(), grads


class _Flex(gc.nn.Module):
    def __init__(self, case, q, k, v, bias):
        super().__init__()
        self.case = case
        for name, value in zip("qkvb", (q, k, v, bias)):
            setattr(self, name, gc.nn.Parameter(value, dtype="float64"))

    def forward(self, c, cl, ids):
        score_mod, mask_mod = _mods(self.case, gc, self.b, ids)
        block = None if mask_mod is None else create_block_mask(mask_mod, B, H, Q, KV)
        out, lse = flex_attention(self.q, self.k, self.v, score_mod=score_mod, block_mask=block,
                                  enable_gqa=self.k.shape[1] != H, return_lse=True)
        loss = gc.sum(out * c)
        if CASES[self.case][3]:
            loss = loss + gc.sum(lse * cl)
        return {"out": out, "lse": lse, "loss": loss}


@pytest.mark.parametrize("case", list(CASES))
def test_values_logsumexp_and_gradients_match_torch(case):
    heads = CASES[case][2]
    q, k, v = RNG.standard_normal((B, H, Q, E)), *RNG.standard_normal((2, B, heads, KV, E))
    bias = RNG.standard_normal(Q + KV - 1)
    c, cl = RNG.standard_normal((B, H, Q, E)), RNG.standard_normal((B, H, Q))
    out, lse, grads = _torch_case(case, q, k, v, bias, c, cl)
    model = gc.capture(_Flex(case, q, k, v, bias), c=c, cl=cl, ids=DOCS)
    graphs = gc.grad(model, "loss")
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(graphs, backend=backend).run({"c": c, "cl": cl, "ids": DOCS})
        np.testing.assert_allclose(got["out"], out, rtol=1e-12, atol=1e-13, err_msg=backend)
        np.testing.assert_allclose(got["lse"], lse, rtol=1e-12, atol=1e-13, err_msg=backend)  # -inf where torch's
        for name, want in grads.items():
            np.testing.assert_allclose(got[f"{name}_grad"], want, rtol=1e-10, atol=1e-12, err_msg=f"{backend} {name}")
        assert "b" in grads or not np.any(got.get("b_grad", 0)), "only a score_mod reading the bias moves it"
    if case == "fully_masked_row":
        assert np.all(out[:, :, 2] == 0) and np.all(np.isneginf(lse[:, :, 2]))


@pytest.mark.parametrize("opset", [21, 23])
def test_symbolic_lengths_float32_and_gqa_match_torch(opset):
    """Q and KV given at capture as dim names; at opset 23 a mask-only float32 call is the Attention op."""
    def fn(q, k, v):
        block = create_block_mask(and_masks(causal, window), None, None, q.shape[2], k.shape[2])
        return flex_attention(q, k, v, block_mask=block, enable_gqa=True)

    model = gc.capture(fn, q=gc.spec("float32", (1, 4, "T", 8)), k=gc.spec("float32", (1, 2, "T", 8)),
                       v=gc.spec("float32", (1, 2, "T", 8)), opset=opset)
    assert ("Attention" in {n.op_type for n in model.proto.graph.node}) == (opset >= 23)
    for t in (3, 7):
        q, k, v = (RNG.standard_normal((1, heads, t, 8)).astype(np.float32) for heads in (4, 2, 2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            block = tflex.create_block_mask(tflex.and_masks(causal, window), None, None, t, t, device="cpu")
            want = tflex.flex_attention(*map(torch.from_numpy, (q, k, v)), block_mask=block, enable_gqa=True)
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(model, backend=backend).run({"q": q, "k": k, "v": v})["output"]
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{backend} T={t}")


def test_create_mask_and_mask_combinators_match_torch():
    pairs = [(causal, causal), (no_row_2, no_row_2), (noop_mask, tflex.noop_mask),
             (and_masks(causal, window), tflex.and_masks(causal, window)),
             (or_masks(prefix, window), tflex.or_masks(prefix, window)), (and_masks(), tflex.and_masks()),
             (or_masks(), tflex.or_masks())]
    for mod, torch_mod in pairs:
        want = tflex.create_mask(torch_mod, B, H, Q, KV, device="cpu").numpy()
        got = np.asarray(create_mask(mod, B, H, Q, KV))
        assert got.dtype == bool and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    def capped(score, b, h, q_idx, kv_idx):  # -inf where the key is 2 or more ahead: a mask as torch reads it
        return gc.where(kv_idx > q_idx + 1, float("-inf"), score) if isinstance(score, gc.Tensor) else \
            torch.where(kv_idx > q_idx + 1, float("-inf"), score)

    for mod in (alibi, capped):
        want = tflex.create_mask(mod, None, H, Q, KV, device="cpu").numpy()
        assert want.shape == (1, H, Q, KV)
        np.testing.assert_array_equal(np.asarray(create_mask(mod, None, H, Q, KV)), want)


def _slope_mod(slopes):
    def slope_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx).to(score.dtype)
    return slope_mod


def _gc_attend(q, k, v, slopes):
    block = create_block_mask(causal, None, None, q.shape[2], k.shape[2])
    return flex_attention(q, k, v, score_mod=_slope_mod(slopes), block_mask=block)


def _torch_attend(q, k, v, slopes):
    hop = sys.modules["torch._higher_order_ops.flex_attention"]
    block = tflex.create_block_mask(causal, None, None, q.shape[2], k.shape[2], device="cpu")
    return hop.math_attention(q, k, v, _slope_mod(slopes), block.as_tuple(), q.shape[-1] ** -0.5, {})[0]


def _block(m, nn, kw, slopes):
    """A pre-norm causal attention block of 2 heads with a learned slope per head (ALiBi-like), and a ReLU MLP."""
    m.norm, m.qkv = nn.LayerNorm(8, **kw), nn.Linear(8, 24, **kw)
    m.proj, m.ff = nn.Linear(8, 8, **kw), nn.Linear(8, 8, **kw)
    m.slopes = slopes


def _block_forward(m, x, attend):
    b, t, d = x.shape
    q, k, v = m.qkv(m.norm(x)).reshape(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    h = x + m.proj(attend(q, k, v, m.slopes).transpose(1, 2).reshape(b, t, d))
    return h + m.ff(h).relu()


class _GcBlock(gc.nn.Module):
    def __init__(self):
        super().__init__()
        _block(self, gc.nn, {"dtype": "float64"}, gc.nn.Parameter(np.array([-0.5, -0.25]), dtype="float64"))

    def forward(self, x):
        return _block_forward(self, x, _gc_attend)


class _TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _block(self, torch.nn, {"dtype": torch.float64}, torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)))

    def forward(self, x):
        return _block_forward(self, x, _torch_attend)


def test_a_block_trains_three_trainer_steps_like_torch():
    net = _GcBlock()
    arts = gc.training.generate(gc.capture(net, seed=0, x=gc.spec("float64", ("N", 5, 8))),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    twin = _TorchBlock()
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    opt = torch.optim.SGD(twin.parameters(), 0.1)
    batches = [{"x": RNG.standard_normal((3, 5, 8)), "y": RNG.standard_normal((3, 5, 8))} for _ in range(3)]
    want = []
    for batch in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
        loss.backward()
        opt.step()
        want.append(loss.item())
    for backend in ("numpy", "ort-cpu"):
        trainer = gc.Trainer(arts, backend=backend)
        np.testing.assert_allclose([trainer.step(b) for b in batches], want, rtol=1e-10, err_msg=backend)
        state = trainer.state_dict()
        for name, p in twin.state_dict().items():
            np.testing.assert_allclose(state[name], p.numpy(), rtol=1e-9, atol=1e-12, err_msg=f"{backend} {name}")


def _capture(fn, **shapes):
    return gc.capture(fn, **{n: np.zeros(s) for n, s in shapes.items()})


QKV = {"q": (B, H, Q, E), "k": (B, H, KV, E), "v": (B, H, KV, E)}


@pytest.mark.parametrize("fn, match", [
    (lambda q, k, v: flex_attention(q, k, v, block_mask=create_block_mask(lambda b, h, i, j: (i - j).float(),
                                                                          B, H, Q, KV)),
     r"flex_attention: mask_mod must return a bool Tensor \(true: attend\), got a float32 Tensor"),
    (lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s.sum(-1, keepdim=True)),
     r"flex_attention: score_mod changed the scores' shape \[2, 4, 5, 6\] to \[2, 4, 5, 1\]"),
    (lambda q, k, v: flex_attention(q, k, v, block_mask=create_block_mask(causal, B, H, Q, 7)),
     r"flex_attention: block_mask was created for Q_LEN=5, KV_LEN=7 but the query has Q_LEN=5 and the key "
     r"KV_LEN=6"),
    (lambda q, k, v: flex_attention(q, k[:, :2], v[:, :2]),
     r"flex_attention: query has 4 heads and key 2; set enable_gqa=True"),
    (lambda q, k, v: flex_attention(q[0], k[0], v[0]),
     r"flex_attention: query, key and value must be 4-D \[B, H, L, E\], got query \[4, 5, 3\]"),
    (lambda q, k, v: flex_attention(q, k, v, block_mask=create_block_mask(soft_cap, B, H, Q, KV)),
     r"create_block_mask: takes a mask_mod"),
], ids=["non_bool_mask", "score_shape", "block_mask_lengths", "gqa_off", "rank", "score_mod_as_mask"])
def test_refusals_name_the_function_and_the_problem(fn, match):
    with pytest.raises(gc.GraphError, match=match):
        _capture(fn, **QKV)


def test_import_paths():
    """``gc.nn.attention`` is a package as torch's: MultiheadAttention where it was, the flex_attention module."""
    from graphc.nn.attention import MultiheadAttention

    assert MultiheadAttention is gc.nn.MultiheadAttention
    assert gc.nn.attention.flex_attention.flex_attention is flex_attention


def test_float64_sdpa_at_opset_23_matches_torch_with_a_fully_masked_row():
    """The lowering flex_attention shares: float64 stays off the Attention op (a float32 scale attribute,
    and onnxruntime's NaN on a fully masked row), so it equals torch to rounding on both backends."""
    q, k, v = RNG.standard_normal((3, 2, 2, 4, 3))
    mask = np.tril(np.ones((4, 4), bool))
    mask[1] = False
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v, mask))).numpy()
    model = gc.capture(lambda q, k, v, m: gc.scaled_dot_product_attention(q, k, v, attn_mask=m), q=q, k=k, v=v, m=mask,
                       opset=23)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"q": q, "k": k, "v": v, "m": mask})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15, err_msg=backend)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_inputs_give_a_float32_logsumexp_as_torch(dtype):
    """float16/bfloat16 q, k, v: the output in their dtype within one rounding of torch's, the logsumexp float32
    (torch's dtype) within float32 rounding (rounded to the narrow dtype it was 8.5e-4 / 4.6e-3 off)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    narrow, tdtype = (np.float16, torch.float16) if dtype == "float16" else (ml_dtypes.bfloat16, torch.bfloat16)
    q, k, v = (RNG.standard_normal((B, H, n, 8)).astype(narrow) for n in (Q, KV, KV))

    def fn(q, k, v):
        out, lse = flex_attention(q, k, v, block_mask=create_block_mask(causal, None, None, Q, KV), return_lse=True)
        return {"out": out, "lse": lse}

    model = gc.capture(fn, q=gc.spec(dtype, q.shape), k=gc.spec(dtype, k.shape), v=gc.spec(dtype, v.shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block = tflex.create_block_mask(causal, None, None, Q, KV, device="cpu")
        out, lse = tflex.flex_attention(*(torch.from_numpy(a.astype(np.float32)).to(tdtype) for a in (q, k, v)),
                                        block_mask=block, return_lse=True)
    ulp = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"q": q, "k": k, "v": v})
        assert got["out"].dtype == narrow and got["lse"].dtype == np.float32 == lse.numpy().dtype
        np.testing.assert_allclose(got["lse"], lse.numpy(), rtol=1e-6, atol=1e-6, err_msg=backend)
        np.testing.assert_allclose(got["out"].astype(np.float64), out.float().numpy(), rtol=ulp, atol=ulp,
                                   err_msg=backend)


def test_triton_export_at_opset_17_keeps_no_unread_initializer(tmp_path):
    """deploy.triton writes opset 17, where ReduceMax/ReduceSum take their axes as attributes: the converter
    left the axes initializers (``unsqueeze_folded``, ...) behind, unread, which onnxruntime warns about and
    removes. Now none is left, and the server model's outputs are the captured model's."""
    from graphc.serving import deploy

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=relative_position, block_mask=create_block_mask(causal, B, H, Q, KV))

    model = _capture(fn, **QKV)
    deploy.triton(model, tmp_path / "repo", "flex")
    (path,) = (tmp_path / "repo").rglob("*.onnx")
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path))
    assert proto.opset_import[0].version == 17
    read = {name for node in proto.graph.node for name in node.input}
    assert [t.name for t in proto.graph.initializer if t.name not in read] == []
    feeds = {n: RNG.standard_normal(s) for n, s in QKV.items()}
    want = gc.Session(model, backend="numpy").run(feeds)["output"]
    np.testing.assert_allclose(gc.Session(gc.load(path), backend="ort-cpu").run(feeds)["output"], want, rtol=1e-12)
