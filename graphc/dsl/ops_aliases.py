"""torch's remaining top-level aliases, in-place ``_`` forms and simple Tensor methods, each the
graph of the DSL function it names:

1. ``torch.<name>`` for functional ops under torch's own positional signature where it differs from
   ``torch.nn.functional``'s (``torch.group_norm(..., cudnn_enabled)``, losses taking torch's int
   ``reduction`` code, ``torch.grid_sampler``'s int modes, ``torch.adaptive_max_pool1d``'s pair);
2. the ``_`` forms torch has at top level (``torch.abs_(x)`` is ``x.abs_()``) and as methods
   (``x.eq_(y)``, ``x.transpose_(0, 1)``), through ``graphc.dsl.inplace``;
3. ``*_copy`` functions (the view op's result as a new Tensor, so a write never reaches the base),
   ``mH``/``H``/``adjoint`` (real dtypes: the transpose), ``sum_to_size``, ``msort`` and dtype tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import (linalg_householder, ops, ops_array, ops_binary, ops_dropout, ops_layers, ops_linalg, ops_nn,
                        ops_pool, ops_random, ops_reshape, ops_search, ops_spatial, ops_views)
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ctc import ctc_loss as _ctc_loss
from graphc.dsl.ops_distance import bilinear, cosine_similarity, pairwise_distance, pdist
from graphc.dsl.ops_layers import (adaptive_avg_pool1d, avg_pool1d, celu, conv1d, conv3d, conv_transpose1d,
                                   conv_transpose2d, conv_transpose3d, hardshrink, max_pool1d, prelu,
                                   rms_norm, selu, threshold)
from graphc.dsl.ops_pool import max_pool1d_with_indices, max_pool3d
from graphc.dsl.ops_spatial import channel_shuffle, pixel_shuffle, pixel_unshuffle
from graphc.dsl.inplace import in_place, method_in_place, reshaped_in_place, write
from graphc.dsl.losses import bce_with_logits, kl_div as _kl_div, poisson_nll
from graphc.dsl.losses_margin import cosine_embedding, hinge_embedding, margin_ranking, triplet_margin
from graphc.dsl.autocast import autocast_op
from graphc.dsl.tensor import ComplexTensor, Tensor, is_contiguous
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

# torch's int codes: at::Reduction, and grid_sampler's interpolation and padding modes
_REDUCTIONS = ("none", "mean", "sum")
_GRID_MODES = ("bilinear", "nearest", "bicubic")
_GRID_PADDINGS = ("zeros", "border", "reflection")


def _code(fn: str, arg: str, value: Any, names: tuple[str, ...]) -> str:
    """The name torch's int code ``value`` of ``arg`` stands for."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(names):
        raise CaptureError(f"{fn} {arg}={value!r}: expected an int code in 0..{len(names) - 1} "
                           f"({', '.join(f'{i} {n}' for i, n in enumerate(names))}), as torch.{fn} takes "
                           f"(at {user_source()})")
    return names[value]


def _tensor(fn: str, arg: str, x: Any, arrays: bool = False) -> Tensor:
    """``x``, a Tensor (a numpy array lifted where ``arrays``); a CaptureError naming ``fn``'s ``arg`` otherwise."""
    if arrays and isinstance(x, np.ndarray):
        return ops.lift(x)
    if not isinstance(x, Tensor):
        raise CaptureError(f"{fn} takes a Tensor {arg}, got {type(x).__name__} (at {user_source()})")
    return x


# 1. torch-level names: F's function where torch's positional order is F's (above), else under torch's
def group_norm(input: Tensor, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,  # noqa: A002
               cudnn_enabled: bool = True) -> Tensor:
    """``torch.group_norm``: ``F.group_norm``; ``cudnn_enabled`` is a device hint, ignored."""
    return ops_layers.group_norm(input, num_groups, weight, bias, eps)


def instance_norm(input: Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any,  # noqa: A002
                  use_input_stats: bool, momentum: float, eps: float, cudnn_enabled: bool) -> Tensor:
    """``torch.instance_norm``: with ``use_input_stats`` each sample's own statistics (running
    statistics, which torch would update in place, are refused); without, ``running_mean`` and
    ``running_var`` normalize every sample (a per-channel batch norm in eval mode)."""
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise CaptureError(f"instance_norm with use_input_stats=False needs running_mean and running_var "
                               f"(at {user_source()})")
        return ops_nn.batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    if running_mean is not None or running_var is not None:
        raise CaptureError(f"instance_norm updating running_mean/running_var in place is not captured; pass None "
                           f"(use gc.nn.InstanceNorm*d(track_running_stats=True) for running statistics) "
                           f"(at {user_source()})")
    return ops_layers.instance_norm(input, weight, bias, eps)


def kl_div(input: Tensor, target: Tensor, reduction: int = 1, *, log_target: bool = False) -> Tensor:  # noqa: A002
    """``torch.kl_div``: ``F.kl_div`` with torch's int ``reduction`` (1, mean, is over every element)."""
    return _kl_div(input, target, _code("kl_div", "reduction", reduction, _REDUCTIONS), log_target)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Any = None,  # noqa: A002
                                     pos_weight: Any = None, reduction: int = 1) -> Tensor:
    """``torch.binary_cross_entropy_with_logits``: ``weight, pos_weight, reduction`` in torch's order."""
    reduction = _code("binary_cross_entropy_with_logits", "reduction", reduction, _REDUCTIONS)
    return bce_with_logits(input, target, reduction, weight, pos_weight)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          reduction: int = 1) -> Tensor:
    """``torch.cosine_embedding_loss``, torch's int ``reduction``."""
    return cosine_embedding(input1, input2, target, margin,
                            _code("cosine_embedding_loss", "reduction", reduction, _REDUCTIONS))


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0,  # noqa: A002
                         reduction: int = 1) -> Tensor:
    """``torch.hinge_embedding_loss``, torch's int ``reduction``."""
    return hinge_embedding(input, target, margin, _code("hinge_embedding_loss", "reduction", reduction, _REDUCTIONS))


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        reduction: int = 1) -> Tensor:
    """``torch.margin_ranking_loss``, torch's int ``reduction``."""
    return margin_ranking(input1, input2, target, margin,
                          _code("margin_ranking_loss", "reduction", reduction, _REDUCTIONS))


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2.0,
                        eps: float = 1e-6, swap: bool = False, reduction: int = 1) -> Tensor:
    """``torch.triplet_margin_loss``, torch's int ``reduction``."""
    return triplet_margin(anchor, positive, negative, margin, p, eps, swap,
                          _code("triplet_margin_loss", "reduction", reduction, _REDUCTIONS))


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool, full: bool, eps: float,  # noqa: A002
                     reduction: int) -> Tensor:
    """``torch.poisson_nll_loss``: every argument required, as torch's; int ``reduction``."""
    return poisson_nll(input, target, log_input, full, eps,
                       _code("poisson_nll_loss", "reduction", reduction, _REDUCTIONS))


def ctc_loss(log_probs: Tensor, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0,
             reduction: int = 1, zero_infinity: bool = False) -> Tensor:
    """``torch.ctc_loss``, torch's int ``reduction``."""
    return _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
                     _code("ctc_loss", "reduction", reduction, _REDUCTIONS), zero_infinity)


def adaptive_max_pool1d(input: Tensor, output_size: Any) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``torch.adaptive_max_pool1d``: ``(values, indices)``, as torch's (``F``'s returns the values)."""
    return ops_pool.adaptive_max_pool1d_with_indices(input, output_size)


def constant_pad_nd(input: Tensor, pad: Any, value: Any = 0) -> Tensor:  # noqa: A002
    """``torch.constant_pad_nd``: ``F.pad(input, pad, "constant", value)``."""
    return ops_array.pad(input, pad, "constant", value)


@autocast_op()
def grid_sampler(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,  # noqa: A002
                 align_corners: bool) -> Tensor:
    """``torch.grid_sampler``: ``F.grid_sample`` with torch's int codes for the modes (0 bilinear, 1
    nearest, 2 bicubic; 0 zeros, 1 border, 2 reflection)."""
    mode = _code("grid_sampler", "interpolation_mode", interpolation_mode, _GRID_MODES)
    padding = _code("grid_sampler", "padding_mode", padding_mode, _GRID_PADDINGS)
    return ops_spatial.grid_sample(input, grid, mode, padding, align_corners)


def _grid_sampler_nd(rank: int) -> Any:
    def fn(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,  # noqa: A002
           align_corners: bool) -> Tensor:
        if not isinstance(input, Tensor) or input.shape is None or len(input.shape) != rank:
            raise CaptureError(f"grid_sampler_{rank - 2}d takes a rank-{rank} input, got "
                               f"{input.type_str() if isinstance(input, Tensor) else type(input).__name__} "
                               f"(at {user_source()}); gc.grid_sampler takes either")
        return grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)
    fn.__name__ = f"grid_sampler_{rank - 2}d"
    fn.__doc__ = f"``torch.grid_sampler_{rank - 2}d``: ``grid_sampler`` of a rank-{rank} input."
    return fn


grid_sampler_2d, grid_sampler_3d = _grid_sampler_nd(4), _grid_sampler_nd(5)


def affine_grid_generator(theta: Tensor, size: Any, align_corners: bool) -> Tensor:
    """``torch.affine_grid_generator``: ``F.affine_grid``."""
    return ops_spatial.affine_grid(theta, size, align_corners)


def rsub(input: Tensor, other: Any, alpha: Any = 1) -> Tensor:  # noqa: A002
    """``torch.rsub(input, other, alpha=1)``: ``other - alpha * input``."""
    return ops_binary.sub(other, _tensor("rsub", "input", input, arrays=True), alpha=alpha)


def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,  # noqa: A002
          generator: Any = None) -> Tensor:
    """``torch.rrelu``: ``F.rrelu``; a torch ``generator`` cannot seed the graph's draws and is refused."""
    if generator is not None:
        raise CaptureError(f"rrelu generator={generator!r}: a captured graph draws its own numbers (gc.capture's "
                           f"seed= seeds them); pass None (at {user_source()})")
    return ops_random.rrelu(input, lower, upper, training)


def _dropout_as_torch(fn: Any, name: str) -> Any:
    """``torch.<name>(input, p, train)``: ``fn`` under torch's argument name ``train``."""
    def dropout(input: Tensor, p: float, train: bool) -> Tensor:  # noqa: A002
        return fn(input, p, train)
    dropout.__name__, dropout.__doc__ = name, f"``torch.{name}(input, p, train)``: ``{fn.__name__}``."
    return dropout


# feature_dropout drops whole channels (a mask over the first two dims): dropout2d's
alpha_dropout, feature_alpha_dropout, feature_dropout = (
    _dropout_as_torch(fn, name) for fn, name in ((ops_dropout.alpha_dropout, "alpha_dropout"),
                                                 (ops_dropout.feature_alpha_dropout, "feature_alpha_dropout"),
                                                 (ops_dropout.dropout2d, "feature_dropout")))
native_channel_shuffle = channel_shuffle


# 2. torch's ``_`` functions: ``torch.<name>_(input, ...)`` is ``input.<name>_(...)`` (a complex ``input``'s too)
def _method(name: str) -> Any:
    def fn(input: Tensor, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        target = input if isinstance(input, ComplexTensor) else _tensor(name, "input", input)
        return getattr(target, name)(*args, **kwargs)
    fn.__name__, fn.__doc__ = name, f"``torch.{name}(input, ...)``: ``input.{name}(...)``."
    return fn


_TORCH_METHODS = (
    "abs_ acos_ acosh_ addmv_ arccos_ arccosh_ arcsin_ arcsinh_ arctan_ arctanh_ asin_ asinh_ atan_ atanh_ "
    "ceil_ clamp_ clamp_max_ clamp_min_ clip_ cos_ cosh_ deg2rad_ detach_ erf_ erfc_ exp2_ exp_ expm1_ fill_ fix_ "
    "floor_ frac_ gcd_ index_put_ lcm_ log10_ log1p_ log2_ log_ logit_ nan_to_num_ neg_ negative_ rad2deg_ "
    "reciprocal_ round_ rsqrt_ sigmoid_ sin_ sinc_ sinh_ sqrt_ square_ tan_ tanh_ trunc_ xlogy_ zero_ conj_physical_ "
    "i0_ ldexp_"
).split()
globals().update({name: _method(name) for name in _TORCH_METHODS})

# the in-place activations and dropouts torch has at top level
relu_, selu_, celu_, threshold_, rrelu_, dropout_, alpha_dropout_, feature_alpha_dropout_, feature_dropout_ = (
    in_place(fn) for fn in (ops.relu, ops_layers.selu, ops_layers.celu, ops_layers.threshold, rrelu, ops_nn.dropout,
                            alpha_dropout, feature_alpha_dropout, feature_dropout))


def fill(input: Tensor, value: Any) -> Tensor:  # noqa: A002
    """``torch.fill(input, value)``: a new Tensor of ``input``'s shape and dtype holding ``value``."""
    return ops_array.full_like(_tensor("fill", "input", input, arrays=True), value)


# Tensor methods' ``_`` forms: ``t`` rebound to the result (a comparison's or logical op's bool result
# cast to ``t``'s dtype, as torch writes it); the shape-changing ones refuse views, as ``t_`` does
def _cast_back(name: str) -> Any:
    def fn(t: Tensor, *args: Any) -> Tensor:
        out = getattr(t, name)(*args)
        return out if out.dtype == t.dtype else ops.cast(out, t.dtype)
    fn.__name__ = name
    return fn


def _detach_(t: Tensor) -> Tensor:
    """``t.detach_()``: ``t`` rebound to ``t.detach()``; a view is refused, as torch refuses it."""
    if t._view is not None:
        raise CaptureError(f"detach_ of {t.name}, a view, at {user_source()}: torch cannot detach views in place; "
                           f"use .detach()")
    return write(t, ops_reshape.clone(ops.detach(t)))


def _requires_grad_(t: Tensor, requires_grad: bool = True) -> Tensor:
    """``t.requires_grad_(True)``: ``t`` itself, as every float value of a capture can be differentiated by
    (``gc.autograd.grad``); False is refused, since a captured graph has no flags to clear."""
    if requires_grad is True and t.dtype in FLOAT_DTYPES:
        return t
    raise CaptureError(f"requires_grad_({requires_grad!r}) on {t.name} ({t.type_str()}) at {user_source()}: a captured "
                       f"graph has no autograd flags; every float value can be differentiated by (gc.autograd.grad), "
                       f"gc.detach(t) cuts the gradient, and gc.grad(model, loss, wrt=[...]) takes gradients with "
                       f"respect to parameters after capture")


_FLOAT_POWER_IN_PLACE = method_in_place("float_power")


def _float_power_(t: Tensor, exponent: Any) -> Tensor:
    """``t.float_power_(e)``: torch computes in float64 and refuses to write the result into any other dtype
    (where other in-place ops cast back)."""
    if t.dtype != "float64":
        raise CaptureError(f"float_power_ on {t.name} ({t.type_str()}) at {user_source()}: its result's dtype "
                           f"float64 is not the written tensor's {t.dtype}, and torch writes it into float64 only; "
                           f"write out of place: y = t.float_power(e)")
    return _FLOAT_POWER_IN_PLACE(t, exponent)


INPLACE_METHODS = {
    **{f"{name}_": method_in_place(name) for name in (
        "absolute arccos arccosh arcsin arcsinh arctan arctanh arctan2 negative multiply subtract divide clip "
        "gcd lcm bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift "
        "addmm addmv addr addbmm baddbmm index_put conj_physical").split()},
    **{f"{name}_": in_place(_cast_back(name)) for name in (
        "eq ne not_equal lt less le less_equal gt greater ge greater_equal "
        "logical_and logical_or logical_xor logical_not").split()},
    "transpose_": reshaped_in_place(ops_reshape.swapaxes), "swapaxes_": reshaped_in_place(ops_reshape.swapaxes),
    "swapdims_": reshaped_in_place(ops_reshape.swapaxes), "detach_": _detach_, "requires_grad_": _requires_grad_,
    "float_power_": _float_power_,
}


# 3. simple functions and methods
def conj(input: Tensor) -> Tensor:  # noqa: A002
    """``torch.conj`` (and ``resolve_conj``, ``resolve_neg``, ``real``): graphc's dtypes are real, so
    ``input`` itself, as torch returns it."""
    return ops.lift(input)


resolve_conj = resolve_neg = real = conj


def conj_physical(input: Tensor) -> Tensor:  # noqa: A002
    """``torch.conj_physical``: of a real Tensor, a copy."""
    return ops_reshape.clone(input)


def imag(input: Tensor) -> Tensor:  # noqa: A002
    """``torch.imag``: refused, as torch refuses it for real dtypes (graphc has no complex dtype)."""
    raise op_error("imag", [ops.lift(input)], "imag is not implemented for tensors with non-complex dtypes (as in "
                   "torch; graphc has no complex dtype)", user_source())


def is_conj(input: Tensor) -> bool:  # noqa: A002
    """``torch.is_conj`` (and ``is_neg``, ``is_complex``): False, every graphc dtype being real."""
    return False


is_neg = is_complex = is_conj


def is_same_size(input: Tensor, other: Tensor) -> bool:  # noqa: A002
    """``torch.is_same_size``: the shapes equal (a dim name equals only itself)."""
    return tuple(ops.lift(input).shape) == tuple(ops.lift(other).shape)


def is_signed(input: Tensor) -> bool:  # noqa: A002
    """``torch.is_signed``: False for bool and uint8, else True."""
    return ops.lift(input).dtype not in ("bool", "uint8")


def adjoint(input: Tensor) -> Tensor:  # noqa: A002
    """``torch.adjoint`` (``Tensor.mH``): the last two dims swapped (real dtypes: no conjugate)."""
    x = ops.lift(input)
    if x.ndim < 2:
        raise op_error("Transpose", [x], f"adjoint()/mH is only supported on matrices or batches of matrices, got a "
                       f"{x.ndim}-D tensor (as torch)", user_source())
    return ops_views.swap_last(x)


def matrix_h(input: Tensor) -> Tensor:  # noqa: A002
    """``Tensor.H``: a matrix transposed; a 0-D Tensor as it is; other ranks refused, as torch."""
    x = ops.lift(input)
    if x.ndim not in (0, 2):
        raise op_error("Transpose", [x], f"tensor.H is only supported on matrices (2-D tensors), got a {x.ndim}-D "
                       f"tensor; for batches of matrices use .mH (as torch)", user_source())
    return ops_views.t(x)


def msort(input: Tensor) -> Tensor:  # noqa: A002
    """``torch.msort``: sorted along dim 0, the values."""
    return ops_views.sort(input, 0)[0]


def sum_to_size(input: Tensor, *size: Any) -> Tensor:  # noqa: A002
    """``Tensor.sum_to_size(*size)``: summed to ``size``, which must broadcast to ``input``'s shape
    (leading dims summed away, dims of size 1 in ``size`` summed with keepdim)."""
    x = ops.lift(input)
    if not size:
        raise op_error("ReduceSum", [x], "sum_to_size: expected a size (ints, or one tuple: () sums every entry), "
                       "got none, as torch refuses", user_source())
    size = list(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else list(size)
    lead = x.ndim - len(size)
    if lead < 0 or any(s != 1 and s != d for s, d in zip(size, x.shape[lead:])):
        raise op_error("ReduceSum", [x], f"sum_to_size: size {size} is not expandable to size {list(x.shape)} "
                       f"(as torch)", user_source())
    if lead:
        x = x.sum(list(range(lead)))
    ones = [i for i, (s, d) in enumerate(zip(size, x.shape)) if s == 1 and d != 1]
    return x.sum(ones, keepdim=True) if ones else x


def narrow_copy(input: Tensor, dim: int, start: int, length: int) -> Tensor:  # noqa: A002
    """``torch.narrow_copy``: ``narrow``'s result as a new Tensor (not a view)."""
    return ops_reshape.clone(ops_views.narrow(input, dim, start, length))


def _copied(fn: Any, name: str) -> Any:
    """``torch.<name>``: ``fn``'s result (each of a tuple's) as a new Tensor, so a write into it never
    reaches the input, as torch's ``*_copy`` functions copy."""
    def copy(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return tuple(map(ops_reshape.clone, out)) if isinstance(out, tuple) else ops_reshape.clone(out)
    copy.__name__, copy.__doc__ = name, f"``torch.{name}``: ``{fn.__name__}``'s result, copied (not a view)."
    return copy


def _view(input: Tensor, size: Any) -> Tensor:  # noqa: A002
    return ops.reshape(input, list(size))


def _expand(input: Tensor, size: Any, *, implicit: bool = False) -> Tensor:  # noqa: A002
    return ops_array.expand(input, list(size))


def _slice(input: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Tensor:  # noqa: A002
    index = [slice(None)] * ops_array.dim_index(ops.lift(input), dim, "Slice") + [slice(start, end, step)]
    return ops.lift(input)[tuple(index)]


def alias(input: Tensor) -> Tensor:  # noqa: A002
    """``torch.alias``: ``input`` itself (one argument, as torch's)."""
    return ops.lift(input)


_COPIES = {
    "alias_copy": alias, "detach_copy": ops.detach, "diagonal_copy": ops_linalg.diagonal,
    "expand_copy": _expand, "permute_copy": ops.transpose, "select_copy": ops_views.select,
    "slice_copy": _slice, "split_copy": ops_array.split, "split_with_sizes_copy": ops_reshape.split_with_sizes,
    "squeeze_copy": ops_reshape.squeeze, "t_copy": ops_views.t, "transpose_copy": ops_reshape.swapaxes,
    "unbind_copy": ops_reshape.unbind, "unsqueeze_copy": ops_reshape.unsqueeze, "view_copy": _view,
    "unfold_copy": ops_search.windows,
}
globals().update({name: _copied(fn, name) for name, fn in _COPIES.items()})

def _is_contiguous(t: Tensor, memory_format: Any = None) -> bool:
    """``t.is_contiguous()``, torch's strides (True where graphc does not know them)."""
    if memory_format is not None and str(memory_format) != "torch.contiguous_format":
        raise CaptureError(f"is_contiguous memory_format={memory_format}: graphc tracks only torch's default "
                           f"(contiguous) strides (at {user_source()})")
    return is_contiguous(t)


ger = ops_views.outer

# Tensor methods (bound by methods_torch); a device move is the Tensor itself, as ``to(device)``
METHODS = {
    "tile": lambda a, *dims: ops_array.tile(a, list(dims[0]) if len(dims) == 1 and isinstance(
        dims[0], (tuple, list)) else list(dims)),
    "clip": ops_array.clamp, "mH": property(adjoint), "H": property(matrix_h), "adjoint": adjoint,
    "sum_to_size": sum_to_size, "is_same_size": is_same_size, "is_signed": is_signed, "narrow_copy": narrow_copy,
    "msort": msort, "conj": conj, "resolve_conj": conj, "resolve_neg": conj, "conj_physical": conj_physical,
    "real": property(conj), "is_conj": is_conj, "is_neg": is_conj, "prelu": prelu, "ger": ger,
    "is_contiguous": _is_contiguous, "cpu": lambda a, *args, **kwargs: a, "cuda": lambda a, *args, **kwargs: a,
    "geqrf": linalg_householder.geqrf, "orgqr": linalg_householder.orgqr, "ormqr": linalg_householder.ormqr,
    **INPLACE_METHODS,
}

__all__ = [
    "adaptive_avg_pool1d", "avg_pool1d", "bilinear", "celu", "channel_shuffle", "conv1d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "cosine_similarity", "hardshrink", "max_pool1d", "max_pool1d_with_indices",
    "max_pool3d", "pairwise_distance", "pdist", "pixel_shuffle", "pixel_unshuffle", "prelu", "rms_norm", "selu",
    "threshold",
    "group_norm", "instance_norm", "kl_div", "binary_cross_entropy_with_logits", "cosine_embedding_loss",
    "hinge_embedding_loss", "margin_ranking_loss", "triplet_margin_loss", "poisson_nll_loss", "ctc_loss",
    "adaptive_max_pool1d", "constant_pad_nd", "grid_sampler", "grid_sampler_2d", "grid_sampler_3d",
    "affine_grid_generator", "rsub", "rrelu",
    "alpha_dropout", "feature_alpha_dropout", "feature_dropout", "native_channel_shuffle", *_TORCH_METHODS,
    "relu_", "selu_", "celu_", "threshold_", "rrelu_", "dropout_", "alpha_dropout_", "feature_alpha_dropout_",
    "feature_dropout_", "fill", "conj", "resolve_conj", "resolve_neg", "real", "conj_physical", "imag", "is_conj",
    "is_neg", "is_complex", "is_same_size", "is_signed", "adjoint", "msort", "narrow_copy", "ger", *_COPIES,
]
