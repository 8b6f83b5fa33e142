"""`gc.nn.MultiheadAttention`, with ``torch.nn.MultiheadAttention``'s parameters and semantics."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_mha import heads
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn import draws
from graphc.nn.layers import Linear
from graphc.nn.module import Module, Parameter
from graphc.nn.signatures import takes_device


@takes_device
class MultiheadAttention(Module):
    """Scaled dot-product attention over ``num_heads`` heads.

    Parameters as PyTorch: ``in_proj_weight [3E, E]`` (xavier-uniform) or, where ``kdim`` or ``vdim``
    differ from ``E`` (``_qkv_same_embed_dim`` False), ``q_proj_weight [E, E]``, ``k_proj_weight [E, kdim]``
    and ``v_proj_weight [E, vdim]`` (each xavier-uniform); ``in_proj_bias [3E]`` (zeros), ``out_proj.weight
    [E, E]`` (Linear init), ``out_proj.bias`` (zeros); with ``add_bias_kv``, ``bias_k`` and ``bias_v [1, 1, E]``
    (xavier-normal), a key and value appended; ``add_zero_attn`` appends a zero one.
    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True) -> (output, weights or None)``; inputs are ``[L, N, E]``, ``[S, N, kdim]``,
    ``[S, N, vdim]`` or, with ``batch_first=True``, ``[N, L, E]``, ...
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, dtype: Any = "float32"):
        super().__init__()
        if embed_dim % num_heads:
            raise CaptureError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim, self.add_zero_attn = embed_dim // num_heads, add_zero_attn
        same = self._qkv_same_embed_dim  # torch's attributes: the ones not used are None
        self.in_proj_weight = _xavier_uniform((3 * embed_dim, embed_dim), dtype) if same else None
        for name, width in (("q", embed_dim), ("k", self.kdim), ("v", self.vdim)):
            setattr(self, f"{name}_proj_weight", None if same else _xavier_uniform((embed_dim, width), dtype))
        self.in_proj_bias = Parameter(shape=(3 * embed_dim,), init=draws.zeros, dtype=dtype) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.out_proj._repr_name = "NonDynamicallyQuantizableLinear"  # torch's class for it; repr shows no arguments
        if bias:  # zeros, as PyTorch's (a new Parameter: inside a capture ``out_proj.bias`` reads as a Tensor)
            self.out_proj.bias = Parameter(shape=(embed_dim,), init=draws.zeros, dtype=dtype)
        for name in ("bias_k", "bias_v"):
            setattr(self, name, Parameter(shape=(1, 1, embed_dim), init=_xavier_normal, dtype=dtype)
                    if add_bias_kv else None)

    def _projections(self) -> tuple[tuple, tuple]:
        """The q, k, v projections' weights and biases (None without ``bias``)."""
        e, w, b = self.embed_dim, self.in_proj_weight, self.in_proj_bias
        weights = tuple(w[i * e:(i + 1) * e] for i in range(3)) if self._qkv_same_embed_dim else \
            (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        return weights, tuple(None if b is None else b[i * e:(i + 1) * e] for i in range(3))

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True):
        query = ops.lift(query)
        key = query if key is None else ops.lift(key, query)
        value = key if value is None else ops.lift(value, query)
        for name, t, width in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if t.shape is not None and (len(t.shape) != 3 or t.shape[2] != width):
                raise op_error("MultiheadAttention", [t], f"expects a rank-3 {name} with {width} features, got "
                               f"shape {list(t.shape)}", user_source())
        if not self.batch_first:
            query, key, value = (ops.transpose(t, [1, 0, 2]) for t in (query, key, value))
        key_padding_mask, attn_mask = (None if m is None else ops.lift(m) for m in (key_padding_mask, attn_mask))
        weights, biases = self._projections()
        out, weights = heads(query, key, value, self.num_heads, weights, biases,
                             bias_k=self.bias_k, bias_v=self.bias_v, add_zero_attn=self.add_zero_attn,
                             dropout_p=self.dropout, training=self.training, key_padding_mask=key_padding_mask,
                             attn_mask=attn_mask)
        out = self.out_proj(out)
        if not self.batch_first:
            out = ops.transpose(out, [1, 0, 2])
        if not need_weights:
            return out, None
        return out, (ops.mean(weights, axis=1) if average_attn_weights else weights)


def _xavier_uniform(shape: tuple[int, int], dtype: Any) -> Parameter:
    return Parameter(shape=shape, init=draws.xavier_uniform(), dtype=dtype)


def _xavier_normal(rng, shape, dtype):
    """torch's ``xavier_normal_`` (gain 1): N(0, sqrt(2 / (fan_in + fan_out)))."""
    fan_in, fan_out = draws.fan_in_out(shape)
    return draws.normal(0.0, (2.0 / (fan_in + fan_out)) ** 0.5)(rng, shape, dtype)
