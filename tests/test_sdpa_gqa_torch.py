"""``F.scaled_dot_product_attention(..., enable_gqa=True)`` (grouped-query attention, as Llama-style models call
it: fewer key/value heads than query heads) against torch: float64 values and ``gc.grad`` gradients of query,
key and value to 1e-10 on the numpy and ort-cpu backends, float32 at opset 23 (the ONNX Attention op), and the
refusals."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import TorchNS, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(11)
Q, K, V = R.standard_normal((2, 6, 5, 4)), R.standard_normal((2, 2, 7, 4)), R.standard_normal((2, 2, 7, 3))
MASK = R.random((5, 7)) > 0.3

CASES = {  # fn(M, q, k, v), M torch or gc
    "plain": lambda M, q, k, v: M.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    "causal_scale": lambda M, q, k, v: M.scaled_dot_product_attention(q, k[:, :, :5], v[:, :, :5], is_causal=True,
                                                                     scale=0.3, enable_gqa=True),
    "bool_mask": lambda M, q, k, v: M.scaled_dot_product_attention(q, k, v, attn_mask=M.tensor(MASK),
                                                                  enable_gqa=True),
    "one_kv_head": lambda M, q, k, v: M.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True),
    "equal_heads": lambda M, q, k, v: M.scaled_dot_product_attention(q[:, :2], k, v, enable_gqa=True),
}


@pytest.mark.parametrize("name", CASES)
def test_gqa_values_and_gradients_match_torch_on_both_backends(name):
    """Refused before: 'scaled_dot_product_attention() got an unexpected keyword argument 'enable_gqa''."""
    fn = CASES[name]
    ts = [torch.tensor(a, requires_grad=True) for a in (Q, K, V)]
    want = fn(TorchNS(torch), *ts)
    c = R.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda _, q, k, v: fn(gc, q, k, v), {"q": Q, "k": K, "v": V}, {}, c,
                       backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        for n, t in zip("qkv", ts):
            np.testing.assert_allclose(got[n], t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{backend} {n}")


def test_gqa_float32_at_opset_23_matches_torch():
    """The ONNX Attention op, which takes the fewer key/value heads itself, on both backends."""
    q, k, v = (a.astype(np.float32) for a in (Q, K, V))
    model = gc.capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                       q=q, k=k, v=v, opset=23)
    assert "Attention" in {n.op_type for n in model.proto.graph.node}
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=True,
                                                            enable_gqa=True)
    np.testing.assert_allclose(run_both(model, {"q": q, "k": k, "v": v})["output"], want.numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("k,v,message", [
    ((2, 4, 7, 4), (2, 4, 7, 3), r"scaled_dot_product_attention: enable_gqa needs the query heads \(6\) to be a "
     r"static multiple of the key heads \(4\)"),
    ((2, 2, 7, 4), (2, 3, 7, 3), r"enable_gqa needs key and value to have the same heads \(dim -3\), got 2 and 3"),
])
def test_gqa_refusals_name_the_problem(k, v, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                   q=Q, k=R.standard_normal(k), v=R.standard_normal(v))
    assert "test_sdpa_gqa_torch.py" in str(err.value)
