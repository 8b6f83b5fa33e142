"""``gc.autocast``'s op policy: the one table of what each torch-named op runs in per device type.

``lower``: the floating Tensor arguments cast to the autocast dtype (bfloat16 / float16);
``fp32``: cast to float32; ``promote``: cast to the widest floating dtype among them (bfloat16
with float16 is float32); ``mixed``: torch's mixed-dtype norm kernels, which autocast leaves
alone: a narrow input with float32 affine params is normalized in float32 and the result rounded
to the input's dtype; ``given``: nothing cast, the op's own inner ops run with autocast off (torch
computes it in one kernel, which graphc builds from listed ops: ``gc.fft``'s MatMuls). float64
arguments are never cast.

The CPU column is torch 2.13's own behaviour, probed under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` (the output dtype of each op; ``tests/test_autocast_ops.py`` probes it
again): ``tensordot`` lowers there as the ``mm`` it is; ``einsum`` and ``bilinear``, unlisted, compute as
torch's CPU kernels do, from ``bmm`` pairs the op casts itself (``ops_einsum``). The CUDA column could
not be probed here (no GPU): it is torch 2.13's source lists (``ATen/autocast_mode.h``: lower precision /
float32 / promote), restricted to the ops graphc has, with ``given`` for the transforms it does not list;
``nn.GRUCell`` and the other cell modules step through the functional cells, so the cells' entries are
theirs too, as torch's.
"""

from __future__ import annotations

LOWER, FP32, PROMOTE, MIXED, GIVEN = "lower", "fp32", "promote", "mixed", "given"
DEVICES = ("cpu", "cuda")
# device type -> (the default dtype, the dtypes it takes), as torch.autocast's
DTYPES = {"cpu": ("bfloat16", ("bfloat16", "float16")), "cuda": ("float16", ("float16", "bfloat16"))}

_L, _F, _P, _M, _G = LOWER, FP32, PROMOTE, MIXED, GIVEN
# torch op name -> (cpu, cuda); None: not listed for that device type (runs on what it is given)
POLICY: dict[str, tuple[str | None, str | None]] = {
    # matrix products and convolutions
    "matmul": (_L, _L), "mm": (_L, _L), "bmm": (_L, _L), "baddbmm": (_L, _L), "addmm": (_L, _L),
    "addbmm": (_L, _L), "linear": (_L, _L), "conv1d": (_L, _L), "conv2d": (_L, _L), "conv3d": (_L, _L),
    "conv_transpose1d": (_L, _L), "conv_transpose2d": (_L, _L), "conv_transpose3d": (_L, _L),
    "conv_tbc": (_L, _L), "prelu": (_L, _L), "scaled_dot_product_attention": (_L, _L), "convolution": (_G, _L),
    "linalg_vecdot": (_L, _L), "tensordot": (_L, _P), "einsum": (None, _L), "addmv": (None, _L),
    "addr": (None, _L), "mv": (None, _L),
    "chain_matmul": (None, _L), "linalg_multi_dot": (None, _L),
    "rnn_tanh_cell": (None, _L), "rnn_relu_cell": (None, _L), "lstm_cell": (None, _L), "gru_cell": (None, _L),
    # joins
    "cat": (_P, None), "stack": (_P, None), "index_copy": (_P, None),
    "addcdiv": (None, _P), "addcmul": (None, _P), "atan2": (None, _P), "dot": (None, _P),
    "scatter_add": (None, _P), "bilinear": (None, _P), "cross": (None, _P),
    "linalg_cross": (None, _P), "index_put": (None, _P), "vdot": (None, _P),
    # losses
    "mse_loss": (_F, _F), "l1_loss": (_F, _F), "smooth_l1_loss": (_F, _F), "huber_loss": (_F, _F),
    "nll_loss": (_F, _F), "cross_entropy": (_F, _F), "binary_cross_entropy": (_F, None),
    "binary_cross_entropy_with_logits": (_F, _F), "kl_div": (_F, _F), "poisson_nll_loss": (_F, _F),
    "cosine_embedding_loss": (_F, _F), "hinge_embedding_loss": (_F, _F), "margin_ranking_loss": (_F, _F),
    "soft_margin_loss": (_F, _F), "multi_margin_loss": (_F, _F), "multilabel_margin_loss": (_F, _F),
    "triplet_margin_loss": (_F, _F), "ctc_loss": (_F, None),
    # pooling, padding and sampling (max_pool3d without indices; max_unpool2d is also max_unpool1d's;
    # the pads by how many dims ``gc.pad`` pads)
    "avg_pool3d": (_F, None), "max_pool3d": (_F, None), "adaptive_avg_pool3d": (_F, None),
    "adaptive_max_pool3d": (_F, None), "max_unpool2d": (_F, None), "max_unpool3d": (_F, None),
    "fractional_max_pool2d": (_F, None), "fractional_max_pool3d": (_F, None), "grid_sample": (_F, _P),
    "grid_sampler": (_F, _P),
    "reflection_pad1d": (_F, None), "reflection_pad2d": (_F, None), "replication_pad1d": (_F, None),
    "replication_pad2d": (_F, None), "replication_pad3d": (_F, None),
    # statistics, spectra, quantization (per tensor with float scale and int zero point)
    "quantile": (_F, None), "nanquantile": (_F, None), "stft": (_F, None),
    "fake_quantize_per_tensor_affine": (_F, None),
    # Fourier transforms (``gc.fft``: MatMuls with a cos/sin basis, which must not lower) and complex views
    **{f"fft_{op}": (_F, _G) for op in ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2",
                                        "irfft2", "rfftn", "irfftn", "hfft", "ihfft")},
    **{f"fft_{op}": (_G, _G) for op in ("hfft2", "hfftn", "ihfft2", "ihfftn")},
    "polar": (_F, None), "view_as_complex": (_F, None),
    # matrix factorizations and solvers (``cholesky`` is torch.cholesky's and linalg_cholesky's, ...)
    "cholesky": (_F, None), "linalg_cholesky_ex": (_F, None), "cholesky_solve": (_F, None),
    "cholesky_inverse": (_F, None), "pinverse": (_F, None), "geqrf": (_F, None), "orgqr": (_F, None),
    "ormqr": (_F, None), "linalg_qr": (_F, None), "linalg_svd": (_F, None), "linalg_svdvals": (_F, None),
    "linalg_eigh": (_F, None), "linalg_eigvalsh": (_F, None), "linalg_inv": (_F, None),
    "linalg_inv_ex": (_F, None), "linalg_solve": (_F, None), "linalg_lstsq": (_F, None),
    "linalg_cond": (_F, None), "linalg_matrix_rank": (_F, None), "linalg_tensorinv": (_F, None),
    "linalg_tensorsolve": (_F, None), "triangular_solve": (_F, None),
    # numerics that need float32's range
    "cdist": (_F, _F), "prod": (_F, _F), "trace": (_F, None), "inverse": (_F, None),
    "softmax": (None, _F), "log_softmax": (None, _F), "cumsum": (None, _F), "cumprod": (None, _F),
    "exp": (None, _F), "log": (None, _F), "rsqrt": (None, _F), "reciprocal": (None, _F),
    "pow": (None, _F), "acos": (None, _F), "asin": (None, _F), "cosh": (None, _F), "sinh": (None, _F),
    "tan": (None, _F), "erfinv": (None, _F), "expm1": (None, _F), "log10": (None, _F), "log1p": (None, _F),
    "log2": (None, _F), "cosine_similarity": (None, _F), "dist": (None, _F), "norm": (None, _F),
    "normalize": (None, _F), "pdist": (None, _F), "softmin": (None, _F), "softplus": (None, _F),
    "sum": (None, _F), "renorm": (None, _F), "logsumexp": (None, _F), "linalg_vector_norm": (None, _F),
    "linalg_matrix_norm": (None, _F), "frobenius_norm": (None, _F), "nuclear_norm": (None, _F),
    # interpolate, by mode and dims (the CPU leaves them; graphc builds the antialiased ones from MatMuls)
    **{op: (None, _F) for op in ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
                                 "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d")},
    "_upsample_bilinear2d_aa": (_G, _F), "_upsample_bicubic2d_aa": (_G, _F),
    # norms
    "layer_norm": (_M, _F), "native_layer_norm": (None, _F), "group_norm": (_M, _F), "batch_norm": (_M, _M), "rms_norm": (None, _F),
}

# F.interpolate's mode -> torch's upsample op; a nearest one is named by its dims
_UPSAMPLE = {"linear": "upsample_linear1d", "bilinear": "upsample_bilinear2d", "trilinear": "upsample_trilinear3d",
             "bicubic": "upsample_bicubic2d"}


def upsample_op(arguments: dict) -> str | None:
    """The upsample op of torch's that ``F.interpolate(**arguments)`` runs (``_upsample_bicubic2d_aa`` antialiased);
    None for an input without dims (interpolate reports it)."""
    ndim, mode = getattr(arguments["x"], "ndim", None), arguments["mode"]
    if ndim is None:
        return None
    op = f"upsample_nearest{ndim - 2}d" if mode == "nearest" else _UPSAMPLE.get(mode)
    return f"_{op}_aa" if op and arguments["antialias"] else op


# ONNX op type -> the torch op whose policy it follows, for ``generate(autocast=)`` on imported models
# (``passes/precision/autocast.py``). torch.onnx writes linear as Gemm (2-D input) or MatMul + Add,
# matmul/mm/bmm as MatMul, conv{1,2,3}d as Conv, conv_transpose{1,2,3}d as ConvTranspose, prelu as
# PRelu, scaled_dot_product_attention as Attention (opset 23) or as its MatMul/Softmax/MatMul form;
# einsum, which torch computes as bmm (so autocast lowers it), as Einsum; nn.RNN/GRU/LSTM as
# RNN/GRU/LSTM (lowered on CUDA only, as their cells). The float32-listed ops map one to one (CUDA's
# exp, log, softmax, sum, ...; both devices' prod and losses), Concat is cat (promote on the CPU; on
# CUDA torch.cat promotes by itself) and the three norms are the policy's "mixed" ones (float32 on
# CUDA for layer_norm and group_norm). An op type not here runs on what it is given, as torch's.
ONNX_OPS = {
    "MatMul": "matmul", "Gemm": "addmm", "Conv": "conv2d", "ConvTranspose": "conv_transpose2d",
    "PRelu": "prelu", "Attention": "scaled_dot_product_attention", "Einsum": "bmm",
    "RNN": "rnn_tanh_cell", "GRU": "gru_cell", "LSTM": "lstm_cell",
    "ReduceProd": "prod", "Softmax": "softmax", "LogSoftmax": "log_softmax", "CumSum": "cumsum",
    "Exp": "exp", "Log": "log", "Pow": "pow", "Reciprocal": "reciprocal", "Acos": "acos", "Asin": "asin",
    "Cosh": "cosh", "Sinh": "sinh", "Tan": "tan", "Softplus": "softplus", "ReduceSum": "sum",
    "ReduceL1": "norm", "ReduceL2": "norm", "LpNormalization": "normalize", "GridSample": "grid_sample",
    "NegativeLogLikelihoodLoss": "nll_loss", "SoftmaxCrossEntropyLoss": "cross_entropy",
    "Concat": "cat",
    "LayerNormalization": "layer_norm", "GroupNormalization": "group_norm", "BatchNormalization": "batch_norm",
}


def onnx_kinds(device: str) -> dict[str, str]:
    """ONNX op type -> what autocast runs it in on ``device`` (``LOWER``, ``FP32``, ``PROMOTE``,
    ``MIXED``); op types it leaves to their inputs are not keys."""
    return {onnx: kind(op, device) for onnx, op in ONNX_OPS.items() if kind(op, device) is not None}


def onnx_lower(device: str) -> frozenset[str]:
    """The ONNX op types autocast runs in the low dtype on ``device``."""
    return frozenset(onnx for onnx, how in onnx_kinds(device).items() if how == LOWER)


def kind(op: str, device: str) -> str | None:
    """What ``op`` runs in under autocast on ``device`` (None: as given)."""
    return POLICY[op][DEVICES.index(device)]


__all__ = ["DEVICES", "DTYPES", "FP32", "GIVEN", "LOWER", "MIXED", "ONNX_OPS", "POLICY", "PROMOTE", "kind", "onnx_kinds",
           "onnx_lower", "upsample_op"]
