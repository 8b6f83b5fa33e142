"""Random kernels. Every draw comes from the executable's seeded numpy Generator
(``prepare(model, seed=...)``), so a session reproduces its draws run after run; a node's own
``seed`` attribute is accepted but does not reseed (see Dropout in norm.py)."""

from __future__ import annotations

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from graphc.backends.numpy.kernels import kernel


def _dtype(dtype, like=None):
    if dtype is not None:
        return tensor_dtype_to_np_dtype(dtype)
    return like.dtype if like is not None else np.float32


@kernel("RandomNormal", since=1, context=True)
def random_normal(ctx, *, dtype=None, mean=0.0, scale=1.0, seed=None, shape):
    return (ctx.rng.normal(mean, scale, tuple(shape)).astype(_dtype(dtype)),)


@kernel("RandomUniform", since=1, context=True)
def random_uniform(ctx, *, dtype=None, high=1.0, low=0.0, seed=None, shape):
    return (ctx.rng.uniform(low, high, tuple(shape)).astype(_dtype(dtype)),)


@kernel("RandomNormalLike", since=1, context=True)
def random_normal_like(ctx, x, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    return (ctx.rng.normal(mean, scale, x.shape).astype(_dtype(dtype, x)),)


@kernel("RandomUniformLike", since=1, context=True)
def random_uniform_like(ctx, x, *, dtype=None, high=1.0, low=0.0, seed=None):
    return (ctx.rng.uniform(low, high, x.shape).astype(_dtype(dtype, x)),)


@kernel("Bernoulli", since=15, context=True)
def bernoulli(ctx, p, *, dtype=None, seed=None):
    return ((ctx.rng.random(p.shape) < p).astype(_dtype(dtype, p)),)


@kernel("Multinomial", since=7, context=True)
def multinomial(ctx, logits, *, dtype=6, sample_size=1, seed=None):
    """Draws ``sample_size`` class indices per batch row from unnormalized log-probabilities."""
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
    u = ctx.rng.random((logits.shape[0], sample_size, 1))
    idx = (u > cdf[:, None, :]).sum(axis=-1)
    return (np.minimum(idx, logits.shape[1] - 1).astype(tensor_dtype_to_np_dtype(dtype)),)
