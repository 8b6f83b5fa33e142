"""A sequence classifier over padded token batches of different lengths: embedding, the batch
packed by its lengths (fed at run time, in any order), a bidirectional 2-layer LSTM, the last
layer's final hidden states of both directions, a linear head. Padding past a sequence's length
changes nothing, as with torch's ``pack_padded_sequence``.

    graphc capture models/packed_lstm.py:PackedLSTMClassifier --input tokens:int64[N,T] \\
        --input lengths:int64[N] -o packed_lstm.onnx
"""

from __future__ import annotations

import graphc as gc
from graphc import nn
from graphc.nn.utils.rnn import pack_padded_sequence


class PackedLSTMClassifier(nn.Module):
    def __init__(self, vocab: int = 50, embed: int = 16, hidden: int = 16, classes: int = 4, num_layers: int = 2,
                 dtype: str = "float32"):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed, padding_idx=0, dtype=dtype)
        self.rnn = nn.LSTM(embed, hidden, num_layers, batch_first=True, bidirectional=True, dtype=dtype)
        self.head = nn.Linear(2 * hidden, classes, dtype=dtype)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.rnn(packed)
        return self.head(gc.cat([h_n[-2], h_n[-1]], 1))  # the last layer's forward and backward states


def example_inputs(batch: int | str = "N", length: int | str = "T") -> dict[str, gc.TensorSpec]:
    return {"tokens": gc.spec("int64", (batch, length), name="tokens"), "lengths": gc.spec("int64", (batch,))}
