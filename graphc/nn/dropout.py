"""The dropout layers beyond ``Dropout``: channel dropout (``Dropout1d``, ``Dropout2d``,
``Dropout3d``) and alpha dropout (``AlphaDropout``, ``FeatureAlphaDropout``), the identity in
``eval()``; their functions are in ``graphc.dsl.ops_dropout``. ``inplace=True`` writes the result
into the input and returns it, as torch's (``graphc.dsl.inplace``)."""

from __future__ import annotations

from graphc.dsl import ops_dropout
from graphc.dsl.tensor import Tensor
from graphc.nn.module import Module


class DropoutLayer(Module):
    """A dropout layer ``(p=0.5, inplace=False)`` calling ``fn``; its repr is torch's."""

    fn = None  # the functional form (x, p, training, inplace)

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        self.p, self.inplace = p, inplace

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(DropoutLayer):
    fn = staticmethod(ops_dropout.dropout1d)


class Dropout2d(DropoutLayer):
    fn = staticmethod(ops_dropout.dropout2d)


class Dropout3d(DropoutLayer):
    fn = staticmethod(ops_dropout.dropout3d)


class AlphaDropout(DropoutLayer):
    fn = staticmethod(ops_dropout.alpha_dropout)


class FeatureAlphaDropout(DropoutLayer):
    fn = staticmethod(ops_dropout.feature_alpha_dropout)
