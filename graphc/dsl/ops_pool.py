"""The pooling functions of ``torch.nn.functional`` beyond ``ops_layers``: 3-D max and average
pooling, the ``*_with_indices`` forms, adaptive max pooling and 3-D adaptive average pooling,
``max_unpool``, power-average (``lp_pool``) pooling and ``local_response_norm``. Each is standard
ONNX ops that have gradient rules (MaxPool, AveragePool, Pow, ScatterElements, ...)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import concat, const_i64, emit, lift, reshape, reshape_like, scalar, unsqueeze
from graphc.dsl.ops_array import ir_tensor
from graphc.dsl.ops_layers import adaptive_avg_pool, adaptive_pool, max_pool1d, pool
from graphc.dsl.ops_nn import check_rank, ints, max_pool2d, positive_int, window_sums
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError


@autocast_op(named=lambda a: None if a["return_indices"] else "max_pool3d")
def max_pool3d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """NCDHW max pooling; with ``return_indices``, ``(output, indices)`` as torch's.
    Signature: ai.onnx@12::MaxPool"""
    return pool("MaxPool", x, 3, kernel_size, stride, padding, ceil_mode, return_indices,
                dilations=ints(dilation, 3, "dilation"))


@autocast_op()
def avg_pool3d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """NCDHW average pooling (``divisor_override`` as ``ops_nn.window_sums``).
    Signature: ai.onnx@19::AveragePool"""
    if divisor_override is None:
        return pool("AveragePool", x, 3, kernel_size, stride, padding, ceil_mode,
                    count_include_pad=int(bool(count_include_pad)))
    return window_sums("avg_pool3d", divisor_override, ceil_mode, ints(kernel_size, 3, "kernel_size"),
                       lambda: pool("AveragePool", x, 3, kernel_size, stride, padding, False, count_include_pad=1))


def _with_indices(fn):
    """``fn`` with ``return_indices=True``: torch's ``max_poolNd_with_indices``."""

    def with_indices(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                     ceil_mode: bool = False, return_indices: bool = True) -> tuple[Tensor, Tensor]:
        return fn(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)

    with_indices.__name__ = f"{fn.__name__}_with_indices"
    with_indices.__doc__ = f"``{fn.__name__}(..., return_indices=True)``: ``(output, indices)``."
    return with_indices


max_pool1d_with_indices = _with_indices(max_pool1d)
max_pool2d_with_indices = _with_indices(max_pool2d)
max_pool3d_with_indices = _with_indices(max_pool3d)


# -- adaptive pooling -------------------------------------------------------------------------


@autocast_op(named=lambda a: "adaptive_max_pool3d" if a["nd"] == 3 else None)
def adaptive_max_pool(x: Tensor, output_size: Any, nd: int, return_indices: bool = False) -> Any:
    """``adaptive_pool`` with MaxPool (``(output, indices)`` with ``return_indices``); every spatial
    dim static, a ``None`` size's too."""
    return adaptive_pool("MaxPool", x, output_size, nd, return_indices, static_dims=True)


def adaptive_max_pool1d(x: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    return adaptive_max_pool(x, output_size, 1, return_indices)


def adaptive_max_pool2d(x: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    return adaptive_max_pool(x, output_size, 2, return_indices)


def adaptive_max_pool3d(x: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    return adaptive_max_pool(x, output_size, 3, return_indices)


def adaptive_max_pool1d_with_indices(x: Tensor, output_size: Any, return_indices: bool = True) -> Any:
    return adaptive_max_pool(x, output_size, 1, True)


def adaptive_max_pool2d_with_indices(x: Tensor, output_size: Any, return_indices: bool = True) -> Any:
    return adaptive_max_pool(x, output_size, 2, True)


def adaptive_max_pool3d_with_indices(x: Tensor, output_size: Any, return_indices: bool = True) -> Any:
    return adaptive_max_pool(x, output_size, 3, True)


@autocast_op()
def adaptive_avg_pool3d(x: Tensor, output_size: Any) -> Tensor:
    return adaptive_avg_pool(x, output_size, 3)


# -- unpooling --------------------------------------------------------------------------------


def unpool_sizes(x: Tensor, nd: int, kernel: list[int], stride: list[int], padding: list[int],
                 output_size: Any) -> list[int]:
    """torch's output spatial sizes of ``max_unpool``: ``(in - 1) * stride - 2 * padding + kernel``,
    or ``output_size`` (its last ``nd`` entries), which must lie within a stride of those."""
    dims = list(x.shape[2:])
    if not all(isinstance(d, int) for d in dims):
        raise op_error("ScatterElements", [x], f"max_unpool{nd}d needs static spatial dims", user_source())
    default = [(d - 1) * s - 2 * p + k for d, s, p, k in zip(dims, stride, padding, kernel)]
    if output_size is None:
        return default
    sizes = [int(s) for s in output_size]
    sizes = sizes[2:] if len(sizes) == nd + 2 else sizes
    if len(sizes) != nd:
        raise CaptureError(f"max_unpool{nd}d output_size must have {nd} or {nd + 2} entries, got {list(output_size)} "
                           f"(at {user_source()})")
    for axis, (size, want, s) in enumerate(zip(sizes, default, stride)):
        if not want - s < size < want + s:
            raise CaptureError(f"max_unpool{nd}d output_size {list(output_size)}: dim {axis} must be between "
                               f"{want - s} and {want + s} (exclusive), as in PyTorch (at {user_source()})")
    return sizes


@autocast_op(named=lambda a: f"max_unpool{max(a['nd'], 2)}d")
def max_unpool(x: Tensor, indices: Tensor, nd: int, kernel_size: Any, stride: Any = None, padding: Any = 0,
               output_size: Any = None) -> Tensor:
    """Each value of ``x`` written at its ``indices`` (torch's: flat positions in each channel's
    output plane), zeros elsewhere: a ScatterElements into each image's ``[C, prod(output)]``
    zeros, not ONNX ``MaxUnpool``, whose indices are flat over the whole tensor."""
    x, indices = lift(x), lift(indices)
    check_rank("MaxUnpool", x, nd + 2)
    if indices.dtype != "int64" or (x.shape is not None and indices.shape != x.shape):
        raise op_error("MaxUnpool", [x, indices], f"indices must be int64 of the input's shape {x.shape}, got "
                       f"{indices.dtype}{list(indices.shape or [])}", user_source())
    kernel = ints(kernel_size, nd, "kernel_size")
    strides = kernel if stride is None else ints(stride, nd, "stride")
    sizes = unpool_sizes(x, nd, kernel, strides, ints(padding, nd, "padding"), output_size)
    lead = emit("Slice", [emit("Shape", [x]), const_i64([0]), const_i64([2])])
    planes = emit("ConstantOfShape", [concat([lead, const_i64([math.prod(sizes)])])],
                  {"value": ir_tensor(np.zeros(1, x.dtype.numpy))},
                  out_types=[(x.dtype, [*x.shape[:2], math.prod(sizes)])])
    flat = emit("ScatterElements", [planes, reshape(indices, [*x.shape[:2], -1]), reshape(x, [*x.shape[:2], -1])],
                {"axis": 2})
    return reshape(flat, [*x.shape[:2], *sizes])


def max_unpool1d(x: Tensor, indices: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 output_size: Any = None) -> Tensor:
    return max_unpool(x, indices, 1, kernel_size, stride, padding, output_size)


def max_unpool2d(x: Tensor, indices: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 output_size: Any = None) -> Tensor:
    return max_unpool(x, indices, 2, kernel_size, stride, padding, output_size)


def max_unpool3d(x: Tensor, indices: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 output_size: Any = None) -> Tensor:
    return max_unpool(x, indices, 3, kernel_size, stride, padding, output_size)


# -- power-average pooling and local response normalisation ------------------------------------


def lp_pool(x: Tensor, norm_type: float, nd: int, kernel_size: Any, stride: Any = None,
            ceil_mode: bool = False) -> Tensor:
    """torch's formula, ``(avg_pool(x^p) * prod(kernel))^(1/p)`` (a window that ``ceil_mode`` cuts
    short sums its elements times kernel size / their count, as torch's; odd ``p`` and a negative
    sum give NaN, as torch's), not ONNX ``LpPool``, which takes ``|x|``. ``p = inf`` is the max
    of ``|x|``."""
    x = lift(x)
    p = float(norm_type)
    if p == 0 or math.isnan(p):
        raise CaptureError(f"lp_pool{nd}d norm_type must be nonzero, got {norm_type} (at {user_source()})")
    if math.isinf(p):
        mag = emit("Abs", [x])
        if p > 0:
            return pool("MaxPool", mag, nd, kernel_size, stride, 0, ceil_mode)
        return -pool("MaxPool", -mag, nd, kernel_size, stride, 0, ceil_mode)
    averaged = pool("AveragePool", emit("Pow", [x, scalar(p, x)]), nd, kernel_size, stride, 0, ceil_mode,
                    count_include_pad=1)
    window = math.prod(ints(kernel_size, nd, "kernel_size"))
    return emit("Pow", [averaged * scalar(float(window), x), scalar(1.0 / p, x)])


def lp_pool1d(x: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
    return lp_pool(x, norm_type, 1, kernel_size, stride, ceil_mode)


def lp_pool2d(x: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
    return lp_pool(x, norm_type, 2, kernel_size, stride, ceil_mode)


def lp_pool3d(x: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
    return lp_pool(x, norm_type, 3, kernel_size, stride, ceil_mode)


def local_response_norm(x: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """``x / (k + alpha * mean of x^2 over size channels)^beta``, the channels from ``c - size//2``
    to ``c + (size-1)//2`` (zeros past the ends), as torch's: an AveragePool over the channels of
    ``x^2`` viewed as ``[N, 1, C, rest]``. (ONNX ``LRN`` centres an even window one channel later.)"""
    x = lift(x)
    if x.shape is not None and len(x.shape) < 3:
        raise op_error("LRN", [x], f"local_response_norm expects an input of rank 3 or more (N, C, ...), got rank "
                       f"{len(x.shape)}", user_source())
    size = positive_int("local_response_norm", "size", size)
    squares = emit("Reshape", [unsqueeze(x * x, [1]), const_i64([0, 0, 0, -1])])
    summed = emit("AveragePool", [squares], {"kernel_shape": [size, 1], "pads": [size // 2, 0, (size - 1) // 2, 0],
                                             "count_include_pad": 1})
    div = emit("Pow", [reshape_like(summed, x) * scalar(alpha, x) + scalar(k, x), scalar(beta, x)])
    return x / div


__all__ = [
    "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d",
    "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d", "adaptive_max_pool3d_with_indices", "avg_pool3d",
    "local_response_norm", "lp_pool1d", "lp_pool2d", "lp_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices",
    "max_pool3d", "max_pool3d_with_indices", "max_unpool1d", "max_unpool2d", "max_unpool3d",
]
