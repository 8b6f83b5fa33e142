"""Normalisations of float64 inputs with a double ``eps``, for ``ops_nn`` and ``ops_layers``: ONNX's
LayerNormalization, InstanceNormalization and RMSNormalization take ``epsilon`` as a float32
attribute (1e-5 is 9.99999974e-6 there; torch's is a double), which moves a float64 output of small
variance (std 0.02) by about 1e-9 relative. Where float32 cannot hold ``eps`` a float64 input's
normalisation is written out here in standard ops, ``eps`` a float64 constant."""

from __future__ import annotations

import numpy as np

from graphc.dsl.ops import mean, scalar, sqrt
from graphc.dsl.tensor import Tensor

__all__ = ["rounds_eps", "standardized"]


def rounds_eps(x: Tensor, eps: float) -> bool:
    """Would a float32 ``epsilon`` attribute change ``eps`` for the float64 ``x``?"""
    return x.dtype == "float64" and float(np.float32(eps)) != float(eps)


def standardized(x: Tensor, axes: int | list[int], eps: float) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance, two passes), ``eps`` in x's dtype."""
    centred = x - mean(x, axes, keepdims=True)
    return centred / sqrt(mean(centred * centred, axes, keepdims=True) + scalar(eps, x))
