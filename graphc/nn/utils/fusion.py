"""``gc.nn.utils.fuse_conv_bn_eval``/``fuse_linear_bn_eval`` and their ``*_weights``: a BatchNorm in
eval mode folded into the conv or linear layer before it, as torch's, by numpy arithmetic on the
parameters (float64, cast back); the fused parameters keep torch's ``requires_grad``."""

from __future__ import annotations

import copy

import numpy as np

from graphc.dsl.builder import user_source
from graphc.errors import CaptureError
from graphc.nn.module import Module, Parameter
from graphc.nn.utils.norms import weight_value

__all__ = ["fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval", "fuse_linear_bn_weights"]


def _bn_scale(bn_rv, bn_eps, bn_w):
    """``bn_w / sqrt(bn_rv + eps)`` (``bn_w`` None: ones) in float64."""
    rv = np.asarray(bn_rv, np.float64)
    return (np.ones_like(rv) if bn_w is None else np.asarray(bn_w, np.float64)) / np.sqrt(rv + bn_eps)


def _bias(b, bn_rm, scale, bn_b, dtype) -> np.ndarray:
    """``(b - bn_rm) * scale + bn_b`` (``b`` and ``bn_b`` None: zeros), cast to ``dtype``."""
    rm = np.asarray(bn_rm, np.float64)
    b = np.zeros_like(rm) if b is None else np.asarray(b, np.float64)
    shift = np.zeros_like(rm) if bn_b is None else np.asarray(bn_b, np.float64)
    return ((b - rm) * scale + shift).astype(dtype)


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b,
                         transpose: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``torch.nn.utils.fuse_conv_bn_weights`` on arrays: ``(weight, bias)`` of the conv that
    computes ``bn(conv(x))``; ``transpose`` for a ConvTranspose weight ``(in, out, ...)``."""
    conv_w = np.asarray(conv_w)
    scale = _bn_scale(bn_rv, bn_eps, bn_w)
    shape = [1, -1] if transpose else [-1, 1]
    weight = conv_w.astype(np.float64) * scale.reshape(shape + [1] * (conv_w.ndim - 2))
    return weight.astype(conv_w.dtype), _bias(conv_b, bn_rm, scale, bn_b, conv_w.dtype)


def fuse_linear_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b) -> tuple[np.ndarray, np.ndarray]:
    """``torch.nn.utils.fuse_linear_bn_weights`` on arrays: ``(weight, bias)`` of ``bn(linear(x))``."""
    linear_w = np.asarray(linear_w)
    scale = _bn_scale(bn_rv, bn_eps, bn_w)
    weight = linear_w.astype(np.float64) * scale[:, None]
    return weight.astype(linear_w.dtype), _bias(linear_b, bn_rm, scale, bn_b, linear_w.dtype)


def _values(module: Module, *names: str) -> list[np.ndarray | None]:
    return [None if module._parameters.get(n) is None else weight_value(module._parameters[n]) for n in names]


def _fused(layer: Module, bn: Module, fn: str, weights) -> Module:
    if layer.training or bn.training:
        raise CaptureError(f"{fn}: fusion only for eval! {type(layer).__name__} and {type(bn).__name__} must be in "
                           f"eval mode, as torch requires (at {user_source()})")
    w, b = _values(layer, "weight", "bias")
    weight, bias = weights(w, b, *_values(bn, "running_mean", "running_var"), bn.eps, *_values(bn, "weight", "bias"))
    fused = copy.deepcopy(layer)
    old_w, old_b = layer._parameters["weight"], layer._parameters.get("bias")
    # torch's requires_grad: the layer's; a layer without a bias gets one made like the running mean, which has none
    fused.weight = Parameter(weight, old_w.requires_grad, dtype=old_w.dtype)
    fused.bias = Parameter(bias, old_b is not None and old_b.requires_grad, dtype=old_w.dtype)
    return fused


def fuse_conv_bn_eval(conv: Module, bn: Module, transpose: bool = False) -> Module:
    """``torch.nn.utils.fuse_conv_bn_eval``: a copy of ``conv`` (eval mode, as ``bn``) computing
    ``bn(conv(x))``; ``transpose`` for a ConvTranspose."""
    return _fused(conv, bn, "fuse_conv_bn_eval", lambda *a: fuse_conv_bn_weights(*a, transpose=transpose))


def fuse_linear_bn_eval(linear: Module, bn: Module) -> Module:
    """``torch.nn.utils.fuse_linear_bn_eval``: a copy of ``linear`` computing ``bn(linear(x))``
    (``bn`` over the output features, or one feature broadcast, as torch)."""
    features = bn.num_features
    if features not in (linear.out_features, 1):
        raise CaptureError(f"fuse_linear_bn_eval: the BatchNorm's num_features={features} must equal the Linear's "
                           f"out_features={linear.out_features} or be 1, as torch requires (at {user_source()})")
    return _fused(linear, bn, "fuse_linear_bn_eval", fuse_linear_bn_weights)
