"""PyTorch's default initialisations as recipes ``fn(rng, shape, dtype) -> np.ndarray``, drawn from a
``numpy.random.Generator``: a ``Parameter`` keeps one and calls it when the module is initialised
(``Module.init_parameters(seed)``, which ``gc.capture`` runs). torch's ``nn.init`` names: ``graphc.nn.init``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Init = Callable[[np.random.Generator, tuple, Any], np.ndarray]


def fan_in_out(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out) as ``torch.nn.init._calculate_fan_in_and_fan_out``."""
    if len(shape) < 2:
        raise ValueError(f"fan in/out need a tensor of rank >= 2, got shape {tuple(shape)}")
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def between(low: float, high: float) -> Init:
    """U(low, high)."""
    return lambda rng, shape, dtype: rng.uniform(low, high, size=shape).astype(dtype)


def uniform(bound: float) -> Init:
    return between(-bound, bound)


def kaiming_uniform(a: float = math.sqrt(5)) -> Init:
    """``torch.nn.init.kaiming_uniform_(w, a)`` (leaky_relu gain, fan_in mode); with the default
    ``a=sqrt(5)`` this is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's Linear/Conv default."""
    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        fan_in, _ = fan_in_out(shape)
        gain = math.sqrt(2.0 / (1 + a * a))
        bound = gain * math.sqrt(3.0 / fan_in) if fan_in else 0.0
        return rng.uniform(-bound, bound, size=shape).astype(dtype)

    return draw


def xavier_uniform(gain: float = 1.0) -> Init:
    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        fan_in, fan_out = fan_in_out(shape)
        bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, size=shape).astype(dtype)

    return draw


def normal(mean: float = 0.0, std: float = 1.0) -> Init:
    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        return rng.normal(mean, std, size=shape).astype(dtype)

    return draw


def constant(value: float) -> Init:
    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        return np.full(shape, value, dtype=dtype)

    return draw


zeros = constant(0.0)
ones = constant(1.0)


def bias_uniform(fan_in: int) -> Init:
    """PyTorch's Linear/Conv bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return uniform(1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0)
