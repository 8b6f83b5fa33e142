"""Bilinear, CosineSimilarity and PairwiseDistance with ``torch.nn``'s arguments, parameter
names and init; the formulas are ``graphc/dsl/ops_distance.py``'s."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl.ops_distance import bilinear, cosine_similarity, pairwise_distance
from graphc.dsl.tensor import Tensor
from graphc.nn import draws
from graphc.nn.module import Module, Parameter
from graphc.nn.signatures import takes_device


@takes_device
class Bilinear(Module):
    """``y = x1^T weight x2 + bias``: ``weight [out_features, in1_features, in2_features]``,
    ``bias [out_features]``, both U(+-1/sqrt(in1_features)) as PyTorch's."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True,
                 dtype: Any = "float32"):
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        draw = draws.uniform(1.0 / math.sqrt(in1_features))
        self.weight = Parameter(shape=(out_features, in1_features, in2_features), init=draw, dtype=dtype)
        self.bias = Parameter(shape=(out_features,), init=draw, dtype=dtype) if bias else None

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class CosineSimilarity(Module):
    """``F.cosine_similarity(x1, x2, dim, eps)``."""

    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    """``F.pairwise_distance(x1, x2, p, eps, keepdim)``."""

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)
