"""torch's ``native_*`` forms of the normalisations and dropout, which return the statistics (or mask) beside the
output: ``torch.native_layer_norm``, ``native_batch_norm``, ``native_group_norm`` and ``native_dropout``. The
output is the DSL function's (``layer_norm``, ``batch_norm``, ``group_norm``, ``dropout``); the statistics are
written out beside it: detached where torch's are not differentiable (layer and batch norm), differentiable
where they are (group norm)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_layers import group_norm
from graphc.dsl.ops_nn import batch_norm, layer_norm
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError

__all__ = ["native_batch_norm", "native_dropout", "native_group_norm", "native_layer_norm"]


def _moments(x: Tensor, axes: list[int], eps: float) -> tuple[Tensor, Tensor]:
    """The mean of ``x`` over ``axes`` and ``1 / sqrt(biased variance + eps)``, both keeping the dims."""
    mean = ops.mean(x, axes, keepdims=True)
    centred = x - mean
    return mean, ops.scalar(1.0, x) / ops.sqrt(ops.mean(centred * centred, axes, keepdims=True) + ops.scalar(eps, x))


@autocast_op()
def native_layer_norm(input: Any, normalized_shape: Any, weight: Any, bias: Any,  # noqa: A002
                      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.native_layer_norm``: ``(out, mean, rstd)``, the statistics over the ``normalized_shape`` dims
    kept as 1s (``[*batch, 1, ...]``), without gradient, as torch's."""
    x = ops.lift(input)
    out = layer_norm(x, normalized_shape, weight, bias, eps)
    rank = 1 if isinstance(normalized_shape, (int, np.integer)) else len(normalized_shape)
    mean, rstd = _moments(ops.detach(x), list(range(-rank, 0)), eps)
    return out, mean, rstd


def native_batch_norm(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,  # noqa: A002
                      training: bool, momentum: float, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.native_batch_norm``: ``(out, save_mean, save_invstd)``: in training the batch's per-channel mean
    and ``1 / sqrt(biased variance + eps)`` (without gradient, as torch's; the running statistics are updated
    as ``batch_norm``'s), in evaluation two empty ``[0]`` Tensors, as torch's CPU kernel."""
    x = ops.lift(input)
    out = batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    if not training:
        empty = ops.constant(np.zeros(0, x.dtype.numpy))
        return out, empty, empty
    mean, rstd = _moments(ops.detach(x), [0, *range(2, x.ndim)], eps)
    return out, ops.reshape(mean, [-1]), ops.reshape(rstd, [-1])


def native_group_norm(input: Any, weight: Any, bias: Any, N: int, C: int, HxW: int, group: int,  # noqa: A002, N803
                      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.native_group_norm``: ``(out, mean, rstd)``, the statistics ``[N, group]`` of each sample's
    groups, differentiable, as torch's; ``N``, ``C``, ``HxW`` must agree with ``input``'s static shape."""
    x = ops.lift(input)
    shape = x.shape
    if shape is not None and len(shape) >= 2 and all(isinstance(d, int) for d in shape) and (
            shape[0] != N or shape[1] != C or math.prod(shape[2:]) != HxW):
        raise op_error("native_group_norm", [x], f"N={N}, C={C}, HxW={HxW} do not describe the input "
                       f"{tuple(shape)}", user_source())
    out = group_norm(x, group, weight, bias, eps)
    mean, rstd = _moments(ops.reshape(x, [N, group, -1]), [-1], eps)
    return out, ops.reshape(mean, [N, group]), ops.reshape(rstd, [N, group])


def native_dropout(input: Any, p: float, train: bool | None) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``torch.native_dropout``: ``(out, mask)``, ONNX Dropout's two outputs (the bool mask of kept entries; all
    True when not ``train``); ``train=None`` is training, as torch's."""
    if not 0.0 <= p < 1.0:
        raise CaptureError(f"native_dropout probability {p} must be in [0, 1) (at {user_source()})")
    x = ops.lift(input)
    mode = ops.constant(np.asarray(train is None or bool(train)))
    out, mask = ops.emit("Dropout", [x, ops.scalar(p, x), mode], num_outputs=2, name_hint="dropout")
    return out, mask
