"""torch.nn.functional's last names, part 2, against torch 2.13 (values and gradients, float32 and
float64, numpy and ort-cpu): ``F.multi_head_attention_forward`` (shared with ``nn.MultiheadAttention``)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
TOL = {"float64": {"rtol": 1e-10, "atol": 1e-12}, "float32": {"rtol": 2e-5, "atol": 2e-6}}
E, H, L, S, N = 8, 2, 3, 4, 2
MHA_PARAMS = ("query", "in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias", "bias_k", "bias_v")


def _mha_params(dtype, batched=True):
    shape = (L, N, E) if batched else (L, E)
    return {"query": RNG.normal(size=shape), "in_proj_weight": RNG.normal(size=(3 * E, E)) * 0.4,
            "in_proj_bias": RNG.normal(size=3 * E) * 0.1, "out_proj_weight": RNG.normal(size=(E, E)) * 0.4,
            "out_proj_bias": RNG.normal(size=E) * 0.1, "bias_k": RNG.normal(size=(1, 1, E)),
            "bias_v": RNG.normal(size=(1, 1, E))}


MHA_CASES = {
    "plain": {},
    "bias_kv_zero_attn_bool_masks": {"bias": True, "add_zero_attn": True, "key_padding_mask": "bool",
                                     "attn_mask": "bool"},
    "float_masks_3d_per_head": {"key_padding_mask": "float", "attn_mask": "float3", "average_attn_weights": False},
    "separate_weights": {"use_separate_proj_weight": True, "attn_mask": "float"},
    "static_kv": {"static": True, "need_weights": False},
    "unbatched_bias_kv": {"batched": False, "bias": True, "attn_mask": "bool", "key_padding_mask": "bool"},
}


def _mha_inputs(case, dtype):
    batched = case.get("batched", True)
    kv = RNG.normal(size=(S, N, E) if batched else (S, E)).astype(dtype)
    inputs = {"key": kv, "value": (kv * 0.5 + 1).astype(dtype)}
    extra = S + case.get("bias", False) + case.get("add_zero_attn", False)
    if case.get("key_padding_mask") == "bool":
        mask = np.zeros((N, S) if batched else (S,), bool)
        mask[..., 1] = True
        inputs["key_padding_mask"] = mask
    elif case.get("key_padding_mask") == "float":
        inputs["key_padding_mask"] = RNG.normal(size=(N, S)).astype(dtype)
    kind = case.get("attn_mask")
    if kind == "bool":
        inputs["attn_mask"] = np.triu(np.ones((L, S), bool), 2)
    elif kind == "float":
        inputs["attn_mask"] = RNG.normal(size=(L, S)).astype(dtype)
    elif kind == "float3":
        inputs["attn_mask"] = RNG.normal(size=(N * H, L, S)).astype(dtype)
    if case.get("static"):
        inputs["static_k"], inputs["static_v"] = (RNG.normal(size=(N * H, S + 1, E // H)).astype(dtype)
                                                  for _ in range(2))
    assert extra >= S
    return inputs


def _mha_fn(case):
    def fn(F, query, w, b, ow, ob, bias_k, bias_v, **inputs):
        separate = case.get("use_separate_proj_weight", False)
        out = F.multi_head_attention_forward(
            query, inputs["key"], inputs["value"], E, H, None if separate else w, b,
            bias_k if case.get("bias") else None, bias_v if case.get("bias") else None,
            case.get("add_zero_attn", False), 0.0, ow, ob, training=True,
            key_padding_mask=inputs.get("key_padding_mask"), need_weights=case.get("need_weights", True),
            attn_mask=inputs.get("attn_mask"), use_separate_proj_weight=separate,
            q_proj_weight=w[:E] if separate else None, k_proj_weight=w[E:2 * E] if separate else None,
            v_proj_weight=w[2 * E:] if separate else None, static_k=inputs.get("static_k"),
            static_v=inputs.get("static_v"), average_attn_weights=case.get("average_attn_weights", True))
        return out
    return fn


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(MHA_CASES))
def test_multi_head_attention_forward_matches_torch(name, dtype):
    case = MHA_CASES[name]
    params = {k: v.astype(dtype) for k, v in _mha_params(dtype, case.get("batched", True)).items()}
    inputs = _mha_inputs(case, dtype)
    fn = _mha_fn(case)
    ts = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    out, weights = fn(torch.nn.functional, *ts.values(), **{k: torch.from_numpy(v) for k, v in inputs.items()})
    c = RNG.standard_normal(out.shape).astype(dtype)
    (out * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, params, inputs, c, backend=backend)
        np.testing.assert_allclose(got["out"], out.detach().numpy(), **TOL[dtype], err_msg=backend)
        for k, t in ts.items():
            want = np.zeros_like(params[k]) if t.grad is None else t.grad.numpy()
            np.testing.assert_allclose(got.get(k, np.zeros_like(want)), want, **TOL[dtype], err_msg=f"{backend} {k}")
    which = 0 if weights is None else 1  # the weights, or the output again without them
    model = gc.capture(lambda **kw: fn(gc.nn.functional, *(kw.pop(k) for k in MHA_PARAMS), **kw)[which],
                       **params, **inputs)
    got_w = gc.Session(model, backend="ort-cpu").run({**params, **inputs})["output"]
    np.testing.assert_allclose(got_w, (out if weights is None else weights).detach().numpy(), **TOL[dtype])


def test_multi_head_attention_forward_symbolic_batch_and_length():
    """Query, key and value with symbolic batch and lengths: one graph, run at two batch sizes."""
    p = {k: v.astype("float32") for k, v in _mha_params("float32").items()}
    model = gc.capture(lambda q, k: gc.nn.functional.multi_head_attention_forward(
        q, k, k, E, H, p["in_proj_weight"], p["in_proj_bias"], p["bias_k"], p["bias_v"], True, 0.0,
        p["out_proj_weight"], p["out_proj_bias"])[0],
        q=gc.spec("float32", ("L", "N", E)), k=gc.spec("float32", ("S", "N", E)))
    tp = {k: torch.from_numpy(v) for k, v in p.items()}
    for n in (1, 3):
        q, k = RNG.normal(size=(L, n, E)).astype("float32"), RNG.normal(size=(S + n, n, E)).astype("float32")
        want = torch.nn.functional.multi_head_attention_forward(
            torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k), E, H, tp["in_proj_weight"],
            tp["in_proj_bias"], tp["bias_k"], tp["bias_v"], True, 0.0, tp["out_proj_weight"],
            tp["out_proj_bias"])[0]
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(model, backend=backend).run({"q": q, "k": k})["output"]
            np.testing.assert_allclose(got, want.numpy(), **TOL["float32"], err_msg=f"{backend} n={n}")


def test_multi_head_attention_module_is_the_function():
    """``nn.MultiheadAttention(batch_first=False)`` and the function, given its parameters: one value."""
    m = gc.nn.MultiheadAttention(E, H, dtype="float64")
    q, k = RNG.normal(size=(L, N, E)), RNG.normal(size=(S, N, E))
    st = m.state_dict()

    def both(q, k):
        a = m(q, k, k, average_attn_weights=False)
        b = gc.nn.functional.multi_head_attention_forward(
            q, k, k, E, H, m.in_proj_weight, m.in_proj_bias, None, None, False, 0.0, m.out_proj.weight,
            m.out_proj.bias, average_attn_weights=False)
        return {"m0": a[0], "m1": a[1], "f0": b[0], "f1": b[1]}

    out = gc.Session(gc.capture(both, q=q, k=k), backend="numpy").run({"q": q, "k": k})
    np.testing.assert_array_equal(out["m0"], out["f0"])
    np.testing.assert_array_equal(out["m1"], out["f1"])
    assert st["in_proj_weight"].shape == (3 * E, E)


@pytest.mark.parametrize("change, match", [
    ({"embed_dim_to_check": 6}, "was expecting embedding dimension of 6, but got 8"),
    ({"num_heads": 3}, "embed_dim 8 not divisible by num_heads 3"),
    ({"is_causal": True}, "Need attn_mask if specifying the is_causal hint"),
    ({"bias_v": None}, "bias_k and bias_v must both be given or both None"),
    ({"use_separate_proj_weight": True}, "use_separate_proj_weight is True but q_proj_weight is None"),
    ({"in_proj_weight": np.zeros((E, E))}, r"in_proj_weight must be \[3 \* embed_dim, embed_dim\] = \[24, 8\]"),
    ({"attn_mask": np.zeros(S)}, r"attn_mask must be \[L, S\] or \[N \* num_heads, L, S\]"),
    ({"key": np.zeros((S, E))}, "key must have query's rank 3"),
])
def test_multi_head_attention_forward_refuses_bad_arguments(change, match):
    p = {k: v.astype("float32") for k, v in _mha_params("float32").items()}
    args = {"key": np.zeros((S, N, E), "float32"), "value": np.zeros((S, N, E), "float32"),
            "embed_dim_to_check": E, "num_heads": H, "in_proj_weight": p["in_proj_weight"],
            "in_proj_bias": p["in_proj_bias"], "bias_k": p["bias_k"], "bias_v": p["bias_v"], "add_zero_attn": False,
            "dropout_p": 0.0, "out_proj_weight": p["out_proj_weight"], "out_proj_bias": p["out_proj_bias"], **change}
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(lambda q: gc.nn.functional.multi_head_attention_forward(q, **args)[0], q=p["query"])


# -- F.grouped_mm ---------------------------------------------------------------------------------

GMM_SHAPES = {"2d_3d": ((12, 8), (3, 8, 4)), "3d_2d": ((3, 4, 8), (8, 12)), "2d_2d": ((4, 12), (12, 8)),
              "3d_3d": ((3, 4, 8), (3, 8, 4))}


def _loop(a, b, offs):
    """torch's grouped_mm as an explicit per-group matmul loop (zeros past offs[-1] and for empty groups)."""
    if offs is None:
        return a @ b
    starts = [0, *offs[:-1]]
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, offs))]
                         + [a[offs[-1]:] @ b[0] * 0])
    if a.dim() == 3:
        return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(zip(starts, offs))]
                         + [a[0] @ b[:, offs[-1]:] * 0], 1)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, offs)])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("offs", [[4, 8, 12], [0, 5, 9]], ids=["even", "empty_group_and_tail"])
@pytest.mark.parametrize("kind", list(GMM_SHAPES))
def test_grouped_mm_matches_a_per_group_loop_and_torch(kind, offs, dtype):
    """Values and gradients against the per-group loop in float64 (torch's CPU kernel takes float32
    only); in float32 with torch's own ``F.grouped_mm`` where its CPU kernel runs (aligned, every row in a group)."""
    offs = None if kind == "3d_3d" else np.asarray(offs, np.int32)
    sa, sb = GMM_SHAPES[kind]
    a0, b0 = RNG.normal(size=sa).astype(dtype), RNG.normal(size=sb).astype(dtype)
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a0, b0))
    out = _loop(ta, tb, None if offs is None else offs.tolist())
    c = RNG.standard_normal(out.shape).astype(dtype)
    (out * torch.from_numpy(c)).sum().backward()
    if dtype == "float32" and (offs is None or offs[0] > 0 and offs[-1] == 12):
        tt = [torch.tensor(v, requires_grad=True) for v in (a0, b0)]
        kw = {} if offs is None else {"offs": torch.from_numpy(offs)}
        b_in = tt[1].mT.contiguous().mT  # column-major mat_b, as torch's kernel wants
        got_t = torch.nn.functional.grouped_mm(tt[0], b_in, **kw)
        (got_t * torch.from_numpy(c)).sum().backward()
        np.testing.assert_allclose(got_t.detach().numpy(), out.detach().numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tt[0].grad.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tt[1].grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)
    inputs = {} if offs is None else {"offs": offs}
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, a, b, **kw: F.grouped_mm(a, b, **kw), {"a": a0, "b": b0}, inputs, c, backend=backend)
        np.testing.assert_allclose(got["out"], out.detach().numpy(), **TOL[dtype], err_msg=backend)
        np.testing.assert_allclose(got["a"], ta.grad.numpy(), **TOL[dtype], err_msg=backend)
        np.testing.assert_allclose(got["b"], tb.grad.numpy(), **TOL[dtype], err_msg=backend)


def test_grouped_mm_symbolic_tokens_and_out_dtype():
    """Tokens ``M`` symbolic and ``offs`` a run-time input: one graph for two token counts."""
    b = RNG.normal(size=(2, 8, 4)).astype("float32")
    model = gc.capture(lambda a, o: gc.nn.functional.grouped_mm(a, b, offs=o, out_dtype=gc.float64),
                       a=gc.spec("float32", ("M", 8)), o=gc.spec("int32", (2,)))
    for m, offs in ((6, [2, 6]), (9, [7, 8])):
        a = RNG.normal(size=(m, 8)).astype("float32")
        want = _loop(torch.from_numpy(a), torch.from_numpy(b), offs).numpy()
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(model, backend=backend).run({"a": a, "o": np.asarray(offs, np.int32)})["output"]
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{backend} m={m}")


@pytest.mark.parametrize("a, b, kw, match", [
    ((4, 8), (2, 8, 4), {}, "offs must be None when mat_a and mat_b are 3D, and given when either is 2D"),
    ((2, 4, 8), (2, 8, 4), {"offs": np.array([1, 2], np.int32)}, "offs must be None when"),
    ((4, 8), (2, 6, 4), {"offs": np.array([1, 2], np.int32)}, "mat_a's last dim and mat_b's contracted dim"),
    ((4, 8), (3, 8, 4), {"offs": np.array([1, 2], np.int32)}, "the number of groups and offs' length"),
    ((4, 8), (2, 8, 4), {"offs": np.array([1.0, 2.0])}, "offs must be a 1D integer Tensor"),
    ((8,), (2, 8, 4), {"offs": np.array([1, 2], np.int32)}, "mat_a must be a 2D or 3D Tensor"),
    ((4, 8), (2, 8, 4), {"offs": np.array([1, 2], np.int32), "bias": np.zeros(4)}, "bias is not supported"),
])
def test_grouped_mm_refuses_bad_arguments(a, b, kw, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(lambda x: gc.nn.functional.grouped_mm(x, np.zeros(b, "float32"), **kw),
                   x=np.zeros(a, "float32"))


# -- torch.geqrf, torch.orgqr (linalg.householder_product), torch.ormqr -----------------------------

QR_SHAPES = [(5, 3), (3, 3), (3, 5), (2, 4, 3)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", QR_SHAPES, ids=str)
def test_geqrf_matches_torch(shape, dtype):
    """LAPACK's packed QR and tau, signs included, against torch (no gradient, as torch's)."""
    a = RNG.normal(size=shape).astype(dtype)
    a[..., 1:, 0] = 0 if shape == (3, 3) else a[..., 1:, 0]  # a column already zero below its diagonal: tau 0
    want = torch.geqrf(torch.from_numpy(a))
    model = gc.capture(lambda x: dict(zip(("a", "tau"), gc.geqrf(x))), x=a)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": a})
        np.testing.assert_allclose(got["a"], want.a.numpy(), **TOL[dtype], err_msg=backend)
        np.testing.assert_allclose(got["tau"], want.tau.numpy(), **TOL[dtype], err_msg=backend)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape, k", [((5, 3), 3), ((4, 4), 2), ((2, 5, 3), 2)], ids=str)
def test_householder_product_and_orgqr_match_torch(shape, k, dtype):
    a0, tau0 = RNG.normal(size=shape).astype(dtype), RNG.normal(size=(*shape[:-2], k)).astype(dtype)
    ta, tt = torch.tensor(a0, requires_grad=True), torch.tensor(tau0, requires_grad=True)
    want = torch.linalg.householder_product(ta, tt)
    c = RNG.standard_normal(want.shape).astype(dtype)
    (want * torch.from_numpy(c)).sum().backward()
    np.testing.assert_array_equal(torch.orgqr(ta, tt).detach().numpy(), want.detach().numpy())
    for name, fn in (("householder_product", lambda F, a, t: gc.linalg.householder_product(a, t)),
                     ("orgqr", lambda F, a, t: F.orgqr(a, t))):
        for backend in ("numpy", "ort-cpu"):
            got = gc_grads(fn, {"a": a0, "t": tau0}, {}, c, backend=backend)
            np.testing.assert_allclose(got["out"], want.detach().numpy(), **TOL[dtype], err_msg=f"{name} {backend}")
            np.testing.assert_allclose(got["a"], ta.grad.numpy(), **TOL[dtype], err_msg=f"{name} {backend}")
            np.testing.assert_allclose(got["t"], tt.grad.numpy(), **TOL[dtype], err_msg=f"{name} {backend}")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("left, transpose", [(True, False), (True, True), (False, False), (False, True)])
def test_ormqr_matches_torch(left, transpose, dtype):
    """``other`` times Q from geqrf's reflectors, batched, values and gradients for all three inputs."""
    a0, tau0 = RNG.normal(size=(2, 4, 3)).astype(dtype), RNG.normal(size=(2, 3)).astype(dtype)
    c0 = RNG.normal(size=(2, 4, 5) if left else (2, 5, 4)).astype(dtype)
    ts = [torch.tensor(v, requires_grad=True) for v in (a0, tau0, c0)]
    want = torch.ormqr(*ts, left=left, transpose=transpose)
    c = RNG.standard_normal(want.shape).astype(dtype)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, a, t, o: F.ormqr(a, t, o, left=left, transpose=transpose),
                       {"a": a0, "t": tau0, "o": c0}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), **TOL[dtype], err_msg=backend)
        for name, t in zip("ato", ts):
            np.testing.assert_allclose(got[name], t.grad.numpy(), **TOL[dtype], err_msg=f"{backend} {name}")


def test_geqrf_round_trip_and_symbolic_batch():
    """orgqr of geqrf's output is torch.linalg.qr's Q, ormqr applies it; a symbolic batch dim."""
    model = gc.capture(lambda x: {"q": gc.orgqr(*gc.geqrf(x)), "qtx": gc.ormqr(*gc.geqrf(x), x, transpose=True)},
                       x=gc.spec("float64", ("N", 4, 3)))
    for n in (1, 3):
        x = RNG.normal(size=(n, 4, 3))
        q, r = torch.linalg.qr(torch.from_numpy(x))
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(model, backend=backend).run({"x": x})
            np.testing.assert_allclose(got["q"], q.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
            np.testing.assert_allclose(got["qtx"][:, :3], r.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


@pytest.mark.parametrize("call, match", [
    (lambda x: gc.orgqr(x, np.zeros(4)), r"tau must have at most min\(rows, cols\) = 3 elements"),
    (lambda x: gc.linalg.householder_product(x.transpose(-1, -2), np.zeros(2)),
     "input must have at least as many rows as columns, got 3 x 4"),
    (lambda x: gc.ormqr(x, np.zeros(3), np.zeros((5, 2))), r"input's rows \(4\) must equal other's rows \(5\)"),
    (lambda x: gc.orgqr(x, np.zeros((1, 3))), "tau must be input's dtype float64 with one dim fewer"),
    (lambda x: gc.geqrf(x[0]), r"input must be \(\.\.\., rows, cols\) matrices, got rank 1"),
])
def test_householder_functions_refuse_bad_arguments(call, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(call, x=np.zeros((4, 3)))
