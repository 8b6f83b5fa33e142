"""`gc.nn.MultiheadAttention`, with ``torch.nn.MultiheadAttention``'s parameters and semantics."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_mha import heads
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn import init
from graphc.nn.layers import Linear
from graphc.nn.module import Module, Parameter


class MultiheadAttention(Module):
    """Scaled dot-product attention over ``num_heads`` heads.

    Parameters as PyTorch: ``in_proj_weight [3E, E]`` (xavier-uniform), ``in_proj_bias [3E]``
    (zeros), ``out_proj.weight [E, E]`` (Linear init), ``out_proj.bias`` (zeros).
    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True) -> (output, weights or None)``; inputs are ``[L, N, E]`` or, with
    ``batch_first=True``, ``[N, L, E]``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, dtype: Any = "float32"):
        super().__init__()
        if embed_dim % num_heads:
            raise CaptureError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = Parameter(shape=(3 * embed_dim, embed_dim), init=init.xavier_uniform(), dtype=dtype)
        self.in_proj_bias = Parameter(shape=(3 * embed_dim,), init=init.zeros, dtype=dtype) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.out_proj._repr_name = "NonDynamicallyQuantizableLinear"  # torch's class for it; repr shows no arguments
        if bias:  # zeros, as PyTorch's (a new Parameter: inside a capture ``out_proj.bias`` reads as a Tensor)
            self.out_proj.bias = Parameter(shape=(embed_dim,), init=init.zeros, dtype=dtype)

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True):
        key = query if key is None else key
        value = key if value is None else value
        for t in (query, key, value):
            if t.shape is not None and (len(t.shape) != 3 or t.shape[2] != self.embed_dim):
                raise op_error("MultiheadAttention", [t], f"expects rank-3 input with {self.embed_dim} features",
                               user_source())
        if not self.batch_first:
            query, key, value = (ops.transpose(t, [1, 0, 2]) for t in (query, key, value))
        e, w, b = self.embed_dim, self.in_proj_weight, self.in_proj_bias
        out, weights = heads(query, key, value, self.num_heads, tuple(w[i * e:(i + 1) * e] for i in range(3)),
                             tuple(None if b is None else b[i * e:(i + 1) * e] for i in range(3)),
                             dropout_p=self.dropout, training=self.training, key_padding_mask=key_padding_mask,
                             attn_mask=attn_mask)
        out = self.out_proj(out)
        if not self.batch_first:
            out = ops.transpose(out, [1, 0, 2])
        if not need_weights:
            return out, None
        return out, (ops.mean(weights, axis=1) if average_attn_weights else weights)
