"""Normalization kernels (BatchNormalization, LayerNormalization, InstanceNormalization,
GroupNormalization, LRN, LpNormalization, MeanVarianceNormalization) and Dropout.

BatchNormalization versions differ in how training mode is chosen:
- opset < 7: the ``is_test`` attribute; opset 7-13: the number of outputs (1 output: inference
  with the running statistics; 5 outputs: training, Y plus running mean/var and saved
  mean/var); opset >= 14: the ``training_mode`` attribute, outputs Y, running mean and var.
In training mode Y is normalized with the batch mean and (biased) variance and the running
statistics become ``running * momentum + batch * (1 - momentum)``.
"""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel, require_shape, require_unidirectional


def _channel_shape(x, spatial=1):
    return (-1,) + (1,) * (x.ndim - 2) if spatial else x.shape[1:]


def _per_channel(x, spatial=1, **params):
    """Refuse BatchNormalization/InstanceNormalization parameters not of shape (C) (opset < 9,
    ``spatial`` 0: X's shape past the batch)."""
    want = (x.shape[1] if x.ndim > 1 else 1,) if spatial else x.shape[1:]
    for name, value in params.items():
        require_shape(value, want, name, "one value per channel" if spatial else "spatial 0: X's shape past N")


def _bn_infer(x, scale, bias, mean, var, epsilon, spatial=1):
    _per_channel(x, spatial, scale=scale, B=bias, input_mean=mean, input_var=var)
    shape = _channel_shape(x, spatial)
    a = scale / np.sqrt(var + epsilon)  # y = x * a + (bias - mean * a): two passes over x
    y = x * a.astype(x.dtype, copy=False).reshape(shape)
    y += (bias - mean * a).astype(x.dtype, copy=False).reshape(shape)
    return y


def _bn_train(x, scale, bias, mean, var, epsilon, momentum, spatial=1):
    _per_channel(x, spatial, input_mean=mean, input_var=var)  # scale and B: _bn_infer's check
    axes = (0, *range(2, x.ndim)) if spatial else (0,)
    batch_mean = x.mean(axis=axes)
    batch_var = x.var(axis=axes)
    y = _bn_infer(x, scale, bias, batch_mean, batch_var, epsilon, spatial)
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    dt = x.dtype
    return (y.astype(dt, copy=False), running_mean.astype(mean.dtype, copy=False),
            running_var.astype(var.dtype, copy=False), batch_mean.astype(dt, copy=False),
            batch_var.astype(dt, copy=False))


@kernel("BatchNormalization", since=1)
def batch_norm_v1(x, scale, bias, mean, var, *, epsilon=1e-5, is_test=0, momentum=0.9,
                  spatial=1, consumed_inputs=None, _outputs=1):
    if is_test:
        return (_bn_infer(x, scale, bias, mean, var, epsilon, spatial).astype(x.dtype, copy=False),)
    return _bn_train(x, scale, bias, mean, var, epsilon, momentum, spatial)[:_outputs]


@kernel("BatchNormalization", since=7)
def batch_norm_v7(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, _outputs=1):
    if _outputs == 1:
        return (_bn_infer(x, scale, bias, mean, var, epsilon, spatial).astype(x.dtype, copy=False),)
    return _bn_train(x, scale, bias, mean, var, epsilon, momentum, spatial)[:_outputs]


@kernel("BatchNormalization", since=9)
def batch_norm_v9(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, _outputs=1):
    return batch_norm_v7(x, scale, bias, mean, var, epsilon=epsilon, momentum=momentum, _outputs=_outputs)


@kernel("BatchNormalization", since=14)
def batch_norm(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    if training_mode:
        return _bn_train(x, scale, bias, mean, var, epsilon, momentum)[:3]
    return (_bn_infer(x, scale, bias, mean, var, epsilon).astype(x.dtype, copy=False),)


@kernel("LayerNormalization", since=17)
def layer_norm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Statistics in at least float32 (``stash_type=1``: Mean and InvStdDev come out float32;
    a float64 input keeps float64 for Y, as onnxruntime does)."""
    axis = axis % x.ndim
    axes = tuple(range(axis, x.ndim))
    require_unidirectional(scale, x.shape, "Scale")
    require_unidirectional(bias, x.shape, "B")
    xs = x.astype(np.float32) if stash_type == 1 and x.dtype.itemsize < 4 else x
    mean = xs.mean(axis=axes, keepdims=True)
    centered = xs - mean
    inv_std = 1 / np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True) + epsilon)
    y = (centered * inv_std).astype(x.dtype, copy=False) * scale
    if bias is not None:
        y = y + bias
    if stash_type == 1:
        mean, inv_std = mean.astype(np.float32, copy=False), inv_std.astype(np.float32, copy=False)
    return y, mean, inv_std


@kernel("RMSNormalization", since=23)
def rms_norm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    axes = tuple(range(axis % x.ndim, x.ndim))
    xs = x.astype(np.float32) if stash_type == 1 and x.dtype.itemsize < 4 else x
    inv_rms = 1 / np.sqrt(np.mean(xs * xs, axis=axes, keepdims=True) + epsilon)
    return ((xs * inv_rms).astype(x.dtype, copy=False) * scale,)


@kernel("InstanceNormalization", since=6)
def instance_norm(x, scale, bias, *, epsilon=1e-5):
    _per_channel(x, scale=scale, B=bias)
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    shape = _channel_shape(x)
    y = (x - mean) / np.sqrt(var + epsilon) * scale.reshape(shape) + bias.reshape(shape)
    return (y.astype(x.dtype, copy=False),)


def _group_norm(x, num_groups, epsilon, stash_type):
    c = x.shape[1] if x.ndim > 1 else 0
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"num_groups is {num_groups}, which does not divide X's channels C = {c} (X has shape "
                         f"{list(x.shape)})")
    n = x.shape[0]
    g = x.reshape(n, num_groups, -1)
    gs = g.astype(np.float32) if stash_type == 1 and x.dtype.itemsize < 4 else g
    mean = gs.mean(axis=-1, keepdims=True)
    var = gs.var(axis=-1, keepdims=True)
    return ((gs - mean) / np.sqrt(var + epsilon)).astype(x.dtype).reshape(x.shape)


@kernel("GroupNormalization", since=18)
def group_norm_v18(x, scale, bias, *, epsilon=1e-5, num_groups):
    """Opset 18: scale and bias have one entry per group."""
    y = _group_norm(x, num_groups, epsilon, 0)
    for name, value in (("scale", scale), ("bias", bias)):
        require_shape(value, (num_groups,), name, "opset 18: one value per group")
    rep = x.shape[1] // num_groups
    shape = _channel_shape(x)
    return (y * np.repeat(scale, rep).reshape(shape) + np.repeat(bias, rep).reshape(shape),)


@kernel("GroupNormalization", since=21)
def group_norm(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    y = _group_norm(x, num_groups, epsilon, stash_type)
    for name, value in (("scale", scale), ("bias", bias)):
        require_shape(value, (x.shape[1],), name, "one value per channel")
    shape = _channel_shape(x)
    return (y * scale.reshape(shape) + bias.reshape(shape),)


@kernel("LRN", since=1)
def lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.pad(x * x, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    total = sum(sq[:, i:i + c] for i in range(size))
    return ((x / (bias + alpha / size * total) ** beta).astype(x.dtype, copy=False),)


@kernel("LpNormalization", since=1)
def lp_normalization(x, *, axis=-1, p=2):
    norm = np.sum(np.abs(x) ** p, axis=axis, keepdims=True) ** (1.0 / p)
    return (np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(x.dtype, copy=False),)


@kernel("MeanVarianceNormalization", since=9)
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    axes = tuple(axes)
    mean = x.mean(axis=axes, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True))
    return (((x - mean) / (std + 1e-9)).astype(x.dtype, copy=False),)


# -- dropout ------------------------------------------------------------------------------------
# Training-mode masks come from the executable's numpy Generator (``prepare(model, seed=...)``,
# default seed 0), so the same seed gives the same masks run after run. A node's own ``seed``
# attribute is accepted but does not reseed: onnxruntime's masks differ anyway, and a fixed
# per-node seed would repeat one mask every step.
@kernel("Dropout", since=1)
def dropout_v1(x, *, ratio=0.5, is_test=0, consumed_inputs=None, _outputs=1):
    return (x, np.ones(x.shape, dtype=bool))[:_outputs]


@kernel("Dropout", since=12, context=True)
def dropout(ctx, x, ratio=None, training_mode=None, *, seed=None, _outputs=1):
    ratio = float(ratio) if ratio is not None else 0.5
    if training_mode is None or not bool(training_mode) or ratio == 0:
        return (x, np.ones(x.shape, dtype=bool))[:_outputs]
    mask = ctx.rng.random(x.shape) >= ratio
    y = (x * mask / (1 - ratio)).astype(x.dtype, copy=False)
    return (y, mask)[:_outputs]
