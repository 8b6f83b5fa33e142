"""``Unfold`` and ``Fold`` with ``torch.nn``'s arguments (im2col and col2im, ``F.unfold``/``F.fold``)."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops_fold
from graphc.dsl.tensor import Tensor
from graphc.nn.module import Module


class Unfold(Module):
    """Sliding blocks of ``[N, C, H, W]`` as columns ``[N, C * kh * kw, L]``."""

    def __init__(self, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1):
        super().__init__()
        self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride

    def forward(self, x: Tensor) -> Tensor:
        return ops_fold.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, "
                f"stride={self.stride}")


class Fold(Module):
    """Columns ``[N, C * kh * kw, L]`` summed into ``[N, C, *output_size]`` at their blocks."""

    def __init__(self, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, x: Tensor) -> Tensor:
        return ops_fold.fold(x, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")
