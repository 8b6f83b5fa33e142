"""A transformer encoder for token sequences: embeddings, pre-norm blocks of multi-head
self-attention and a GELU MLP with residual adds, LayerNorm, mean-pooled classifier head.

    graphc capture models/transformer.py:TransformerEncoder --input tokens:int64[N,T] -o encoder.onnx   # T <= max_len
"""

from __future__ import annotations

import numpy as np

import graphc as gc
from graphc import nn


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4, dropout: float = 0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.drop1 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, dim * mlp_ratio)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(dim * mlp_ratio, dim)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x):
        h = self.norm1(x)
        attn, _ = self.attn(h, h, h, need_weights=False)
        x = x + self.drop1(attn)
        return x + self.drop2(self.fc2(self.act(self.fc1(self.norm2(x)))))


class TransformerEncoder(nn.Module):
    def __init__(self, vocab: int = 1000, max_len: int = 64, dim: int = 64, heads: int = 4, depth: int = 2,
                 classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.max_len = max_len
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.Sequential(*(EncoderBlock(dim, heads, dropout=dropout) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        length = tokens.shape[1]  # an int, or a dim name: then positions past max_len fail at run time
        if isinstance(length, int) and length > self.max_len:
            raise gc.GraphError(f"TransformerEncoder's sequence length is at most {self.max_len}, "
                                f"got {tokens.type_str()}")
        # a static length's positions a constant (the Embedding's own, as before), a dim name's read at run time
        positions = np.arange(length, dtype=np.int64) if isinstance(length, int) else gc.arange(length)
        x = self.tok(tokens) + self.pos(positions)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(axis=1))


def example_inputs(batch: int | str = "N", length: int = 16) -> dict[str, gc.TensorSpec]:
    return {"tokens": gc.spec("int64", (batch, length), name="tokens")}
