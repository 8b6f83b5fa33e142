"""GroupNorm, InstanceNorm1d/2d/3d and RMSNorm with ``torch.nn``'s arguments, parameters and init."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops, ops_layers, ops_nn
from graphc.dsl.batching import batch_of_one
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import to_numpy
from graphc.nn import draws
from graphc.nn.layers import BatchNormBase, affine_repr
from graphc.nn.module import Module, Parameter
from graphc.nn.signatures import takes_device


@takes_device
class GroupNorm(Module):
    """``weight``/``bias`` ``[num_channels]`` (ones, zeros) when ``affine`` (no ``bias`` with ``bias=False``)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 dtype: Any = "float32", *, bias: bool = True):
        super().__init__()
        if num_channels % num_groups:
            raise CaptureError(f"GroupNorm: num_channels {num_channels} must be divisible by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter(shape=(num_channels,), init=draws.ones, dtype=dtype) if affine else None
        self.bias = Parameter(shape=(num_channels,), init=draws.zeros, dtype=dtype) if affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, {affine_repr(self)}"


@takes_device
class _InstanceNorm(Module):
    """PyTorch's defaults: ``affine=False``, no running statistics (the batch's own, in training
    and inference alike). With ``track_running_stats`` the buffers ``running_mean``/``running_var``
    (zeros, ones) and ``num_batches_tracked`` (never stepped, as torch's) are torch's: training
    mode normalises each sample by its own statistics and updates the running ones by their mean
    over the batch, eval mode normalises by the running ones."""

    layout: str  # an unbatched input's, for batching.batch_rank

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False, dtype: Any = "float32", *, bias: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = track_running_stats
        self.weight = Parameter(shape=(num_features,), init=draws.ones, dtype=dtype) if affine else None
        self.bias = Parameter(shape=(num_features,), init=draws.zeros, dtype=dtype) if affine and bias else None
        if track_running_stats:
            self.running_mean = Parameter(shape=(num_features,), init=draws.zeros, dtype=dtype, buffer=True)
            self.running_var = Parameter(shape=(num_features,), init=draws.ones, dtype=dtype, buffer=True)
            self.num_batches_tracked = Parameter(shape=(), init=draws.zeros, dtype="int64", buffer=True)

    def forward(self, x: Tensor) -> Tensor:
        """``(N, C, *spatial)``, or an unbatched ``(C, *spatial)`` as in PyTorch."""
        return batch_of_one(type(self).__name__, x, self.layout, self._normalize)

    def _normalize(self, x: Tensor) -> Tensor:
        ops.same_dim(type(self).__name__, [x], x.shape[1], self.num_features, "input channels and num_features")
        if self.track_running_stats:
            return self._tracked(x)
        return ops_layers.instance_norm(x, self.weight, self.bias, self.eps)

    def _tracked(self, x: Tensor) -> Tensor:
        """As torch's ``instance_norm``: a BatchNormalization of ``x`` as ``[1, N*C, *spatial]``
        with the running statistics tiled N times (in training mode each sample's channel is a
        channel of its own; the training graphs average the tiled statistics' updates over the
        batch, ``passes/training/modes.py``), then the affine per channel."""
        ones = np.ones(self.num_features, to_numpy(x.dtype))
        batch = ops.dim_read(x, 0)
        tiled = [ops.emit("Tile", [ops.lift(t, x), batch])
                 for t in (self.running_mean, self.running_var, ones, np.zeros_like(ones))]
        rows = ops.emit("Reshape", [x, ops.const_i64([1, -1] + [0] * (x.ndim - 2))])
        y = ops.reshape_like(ops_nn.batch_norm(rows, *tiled, training=self.training, eps=self.eps,
                                               momentum=0.0 if self.momentum is None else self.momentum), x)
        per_channel = [self.num_features] + [1] * (x.ndim - 2)
        if self.weight is not None:
            y = y * ops.reshape(ops.lift(self.weight, x), per_channel)
        return y if self.bias is None else y + ops.reshape(ops.lift(self.bias, x), per_channel)

    extra_repr = BatchNormBase.extra_repr


class InstanceNorm1d(_InstanceNorm):
    layout = "C, L"


class InstanceNorm2d(_InstanceNorm):
    layout = "C, H, W"


class InstanceNorm3d(_InstanceNorm):
    layout = "C, D, H, W"


@takes_device
class RMSNorm(Module):
    """``weight`` of ``normalized_shape`` (ones) when ``elementwise_affine``; ``eps=None`` is the
    dtype's machine epsilon."""

    def __init__(self, normalized_shape: Any, eps: float | None = None, elementwise_affine: bool = True,
                 dtype: Any = "float32"):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(shape=self.normalized_shape, init=draws.ones, dtype=dtype) if elementwise_affine \
            else None

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"
