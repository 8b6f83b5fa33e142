"""``gc.autocast``'s op policy: the one table of what each torch-named op runs in per device type.

``lower``: the floating Tensor arguments cast to the autocast dtype (bfloat16 / float16);
``fp32``: cast to float32; ``promote``: cast to the widest floating dtype among them (bfloat16
with float16 is float32); ``mixed``: torch's mixed-dtype norm kernels, which autocast leaves
alone: a narrow input with float32 affine params is normalized in float32 and the result rounded
to the input's dtype. float64 arguments are never cast.

The CPU column is torch 2.13's own behaviour, probed under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` (the output dtype of each op; ``tests/test_autocast_ops.py`` probes it
again). The CUDA column could not be probed here (no GPU): it is the documented list of torch's
"Autocast Op Reference" (CUDA ops that can autocast to float16 / to float32 / to the widest
input type), restricted to the ops graphc has.
"""

from __future__ import annotations

LOWER, FP32, PROMOTE, MIXED = "lower", "fp32", "promote", "mixed"
DEVICES = ("cpu", "cuda")
# device type -> (the default dtype, the dtypes it takes), as torch.autocast's
DTYPES = {"cpu": ("bfloat16", ("bfloat16", "float16")), "cuda": ("float16", ("float16", "bfloat16"))}

_L, _F, _P, _M = LOWER, FP32, PROMOTE, MIXED
# torch op name -> (cpu, cuda); None: not listed for that device type (runs on what it is given)
POLICY: dict[str, tuple[str | None, str | None]] = {
    # matrix products and convolutions
    "matmul": (_L, _L), "mm": (_L, _L), "bmm": (_L, _L), "baddbmm": (_L, _L), "addmm": (_L, _L),
    "addbmm": (_L, _L), "linear": (_L, _L), "conv1d": (_L, _L), "conv2d": (_L, _L), "conv3d": (_L, _L),
    "conv_transpose1d": (_L, _L), "conv_transpose2d": (_L, _L), "conv_transpose3d": (_L, _L),
    "conv_tbc": (_L, None), "prelu": (_L, _L), "scaled_dot_product_attention": (_L, None),
    "addmv": (None, _L), "addr": (None, _L), "mv": (None, _L), "chain_matmul": (None, _L),
    # joins
    "cat": (_P, None), "stack": (_P, None), "index_copy": (_P, None),
    "addcdiv": (None, _P), "addcmul": (None, _P), "atan2": (None, _P), "dot": (None, _P),
    "tensordot": (None, _P), "scatter_add": (None, _P),
    # losses
    "mse_loss": (_F, _F), "l1_loss": (_F, _F), "smooth_l1_loss": (_F, _F), "huber_loss": (_F, None),
    "nll_loss": (_F, _F), "cross_entropy": (_F, _F), "binary_cross_entropy": (_F, None),
    "binary_cross_entropy_with_logits": (_F, _F), "kl_div": (_F, _F), "poisson_nll_loss": (_F, _F),
    "cosine_embedding_loss": (_F, _F), "hinge_embedding_loss": (_F, _F), "margin_ranking_loss": (_F, _F),
    "soft_margin_loss": (_F, _F), "multi_margin_loss": (_F, _F), "multilabel_margin_loss": (_F, _F),
    "triplet_margin_loss": (_F, _F),
    # numerics that need float32's range
    "cdist": (_F, _F), "prod": (_F, _F), "trace": (_F, None), "inverse": (_F, None),
    "softmax": (None, _F), "log_softmax": (None, _F), "cumsum": (None, _F), "cumprod": (None, _F),
    "exp": (None, _F), "log": (None, _F), "rsqrt": (None, _F), "reciprocal": (None, _F),
    # norms
    "layer_norm": (_M, _F), "group_norm": (_M, _F), "batch_norm": (_M, _M),
}


def kind(op: str, device: str) -> str | None:
    """What ``op`` runs in under autocast on ``device`` (None: as given)."""
    return POLICY[op][DEVICES.index(device)]


__all__ = ["DEVICES", "DTYPES", "FP32", "LOWER", "MIXED", "POLICY", "PROMOTE", "kind"]
