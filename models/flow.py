"""A small RealNVP-style normalizing flow over ``dim`` features: blocks of an invertible linear
map (Glow's 1x1 convolution; log-determinant by ``gc.linalg.slogdet``) and an affine coupling
layer (half the features scaled and shifted by an MLP of the other half). ``forward`` gives each
example's log-likelihood under a standard normal base and the mean negative log-likelihood;
``inverse`` maps base samples back to data (``gc.linalg.inv``).

    graphc capture models/flow.py:Flow --input x:float32[N,6] -o flow.onnx
"""

from __future__ import annotations

import math

import numpy as np

import graphc as gc
from graphc import nn


class InvertibleLinear(nn.Module):
    """``y = x W^T``, ``W`` a random rotation at first; its log-determinant ``log|det W|``."""

    def __init__(self, dim: int, seed: int = 0, dtype: str = "float32"):
        super().__init__()
        rotation = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, dim)))[0]
        self.weight = nn.Parameter(rotation, dtype=dtype)

    def forward(self, x):
        return gc.matmul(x, self.weight.T), gc.linalg.slogdet(self.weight).logabsdet

    def inverse(self, y):
        return gc.matmul(y, gc.linalg.inv(self.weight).T)


class AffineCoupling(nn.Module):
    """The second half of the features scaled by ``exp(s)`` and shifted by ``t``, ``(s, t)`` an MLP
    of the first half (``s`` bounded by tanh); log-determinant ``sum(s)``."""

    def __init__(self, dim: int, hidden: int, dtype: str = "float32"):
        super().__init__()
        self.half = dim // 2
        self.net = nn.Sequential(nn.Linear(self.half, hidden, dtype=dtype), nn.Tanh(),
                                 nn.Linear(hidden, 2 * (dim - self.half), dtype=dtype))

    def _scale_shift(self, x1):
        s, t = gc.chunk(self.net(x1), 2, -1)
        return gc.tanh(s), t

    def forward(self, x):
        x1, x2 = x[:, :self.half], x[:, self.half:]
        s, t = self._scale_shift(x1)
        return gc.cat([x1, x2 * gc.exp(s) + t], -1), s.sum(-1)

    def inverse(self, y):
        y1, y2 = y[:, :self.half], y[:, self.half:]
        s, t = self._scale_shift(y1)
        return gc.cat([y1, (y2 - t) * gc.exp(-s)], -1)


class Flow(nn.Module):
    def __init__(self, dim: int = 6, hidden: int = 16, blocks: int = 2, dtype: str = "float32"):
        super().__init__()
        self.dim = dim
        self.linears = nn.ModuleList([InvertibleLinear(dim, seed=i, dtype=dtype) for i in range(blocks)])
        self.couplings = nn.ModuleList([AffineCoupling(dim, hidden, dtype=dtype) for _ in range(blocks)])

    def forward(self, x):
        logdet = 0.0
        for linear, coupling in zip(self.linears, self.couplings):
            x, ld_linear = linear(x)
            x, ld_coupling = coupling(x)
            logdet = logdet + ld_linear + ld_coupling
        base = -0.5 * (x * x).sum(-1) - 0.5 * self.dim * math.log(2 * math.pi)
        log_prob = base + logdet
        return {"loss": -log_prob.mean(), "log_prob": log_prob}

    def inverse(self, z):
        for linear, coupling in zip(reversed(self.linears), reversed(self.couplings)):
            z = linear.inverse(coupling.inverse(z))
        return z


def example_inputs(batch: int | str = "N", dim: int = 6) -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, dim), name="x")}
