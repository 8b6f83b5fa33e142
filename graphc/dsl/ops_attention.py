"""Scaled dot-product attention: ``gc.scaled_dot_product_attention`` and the one lowering it shares
with ``gc.nn.attention.flex_attention`` (``attend``): the ONNX ``Attention`` op where it can say the
call (4-D float32 or narrower inputs from opset 23, no dropout, score modification or logsumexp), its
decomposition (MatMul, Softmax, MatMul) otherwise; a query row whose every key is masked gives zeros,
as torch's."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import current, op_error, user_source
from graphc.dsl.ops import (concat, dim_read, emit, lift, matmul, reduction, scalar, softmax, squeeze, transpose,
                            where)
from graphc.dsl.ops_array import ir_tensor, logsumexp, tril
from graphc.dsl.ops_views import repeat_interleave
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32
from graphc.errors import CaptureError

__all__ = ["attend", "causal_mask", "scaled_dot_product_attention"]


def causal_mask(query: Tensor, key: Tensor, dim: int = -2) -> Tensor:
    """bool ``[L, S]``, true on and below the diagonal (a query attends to keys up to its own
    position), for the lengths on ``dim`` of ``query`` and ``key`` (symbolic ones too)."""
    lengths = [dim_read(t, dim % t.ndim) for t in (query, key)]
    ones = emit("ConstantOfShape", [concat(lengths)], {"value": ir_tensor(np.ones(1, bool))},
                out_types=[("bool", [query.shape[dim], key.shape[dim]])])
    return tril(ones)


def head_groups(op: str, hq: Any, hk: Any, enable_gqa: bool) -> int:
    """How many of the ``hq`` query heads share each of the ``hk`` key/value heads (grouped-query attention):
    1 where they are equal or unknown; else ``enable_gqa`` must be set and ``hq`` a static multiple of ``hk``."""
    if None in (hq, hk) or hq == hk:
        return 1
    if not enable_gqa:
        raise CaptureError(f"{op}: query has {hq} heads and key {hk}; set enable_gqa=True for grouped-query "
                           f"attention (at {user_source()})")
    if not (isinstance(hq, int) and isinstance(hk, int) and hq % hk == 0):
        raise CaptureError(f"{op}: enable_gqa needs the query heads ({hq}) to be a static multiple of the key heads "
                           f"({hk}) (at {user_source()})")
    return hq // hk


def attend(query: Tensor, key: Tensor, value: Tensor, scale: float | None, *, attn_mask: Tensor | None = None,
           is_causal: bool = False, score_mod: Callable[[Tensor], Tensor] | None = None, groups: int = 1,
           dropout_p: float = 0.0, training: bool = False, return_lse: bool = False, op: str = "Attention"
           ) -> Tensor | tuple[Tensor, Tensor]:
    """``softmax(score_mod(q k^T * scale) + mask) v`` over ``[..., L, E]`` inputs, and with
    ``return_lse`` the scores' natural logsumexp over the keys ``[..., L]`` (-inf on a fully masked
    row). ``scale`` None is ``1/sqrt(E)``; ``attn_mask`` is bool (true: attend) or added to the
    scores; ``score_mod`` maps the scaled scores to scores of the same shape; ``groups`` > 1 repeats
    each key and value head for that many query heads (grouped-query attention, the heads on dim -3).
    ``op`` names the caller in errors."""
    from graphc.dsl.ops_nn import dropout

    depth = query.shape[-1]
    if scale is None and not isinstance(depth, int):
        raise op_error(op, [query], "needs a static head size (or scale=)", user_source())
    scale = 1.0 / math.sqrt(depth) if scale is None else float(scale)
    plain = score_mod is None and not return_lse and not (dropout_p and training)
    # not in float64: the op's scale is a float32 attribute (1/sqrt(3) is 1e-8 off), and onnxruntime runs
    # a float64 Attention as onnx's body, which gives NaN on a fully masked row
    if plain and current().opset >= 23 and query.ndim == 4 and query.dtype != "float64":
        inputs = [query, key, value] + ([lift(attn_mask)] if attn_mask is not None else [])
        return emit("Attention", inputs, {"is_causal": int(bool(is_causal)), "scale": scale})
    if groups > 1:
        key, value = repeat_interleave(key, groups, key.ndim - 3), repeat_interleave(value, groups, value.ndim - 3)
    key_t = transpose(key, list(range(key.ndim - 2)) + [key.ndim - 1, key.ndim - 2])
    scores = matmul(query * scalar(scale, query), key_t)
    if score_mod is not None:
        scores = score_mod(scores)
    if is_causal:
        scores = where(causal_mask(query, key), scores, scalar(-np.inf, scores))
    if attn_mask is not None:
        attn_mask = lift(attn_mask)
        scores = (where(attn_mask, scores, scalar(-np.inf, scores)) if attn_mask.dtype == "bool"
                  else scores + lift(attn_mask, scores))
    if attn_mask is None and not return_lse:
        weights = softmax(scores, -1)
    else:  # a row whose every key is masked (all -inf) is softmaxed as zeros, so its gradient is 0
        dead = emit("IsInf", [reduction("ReduceMax", scores, [-1], True)], {"detect_positive": 0})
        zero = scalar(0.0, scores)
        live = where(dead, zero, scores)
        weights = where(dead, zero, softmax(live, -1))
    if dropout_p and training:
        weights = dropout(weights, dropout_p, training=True)
    out = matmul(weights, value)
    if not return_lse:
        return out
    return out, where(squeeze(dead, [scores.ndim - 1]), scalar(-np.inf, scores), logsumexp(live, -1))


@autocast_op()
@in_float32
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 training: bool = False, enable_gqa: bool = False) -> Tensor:
    """``softmax(q k^T * scale + mask) v`` over ``[..., L, E]`` inputs; ``attn_mask`` is bool
    (true: attend) or added to the scores; ``is_causal`` masks keys after each query; ``enable_gqa``: each
    key/value head (dim -3) serves ``Hq / Hk`` query heads, as torch's. The ONNX ``Attention`` op for 4-D
    inputs from opset 23, its decomposition before. ``dropout_p`` applies when ``training`` (PyTorch's
    functional form always drops; a module passes ``self.training``)."""
    query = lift(query)
    key, value = lift(key, query), lift(value, query)
    groups = 1
    if enable_gqa and min(t.ndim for t in (query, key, value)) >= 3:
        if key.shape[-3] != value.shape[-3]:
            raise op_error("Attention", [query, key, value], f"enable_gqa needs key and value to have the same heads "
                           f"(dim -3), got {key.shape[-3]} and {value.shape[-3]}", user_source())
        groups = head_groups("scaled_dot_product_attention", query.shape[-3], key.shape[-3], True)
    return attend(query, key, value, scale, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                  training=training, groups=groups)
