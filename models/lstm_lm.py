"""An LSTM language model, as PyTorch's word_language_model example writes it: embedding,
dropout, a stacked LSTM (dropout between layers), a linear decoder over the vocabulary, the
decoder optionally tied to the embedding.

    graphc capture models/lstm_lm.py:LSTMLanguageModel --input tokens:int64[N,16] -o lm.onnx
"""

from __future__ import annotations

import graphc as gc
from graphc import nn


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int = 100, embed: int = 32, hidden: int = 32, num_layers: int = 2,
                 dropout: float = 0.2, tie_weights: bool = True):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, embed)
        self.rnn = nn.LSTM(embed, hidden, num_layers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)
        if tie_weights:
            if hidden != embed:
                raise ValueError("tie_weights needs hidden == embed")
            self.decoder.weight = self.encoder.weight

    def forward(self, tokens, state=None):
        emb = self.drop(self.encoder(tokens))
        out, _ = self.rnn(emb, state)
        return self.decoder(self.drop(out))  # [N, L, vocab]


def example_inputs(batch: int | str = "N", length: int = 16) -> dict[str, gc.TensorSpec]:
    return {"tokens": gc.spec("int64", (batch, length), name="tokens")}
