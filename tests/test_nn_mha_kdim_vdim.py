"""``nn.MultiheadAttention(kdim=, vdim=, add_bias_kv=, add_zero_attn=)`` against torch 2.13 in float64 on numpy and
ort-cpu: torch's parameter names and shapes (``q_proj_weight``, ``k_proj_weight [E, kdim]``, ``v_proj_weight
[E, vdim]`` where a width differs, ``in_proj_weight`` None), its state_dict loaded strictly, the output, the
attention weights and the gradients of query, key, value and every parameter."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)
E, H, L, S, N = 6, 2, 4, 5, 3

# (id, constructor keyword arguments, whether to pass a key padding mask)
CASES = [
    ("kdim-vdim", {"kdim": 3, "vdim": 7}, False),
    ("kdim-only-batch-first", {"kdim": 4, "batch_first": True}, True),
    ("vdim-bias-kv-zero-attn", {"vdim": 2, "add_bias_kv": True, "add_zero_attn": True}, True),
    ("same-dims-bias-kv-no-bias", {"add_bias_kv": True, "bias": False}, False),
]


def _modules(kwargs):
    ours = nn.MultiheadAttention(E, H, dtype="float64", **kwargs).init_parameters(seed=1)
    theirs = torch.nn.MultiheadAttention(E, H, dtype=torch.float64, **kwargs)
    state = ours.state_dict()
    want = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert {k: v.shape for k, v in state.items()} == want and list(state) == list(want)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    return ours, theirs


@pytest.mark.parametrize("name,kwargs,masked", CASES, ids=[c[0] for c in CASES])
def test_outputs_and_gradients_match_torch(name, kwargs, masked):
    ours, theirs = _modules(kwargs)
    kdim, vdim = kwargs.get("kdim", E), kwargs.get("vdim", E)
    first = kwargs.get("batch_first", False)
    shape = (lambda n, length, d: (n, length, d)) if first else (lambda n, length, d: (length, n, d))
    q, k, v = RNG.standard_normal(shape(N, L, E)), RNG.standard_normal(shape(N, S, kdim)), \
        RNG.standard_normal(shape(N, S, vdim))
    mask = np.zeros((N, S), bool)
    mask[1, -2:] = True
    extra = {"key_padding_mask": mask} if masked else {}
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out, weights = theirs(tq, tk, tv, **{k_: torch.from_numpy(m) for k_, m in extra.items()})
    c = RNG.standard_normal(tuple(out.shape))
    (out * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, q, k, v, **kw: m(q, k, v, **kw), {"q": q, "k": k, "v": v}, extra, c, module=ours,
                       backend=backend)
        np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-10, atol=1e-13, err_msg=backend)
        for key, t in (("q", tq), ("k", tk), ("v", tv)):
            np.testing.assert_allclose(got[key], t.grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=f"{backend} {key}")
        for pname, p in theirs.named_parameters():
            np.testing.assert_allclose(got[f"m.{pname}"], p.grad.numpy(), rtol=1e-10, atol=1e-13,
                                       err_msg=f"{backend} {pname}")
    model = gc.capture(lambda q, k, v: ours(q, k, v, **extra)[1], q=q, k=k, v=v)
    np.testing.assert_allclose(gc.Session(model, backend="ort-cpu").run({"q": q, "k": k, "v": v})["output"],
                               weights.detach().numpy(), rtol=1e-10, atol=1e-13)


def test_attributes_and_init_are_torchs():
    ours, theirs = _modules({"kdim": 3, "vdim": 9, "add_bias_kv": True})
    assert ours.in_proj_weight is None and theirs.in_proj_weight is None and not ours._qkv_same_embed_dim
    assert (ours.kdim, ours.vdim) == (theirs.kdim, theirs.vdim) == (3, 9)
    same = nn.MultiheadAttention(E, H)
    assert same.q_proj_weight is None and same.bias_k is None and same._qkv_same_embed_dim
    big = nn.MultiheadAttention(64, 4, kdim=32, vdim=128, add_bias_kv=True).init_parameters(seed=0).state_dict()
    for name, fan in (("q_proj_weight", 64 + 64), ("k_proj_weight", 64 + 32), ("v_proj_weight", 64 + 128)):
        bound = np.sqrt(6 / fan)  # xavier-uniform of each one's own fans, as torch's
        assert bound * 0.95 < np.abs(big[name]).max() <= bound, name
    np.testing.assert_allclose(big["bias_k"].std(), np.sqrt(2 / 128), rtol=0.2)  # xavier-normal of [1, 1, 64]


def test_a_key_of_the_wrong_width_is_refused_naming_it():
    layer = nn.MultiheadAttention(E, H, kdim=3, vdim=7)
    with pytest.raises(gc.GraphError, match=r"MultiheadAttention.*rank-3 key with 3 features, got shape \[5, 3, 6\]"):
        gc.capture(lambda q: layer(q, q, q), q=RNG.standard_normal((5, 3, E)))
