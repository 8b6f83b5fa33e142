"""``F.multi_head_attention_forward``, torch's multi-head attention, and the batch-first core that it
shares with ``gc.nn.MultiheadAttention`` (``heads``): in-projection, heads, masks, softmax, dropout."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_nn import dropout, linear
from graphc.dsl.ops_views import expand_as
from graphc.dsl.tensor import Tensor

FN = "multi_head_attention_forward"


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """[N, L, E] -> [N, H, L, E/H] (Reshape with 0 = copy dim, so N and L stay symbolic)."""
    n, length, d = x.shape[0], x.shape[1], x.shape[2] // heads
    y = ops.emit("Reshape", [x, ops.const_i64([0, 0, heads, d])], out_types=[(x.dtype, [n, length, heads, d])])
    return ops.transpose(y, [0, 2, 1, 3])


def _per_head(x: Tensor, heads: int) -> Tensor:
    """torch's [N*H, A, B] -> [N, H, A, B]."""
    a, b = x.shape[1], x.shape[2]
    return ops.emit("Reshape", [ops.unsqueeze(x, [1]), ops.const_i64([-1, heads, 0, 0])],
                    out_types=[(x.dtype, [None, heads, a, b])])


def _zeros(like: Tensor) -> Tensor:
    """Zeros (False for bool) of ``like``'s run-time shape and dtype."""
    return expand_as(ops.cast(ops.constant(np.zeros([1] * like.ndim)), like.dtype), like)


def _pad_key(mask: Tensor | None) -> Tensor | None:
    """A mask over the keys given one more key, never masked (torch pads with a 0 / False column)."""
    return None if mask is None else ops.concat([mask, _zeros(mask[..., :1])], -1)


def _masked(scores: Tensor, mask: Tensor | None) -> Tensor:
    """A bool mask sets scores to -inf where True; a float mask is added."""
    if mask is None:
        return scores
    return ops.where(mask, ops.scalar(-np.inf, scores), scores) if mask.dtype == "bool" else scores + mask


def heads(query: Tensor, key: Tensor, value: Tensor, num_heads: int, weights: tuple, biases: tuple, *,
          bias_k: Tensor | None = None, bias_v: Tensor | None = None, add_zero_attn: bool = False,
          dropout_p: float = 0.0, training: bool = True, key_padding_mask: Tensor | None = None,
          attn_mask: Tensor | None = None, static_k: Tensor | None = None,
          static_v: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Batch-first attention before the out-projection: ``[N, L, E]`` query, ``[N, S, E]`` key and
    value, ``weights``/``biases`` the q, k, v projections' (a bias may be None). Returns the heads
    merged, ``[N, L, E]``, and the attention weights ``[N, H, L, S]`` (after dropout, as torch's)."""
    e = query.shape[2]
    d = e // num_heads

    def project(x: Tensor, i: int, bias: Tensor | None, static: Tensor | None) -> Tensor:
        if static is not None:  # torch's [N*H, S, D], in place of the projection
            return _per_head(static, num_heads)
        x = linear(x, weights[i], biases[i])
        if bias is not None:  # one more key / value, torch's [1, 1, E]
            x = ops.concat([x, expand_as(ops.reshape(bias, [1, 1, e]), x[:, :1])], 1)
        return _split_heads(x, num_heads)

    q, k, v = (project(x, i, bias, static) for i, (x, bias, static) in
               enumerate(((query, None, None), (key, bias_k, static_k), (value, bias_v, static_v))))
    if bias_k is not None:
        attn_mask, key_padding_mask = _pad_key(attn_mask), _pad_key(key_padding_mask)
    if add_zero_attn:
        k, v = (ops.concat([t, _zeros(t[:, :, :1])], 2) for t in (k, v))
        attn_mask, key_padding_mask = _pad_key(attn_mask), _pad_key(key_padding_mask)
    scores = ops.matmul(q * (1.0 / math.sqrt(d)), ops.transpose(k, [0, 1, 3, 2]))
    if attn_mask is not None and attn_mask.ndim == 3:
        attn_mask = _per_head(attn_mask, num_heads)
    scores = _masked(scores, attn_mask)
    if key_padding_mask is not None:
        scores = _masked(scores, ops.unsqueeze(key_padding_mask, [1, 2]))  # [N, S] -> [N, 1, 1, S]
    attn = ops.softmax(scores, axis=-1)
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p, training=training)
    out = ops.transpose(ops.matmul(attn, v), [0, 2, 1, 3])
    out = ops.emit("Reshape", [out, ops.const_i64([0, 0, e])], out_types=[(out.dtype, [*out.shape[:2], e])])
    return out, attn


def _check(cond: bool, t: Any, msg: str) -> None:
    if not cond:
        raise op_error(FN, [t], msg, user_source())


def multi_head_attention_forward(
        query: Any, key: Any, value: Any, embed_dim_to_check: int, num_heads: int, in_proj_weight: Any,
        in_proj_bias: Any, bias_k: Any, bias_v: Any, add_zero_attn: bool, dropout_p: float, out_proj_weight: Any,
        out_proj_bias: Any, training: bool = True, key_padding_mask: Any = None, need_weights: bool = True,
        attn_mask: Any = None, use_separate_proj_weight: bool = False, q_proj_weight: Any = None,
        k_proj_weight: Any = None, v_proj_weight: Any = None, static_k: Any = None, static_v: Any = None,
        average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
    """``torch.nn.functional.multi_head_attention_forward``: sequence-first ``[L, N, E]`` query and
    ``[S, N, E]`` key and value (or unbatched ``[L, E]``, ``[S, E]``). Returns ``(output [L, N, E],
    weights [N, L, S]`` averaged over heads, ``[N, H, L, S]`` if not ``average_attn_weights``, None
    if not ``need_weights``). ``is_causal`` is a hint, as torch's: ``attn_mask`` must be given."""
    query = ops.lift(query)
    key, value = ops.lift(key, query), ops.lift(value, query)
    _check(query.shape is not None and query.ndim in (2, 3), query,
           f"query must be [L, N, E] or unbatched [L, E], got shape {query.shape}")
    batched = query.ndim == 3
    for name, t in (("key", key), ("value", value)):
        _check(t.ndim == query.ndim, t, f"{name} must have query's rank {query.ndim}, got shape {t.shape}")
    e = query.shape[-1]
    _check(e == embed_dim_to_check, query,
           f"was expecting embedding dimension of {embed_dim_to_check}, but got {e}")
    _check(isinstance(num_heads, int) and num_heads > 0 and e % num_heads == 0, query,
           f"embed_dim {e} not divisible by num_heads {num_heads}")
    if is_causal and attn_mask is None:
        raise op_error(FN, [query], "Need attn_mask if specifying the is_causal hint", user_source())
    _check((bias_k is None) == (bias_v is None), query, "bias_k and bias_v must both be given or both None")
    _check(bias_k is None or (static_k is None and static_v is None), query,
           "bias cannot be added to static key or value (bias_k with static_k / static_v)")
    if use_separate_proj_weight:
        for name, w in (("q_proj_weight", q_proj_weight), ("k_proj_weight", k_proj_weight),
                        ("v_proj_weight", v_proj_weight)):
            _check(w is not None, query, f"use_separate_proj_weight is True but {name} is None")
        weights = tuple(ops.lift(w, query) for w in (q_proj_weight, k_proj_weight, v_proj_weight))
    else:
        _check(in_proj_weight is not None, query, "use_separate_proj_weight is False but in_proj_weight is None")
        w = ops.lift(in_proj_weight, query)
        _check(w.shape is not None and tuple(w.shape) == (3 * e, e), w,
               f"in_proj_weight must be [3 * embed_dim, embed_dim] = [{3 * e}, {e}], got {w.shape}")
        weights = (w[:e], w[e:2 * e], w[2 * e:])
    biases = (None, None, None)
    if in_proj_bias is not None:
        b = ops.lift(in_proj_bias, query)
        _check(tuple(b.shape) == (3 * e,), b, f"in_proj_bias must be [3 * embed_dim] = [{3 * e}], got {b.shape}")
        biases = (b[:e], b[e:2 * e], b[2 * e:])
    masks = [None if m is None else ops.lift(m) for m in (attn_mask, key_padding_mask)]
    for name, m in zip(("attn_mask", "key_padding_mask"), masks):
        _check(m is None or m.dtype == "bool" or m.dtype == query.dtype, m,
               f"{name} must be bool or query's dtype {query.dtype}, got {m.dtype if m is not None else None}")
    attn_mask, key_padding_mask = masks
    if attn_mask is not None:
        _check(attn_mask.ndim in (2, 3), attn_mask,
               f"attn_mask must be [L, S] or [N * num_heads, L, S], got shape {attn_mask.shape}")
    if not batched:  # torch's unbatched forms: a batch of one
        query, key, value = (ops.unsqueeze(t, [1]) for t in (query, key, value))
        key_padding_mask = None if key_padding_mask is None else ops.unsqueeze(key_padding_mask, [0])
    out, attn = heads(
        *(ops.transpose(t, [1, 0, 2]) for t in (query, key, value)), num_heads, weights, biases,
        bias_k=None if bias_k is None else ops.lift(bias_k, query),
        bias_v=None if bias_v is None else ops.lift(bias_v, query), add_zero_attn=add_zero_attn,
        dropout_p=dropout_p if training else 0.0, training=training, key_padding_mask=key_padding_mask,
        attn_mask=attn_mask, static_k=None if static_k is None else ops.lift(static_k, query),
        static_v=None if static_v is None else ops.lift(static_v, query))
    out = ops.transpose(linear(out, out_proj_weight, out_proj_bias), [1, 0, 2])
    weights_out = (ops.mean(attn, axis=1) if average_attn_weights else attn) if need_weights else None
    if not batched:
        out = ops.squeeze(out, [1])
        weights_out = None if weights_out is None else ops.squeeze(weights_out, [0])
    return out, weights_out
