"""The functional forms of the ``gc.nn`` layers beyond ``ops_nn`` (``torch.nn.functional`` names
and signatures): 1-D/3-D and transposed convolutions, 1-D and adaptive pooling, group/instance/RMS
norm, the activations and ``interpolate`` (attention: ``ops_attention``).
Each is standard ONNX ops; ops newer than the capture's opset are written out in older ones."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.autocast_policy import upsample_op
from graphc.errors import CaptureError
from graphc.model.dtypes import finfo
from graphc.dsl.ops import (clip, concat, const_i64, constant, emit, lift, mean, minimum, reshape, reshape_like,
                            same_dtype, scalar, sigmoid, softmax, sqrt, unary, where)
from graphc.dsl import activations64
from graphc.dsl.norms64 import rounds_eps, standardized
from graphc.dsl.inplace import into, writes_input
from graphc.dsl.ops import nan_if_any
from graphc.dsl.ops_array import chunk
from graphc.dsl.ops_pool_windows import empty_pool, windows_pool
from graphc.dsl.ops_nn import check_rank, conv_pads, ints, max_pool, pool_node
from graphc.dsl.resize_antialias import antialiased, floor_sizes
from graphc.dsl.resize_float64 import exact_resize
from graphc.dsl.resize_nearest import resize_is_faster
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32
from graphc.dsl.builder import current, op_error, user_source


# -- convolution ------------------------------------------------------------------------------


def _conv(op: str, x: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any,
          groups: int, nd: int, output_padding: Any = 0) -> Tensor:
    x = lift(x)
    weight, bias = lift(weight, x), None if bias is None else lift(bias, x)
    check_rank(op, x, nd + 2)
    ws = weight.shape
    in_channels = ws[1] * groups if op == "Conv" else ws[0]
    if isinstance(x.shape[1], int) and x.shape[1] != in_channels:
        raise op_error(op, [x, weight], f"input has {x.shape[1]} channels, weight expects {in_channels} "
                       f"(groups={groups})", user_source())
    kernel, strides, dil = list(ws[2:]), ints(stride, nd, "stride"), ints(dilation, nd, "dilation")
    if padding == "same" and op != "Conv":
        raise CaptureError(f"{op} takes no padding='same', as in PyTorch (at {user_source()})")
    attrs: dict[str, Any] = {"strides": strides, "dilations": dil, "group": int(groups), "kernel_shape": kernel,
                             "pads": conv_pads(padding, kernel, strides, dil)}
    if op == "ConvTranspose" and any(ints(output_padding, nd, "output_padding")):
        attrs["output_padding"] = ints(output_padding, nd, "output_padding")
    inputs = [x, weight] + ([bias] if bias is not None else [])
    for t in inputs[1:]:
        same_dtype(op, x, t)
    return emit(op, inputs, attrs)


@autocast_op()
def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """NCL convolution, weight ``[out, in/groups, k]``. Signature: ai.onnx@11::Conv"""
    return _conv("Conv", x, weight, bias, stride, padding, dilation, groups, 1)


@autocast_op()
def conv3d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """NCDHW convolution, weight ``[out, in/groups, kd, kh, kw]``. Signature: ai.onnx@11::Conv"""
    return _conv("Conv", x, weight, bias, stride, padding, dilation, groups, 3)


@autocast_op()
def conv_transpose1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """Weight ``[in, out/groups, k]``. Signature: ai.onnx@11::ConvTranspose"""
    return _conv("ConvTranspose", x, weight, bias, stride, padding, dilation, groups, 1, output_padding)


@autocast_op()
def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """Weight ``[in, out/groups, kh, kw]``. Signature: ai.onnx@11::ConvTranspose"""
    return _conv("ConvTranspose", x, weight, bias, stride, padding, dilation, groups, 2, output_padding)


@autocast_op()
def conv_transpose3d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """Weight ``[in, out/groups, kd, kh, kw]``. Signature: ai.onnx@11::ConvTranspose"""
    return _conv("ConvTranspose", x, weight, bias, stride, padding, dilation, groups, 3, output_padding)


# -- pooling ----------------------------------------------------------------------------------


def pool(op: str, x: Tensor, nd: int, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
         return_indices: bool = False, **extra: Any) -> Any:
    """An ``nd``-D AveragePool, LpPool or MaxPool (``max_pool``: with torch's indices if asked) with
    torch's ``kernel_size``, ``stride`` (None: the kernel), ``padding`` and ``ceil_mode``."""
    x = lift(x)
    check_rank(op, x, nd + 2)
    k = ints(kernel_size, nd, "kernel_size")
    attrs = {"kernel_shape": k, "strides": k if stride is None else ints(stride, nd, "stride"),
             "pads": ints(padding, nd, "padding") * 2, "ceil_mode": int(bool(ceil_mode)), **extra}
    if op == "MaxPool":
        return max_pool(x, attrs, return_indices)
    return pool_node(op, x, attrs)


def max_pool1d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """With ``return_indices``, ``(output, indices)`` as torch's. Signature: ai.onnx@12::MaxPool"""
    return pool("MaxPool", x, 1, kernel_size, stride, padding, ceil_mode, return_indices,
                dilations=ints(dilation, 1, "dilation"))


@in_float32
def avg_pool1d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Signature: ai.onnx@19::AveragePool"""
    return pool("AveragePool", x, 1, kernel_size, stride, padding, ceil_mode,
                 count_include_pad=int(bool(count_include_pad)))


def adaptive_pool(op: str, x: Tensor, output_size: Any, nd: int, return_indices: bool = False,
                  static_dims: bool = False) -> Any:
    """Adaptive ``op`` (AveragePool or MaxPool): output size 1 -> ``Global<op>`` (without
    indices); else an ``op`` whose kernel and stride are input size / output size, where the
    (static) input size divides evenly: then torch's windows are exactly those; other static sizes
    pool torch's uneven windows (``ops_pool_windows``). A ``None`` size keeps the input's, on a
    symbolic dim too unless ``static_dims``."""
    x = lift(x)
    check_rank(op, x, nd + 2)
    sizes = list(output_size) if isinstance(output_size, (tuple, list)) else ints(output_size, nd, "output_size")
    if len(sizes) != nd:
        raise CaptureError(f"output_size must be an int or {nd} sizes, got {output_size} (at {user_source()})")
    if 0 in sizes:
        return empty_pool(x, sizes, return_indices)
    if sizes == [1] * nd and not return_indices:
        y = emit(f"Global{op}", [x])
        return nan_if_any(y, x, list(range(2, nd + 2)), True) if op == "MaxPool" else y
    dims = list(x.shape[2:])
    if not all((isinstance(d, int) or (o is None and not static_dims)) and (o is None or d % o == 0)
               for d, o in zip(dims, sizes)):
        if not all(isinstance(d, int) for d in dims):
            raise op_error(op, [x], f"adaptive pooling to {tuple(sizes)} needs static spatial dims where they "
                           "are not multiples of the output size", user_source())
        return windows_pool(op, x, [d if o is None else o for d, o in zip(dims, sizes)], return_indices)
    kernel = [1 if o is None else d // o for d, o in zip(dims, sizes)]
    return pool(op, x, nd, kernel, None, 0, False, return_indices)


@in_float32
def adaptive_avg_pool(x: Tensor, output_size: Any, nd: int) -> Tensor:
    """``adaptive_pool`` with AveragePool, torch's windows."""
    return adaptive_pool("AveragePool", x, output_size, nd)


def adaptive_avg_pool1d(x: Tensor, output_size: Any) -> Tensor:
    return adaptive_avg_pool(x, output_size, 1)


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    return adaptive_avg_pool(x, output_size, 2)


# -- normalisation ----------------------------------------------------------------------------


def _channel_shape(x: Tensor, t: Tensor) -> Tensor:
    """A per-channel ``[C]`` tensor shaped ``[C, 1, ...]`` to broadcast over ``x``'s spatial dims."""
    return reshape(t, [-1] + [1] * (x.ndim - 2))


@autocast_op()
@in_float32
def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.group_norm``: statistics over each group of channels and the spatial
    dims, written out (two-pass mean and variance) at every opset."""
    x = lift(x)
    channels = x.shape[1]
    if not isinstance(channels, int) or channels % num_groups:
        raise op_error("GroupNormalization", [x], f"needs a static channel count divisible by {num_groups} groups",
                       user_source())
    one = np.ones(channels, x.dtype.numpy)
    weight = constant(one) if weight is None else lift(weight, x)
    bias = constant(np.zeros_like(one)) if bias is None else lift(bias, x)
    for name, t in (("weight", weight), ("bias", bias)):  # onnx infers nothing to check them by
        if t.shape is not None and (len(t.shape) != 1 or t.shape[0] != channels):
            raise op_error("GroupNormalization", [x, t], f"{name} must have one entry per channel ({channels},), "
                           f"got {tuple(t.shape)}", user_source())
    # NOTE: not ONNX GroupNormalization (opset 21): onnxruntime 1.31's CPU kernel cancels
    # catastrophically when a group's mean is large next to its std (max error vs torch on
    # N(100, 0.1) data 0.24, N(1000, 0.1) NaN; written out here 1e-4 and 1e-3, as numpy).
    normed = standardized(reshape(x, [x.shape[0], num_groups, -1]), -1, eps)
    normed = reshape_like(normed, x)  # H, W may be symbolic
    return normed * _channel_shape(x, weight) + _channel_shape(x, bias)


@in_float32
def instance_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Per-sample, per-channel statistics over the spatial dims (no running statistics); a float64
    ``x`` with an ``eps`` float32 cannot hold written out (``norms64``).
    Signature: ai.onnx@6::InstanceNormalization"""
    x = lift(x)
    channels = x.shape[1]
    if (weight is None or bias is None) and not isinstance(channels, int):
        raise op_error("InstanceNormalization", [x], "needs a static channel count without weight/bias",
                       user_source())
    if weight is None:
        weight = constant(np.ones(channels, x.dtype.numpy))
    if bias is None:
        bias = constant(np.zeros(channels, x.dtype.numpy))
    weight, bias = lift(weight, x), lift(bias, x)
    if rounds_eps(x, eps):
        return standardized(x, list(range(2, x.ndim)), eps) * _channel_shape(x, weight) + _channel_shape(x, bias)
    return emit("InstanceNormalization", [x, weight, bias], {"epsilon": float(eps)})


@autocast_op()
def rms_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` dims; ``eps``
    None is the dtype's machine epsilon, as PyTorch. ``RMSNormalization`` from opset 23, but for a
    float64 ``x`` with an ``eps`` float32 cannot hold (``norms64``)."""
    x = lift(x)
    shape = [int(normalized_shape)] if isinstance(normalized_shape, (int, np.integer)) else list(normalized_shape)
    if x.shape is not None and list(x.shape[-len(shape):]) != shape:
        raise op_error("RMSNormalization", [x], f"trailing dims must be {tuple(shape)}", user_source())
    eps = float(finfo(x.dtype).eps) if eps is None else float(eps)  # x's own, float16's too
    return _rms_norm(x, shape, weight if weight is None else lift(weight, x), eps)


@in_float32
def _rms_norm(x: Tensor, shape: list, weight: Tensor | None, eps: float) -> Tensor:
    axes = list(range(-len(shape), 0))
    if current().opset >= 23 and not rounds_eps(x, eps):
        scale = constant(np.ones(shape, x.dtype.numpy)) if weight is None else weight
        return emit("RMSNormalization", [x, scale], {"axis": -len(shape), "epsilon": eps})
    y = x / sqrt(mean(x * x, axes, keepdims=True) + scalar(eps, x))
    return y if weight is None else y * weight


# -- activations ------------------------------------------------------------------------------


@writes_input
def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """Signature: ai.onnx@16::LeakyRelu"""
    return activations64.native_or_written(x, "LeakyRelu", {"alpha": float(negative_slope)}, inplace)


@writes_input
def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """Signature: ai.onnx@6::Elu"""
    return activations64.native_or_written(x, "Elu", {"alpha": float(alpha)}, inplace)


@writes_input
def silu(x: Tensor, inplace: bool = False) -> Tensor:
    """``x * sigmoid(x)``."""
    x = lift(x)
    return into(x, x * sigmoid(x), inplace)


@writes_input
def mish(x: Tensor, inplace: bool = False) -> Tensor:
    """``x * tanh(softplus(x))``, written out before opset 18. Signature: ai.onnx@18::Mish"""
    x = lift(x)
    native = current().opset >= 18 and x.dtype != "float64"  # onnxruntime's Mish expands to a Softplus
    out = unary("Mish", x) if native else x * unary("Tanh", activations64.native_or_written(x, "Softplus", {}))
    return into(x, out, inplace)


@writes_input
def hardswish(x: Tensor, inplace: bool = False) -> Tensor:
    """``x * relu6(x + 3) / 6``. Signature: ai.onnx@14::HardSwish"""
    return activations64.native_or_written(x, "HardSwish", {}, inplace)


@writes_input
def hardsigmoid(x: Tensor, inplace: bool = False) -> Tensor:
    """``relu6(x + 3) / 6``. Signature: ai.onnx@6::HardSigmoid"""
    return activations64.native_or_written(x, "HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5}, inplace)


@autocast_op()
def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta x)) / beta``, ``x`` itself where ``beta x > threshold``."""
    x = lift(x)
    if beta == 1.0:
        soft = activations64.native_or_written(x, "Softplus", {})
    else:
        soft = activations64.native_or_written(x * scalar(beta, x), "Softplus", {}) / scalar(beta, x)
    return where(x * scalar(beta, x) > scalar(threshold, x), x, soft)


@writes_input
def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` clamped to ``[min_val, max_val]``. Two Wheres, not a Clip: torch's gradient is 0 at the
    bounds themselves (Clip's, as ``torch.clamp``'s, passes there); NaN stays NaN."""
    if not min_val < max_val:
        raise CaptureError(f"{hardtanh_bounds_message('hardtanh', min_val, max_val)} (at {user_source()})")
    x = lift(x)
    lo, hi = scalar(min_val, x), scalar(max_val, x)
    return into(x, where(x <= lo, lo, where(x >= hi, hi, x)), inplace)


def hardtanh_bounds_message(name: str, min_val: float, max_val: float) -> str:
    """The refusal of bounds that are not ``min_val < max_val`` (``F.hardtanh``'s and ``nn.Hardtanh``'s)."""
    return f"{name} needs min_val < max_val, got {min_val} and {max_val}"


@writes_input
def relu6(x: Tensor, inplace: bool = False) -> Tensor:
    """``hardtanh(x, 0, 6)``, as torch defines it (gradient 0 at 0 and at 6)."""
    return hardtanh(x, 0.0, 6.0, inplace)


@writes_input
def selu(x: Tensor, inplace: bool = False) -> Tensor:
    """``scale * elu(x, alpha)`` with torch's constants (ONNX's defaults, float32).
    Signature: ai.onnx@6::Selu"""
    return activations64.native_or_written(x, "Selu", {}, inplace)


@writes_input
def celu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``; ONNX's Celu takes float32 only, so
    other dtypes get its function body, ``alpha * elu(x / alpha)``. Signature: ai.onnx@12::Celu"""
    if alpha == 0:
        raise CaptureError(f"celu alpha must not be 0 (at {user_source()})")
    x = lift(x)
    if x.dtype == "float32":
        return into(x, unary("Celu", x, alpha=float(alpha)), inplace)
    return into(x, elu(x / scalar(alpha, x)) * scalar(alpha, x), inplace)


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """``a * sigmoid(b)`` for the halves ``a, b`` of ``dim`` (a static, even size)."""
    x = lift(x)
    size = x.shape[dim] if x.shape is not None and -x.ndim <= dim < x.ndim else None
    if not isinstance(size, int) or size % 2:
        raise op_error("Split", [x], f"glu halves dim {dim}, which needs a static even size, got {size}",
                       user_source())
    a, b = chunk(x, 2, dim)
    return a * sigmoid(b)


@in_float32
def logsigmoid(x: Tensor) -> Tensor:
    """``log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|))``: exp never overflows, and the gradient
    is ``sigmoid(-x)`` to the last bit (Min's tie at 0 gives torch's 0.5; no Softplus: onnxruntime
    has none in float64)."""
    x = lift(x)
    return minimum(x, scalar(0.0, x)) - unary("Log", unary("Exp", -unary("Abs", x)) + scalar(1.0, x))


def softsign(x: Tensor) -> Tensor:
    """``x / (1 + |x|)``. Signature: ai.onnx@1::Softsign"""
    return activations64.native_or_written(x, "Softsign", {})


def tanhshrink(x: Tensor) -> Tensor:
    """``x - tanh(x)``."""
    x = lift(x)
    return x - unary("Tanh", x)


def _check_lambd(fn: str, lambd: float) -> None:
    if lambd < 0:
        raise CaptureError(f"{fn} lambd must be >= 0, got {lambd} (at {user_source()})")


def softshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0: ``x - clamp(x, -lambd,
    lambd)``, whose gradient is 0 on ``[-lambd, lambd]`` bounds included, as torch's (ONNX
    ``Shrink`` says the same but onnxruntime runs it about 4x slower than these two nodes)."""
    _check_lambd("softshrink", lambd)
    x = lift(x)
    return x - clip(x, -lambd, lambd)


def hardshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0."""
    _check_lambd("hardshrink", lambd)
    x = lift(x)
    return where(unary("Abs", x) > scalar(lambd, x), x, scalar(0.0, x))


@writes_input
def threshold(x: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold`` or NaN, else ``value`` (gradient 0 there), as torch."""
    x = lift(x)
    return into(x, where(x <= scalar(threshold, x), scalar(value, x), x), inplace)


@autocast_op()
def softmin(x: Tensor, dim: int = -1) -> Tensor:
    """``softmax(-x, dim)``."""
    return softmax(-lift(x), dim)


@autocast_op()
def prelu(x: Tensor, weight: Tensor) -> Tensor:
    """``max(0, x) + weight * min(0, x)``, one slope per channel (dim 1) or one for all.
    Signature: ai.onnx@16::PRelu"""
    x = lift(x)
    weight = lift(weight, x)
    if weight.shape is not None and weight.shape != (1,) and x.ndim > 2:
        weight = _channel_shape(x, weight)
    return emit("PRelu", [x, weight])


# -- resampling -------------------------------------------------------------------------------


_RESIZE_MODES = {"nearest": "nearest", "nearest-exact": "nearest", "linear": "linear", "bilinear": "linear",
                 "trilinear": "linear", "bicubic": "cubic"}
# torch's source index: nearest floor(i / s); nearest-exact floor((i + 0.5) / s), ONNX's half_pixel rounded up
_NEAREST = {"nearest": ("asymmetric", "floor"), "nearest-exact": ("half_pixel", "round_prefer_ceil")}


@autocast_op(named=upsample_op)
def interpolate(x: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """``torch.nn.functional.interpolate`` for modes nearest, nearest-exact (``resize_nearest``), (bi/tri)linear,
    bicubic and area (``adaptive_avg_pool``), by ``size`` or ``scale_factor``; ``recompute_scale_factor=True``
    resizes to torch's ``floor(n * factor)`` sizes (static spatial dims); ``antialias=True``: torch's antialiased
    bilinear/bicubic (``resize_antialias``). Signature: ai.onnx@19::Resize"""
    x = lift(x)
    nd = x.ndim - 2
    if recompute_scale_factor and scale_factor is not None:
        if not all(isinstance(n, int) for n in x.shape[2:]):
            raise op_error("Resize", [x], "recompute_scale_factor=True needs static spatial dims", user_source())
        size, scale_factor = floor_sizes(x, _factors(scale_factor, nd)), None
    if mode not in _RESIZE_MODES and mode != "area":
        raise CaptureError(f"interpolate mode={mode!r}; expected one of {sorted([*_RESIZE_MODES, 'area'])} "
                           f"(at {user_source()})")
    if (size is None) == (scale_factor is None):
        raise CaptureError(f"interpolate takes exactly one of size and scale_factor (at {user_source()})")
    factors = None if scale_factor is None else _factors(scale_factor, nd)
    if antialias:
        return antialiased(x, mode, None if size is None else ints(size, nd, "size"), factors, align_corners)
    static = ints(size, nd, "size") if factors is None else floor_sizes(x, factors)
    if mode == "area":  # torch's: adaptive average pooling to the output size
        if static is None:
            raise op_error("Resize", [x], "mode='area' with scale_factor needs static spatial dims", user_source())
        return adaptive_avg_pool(x, static, nd)
    if static is not None and all(isinstance(n, int) for n in x.shape[2:]) and (
            mode in _NEAREST or x.dtype == "float64") and not resize_is_faster(mode, factors):
        return exact_resize(x, mode, static, factors, align_corners)  # float64: torch's double coordinates
    attrs: dict[str, Any] = {"mode": _RESIZE_MODES[mode]}
    if mode in _NEAREST:
        attrs.update(zip(("coordinate_transformation_mode", "nearest_mode"), _NEAREST[mode]))
    else:
        attrs["coordinate_transformation_mode"] = "align_corners" if align_corners else "half_pixel"
        if mode == "bicubic":
            attrs["cubic_coeff_a"] = -0.75
    if factors is not None:
        sizes = _sizes_scales_miss(x, factors)
        if sizes is None:
            return emit("Resize", [x, None, constant(np.asarray([1.0, 1.0, *factors], np.float32))], attrs)
    else:
        sizes = ints(size, nd, "size")
    if current().opset >= 18:  # the spatial sizes alone (``axes``), so N and C may be symbolic
        attrs["axes"] = list(range(2, nd + 2))
        return emit("Resize", [x, None, None, const_i64(sizes)], attrs)
    lead = emit("Slice", [emit("Shape", [x]), const_i64([0]), const_i64([2])])
    return emit("Resize", [x, None, None, concat([lead, const_i64(sizes)])], attrs)


def _factors(scale_factor: Any, nd: int) -> list[float]:
    """``scale_factor`` (one number, or one per spatial dim) as ``nd`` floats."""
    return [float(f) for f in (scale_factor if isinstance(scale_factor, (tuple, list)) else [scale_factor] * nd)]


def _sizes_scales_miss(x: Tensor, factors: list[float]) -> list[int] | None:
    """PyTorch's output sizes, ``floor(n * factor)`` in double, where the float32 scales would give
    others: ONNX floors ``n * float32(factor)`` (onnx's shape inference and reference, the numpy
    backend), so 5 * 1.4 gives 6 (onnxruntime's float32 product gives 7). Such sizes are written
    as ``sizes``, whose implied scales are the factors to within float32 rounding. None where the
    scales give PyTorch's sizes, or a spatial dim is symbolic (the scales are kept)."""
    want = floor_sizes(x, factors)
    return None if want is None or want == floor_sizes(x, [float(np.float32(f)) for f in factors]) else want


__all__ = [
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "avg_pool1d", "celu", "conv1d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "elu", "glu", "group_norm", "hardshrink", "hardsigmoid", "hardswish",
    "hardtanh", "instance_norm", "interpolate", "leaky_relu", "logsigmoid", "max_pool1d", "mish",
    "prelu", "relu6", "rms_norm", "selu", "silu", "softmin", "softplus", "softshrink",
    "softsign", "tanhshrink", "threshold", "conv_transpose3d", "pool",
]
