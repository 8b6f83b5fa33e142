"""Activation layers with ``torch.nn``'s names and arguments (LeakyReLU ... LogSoftmax). An ``inplace``
argument is accepted for torch's signature: a graph has no in-place ops."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops, ops_layers
from graphc.dsl.batching import batch_rank
from graphc.dsl.ops_random import rrelu
from graphc.nn.init import constant as _constant
from graphc.nn.module import Module, Parameter
from graphc.dsl.tensor import Tensor


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.leaky_relu(x, self.negative_slope)


class ELU(Module):
    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.elu(x, self.alpha)


class SiLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.silu(x)


class Mish(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.mish(x)


class Hardswish(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardswish(x)


class Hardsigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardsigmoid(x)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softplus(x, self.beta, self.threshold)


class PReLU(Module):
    """``weight [num_parameters]`` filled with ``init`` (0.25); one slope, or one per channel."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, dtype: Any = "float32"):  # noqa: A002
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = Parameter(shape=(num_parameters,), init=_constant(init), dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.prelu(x, self.weight)



class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class ReLU6(Hardtanh):
    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0)


class SELU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.selu(x)


class CELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.celu(x, self.alpha)


class GLU(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.glu(x, self.dim)


class LogSigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.logsigmoid(x)


class Softsign(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softsign(x)


class Tanhshrink(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.tanhshrink(x)


class _Shrink(Module):
    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def extra_repr(self) -> str:
        return str(self.lambd)


class Softshrink(_Shrink):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softshrink(x, self.lambd)


class Hardshrink(_Shrink):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardshrink(x, self.lambd)


class Threshold(Module):
    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold, self.value = threshold, value

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.threshold(x, self.threshold, self.value)


class _AlongDim(Module):
    """``dim=None`` is the last dim, as ``gc.nn.Softmax`` (torch's deprecated implicit choice is not
    followed)."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(_AlongDim):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softmin(x, self.dim)


class LogSoftmax(_AlongDim):
    def forward(self, x: Tensor) -> Tensor:
        return ops.log_softmax(x, self.dim)


class RReLU(Module):
    """``F.rrelu(x, lower, upper, training=self.training)``: a slope drawn per element from
    U(lower, upper) in training mode, ``(lower + upper) / 2`` in eval mode."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower, self.upper = lower, upper

    def forward(self, x: Tensor) -> Tensor:
        return rrelu(x, self.lower, self.upper, training=self.training)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}"


class Softmax2d(Module):
    """Softmax over the channels of a ``(N, C, H, W)`` or ``(C, H, W)`` input (dim -3)."""

    def forward(self, x: Tensor) -> Tensor:
        x = ops.lift(x)
        batch_rank("Softmax2d", x, "C, H, W")
        return ops.softmax(x, -3)
