"""A small GPT (nanoGPT's layout): token and position embeddings, pre-norm blocks of causal
self-attention (``scaled_dot_product_attention(is_causal=True)``) and a GELU MLP, a final
LayerNorm and an LM head tied to the token embedding.

    graphc capture models/gpt.py:GPT --input idx:int64[N,T] -o gpt.onnx   # T: any length up to block_size
"""

from __future__ import annotations

import graphc as gc
import graphc.nn.functional as F
from graphc import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x):
        B, T, C = x.shape  # noqa: N806 - nanoGPT's names
        q, k, v = gc.split(self.c_attn(x), self.n_embd, dim=2)
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True, training=self.training)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int = 100, block_size: int = 32, n_layer: int = 2, n_head: int = 4,
                 n_embd: int = 32, dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: one parameter, two uses
        for _, module in self.named_modules():  # GPT-2's init: N(0, 0.02) weights, zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx):
        t = idx.shape[1]  # an int, or a dim name: then positions past block_size fail at run time
        if isinstance(t, int) and t > self.block_size:
            raise gc.GraphError(f"GPT's sequence length is at most {self.block_size}, got {idx.type_str()}")
        x = self.drop(self.wte(idx) + self.wpe(gc.arange(t)))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # [N, T, vocab]


def example_inputs(batch: int | str = "N", length: int = 16) -> dict[str, gc.TensorSpec]:
    return {"idx": gc.spec("int64", (batch, length), name="idx")}
