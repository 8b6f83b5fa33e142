"""torch.nn.functional's last names, part 2, against torch 2.13 (values and gradients, float32 and
float64, numpy and ort-cpu): ``F.multi_head_attention_forward`` (shared with ``nn.MultiheadAttention``)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

R = np.random.default_rng(0)
TOL = {"float64": {"rtol": 1e-10, "atol": 1e-12}, "float32": {"rtol": 2e-5, "atol": 2e-6}}
E, H, L, S, N = 8, 2, 3, 4, 2
MHA_PARAMS = ("query", "in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias", "bias_k", "bias_v")


def _mha_params(dtype, batched=True):
    shape = (L, N, E) if batched else (L, E)
    return {"query": R.normal(size=shape), "in_proj_weight": R.normal(size=(3 * E, E)) * 0.4,
            "in_proj_bias": R.normal(size=3 * E) * 0.1, "out_proj_weight": R.normal(size=(E, E)) * 0.4,
            "out_proj_bias": R.normal(size=E) * 0.1, "bias_k": R.normal(size=(1, 1, E)),
            "bias_v": R.normal(size=(1, 1, E))}


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
    kv = R.normal(size=(S, N, E) if batched else (S, E)).astype(dtype)
    inputs = {"key": kv, "value": (kv * 0.5 + 1).astype(dtype)}
    extra = S + case.get("bias", False) + case.get("add_zero_attn", False)
    if case.get("key_padding_mask") == "bool":
        mask = np.zeros((N, S) if batched else (S,), bool)
        mask[..., 1] = True
        inputs["key_padding_mask"] = mask
    elif case.get("key_padding_mask") == "float":
        inputs["key_padding_mask"] = R.normal(size=(N, S)).astype(dtype)
    kind = case.get("attn_mask")
    if kind == "bool":
        inputs["attn_mask"] = np.triu(np.ones((L, S), bool), 2)
    elif kind == "float":
        inputs["attn_mask"] = R.normal(size=(L, S)).astype(dtype)
    elif kind == "float3":
        inputs["attn_mask"] = R.normal(size=(N * H, L, S)).astype(dtype)
    if case.get("static"):
        inputs["static_k"], inputs["static_v"] = (R.normal(size=(N * H, S + 1, E // H)).astype(dtype)
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
    c = R.standard_normal(out.shape).astype(dtype)
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
        q, k = R.normal(size=(L, n, E)).astype("float32"), R.normal(size=(S + n, n, E)).astype("float32")
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
    q, k = R.normal(size=(L, N, E)), R.normal(size=(S, N, E))
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
