"""Activation layers with ``torch.nn``'s names and arguments (LeakyReLU ... PReLU)."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_layers
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

