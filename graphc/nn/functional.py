"""``gc.nn.functional`` (``import graphc.nn.functional as F``): every DSL function under
``torch.nn.functional``'s and ``torch``'s names, in one namespace. Where a ``gc.`` function's
signature differs from torch's (``axis`` for ``dim``), the version here takes torch's."""

from graphc.dsl import ops, ops_layers
from graphc.dsl.ops import (abs, cast, clip, concat, erf, exp, flatten, gelu, log, matmul, maximum, minimum, reshape,
                            sigmoid, sqrt, stack, tanh, where)
from graphc.dsl.inplace import into, writes_input
from graphc.dsl.torch_keywords import RENAMES as _RENAMES, torch_names as _torch_names
from graphc.nn.signatures import implicit_dim
from graphc.dsl.ops_array import (arange, argmax, argmin, cat, chunk, clamp, cos, cumsum, einsum, expand, flip,
                                  full, full_like, gather, index_select, logsumexp, masked_fill, one_hot,
                                  ones, ones_like, pad, permute, pow, repeat, roll, rsqrt, scatter, sin, split, std,
                                  tile, topk, tril, triu, var, zeros, zeros_like)
from graphc.dsl.ops_divide import fmod, remainder
from graphc.dsl.ops_order import cummax, cummin, median, nanmedian
from graphc.dsl.ops_fold import fold, unfold
from graphc.dsl.ops_distance import bilinear, cosine_similarity, pairwise_distance, pdist
from graphc.dsl.ops_embedding import embedding_bag
from graphc.dsl.losses_linear import linear_cross_entropy
from graphc.dsl.ops_random import gumbel_softmax, rrelu
from graphc.dsl.ops_math import (all, amax, amin, any, ceil, floor, frac, isfinite, isinf, isnan, logaddexp,
                                 logical_and, logical_not, logical_or, logical_xor, nan_to_num, neg, norm, normalize,
                                 prod, reciprocal, round, sign, square, trunc)
from graphc.dsl.ops_views import (addmm, argsort, baddbmm, diff, expand_as, index_add, index_copy, movedim, narrow,
                                  outer, repeat_interleave, select, sort, t, unflatten)
from graphc.dsl.ops_layers import (adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, celu, conv1d, conv3d,
                                   conv_transpose1d, conv_transpose2d, conv_transpose3d, elu, glu, group_norm,
                                   hardshrink, hardsigmoid, hardswish, hardtanh, interpolate, leaky_relu, logsigmoid,
                                   max_pool1d, mish, prelu, relu6, rms_norm, selu, silu, softplus,
                                   softshrink, softsign, tanhshrink, threshold)
from graphc.dsl.ops_attention import scaled_dot_product_attention
from graphc.dsl.ops_pool import (adaptive_avg_pool3d, adaptive_max_pool1d, adaptive_max_pool1d_with_indices,
                                 adaptive_max_pool2d, adaptive_max_pool2d_with_indices, adaptive_max_pool3d,
                                 adaptive_max_pool3d_with_indices, avg_pool3d, local_response_norm, lp_pool1d,
                                 lp_pool2d, lp_pool3d, max_pool1d_with_indices, max_pool2d_with_indices, max_pool3d,
                                 max_pool3d_with_indices, max_unpool1d, max_unpool2d, max_unpool3d)
from graphc.dsl.ops_spatial import (affine_grid, channel_shuffle, grid_sample, pixel_shuffle, pixel_unshuffle,
                                    upsample, upsample_bilinear, upsample_nearest)
from graphc.dsl import ops_aliases
from graphc.dsl.ops_aliases import native_channel_shuffle
from graphc.dsl.ops_fractional import (fractional_max_pool2d, fractional_max_pool2d_with_indices,
                                       fractional_max_pool3d, fractional_max_pool3d_with_indices)
from graphc.dsl.ops_dropout import alpha_dropout, dropout1d, dropout2d, dropout3d, feature_alpha_dropout
from graphc.dsl.ops_linalg import (addbmm, addmv, addr, bmm, chain_matmul, cross, cumprod, det, diag, diag_embed,
                                  diagflat, diagonal, dot, inner, kron, logcumsumexp, logdet, mm, mv, slogdet, trace,
                                  vdot)
from graphc.dsl.ops_stats import (aminmax, corrcoef, count_nonzero, cov, dist, histc, kthvalue, mode, nanmean,
                                  nanquantile, nansum, quantile, std_mean, var_mean)
from graphc.dsl.ops_reshape import (atleast_1d, atleast_2d, atleast_3d, broadcast_tensors, broadcast_to, clone, dsplit,
                                   fliplr, flipud, hsplit, is_floating_point, moveaxis, numel, ravel, rot90,
                                   split_with_sizes, squeeze, swapaxes, swapdims, take, take_along_dim, tensor_split,
                                   unbind, unsqueeze, vsplit)
from graphc.dsl.ops_scatter import (argwhere, diagonal_scatter, index_fill, index_put, masked_scatter, masked_select,
                                   nonzero, scatter_add, scatter_reduce, select_scatter, slice_scatter)
from graphc.dsl.ops_nn import avg_pool2d, batch_norm, conv2d, dropout, embedding, layer_norm, linear, max_pool2d
from graphc.dsl.ops_binary import (add, addcdiv, addcmul, allclose, arctan2, atan2, bitwise_and, bitwise_left_shift,
                                   bitwise_not, bitwise_or, bitwise_right_shift, bitwise_xor, copysign, div, divide,
                                   eq, equal, float_power, floor_divide, fmax, fmin, gcd, ge, greater, greater_equal,
                                   gt, heaviside, hypot, isclose, lcm, le, lerp, less, less_equal, logaddexp2, lt,
                                   mul, multiply, ne, not_equal, sub, subtract, true_divide, xlogy)
from graphc.nn.loss import (binary_cross_entropy, binary_cross_entropy_with_logits, cosine_embedding_loss,
                            cross_entropy, gaussian_nll_loss, hinge_embedding_loss, huber_loss, kl_div, l1_loss,
                            margin_ranking_loss, mse_loss, multi_margin_loss, multilabel_margin_loss,
                            multilabel_soft_margin_loss, nll_loss, poisson_nll_loss, smooth_l1_loss,
                            soft_margin_loss, triplet_margin_loss, triplet_margin_with_distance_loss)
from graphc.dsl.ctc import ctc_loss
from graphc.dsl.ops_elementwise import (absolute, acos, acosh, arccos, arccosh, arcsin, arcsinh, arctan, arctanh,
                                        asin, asinh, atan, atanh, clamp_max, clamp_min, cosh, deg2rad, erfc, erfinv,
                                        exp2, expm1, fix, isneginf, isposinf, isreal, log1p, log2, log10, logit,
                                        negative, positive, rad2deg, sgn, signbit, sinc, sinh, tan)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,  # noqa: A002
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5):
    """``torch.nn.functional.instance_norm``, torch's order: each sample's own statistics, or with
    ``use_input_stats=False`` ``running_mean``/``running_var`` (which torch would otherwise update in
    place: refused, ``gc.instance_norm``)."""
    return ops_aliases.instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                                     eps, True)


@writes_input
def relu(input, inplace: bool = False):  # noqa: A002
    """``torch.nn.functional.relu(input, inplace=False)``: ``inplace=True`` writes into ``input`` and returns it."""
    return into(input, ops.relu(input), inplace)


def _in(input, dtype):  # noqa: A002
    """``input``, cast to ``dtype`` first when given, as torch's softmaxes' ``dtype=``."""
    return input if dtype is None else cast(ops.lift(input), dtype)


def softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):  # noqa: A002 - torch's names
    """``torch.nn.functional.softmax(input, dim=None, dtype=None)``: ``dtype`` casts ``input`` first;
    ``dim=None`` is torch's implicit dim, with its warning (``implicit_dim``; ``_stacklevel``, torch's warning
    depth, is unused)."""
    return ops.softmax(_in(input, dtype), implicit_dim("softmax", input, dim))


def softmin(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):  # noqa: A002
    """``torch.nn.functional.softmin(input, dim=None, dtype=None)``: ``softmax(-input)``, as ``softmax``."""
    return ops_layers.softmin(_in(input, dtype), implicit_dim("softmin", input, dim))


def log_softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):  # noqa: A002
    """``torch.nn.functional.log_softmax(input, dim=None, dtype=None)``, as ``softmax``."""
    return ops.log_softmax(_in(input, dtype), implicit_dim("log_softmax", input, dim))


def sum(input, *args, **kwargs):  # noqa: A001, A002 - torch's names
    """``torch.sum(input, dim=None, keepdim=False)`` (``axis=``/``keepdims=`` too): ``Tensor.sum``."""
    return ops.lift(input).sum(*args, **kwargs)


def mean(input, *args, **kwargs):  # noqa: A002
    """``torch.mean(input, dim=None, keepdim=False)``: ``Tensor.mean``."""
    return ops.lift(input).mean(*args, **kwargs)


def max(input, *args, **kwargs):  # noqa: A001, A002
    """``torch.max(input)``, the largest value; ``torch.max(input, dim, keepdim=False)``, torch's
    ``(values, indices)`` (also the values Tensor, as ``Tensor.max``); or ``torch.max(input,
    other)``, the elementwise maximum."""
    return ops.lift(input).max(*args, **kwargs)


def min(input, *args, **kwargs):  # noqa: A001, A002
    """``torch.min``, as ``max``."""
    return ops.lift(input).min(*args, **kwargs)


def transpose(input, *dims):  # noqa: A002
    """``torch.transpose(input, dim0, dim1)``: two dims swapped; a permutation, or none (all
    axes reversed), as ``gc.transpose``: ``Tensor.transpose``."""
    return ops.lift(input).transpose(*dims)


__all__ = [
    "abs", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "arange", "argmax", "argmin", "avg_pool1d", "avg_pool2d",
    "batch_norm", "cast", "chunk", "clamp", "clip", "concat", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "cos", "cumsum", "dropout", "einsum", "elu", "embedding", "erf", "exp", "expand",
    "flatten", "full", "full_like", "gather", "gelu", "group_norm", "hardsigmoid", "hardswish", "index_select",
    "instance_norm", "interpolate", "layer_norm", "leaky_relu", "linear", "log", "log_softmax", "masked_fill",
    "matmul", "max", "max_pool1d", "max_pool2d", "maximum", "mean", "min", "minimum", "mish", "one_hot", "ones",
    "ones_like", "pad", "pixel_shuffle", "pow", "prelu", "relu", "repeat", "reshape", "rms_norm", "rsqrt",
    "scaled_dot_product_attention", "scatter", "sigmoid", "silu", "sin", "softmax", "softplus", "split", "sqrt",
    "squeeze", "stack", "sum", "tanh", "tile", "topk", "transpose", "tril", "triu", "unsqueeze", "where", "zeros",
    "zeros_like", "cat", "permute", "flip", "logsumexp", "normalize", "roll", "std", "var",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "huber_loss", "kl_div", "l1_loss",
    "mse_loss", "nll_loss", "smooth_l1_loss",
    "fold", "unfold", "fmod", "remainder",
    "all", "amax", "amin", "any", "ceil", "floor", "frac", "isfinite", "isinf", "isnan", "logaddexp", "logical_and",
    "logical_not", "logical_or", "logical_xor", "nan_to_num", "neg", "norm", "prod", "reciprocal", "round", "sign",
    "square", "trunc",
    "addmm", "argsort", "baddbmm", "diff", "expand_as", "index_add", "index_copy", "movedim", "narrow", "outer",
    "repeat_interleave", "select", "sort", "t", "unflatten",
    "celu", "glu", "hardshrink", "hardtanh", "logsigmoid", "relu6", "selu", "softmin", "softshrink", "softsign",
    "tanhshrink", "threshold",
    "cosine_embedding_loss", "gaussian_nll_loss", "hinge_embedding_loss", "margin_ranking_loss", "multi_margin_loss",
    "multilabel_margin_loss", "multilabel_soft_margin_loss", "poisson_nll_loss",
    "soft_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
    "cummax", "cummin", "median", "nanmedian",
    "bilinear", "cosine_similarity", "pairwise_distance", "pdist",
    "embedding_bag",
    "gumbel_softmax", "rrelu",
    "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d",
    "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d", "adaptive_max_pool3d_with_indices", "avg_pool3d",
    "conv_transpose3d", "local_response_norm", "lp_pool1d", "lp_pool2d", "lp_pool3d", "max_pool1d_with_indices",
    "max_pool2d_with_indices", "max_pool3d", "max_pool3d_with_indices", "max_unpool1d", "max_unpool2d", "max_unpool3d",
    "affine_grid", "channel_shuffle", "grid_sample", "native_channel_shuffle", "pixel_unshuffle", "upsample",
    "upsample_bilinear",
    "upsample_nearest",
    "alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "feature_alpha_dropout",
    "addbmm", "addmv", "addr", "bmm", "chain_matmul", "cross", "cumprod", "det", "diag", "diag_embed", "diagflat",
    "diagonal", "dot", "inner", "kron", "logcumsumexp", "logdet", "mm", "mv", "slogdet", "trace", "vdot",
    "aminmax", "corrcoef", "count_nonzero", "cov", "dist", "histc", "kthvalue", "mode", "nanmean", "nanquantile",
    "nansum", "quantile", "std_mean", "var_mean",
    "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_tensors", "broadcast_to", "clone", "dsplit", "fliplr",
    "flipud", "hsplit", "is_floating_point", "moveaxis", "numel", "ravel", "rot90", "split_with_sizes", "swapaxes",
    "swapdims", "take", "take_along_dim", "tensor_split", "unbind", "vsplit",
    "argwhere", "diagonal_scatter", "index_fill", "index_put", "masked_scatter", "masked_select", "nonzero",
    "scatter_add", "scatter_reduce", "select_scatter", "slice_scatter",
    "ctc_loss",
    "add", "addcdiv", "addcmul", "allclose", "arctan2", "atan2", "bitwise_and", "bitwise_left_shift", "bitwise_not",
    "bitwise_or", "bitwise_right_shift", "bitwise_xor", "copysign", "div", "divide", "eq", "equal", "float_power",
    "floor_divide", "fmax", "fmin", "gcd", "ge", "greater", "greater_equal", "gt", "heaviside", "hypot", "isclose",
    "lcm", "le", "lerp", "less", "less_equal", "logaddexp2", "lt", "mul", "multiply", "ne", "not_equal", "sub",
    "subtract", "true_divide", "xlogy",
    "absolute", "acos", "acosh", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctanh", "asin", "asinh",
    "atan", "atanh", "clamp_max", "clamp_min", "cosh", "deg2rad", "erfc", "erfinv", "exp2", "expm1", "fix",
    "isneginf", "isposinf", "isreal", "log10", "log1p", "log2", "logit", "negative", "positive", "rad2deg", "sgn",
    "signbit", "sinc", "sinh", "tan",
    "linear_cross_entropy",
]


# in-place activations (graphc.dsl.inplace): the input rebound to the result and returned, as torch's
from graphc.dsl.inplace import in_place as _in_place  # noqa: E402
from graphc.dsl.ops_layers import elu as _elu  # noqa: E402

relu_, elu_, leaky_relu_, hardtanh_, celu_, selu_, rrelu_, threshold_ = (
    _in_place(fn) for fn in (relu, _elu, leaky_relu, hardtanh, celu, selu, rrelu, threshold))
__all__ += ["relu_", "elu_", "leaky_relu_", "hardtanh_", "celu_", "selu_", "rrelu_", "threshold_"]
__all__ += ["fractional_max_pool2d", "fractional_max_pool2d_with_indices", "fractional_max_pool3d",
            "fractional_max_pool3d_with_indices"]
# torch.nn.functional's last names, part 2
from graphc.dsl.ops_mha import multi_head_attention_forward  # noqa: E402

__all__ += ["multi_head_attention_forward"]
from graphc.dsl.ops_grouped_mm import grouped_mm  # noqa: E402

__all__ += ["grouped_mm"]
from graphc.dsl.linalg_householder import geqrf, orgqr, ormqr  # noqa: E402

__all__ += ["geqrf", "orgqr", "ormqr"]
from graphc.dsl.ops_cells import conv_tbc  # noqa: E402

__all__ += ["conv_tbc"]

# torch's parameter names as keywords (``F.relu6(input=x)``), graphc's (``x=``) still bound
_TORCH_NAMES = {**_RENAMES, "one_hot": {"x": "tensor"}, "embedding": {"indices": "input"}}
for _name in __all__:
    globals()[_name] = _torch_names(globals()[_name], _TORCH_NAMES.get(_name))
del _name
