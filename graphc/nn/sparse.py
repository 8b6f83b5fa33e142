"""EmbeddingBag with ``torch.nn``'s arguments, parameter name and init; the formula is
``graphc/dsl/ops_embedding.py``'s ``embedding_bag``."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.ops_embedding import MODES, embedding_bag
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn import draws
from graphc.nn.module import Module, Parameter
from graphc.nn.reprs import not_default
from graphc.nn.signatures import takes_device


def padding_row_init(layer: str, num_embeddings: int, padding_idx: int | None) -> tuple[int | None, draws.Init]:
    """``padding_idx`` made non-negative (refused outside ``[-num_embeddings, num_embeddings)``) and
    PyTorch's embedding init: N(0, 1) with the padding row zeroed."""
    if padding_idx is not None:
        if not -num_embeddings <= padding_idx < num_embeddings:
            raise CaptureError(f"{layer} padding_idx {padding_idx} is outside [-{num_embeddings}, {num_embeddings})")
        padding_idx %= num_embeddings
    normal = draws.normal()

    def draw(rng, shape, dt):
        w = normal(rng, shape, dt)
        if padding_idx is not None:
            w[padding_idx] = 0
        return w
    return padding_idx, draw


def embedding_weight(layer: str, shape: tuple[int, int], draw: draws.Init, weight: Any, dtype: Any) -> Parameter:
    """An embedding layer's ``weight``: drawn by ``draw`` (``padding_row_init``'s), or torch's ``_weight`` (an
    array, ``gc.Tensor`` or Parameter, refused unless ``[num_embeddings, embedding_dim]``) in its dtype, a float64
    array's float32 unless ``dtype`` says (``Parameter``'s rule)."""
    if weight is None:
        return Parameter(shape=shape, init=draw, dtype=dtype)
    if _shape(weight) != shape:
        raise CaptureError(f"{layer} _weight: expected shape {list(shape)} ([num_embeddings, embedding_dim]), "
                           f"got {list(_shape(weight))}")
    return Parameter(weight, dtype=dtype)


def _shape(value: Any) -> tuple[int, ...]:
    """The shape of an array, nested list, ``gc.Tensor`` (which ``np.shape`` refuses) or Parameter."""
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def pretrained(cls: type, embeddings: Any, freeze: bool, **kwargs: Any) -> Module:
    """``cls.from_pretrained``: the 2-D ``embeddings`` as the weight, its dtype kept, frozen
    (``requires_grad=False``, as torch's: every read of ``weight`` gets no gradient) when ``freeze``."""
    shape = _shape(embeddings)
    if len(shape) != 2:
        raise CaptureError(f"{cls.__name__}.from_pretrained embeddings: expected a 2-D array, got shape {list(shape)}")
    module = cls(*shape, _weight=embeddings, dtype=np.asarray(embeddings).dtype.name, **kwargs)
    module.weight.requires_grad_(not freeze)
    return module


@takes_device
class EmbeddingBag(Module):
    """``weight [num_embeddings, embedding_dim]`` drawn from N(0, 1) (the ``padding_idx`` row zero);
    ``forward(input, offsets=None, per_sample_weights=None)`` is ``F.embedding_bag`` with the
    module's ``max_norm`` (the rows looked up renormalised in place, as ``Embedding``'s), ``norm_type``,
    ``scale_grad_by_freq``, ``mode``, ``include_last_offset`` and ``padding_idx``. ``_weight`` is
    ``Embedding``'s."""

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: float | None = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                 _weight: Any = None, include_last_offset: bool = False, padding_idx: int | None = None,
                 dtype: Any = None):
        super().__init__()
        if mode not in MODES:
            raise CaptureError(f"EmbeddingBag mode={mode!r}; expected 'sum', 'mean' or 'max'")
        padding_idx, draw = padding_row_init("EmbeddingBag", num_embeddings, padding_idx)
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        self.sparse, self.include_last_offset, self.padding_idx = sparse, include_last_offset, padding_idx
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, scale_grad_by_freq
        self.weight = embedding_weight("EmbeddingBag", (num_embeddings, embedding_dim), draw, _weight, dtype)

    @classmethod
    def from_pretrained(cls, embeddings: Any, freeze: bool = True, max_norm: float | None = None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean",
                        sparse: bool = False, include_last_offset: bool = False,
                        padding_idx: int | None = None) -> "EmbeddingBag":
        """``torch.nn.EmbeddingBag.from_pretrained`` (``pretrained``)."""
        return pretrained(cls, embeddings, freeze, max_norm=max_norm, norm_type=norm_type,
                          scale_grad_by_freq=scale_grad_by_freq, mode=mode, sparse=sparse,
                          include_last_offset=include_last_offset, padding_idx=padding_idx)

    def forward(self, input: Tensor, offsets: Any = None, per_sample_weights: Any = None) -> Tensor:  # noqa: A002
        return embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq,
                             mode=self.mode, sparse=self.sparse,
                             per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset,
                             padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        return ", ".join([f"{self.num_embeddings}, {self.embedding_dim}",
                          *not_default(self, max_norm=None, norm_type=2, scale_grad_by_freq=False),
                          f"mode={self.mode!r}", *not_default(self, padding_idx=None)])
