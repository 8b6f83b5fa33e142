"""Standard layers with PyTorch's constructor arguments, parameter names, layouts and init."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops, ops_nn
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.inplace import into
from graphc.dsl.ops_layers import adaptive_avg_pool2d
from graphc.dsl.ops_nn import linear
from graphc.dsl.ops_views import unflatten
from graphc.dsl.tensor import Tensor
from graphc.model import COUNT_KEY, COUNTER_KEY
from graphc.nn import draws
from graphc.nn.activation import AlongDim, InPlace
from graphc.nn.dropout import DropoutLayer
from graphc.nn.module import Module, Parameter
from graphc.nn.reprs import not_default
from graphc.nn.signatures import takes_device
from graphc.nn.sparse import embedding_weight, padding_row_init, pretrained
from graphc.passes.values import SYNC_BATCHNORM_KEY


@takes_device
class Linear(Module):
    """``y = x @ weight.T + bias``; ``weight`` is ``[out_features, in_features]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = "float32"):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(shape=(out_features, in_features), init=draws.kaiming_uniform(), dtype=dtype)
        if bias:
            self.bias = Parameter(shape=(out_features,), init=draws.bias_uniform(in_features), dtype=dtype)
        else:
            self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class MaxPool2d(Module):
    """torch's arguments, in its order (``return_indices`` before ``ceil_mode``); with
    ``return_indices`` the output is ``(values, indices)``, torch's flat indices in each plane."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return ops_nn.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                                 self.return_indices)

    def extra_repr(self) -> str:
        return f"{pool_repr(self)}, dilation={self.dilation}, ceil_mode={self.ceil_mode}"


class AvgPool2d(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return ops_nn.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                                 self.divisor_override)

    def extra_repr(self) -> str:
        return pool_repr(self)


def pool_repr(pool: Module, nd: int = 0) -> str:
    """torch's ``kernel_size=..., stride=..., padding=...`` of a pool, the stride the kernel's when
    not given; ``nd``: each as an ``nd``-tuple, as torch keeps ``AvgPool1d``'s and the max-unpools'."""
    values = {"kernel_size": pool.kernel_size, "stride": pool.kernel_size if pool.stride is None else pool.stride,
              "padding": pool.padding}
    return ", ".join(f"{name}={tuple(ops_nn.ints(v, nd, name)) if nd else v}" for name, v in values.items())


class AdaptiveAvgPool2d(Module):
    """Output size 1 -> ``GlobalAveragePool``; otherwise an ``AveragePool`` when the input size
    divides evenly (static H, W), as PyTorch computes it in that case."""

    def __init__(self, output_size: Any):
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


@takes_device
class _BatchNorm(Module):
    _ranks: tuple[int, ...]  # the input ranks torch takes, and their layout
    _layout: str
    _sync = False  # SyncBatchNorm: statistics over every data-parallel worker's shard in training graphs

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, dtype: Any = "float32", *, bias: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = track_running_stats
        self.weight = Parameter(shape=(num_features,), init=draws.ones, dtype=dtype) if affine else None
        self.bias = Parameter(shape=(num_features,), init=draws.zeros, dtype=dtype) if affine and bias else None
        if not track_running_stats:  # as torch's: no buffers, the batch's statistics in both modes
            self.running_mean = self.running_var = self.num_batches_tracked = None
            return
        self.running_mean = Parameter(shape=(num_features,), init=draws.zeros, dtype=dtype, buffer=True)
        self.running_var = Parameter(shape=(num_features,), init=draws.ones, dtype=dtype, buffer=True)
        # PyTorch's counter, kept so state_dict() keys are PyTorch's; with momentum=None (the
        # cumulative average, factor 1/num_batches_tracked) the BatchNormalization node names it
        # and its count in metadata, and the training graphs step it as optimizer state
        self.num_batches_tracked = Parameter(shape=(), init=draws.zeros, dtype="int64", buffer=True)

    def forward(self, x: Tensor) -> Tensor:
        x = ops.lift(x)
        if x.ndim not in self._ranks:
            raise op_error(type(self).__name__, [x], f"expects a {self._layout} input, got rank {x.ndim}",
                           user_source())
        if not self.track_running_stats:
            ops.same_dim(type(self).__name__, [x], x.shape[1], self.num_features, "input channels and num_features")
            return ops_nn.batch_statistics_norm(x, self.weight, self.bias, self.eps, sync=self._sync)
        y = ops_nn.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                              training=self.training, momentum=0.0 if self.momentum is None else self.momentum,
                              eps=self.eps)
        node = y.value.producer()
        if self.momentum is None:
            counter = self._parameters["num_batches_tracked"]  # the Parameter: attribute access gives a Tensor
            node.metadata_props.update({COUNTER_KEY: counter.qualname, COUNT_KEY: str(int(counter.numpy()))})
        # SyncBatchNorm's node (without running statistics: batch_statistics_norm marks plain ops)
        if self._sync and node is not None and node.op_type == "BatchNormalization":
            node.metadata_props[SYNC_BATCHNORM_KEY] = "true"
        return y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, {affine_repr(self)}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Input ``(N, C)`` or ``(N, C, L)``."""

    _ranks, _layout = (2, 3), "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Input ``(N, C, H, W)``."""

    _ranks, _layout = (4,), "(N, C, H, W)"


class BatchNorm3d(_BatchNorm):
    """Input ``(N, C, D, H, W)``."""

    _ranks, _layout = (5,), "(N, C, D, H, W)"


@takes_device
class LayerNorm(Module):
    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype: Any = "float32"):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = Parameter(shape=shape, init=draws.ones, dtype=dtype) if elementwise_affine else None
        self.bias = Parameter(shape=shape, init=draws.zeros, dtype=dtype) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return ops_nn.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_{affine_repr(self)}"


class Dropout(DropoutLayer):
    fn = staticmethod(ops_nn.dropout)


@takes_device
class Embedding(Module):
    """``weight`` is ``[num_embeddings, embedding_dim]``, drawn from N(0, 1), the ``padding_idx``
    row zero; ``forward`` is ``F.embedding`` with the module's arguments: as in PyTorch the padding
    row gets no gradient, ``scale_grad_by_freq`` divides each row's gradient by its count in the
    batch, ``max_norm`` scales the rows looked up to it (``ops_nn.renormed``)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Any = None, _freeze: bool = False, dtype: Any = None):
        super().__init__()
        padding_idx, draw = padding_row_init("Embedding", num_embeddings, padding_idx)
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        self.weight = embedding_weight("Embedding", (num_embeddings, embedding_dim), draw, _weight, dtype)
        self.weight.requires_grad_(not _freeze)

    @classmethod
    def from_pretrained(cls, embeddings: Any, freeze: bool = True, padding_idx: int | None = None,
                        max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = False) -> "Embedding":
        """``torch.nn.Embedding.from_pretrained`` (``pretrained``)."""
        return pretrained(cls, embeddings, freeze, padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                          scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)

    def forward(self, indices: Tensor) -> Tensor:
        return ops_nn.embedding(indices, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                                self.scale_grad_by_freq, self.sparse)

    def extra_repr(self) -> str:
        return ", ".join([f"{self.num_embeddings}, {self.embedding_dim}",
                          *not_default(self, padding_idx=None, max_norm=None, norm_type=2, scale_grad_by_freq=False,
                                       sparse=False)])


def affine_repr(norm: Module) -> str:
    """torch's ``affine=..., bias=...`` of a norm layer's ``extra_repr``: whether it has a weight, a bias."""
    return f"affine={norm.weight is not None}, bias={norm.bias is not None}"


class ReLU(InPlace):
    def forward(self, x: Tensor) -> Tensor:
        return into(x, ops.relu(x), self.inplace)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return ops.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops.sigmoid(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops.tanh(x)


class Softmax(AlongDim):
    name = "softmax"

    def forward(self, x: Tensor) -> Tensor:
        return ops.softmax(x, self.axis(x))


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return ops.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """``dim`` split into ``unflattened_size`` (one entry may be -1)."""

    def __init__(self, dim: int, unflattened_size: Any):
        super().__init__()
        self.dim, self.unflattened_size = dim, unflattened_size  # kept as given: a list prints as one, as torch's

    def forward(self, x: Tensor) -> Tensor:
        return unflatten(x, self.dim, tuple(self.unflattened_size))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


BatchNormBase = _BatchNorm  # the base of the BatchNorm layers, for the ones defined elsewhere (SyncBatchNorm)
