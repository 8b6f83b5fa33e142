"""Attention (opsets 23-25: scaled dot-product attention with masks, causal and sliding-window
masking, grouped KV heads, KV cache, softcap) and RotaryEmbedding."""

from __future__ import annotations

import math

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype as tensor_dtype

from graphc.backends.numpy.kernels import kernel
from graphc.backends.numpy.linalg import matmul as _matmul_kernel


def _matmul(a, b):
    return _matmul_kernel(a, b)[0]


def _heads(x, num_heads):
    """[B, S, H*D] -> [B, H, S, D]; 4-D inputs are already [B, H, S, D]."""
    if x.ndim == 4:
        return x
    b, s, _ = x.shape
    return x.reshape(b, s, num_heads, -1).transpose(0, 2, 1, 3)


def _softmax(x):
    top = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(top), top, 0))
    total = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(total == 0, 1, total)


def _frontier_bias(shape_qk, offset, allowed_fn, dtype):
    """0 where ``allowed_fn(i + offset, j)`` holds, -inf elsewhere; ``offset`` is a scalar or
    one offset per batch (then the bias gets a batch axis and a head axis)."""
    s_q, s_kv = shape_qk
    i = np.arange(s_q)[:, None]
    j = np.arange(s_kv)[None, :]
    if np.ndim(offset):
        allowed = allowed_fn(i[None] + np.reshape(offset, (-1, 1, 1)), j[None])[:, None]
    else:
        allowed = allowed_fn(i + int(offset), j)
    return np.where(allowed, 0, -np.inf).astype(dtype)


@kernel("Attention", since=23)
def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
              softcap=None, softmax_precision=None, left_window_size=-1, right_window_size=-1,
              _outputs=1):
    """Masks are additive biases (boolean masks: True attends); causal and sliding-window masks
    are bottom-right aligned after the cached keys (or ``nonpad_kv_seqlen - q_len``); softcap
    applies before the masks; a query row with every key masked gives zeros."""
    three_d = q.ndim == 3
    qh, kh, vh = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
    if past_key is not None:
        kh = np.concatenate([past_key, kh], axis=2)
        vh = np.concatenate([past_value, vh], axis=2)
    present_k, present_v = kh, vh
    dt = q.dtype
    s_q, s_kv = qh.shape[2], kh.shape[2]
    bias = np.zeros((s_q, s_kv), dt)
    if attn_mask is not None:
        mask = np.where(attn_mask, 0, -np.inf).astype(dt) if attn_mask.dtype == np.bool_ else attn_mask
        if mask.shape[-1] < s_kv:  # keys beyond the mask are not visible
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, s_kv - mask.shape[-1])],
                          constant_values=-np.inf)
        bias = bias + mask
    if past_key is None and nonpad_kv_seqlen is not None:
        offset = np.reshape(nonpad_kv_seqlen, -1) - s_q
    else:
        offset = past_key.shape[2] if past_key is not None else 0
    if is_causal:
        bias = bias + _frontier_bias((s_q, s_kv), offset, lambda p, j: j <= p, dt)
    if left_window_size >= 0 or right_window_size >= 0:
        def in_window(p, j):
            ok = np.ones(np.broadcast_shapes(np.shape(p), np.shape(j)), bool)
            if left_window_size >= 0:
                ok &= p - j <= left_window_size
            if right_window_size >= 0:
                ok &= j - p <= right_window_size
            return ok
        bias = bias + _frontier_bias((s_q, s_kv), offset, in_window, dt)
    if nonpad_kv_seqlen is not None:
        visible = np.arange(s_kv)[None, :] < np.reshape(nonpad_kv_seqlen, (-1, 1))
        bias = bias + np.where(visible, 0, -np.inf).astype(dt)[:, None, None, :]
    groups = qh.shape[1] // kh.shape[1]
    if groups > 1:  # grouped-query attention: KV head h serves query heads h*groups ...
        kh, vh = np.repeat(kh, groups, axis=1), np.repeat(vh, groups, axis=1)
    root = dt.type(math.sqrt(scale if scale is not None else 1 / math.sqrt(qh.shape[-1])))
    qk = _matmul(qh * root, (kh * root).swapaxes(-1, -2))
    if softcap:
        qk = softcap * np.tanh(qk / softcap)
    qk_bias = qk + bias
    logits = qk_bias.astype(tensor_dtype(softmax_precision)) if softmax_precision else qk_bias
    probs = _softmax(logits)
    all_masked = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    probs = np.where(all_masked, 0, np.nan_to_num(probs, nan=0.0))
    # qk_matmul_output as onnx's reference and node cases define the modes: 0 and 1 the
    # (softcapped) product, 2 with the masks added, 3 the probabilities
    qk_out = {2: qk_bias, 3: probs}.get(qk_matmul_output_mode, qk)
    y = _matmul(probs.astype(dt), vh)
    if three_d:
        b, h, s, d = y.shape
        y = y.transpose(0, 2, 1, 3).reshape(b, s, h * d)
    return (y, present_k, present_v, qk_out.astype(dt))[:_outputs]


@kernel("RotaryEmbedding", since=23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    three_d = x.ndim == 3
    if three_d:  # [B, S, H*D] -> [B, S, H, D]
        b, s, _ = x.shape
        x = x.reshape(b, s, num_heads, -1)
    else:  # [B, H, S, D] -> [B, S, H, D]
        x = x.transpose(0, 2, 1, 3)
    dim = rotary_embedding_dim or x.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    if position_ids is not None:
        cos, sin = cos_cache[position_ids], sin_cache[position_ids]  # [B, S, dim/2]
    else:
        cos, sin = cos_cache, sin_cache
    cos, sin = cos[..., None, : dim // 2], sin[..., None, : dim // 2]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : dim // 2], rot[..., dim // 2:]
    r1, r2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if interleaved:
        out = np.stack([r1, r2], axis=-1).reshape(rot.shape)
    else:
        out = np.concatenate([r1, r2], axis=-1)
    y = np.concatenate([out, rest], axis=-1).astype(x.dtype, copy=False)
    if three_d:
        return (y.reshape(y.shape[0], y.shape[1], -1),)
    return (y.transpose(0, 2, 1, 3),)


@kernel("LinearAttention", since=27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=None,
                     kv_num_heads, q_num_heads, scale=None, update_rule="gated_delta"):
    """Recurrent linear attention: a per-head (d_k, d_v) state decays (gated rules), is
    corrected toward the value (delta rules) and accumulates k v^T; each step reads q @ state.
    Computed in float32; ``chunk_size`` is a tuning hint with no effect on the result."""
    b, t, _ = query.shape
    q4 = _heads(query, q_num_heads).astype(np.float32)
    k4 = _heads(key, kv_num_heads).astype(np.float32)
    v4 = _heads(value, kv_num_heads).astype(np.float32)
    d_k, d_v = q4.shape[-1], v4.shape[-1]
    if decay is not None:  # one gate per head, or one per head and key dim
        per_key = decay.shape[-1] != kv_num_heads
        decay4 = _heads(decay, kv_num_heads) if per_key else decay.reshape(b, t, kv_num_heads, 1).transpose(0, 2, 1, 3)
        decay4 = decay4.astype(np.float32)
    if beta is not None:
        beta4 = beta.reshape(b, t, beta.shape[-1], 1).transpose(0, 2, 1, 3).astype(np.float32)
    state = (past_state.astype(np.float32) if past_state is not None
             else np.zeros((b, kv_num_heads, d_k, d_v), np.float32))
    scale = scale if scale else 1 / math.sqrt(d_k)
    group = q_num_heads // kv_num_heads
    out = np.zeros((b, q_num_heads, t, d_v), np.float32)
    for i in range(t):
        k_t, v_t = k4[:, :, i], v4[:, :, i]
        if decay is not None:
            state = state * np.exp(decay4[:, :, i])[..., None]
        if beta is not None:
            v_t = beta4[:, :, i] * (v_t - np.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        read = np.repeat(state, group, axis=1) if group > 1 else state
        out[:, :, i] = scale * np.einsum("bhd,bhdm->bhm", q4[:, :, i], read)
    y = out.transpose(0, 2, 1, 3).reshape(b, t, q_num_heads * d_v).astype(query.dtype)
    state_dtype = past_state.dtype if past_state is not None else query.dtype
    return y, state.astype(state_dtype)
