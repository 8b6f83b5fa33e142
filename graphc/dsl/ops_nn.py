"""Neural-network DSL ops: conv, pooling, normalisation, dropout, embedding (PyTorch signatures)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from graphc.dsl import ops, ops_array, ops_math
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.inplace import into, writes_input
from graphc.dsl.norms64 import rounds_eps, standardized
from graphc.dsl.renorm import renorm_in_place
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES
from graphc.model.windows import ceil_as_floor_pads
from graphc.passes.infer import ceil_adds_nothing
from graphc.passes.values import EPSILON_KEY, MAX_NORM_LOOKUP_KEY, MOMENTUM_KEY, SYNC_BATCHNORM_KEY


def ints(v: Any, n: int, name: str) -> list[int]:
    """``v`` as ``n`` ints (an int is repeated); ``name`` is the argument in the error."""
    if isinstance(v, (int, np.integer)):
        return [int(v)] * n
    v = [int(i) for i in v]
    if len(v) != n:
        raise CaptureError(f"{name} must be an int or {n} ints, got {v} (at {user_source()})")
    return v


def positive_int(fn: str, name: str, value: Any) -> int:
    """``value`` of ``fn``'s argument ``name`` as an int >= 1 (a whole float too)."""
    if int(value) != value or value < 1:
        raise CaptureError(f"{fn} {name} must be a positive int, got {value} (at {user_source()})")
    return int(value)


def int_pair(v: Any, name: str) -> list[int]:
    """``v`` as ``[int, int]`` (an int is repeated); ``name`` is the argument in the error."""
    return ints(v, 2, name)


def conv_pads(padding: Any, kernel: list | None, strides: list[int], dilations: list[int]) -> list[int]:
    """ONNX ``pads`` (begins, then ends) for torch's ``padding``: an int or one per spatial dim,
    ``"valid"``, or ``"same"`` (stride 1 only, as torch; an odd total pads one more at the end, as
    torch does; onnxruntime runs no dilated ``auto_pad=SAME_UPPER``)."""
    nd = len(strides)
    if padding == "same":
        if strides != [1] * nd:
            raise CaptureError(f"padding='same' needs stride 1, as in PyTorch; got stride {strides} "
                               f"(at {user_source()})")
        if kernel is None or not all(isinstance(k, int) for k in kernel):
            raise CaptureError(f"padding='same' needs a static kernel size (at {user_source()})")
        total = [d * (k - 1) for d, k in zip(dilations, kernel)]
        return [t // 2 for t in total] + [t - t // 2 for t in total]
    if padding == "valid":
        return [0] * (2 * nd)
    if isinstance(padding, str):
        raise CaptureError(f"padding={padding!r}; expected an int, {nd} ints, 'same' or 'valid' (at {user_source()})")
    return ints(padding, nd, "padding") * 2


_LAYOUTS = {3: "N, C, L", 4: "N, C, H, W", 5: "N, C, D, H, W"}


def check_rank(op: str, x: Tensor, rank: int) -> None:
    """A GraphError for ``op`` unless ``x`` (of known rank) is ``(N, C, <rank - 2 spatial dims>)``."""
    if x.shape is not None and len(x.shape) != rank:
        raise op_error(op, [x], f"expects a rank-{rank} input ({_LAYOUTS[rank]}), got rank {len(x.shape)}",
                       user_source())


@autocast_op()
def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """2-D convolution, NCHW, weight ``[out, in/groups, kh, kw]``. Signature: ai.onnx@11::Conv"""
    x = ops.lift(x)
    weight = ops.lift(weight, x)
    bias = None if bias is None else ops.lift(bias, x)
    check_rank("Conv", x, 4)
    ws = weight.shape
    if x.shape is not None and ws is not None and isinstance(ws[1], int):
        ops.same_dim("Conv", [x, weight], x.shape[1], ws[1] * groups, f"input channels and weight channels "
                     f"x groups={groups}")
    kernel, strides, dilations = list(ws[2:]) if ws is not None else None, int_pair(stride, "stride"), \
        int_pair(dilation, "dilation")
    attrs: dict[str, Any] = {"strides": strides, "dilations": dilations, "group": int(groups), "kernel_shape": kernel,
                             "pads": conv_pads(padding, kernel, strides, dilations)}
    inputs = [x, weight] + ([bias] if bias is not None else [])
    for t in inputs[1:]:
        ops.same_dtype("Conv", x, t)
    return ops.emit("Conv", inputs, attrs)


def _pool_attrs(kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool) -> dict[str, Any]:
    k = int_pair(kernel_size, "kernel_size")
    s = k if stride is None else int_pair(stride, "stride")
    ph, pw = int_pair(padding, "padding")
    return {"kernel_shape": k, "strides": s, "pads": [ph, pw, ph, pw], "ceil_mode": int(bool(ceil_mode))}


def pool_node(op: str, x: Tensor, attrs: dict[str, Any], outputs: int = 1) -> Any:
    """A MaxPool, AveragePool or LpPool node of ``x`` with ``attrs``, its ceil_mode as ``floor_ceil``
    writes it."""
    x, attrs = floor_ceil(x, attrs)
    return ops.emit(op, [x], attrs, outputs) if outputs > 1 else ops.emit(op, [x], attrs)


def floor_ceil(x: Tensor, attrs: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
    """``x`` and ``attrs`` of a ceil_mode pool over static dims that onnx's shape formula agrees with.
    That formula counts a last window starting in the end padding, which the kernels and torch drop
    (onnx's and onnxruntime's inference then disagree with the output; onnxruntime once refused a
    Gemm after such a pool's Flatten, and ``check_model`` refuses the file). Where ceil mode adds no
    window, ceil_mode=0: the same windows, inside the padded input, so averaged over the same counts.
    Where an axis drops such a window while another gains one, floor mode with end pads that slide
    ceil's windows: a pad-counting AveragePool then reads ``x`` zero-padded by its own pads and
    counts no pads, so ceil's overhang stays uncounted, as torch's."""
    dims, nd = x.shape[2:] if x.shape is not None else None, len(attrs["kernel_shape"])
    if not attrs["ceil_mode"] or dims is None or not all(isinstance(d, int) for d in dims):
        return x, attrs
    pads, dilations = list(attrs["pads"]), attrs.get("dilations", [1] * nd)
    if ceil_adds_nothing(dims, attrs["kernel_shape"], attrs["strides"], dilations, pads):
        return x, {**attrs, "ceil_mode": 0}
    floor = ceil_as_floor_pads(dims, attrs["kernel_shape"], attrs["strides"], dilations, pads)
    if floor is None:
        return x, attrs  # no window dropped: onnx's formula counts as the kernels do
    attrs = dict(attrs)
    if attrs.get("count_include_pad") and floor != pads:
        if any(pads):
            x = ops.emit("Pad", [x, ops.const_i64([0, 0, *pads[:nd], 0, 0, *pads[nd:]])])
            floor = [0] * nd + [f - p for f, p in zip(floor[nd:], pads[nd:])]
        attrs["count_include_pad"] = 0
    return x, {**attrs, "ceil_mode": 0, "pads": floor}


def max_pool(x: Tensor, attrs: dict[str, Any], return_indices: bool = False) -> Any:
    """A MaxPool node with ``attrs``; with ``return_indices`` also torch's indices: each maximum's
    flat position within its (unpadded) channel plane, ONNX's ``Indices`` (flat over the whole
    tensor) modulo the plane's size. A window holding a NaN gives NaN (and a NaN's index), as
    torch's: a MaxPool of ``x``'s NaN flags finds them (onnxruntime's MaxPool skips NaNs)."""
    nans = ops.cast(ops.unary("IsNaN", x), x.dtype) if x.dtype in FLOAT_DTYPES else None
    if not return_indices:
        y = pool_node("MaxPool", x, attrs)
        return y if nans is None else ops.where(pool_node("MaxPool", nans, attrs) > ops.scalar(0, y),
                                                ops.scalar(np.nan, y), y)
    y, indices = pool_node("MaxPool", x, attrs, 2)
    if nans is not None:
        found, where_found = pool_node("MaxPool", nans, attrs, 2)
        nan = found > ops.scalar(0, found)
        y, indices = ops.where(nan, ops.scalar(np.nan, y), y), ops.where(nan, where_found, indices)
    spatial = list(x.shape[2:])
    if all(isinstance(d, int) for d in spatial):
        plane = ops.const_i64([int(np.prod(spatial))])
    else:
        plane = ops.emit("ReduceProd", [ops.emit("Slice", [ops.emit("Shape", [x]), ops.const_i64([2]),
                                                           ops.const_i64([x.ndim])])], {"keepdims": 1})
    return y, ops.emit("Mod", [indices, plane])


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """With ``return_indices``, ``(output, indices)`` as torch's. Signature: ai.onnx@12::MaxPool"""
    x = ops.lift(x)
    check_rank("MaxPool", x, 4)
    attrs = _pool_attrs(kernel_size, stride, padding, ceil_mode)
    attrs["dilations"] = int_pair(dilation, "dilation")
    return max_pool(x, attrs, return_indices)


@in_float32
def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """NCHW average pooling (``divisor_override`` as ``window_sums``). Signature: ai.onnx@19::AveragePool"""
    x = ops.lift(x)
    check_rank("AveragePool", x, 4)
    attrs = _pool_attrs(kernel_size, stride, padding, ceil_mode)
    attrs["count_include_pad"] = int(bool(count_include_pad))
    if divisor_override is None:
        return pool_node("AveragePool", x, attrs)
    return window_sums("avg_pool2d", divisor_override, ceil_mode, attrs["kernel_shape"],
                       lambda: pool_node("AveragePool", x, {**attrs, "count_include_pad": 1}))


def window_sums(name: str, divisor: Any, ceil_mode: bool, kernel: list[int], mean: Any) -> Tensor:
    """torch's ``divisor_override``: each window's sum over it (pads count 0) divided by ``divisor``,
    from ``mean()``, the pads-included average, times the kernel's size; that is the window's sum
    where no window runs past the padded input, so not under ``ceil_mode`` (refused)."""
    if isinstance(divisor, bool) or not isinstance(divisor, (int, np.integer, float)) or int(divisor) != divisor \
            or divisor == 0:
        raise CaptureError(f"{name} divisor_override must be a nonzero int, got {divisor!r} (at {user_source()})")
    if ceil_mode:
        raise CaptureError(f"{name} divisor_override with ceil_mode=True is not supported (a window past the "
                           f"padded input sums fewer elements); use ceil_mode=False (at {user_source()})")
    return mean() * float(math.prod(kernel)) / float(divisor)


def global_avg_pool2d(x: Tensor) -> Tensor:
    return ops.emit("GlobalAveragePool", [x])


@autocast_op()
@in_float32  # torch computes a narrow float's batch norm, statistics included, in float32 (running ones kept narrow)
def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.batch_norm``. ONNX momentum is PyTorch's ``1 - momentum``.

    With ``training=True`` the node has ``training_mode=1`` and three outputs (Y and the
    updated running mean/var); Y is returned. Without running statistics (both None, training
    only, as torch) the batch's own normalise ``x``, written out (``batch_statistics_norm``). A
    float64 ``x`` with an ``eps`` or ``1 - momentum`` float32 cannot hold: the node's metadata records
    them (``EPSILON_KEY``, ``MOMENTUM_KEY``), and in inference mode the eps is added to the variance
    input (``epsilon=0``).
    Signature: ai.onnx@15::BatchNormalization
    """
    x = ops.lift(x)
    if running_mean is None or running_var is None:
        if running_mean is not None or running_var is not None:
            raise CaptureError(f"batch_norm takes both running_mean and running_var or neither, got only "
                               f"{'running_var' if running_mean is None else 'running_mean'} (at {user_source()})")
        if not training:
            raise CaptureError(f"batch_norm: running_mean must be defined in evaluation mode (training=False), "
                               f"as torch's (at {user_source()})")
        return batch_statistics_norm(x, weight, bias, eps)
    running_mean, running_var = ops.lift(running_mean, x), ops.lift(running_var, x)
    weight = None if weight is None else ops.lift(weight, x)
    bias = None if bias is None else ops.lift(bias, x)
    channels = running_mean.shape[0] if running_mean.shape else None
    if weight is None or bias is None:
        if not isinstance(channels, int):
            raise CaptureError(f"batch_norm without weight/bias needs a static channel count (at {user_source()})")
        one = np.ones(channels, dtype=x.dtype.numpy)
        weight = weight if weight is not None else ops.constant(one)
        bias = bias if bias is not None else ops.constant(np.zeros_like(one))
    if x.shape is not None and len(x.shape) >= 2:
        ops.same_dim("BatchNormalization", [x, running_mean], x.shape[1], channels, "input and norm channels")
    attrs = {"epsilon": float(eps), "momentum": float(1.0 - momentum), "training_mode": int(bool(training))}
    inputs = [x, weight, bias, running_mean, running_var]
    exact = rounds_eps(x, eps) and running_var.dtype == x.dtype
    if exact and not training:  # the double added to the variance: exact in any runtime
        inputs[4], attrs["epsilon"] = running_var + ops.scalar(eps, running_var), 0.0
    y = ops.emit("BatchNormalization", inputs, attrs, 3 if training else 1)
    y = y[0] if training else y
    metadata = y.value.producer().metadata_props  # for the training passes and backends (``exact_attribute``)
    if exact:
        metadata[EPSILON_KEY] = repr(float(eps))
    if rounds_eps(x, 1.0 - momentum) and running_mean.dtype == x.dtype:
        metadata[MOMENTUM_KEY] = repr(float(1.0 - momentum))
    return y


@in_float32
def batch_statistics_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, *,
                          sync: bool = False) -> Tensor:
    """``x`` normalised per channel by its own batch statistics (mean and biased variance over
    every dim but 1), then the affine: torch's batch norm without running statistics, in training
    and inference alike. Written out in standard ops, not a BatchNormalization node, which the
    training and inference passes switch to the running statistics. ``sync`` (``SyncBatchNorm``):
    the mean, centring and variance nodes marked ``SYNC_BATCHNORM_KEY`` ("mean", "centred",
    "variance"), which a data-parallel worker's gradients graph takes over every worker's shard."""
    if x.shape is None or len(x.shape) < 2:
        raise op_error("BatchNormalization", [x], "expects an (N, C, ...) input of known rank >= 2", user_source())
    values = (x.shape[0], *x.shape[2:])
    if all(isinstance(d, int) for d in values) and math.prod(values) == 1:
        raise op_error("BatchNormalization", [x], "expected more than 1 value per channel when training, got "
                       f"input shape {tuple(x.shape)}", user_source())
    axes = [0, *range(2, x.ndim)]
    mean = ops.mean(x, axes, keepdims=True)
    centred = x - mean
    var = ops.mean(centred * centred, axes, keepdims=True)
    if sync:
        for value, mark in ((mean, "mean"), (centred, "centred"), (var, "variance")):
            value.value.producer().metadata_props[SYNC_BATCHNORM_KEY] = mark
    y = centred / ops.sqrt(var + ops.scalar(eps, x))
    per_channel = [-1] + [1] * (x.ndim - 2)
    if weight is not None:
        y = y * ops.reshape(ops.lift(weight, x), per_channel)
    return y if bias is None else y + ops.reshape(ops.lift(bias, x), per_channel)


@autocast_op()
def layer_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.layer_norm``; a float64 ``x`` with an ``eps`` float32 cannot hold written
    out (``norms64``). Signature: ai.onnx@17::LayerNormalization"""
    x = ops.lift(x)
    weight = None if weight is None else ops.lift(weight, x)
    bias = None if bias is None else ops.lift(bias, x)
    shape = [int(normalized_shape)] if isinstance(normalized_shape, (int, np.integer)) else list(normalized_shape)
    if x.shape is not None and len(x.shape) < len(shape):
        raise op_error("LayerNormalization", [x], f"trailing dims must be {tuple(shape)}", user_source())
    for d, n in zip(x.shape[-len(shape):] if x.shape is not None else (), shape):
        ops.same_dim("LayerNormalization", [x], d, n, f"trailing dims and normalized_shape {tuple(shape)}")
    if rounds_eps(x, eps):
        y = standardized(x, list(range(-len(shape), 0)), eps)
        y = y if weight is None else y * weight
        return y if bias is None else y + bias
    if weight is None:
        weight = ops.constant(np.ones(shape, dtype=x.dtype.numpy))
    inputs = [x, weight] + ([bias] if bias is not None else [])
    return ops.emit("LayerNormalization", inputs, {"axis": -len(shape), "epsilon": float(eps)})


@writes_input
def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """ONNX ``Dropout`` with ``ratio`` and ``training_mode`` inputs; ``training`` defaults to True,
    as in ``torch.nn.functional.dropout`` (pass ``training=self.training`` in a module). The node
    stays in the graph in inference capture too (the training generator flips ``training_mode``)."""
    if not 0.0 <= p < 1.0:
        raise CaptureError(f"dropout probability {p} must be in [0, 1) (at {user_source()})")
    x = ops.lift(x)
    ratio = ops.scalar(p, x)
    mode = ops.constant(np.asarray(bool(training)))
    return into(x, ops.emit("Dropout", [x, ratio, mode], name_hint="dropout"), inplace)


def embedding(indices: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """``torch.nn.functional.embedding``: rows of ``weight``. The ``padding_idx`` row (its value
    as stored) gets no gradient; ``scale_grad_by_freq`` divides each row's gradient by how often
    the row occurs in ``indices``; ``max_norm``: ``renormed``; ``sparse`` is accepted (the gradient
    is the same values, dense). Signature: ai.onnx@13::Gather"""
    indices = ops.lift(indices)
    weight = ops.lift(weight)
    if indices.dtype not in ("int64", "int32"):
        raise op_error("Gather", [weight, indices], f"indices must be int64 or int32, got {indices.dtype}",
                       user_source())
    padding_idx = _padding_row(weight, padding_idx)
    rows = gather_rows(weight, indices, None if max_norm is None else (max_norm, norm_type))
    if padding_idx is not None:
        is_pad = ops.unsqueeze(indices == ops.lift(padding_idx, indices), [-1])
        rows = ops.where(is_pad, ops.detach(rows), rows)
    if scale_grad_by_freq:
        rows = _grad_by_freq(rows, indices, weight.shape[0])
    return rows if max_norm is None else renormed(rows, weight, max_norm, norm_type, indices)


def gather_rows(weight: Tensor, indices: Tensor, norms: tuple[float, float] | None) -> Tensor:
    """The rows of ``weight`` at ``indices`` (a Gather; a negative index fails in the backend, as torch
    refuses it: ``ops_array.refusing_negatives``), marked ``MAX_NORM_LOOKUP_KEY`` with ``norms``
    (``max_norm``, ``norm_type``) for a lookup with max_norm."""
    rows = ops.emit("Gather", [weight, ops_array.refusing_negatives(indices, weight, 0)], {"axis": 0})
    if norms is not None:
        rows.value.producer().metadata_props[MAX_NORM_LOOKUP_KEY] = json.dumps(
            {"max_norm": float(norms[0]), "norm_type": float(norms[1])})
    return rows


def _padding_row(weight: Tensor, padding_idx: int | None) -> int | None:
    """``padding_idx`` made non-negative, refused (naming it) outside ``[-rows, rows)``."""
    if padding_idx is None:
        return None
    rows = weight.shape[0] if weight.shape else None
    if not isinstance(padding_idx, (int, np.integer)) or isinstance(padding_idx, bool) or \
            not isinstance(rows, int) or not -rows <= padding_idx < rows:
        raise op_error("Gather", [weight], f"padding_idx={padding_idx!r} must be an int within num_embeddings "
                       f"(weight rows: {rows})", user_source())
    return int(padding_idx) % rows


def _grad_by_freq(rows: Tensor, indices: Tensor, num_rows: Any) -> Tensor:
    """``rows`` with the value unchanged and the gradient at each position divided by how often its
    index occurs in ``indices``, so each weight row's gradient is divided by its count (torch's
    ``scale_grad_by_freq``). The counts: a ScatterElements(add) histogram over the weight's rows."""
    flat = ops.reshape(ops.cast(indices, "int64"), [-1])
    if not isinstance(num_rows, int):
        raise op_error("Gather", [rows], "scale_grad_by_freq needs a static num_embeddings", user_source())
    zeros = ops.lift(np.zeros(num_rows, np.int64))
    counts = ops.emit("ScatterElements", [zeros, flat, ops.emit("Expand", [ops.const_i64([1]), ops.emit("Shape", [flat])])],
                      {"reduction": "add"})
    per_position = ops.unsqueeze(ops.cast(ops.emit("Gather", [counts, indices], {"axis": 0}), rows.dtype), [-1])
    return ops.detach(rows) + (rows - ops.detach(rows)) / per_position


def renormed(rows: Tensor, weight: Tensor, max_norm: float, norm_type: float, indices: Tensor,
             at: str | None = None) -> Tensor:
    """``rows`` of ``weight`` as torch's ``max_norm`` looks them up: each whose ``norm_type``-norm
    exceeds ``max_norm`` scaled by ``max_norm / (norm + 1e-7)``, the scaling not differentiated.
    Torch renormalises those weight rows in place under ``no_grad`` before the lookup, so
    ``weight`` is rebound too (``renorm_in_place``; ``at``: the lookup's line, default the caller's)."""
    norm = ops_math.norm(ops.detach(rows), norm_type, dim=-1, keepdim=True)
    over = norm > ops.scalar(max_norm, norm)
    scale = ops.where(over, ops.scalar(max_norm, norm) / (norm + ops.scalar(1e-7, norm)), ops.scalar(1.0, norm))
    scaled = ops.detach(rows * scale)
    renorm_in_place(weight, indices, scaled, (max_norm, norm_type), at)
    return scaled + (rows - ops.detach(rows))  # the value rows * scale, the gradient rows'


@autocast_op()
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with PyTorch's ``[out, in]`` weight: ``Gemm(transB=1)`` for 2-D input,
    ``MatMul(x, Transpose(weight)) + bias`` for higher ranks."""
    x = ops.lift(x)
    weight = ops.lift(weight, x)
    bias = None if bias is None else ops.lift(bias, x)
    ops.same_dtype("Linear", x, weight)
    if x.shape and weight.shape is not None:
        ops.same_dim("Linear", [x, weight], x.shape[-1], weight.shape[1], "input features and weight in_features")
    if x.shape is not None and len(x.shape) == 2:
        return ops.emit("Gemm", [x, weight] + ([bias] if bias is not None else []), {"transB": 1})
    y = ops.matmul(x, ops.transpose(weight, [1, 0]))
    return y + bias if bias is not None else y


__all__ = ["avg_pool2d", "batch_norm", "conv2d", "dropout", "embedding", "layer_norm", "linear", "max_pool2d",
           "global_avg_pool2d", "max_pool"]
