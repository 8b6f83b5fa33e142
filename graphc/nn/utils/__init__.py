"""``gc.nn.utils``: torch.nn.utils's helpers for writing models (``rnn``: padding and packing)."""

from graphc.nn.utils import rnn

__all__ = ["rnn"]
