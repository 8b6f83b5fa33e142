"""The dropout layers beyond ``Dropout``: channel dropout (``Dropout1d``, ``Dropout2d``,
``Dropout3d``) and alpha dropout (``AlphaDropout``, ``FeatureAlphaDropout``), the identity in
``eval()``; their functions are in ``graphc.dsl.ops_dropout``."""

from __future__ import annotations

from graphc.dsl import ops_dropout
from graphc.dsl.tensor import Tensor
from graphc.nn.module import Module


class _DropoutNd(Module):
    fn = None  # the functional form (x, p, training)

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        self.p, self.inplace = p, inplace

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(_DropoutNd):
    fn = staticmethod(ops_dropout.dropout1d)


class Dropout2d(_DropoutNd):
    fn = staticmethod(ops_dropout.dropout2d)


class Dropout3d(_DropoutNd):
    fn = staticmethod(ops_dropout.dropout3d)


class AlphaDropout(_DropoutNd):
    fn = staticmethod(ops_dropout.alpha_dropout)


class FeatureAlphaDropout(_DropoutNd):
    fn = staticmethod(ops_dropout.feature_alpha_dropout)
