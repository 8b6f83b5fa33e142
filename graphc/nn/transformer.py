"""TransformerEncoderLayer and TransformerDecoderLayer (and their stacks TransformerEncoder and
TransformerDecoder, and the encoder-decoder Transformer) with ``torch.nn``'s arguments, sub-module
names (``self_attn``, ``linear1``, ``norm1``, ...), post- or pre-norm (``norm_first``), masks and
causal attention."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_attention import causal_mask
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import as_dtype, to_numpy
from graphc.nn import draws
from graphc.nn.attention import MultiheadAttention
from graphc.nn.containers import ModuleList
from graphc.nn.layers import Dropout, LayerNorm, Linear
from graphc.nn.module import Module
from graphc.nn.signatures import takes_device

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": ops.relu, "gelu": ops.gelu}


def _activation(activation: Any) -> Callable[[Tensor], Tensor]:
    if callable(activation):
        return activation
    if activation not in _ACTIVATIONS:
        raise CaptureError(f"activation {activation!r}; expected 'relu', 'gelu' or a callable")
    return _ACTIVATIONS[activation]


def _with_causal(x: Tensor, mask: Tensor | None, is_causal: bool, batch_first: bool) -> Tensor | None:
    """``mask`` with the causal mask added (MultiheadAttention's bool masks are true where a key
    is hidden, float masks are added to the scores)."""
    if not is_causal:
        return mask
    dim = -2 if batch_first else 0
    hidden = ~causal_mask(x, x, dim)
    if mask is None:
        return hidden
    if mask.dtype == "bool":
        return hidden | mask
    return ops.where(hidden, ops.scalar(float("-inf"), mask), mask)


class _TransformerLayer(Module):
    """What both layers share, registered in PyTorch's order: ``self_attn``, (``multihead_attn``),
    ``linear1``, ``dropout``, ``linear2``, ``norm1``..., ``dropout1``..., then ``activation`` when it is
    a module; one norm and one dropout per residual block (two in the encoder, three in the decoder)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, activation: Any,
                 layer_norm_eps: float, batch_first: bool, norm_first: bool, bias: bool, dtype: Any, blocks: int):
        super().__init__()
        attention = [MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                        dtype=dtype) for _ in range(blocks - 1)]
        self.self_attn = attention[0]
        if blocks == 3:
            self.multihead_attn = attention[1]
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        for i in range(1, blocks + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        for i in range(1, blocks + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation)
        self.blocks = blocks

    def _ff_block(self, x: Tensor) -> Tensor:
        last = getattr(self, f"dropout{self.blocks}")
        return last(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def _sa_block(self, x: Tensor, mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool) -> Tensor:
        mask = _with_causal(x, mask, is_causal, self.self_attn.batch_first)
        return self.dropout1(self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=key_padding_mask,
                                            need_weights=False)[0])


@takes_device
class TransformerEncoderLayer(_TransformerLayer):
    """``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``; with
    ``is_causal`` and no ``src_mask`` the causal mask is built in the graph."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Any = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype: Any = "float32"):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, dtype, blocks=2)

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


@takes_device
class TransformerDecoderLayer(_TransformerLayer):
    """``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)``."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Any = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype: Any = "float32"):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, dtype, blocks=3)

    def _mha_block(self, x: Tensor, mem: Tensor, mask: Tensor | None, key_padding_mask: Tensor | None,
                   is_causal: bool) -> Tensor:
        if is_causal and mask is None:
            raise CaptureError("memory_is_causal needs memory_mask (as in PyTorch, it is only a hint)")
        return self.dropout2(self.multihead_attn(x, mem, mem, attn_mask=mask, key_padding_mask=key_padding_mask,
                                                 need_weights=False)[0])

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff_block(x))


class _Stack(Module):
    """``num_layers`` copies of ``layer`` (``layers.0``, ``layers.1``, ...; each a deep copy, so
    each draws its own parameters), then ``norm`` if given."""

    def __init__(self, layer: Module, num_layers: int, norm: Module | None = None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def _finish(self, x: Tensor) -> Tensor:
        return x if self.norm is None else self.norm(x)


class TransformerEncoder(_Stack):
    """``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)``. ``enable_nested_tensor``
    and ``mask_check`` are torch's fast-path hints, taken and without effect here."""

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__(encoder_layer, num_layers, norm)

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        for layer in self.layers:
            src = layer(src, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return self._finish(src)


class TransformerDecoder(_Stack):
    """``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)``."""

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None):
        super().__init__(decoder_layer, num_layers, norm)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        for layer in self.layers:
            tgt = layer(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                        bool(tgt_is_causal), memory_is_causal)
        return self._finish(tgt)


@takes_device
class Transformer(Module):
    """``torch.nn.Transformer``: ``encoder`` (a ``TransformerEncoder`` of ``num_encoder_layers``
    layers and a final ``LayerNorm``) and ``decoder`` (likewise), or ``custom_encoder`` /
    ``custom_decoder``. As PyTorch, every parameter of rank 2 or more starts xavier-uniform.
    ``forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
    memory_is_causal=False)`` returns the decoder's output."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation: Any = "relu",
                 custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 dtype: Any = "float32"):
        super().__init__()
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                      bias, dtype)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(*layer_args), num_encoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(*layer_args), num_decoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        for p in self.parameters():
            if len(p.shape) > 1:
                p.init = draws.xavier_uniform()
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        src, tgt = ops.lift(src), ops.lift(tgt)
        self._check(src, tgt)
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    def _check(self, src: Tensor, tgt: Tensor) -> None:
        """PyTorch's checks: batched ``src`` and ``tgt`` of one batch size, both ``d_model`` features."""
        if src.shape is None or tgt.shape is None:
            return
        if len(src.shape) == 3 and len(tgt.shape) == 3:
            batch = 0 if self.batch_first else 1
            ops.same_dim("Transformer", [src, tgt], src.shape[batch], tgt.shape[batch], "src and tgt batch sizes")
        for name, t in (("src", src), ("tgt", tgt)):
            if t.shape[-1] != self.d_model:
                raise op_error("Transformer", [src, tgt], f"the feature number of {name} ({t.shape[-1]}) must "
                               f"equal d_model ({self.d_model})", user_source())

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> np.ndarray:
        """``[sz, sz]``: ``-inf`` above the diagonal, 0 elsewhere (a float attention mask, float32
        unless ``dtype``); ``device`` is accepted for torch's signature (a graph runs where its
        session does)."""
        return np.triu(np.full((sz, sz), -np.inf, dtype=to_numpy(as_dtype(dtype or "float32"))), 1)
