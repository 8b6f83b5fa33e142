"""``gc.nn.attention``, as ``torch.nn.attention``: ``MultiheadAttention`` (also ``gc.nn.MultiheadAttention``)
and the ``flex_attention`` module (``flex_attention``, ``create_block_mask``, ``create_mask``, ``BlockMask``,
``and_masks``, ``or_masks``, ``noop_mask``)."""

from graphc.nn.attention import flex_attention
from graphc.nn.attention.multihead import MultiheadAttention

__all__ = ["MultiheadAttention", "flex_attention"]
