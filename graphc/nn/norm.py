"""GroupNorm, InstanceNorm1d/2d/3d and RMSNorm with ``torch.nn``'s arguments, parameters and init."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops, ops_layers
from graphc.dsl.builder import op_error, user_source
from graphc.errors import CaptureError
from graphc.nn import init
from graphc.nn.module import Module, Parameter
from graphc.dsl.tensor import Tensor


class GroupNorm(Module):
    """``weight``/``bias`` ``[num_channels]`` (ones, zeros) when ``affine``."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 dtype: Any = "float32"):
        super().__init__()
        if num_channels % num_groups:
            raise CaptureError(f"GroupNorm: num_channels {num_channels} must be divisible by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter(shape=(num_channels,), init=init.ones, dtype=dtype) if affine else None
        self.bias = Parameter(shape=(num_channels,), init=init.zeros, dtype=dtype) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"


class _InstanceNorm(Module):
    """PyTorch's defaults: ``affine=False``, no running statistics (the batch's own, in
    training and inference alike)."""

    _spatial: str  # the layout after the channels, and the batched input's rank
    _rank: int

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False, dtype: Any = "float32", *, bias: bool = True):
        super().__init__()
        if track_running_stats:
            raise CaptureError(f"{type(self).__name__} with track_running_stats=True is not supported")
        self.num_features, self.eps = num_features, eps
        self.weight = Parameter(shape=(num_features,), init=init.ones, dtype=dtype) if affine else None
        self.bias = Parameter(shape=(num_features,), init=init.zeros, dtype=dtype) if affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        """``(N, C, *spatial)``, or an unbatched ``(C, *spatial)`` as in PyTorch."""
        x = ops.lift(x)
        name, rank = type(self).__name__, self._rank
        if x.ndim not in (rank - 1, rank):
            raise op_error(name, [x], f"expects a (C, {self._spatial}) or (N, C, {self._spatial}) input, got rank "
                           f"{x.ndim}", user_source())
        batched = ops.unsqueeze(x, [0]) if x.ndim < rank else x
        ops.same_dim(name, [x], batched.shape[1], self.num_features, "input channels and num_features")
        y = ops_layers.instance_norm(batched, self.weight, self.bias, self.eps)
        return ops.squeeze(y, [0]) if x.ndim < rank else y


class InstanceNorm1d(_InstanceNorm):
    _spatial, _rank = "L", 3


class InstanceNorm2d(_InstanceNorm):
    _spatial, _rank = "H, W", 4


class InstanceNorm3d(_InstanceNorm):
    _spatial, _rank = "D, H, W", 5


class RMSNorm(Module):
    """``weight`` of ``normalized_shape`` (ones) when ``elementwise_affine``; ``eps=None`` is the
    dtype's machine epsilon."""

    def __init__(self, normalized_shape: Any, eps: float | None = None, elementwise_affine: bool = True,
                 dtype: Any = "float32"):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(shape=self.normalized_shape, init=init.ones, dtype=dtype) if elementwise_affine \
            else None

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.rms_norm(x, self.normalized_shape, self.weight, self.eps)
