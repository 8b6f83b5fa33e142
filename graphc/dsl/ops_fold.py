"""``torch.nn.functional.unfold`` and ``fold``: sliding blocks of an image as columns
``[N, C * kh * kw, L]`` (im2col) and columns summed back into an image (col2im, unfold's adjoint),
each one ONNX Conv or ConvTranspose by a constant one-hot kernel, so the existing kernels and
gradient rules apply."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.batching import batch_of_one
from graphc.dsl.ops import constant, reshape
from graphc.dsl.ops_layers import conv_transpose2d
from graphc.dsl.ops_nn import conv2d, ints
from graphc.dsl.tensor import Tensor
from graphc.model.windows import windows

# Lowering, measured on onnxruntime 1.31 CPU (1 thread), [8, 64, 32, 32] by 3x3 pad 1, forward and
# gc.grad backward (scripts/bench_lowerings.py --only unfold; quietest of three runs, same order in
# each): unfold as a Conv grouped by channel by the one-hot kernel (its gradient one ConvTranspose)
# 7.2 ms, vs N*C one-channel images into an ungrouped Conv 17.5, vs a Pad and kh*kw strided Slices
# stacked 8.8; fold as the matching grouped ConvTranspose 5.6, vs on N*C one-channel images 7.3, vs
# each tap's block Padded into place and summed 24.0.


def _blocks(op: str, x: Tensor, size: tuple, kernel: list[int], dilation: list[int], padding: list[int],
            stride: list[int]) -> list[int]:
    """The grid of sliding blocks over a ``size`` image (each dim at least one block, as torch)."""
    if min(kernel + dilation + stride) < 1 or min(padding) < 0:
        raise op_error(op, [x], f"kernel_size {kernel}, dilation {dilation} and stride {stride} must be positive and "
                       f"padding {padding} non-negative", user_source())
    if not all(isinstance(d, int) for d in size):
        return [None, None]
    grid = [windows(n, k, s, d, p, p, 0) for n, k, d, p, s in zip(size, kernel, dilation, padding, stride)]
    if min(grid) < 1:
        raise op_error(op, [x], f"a {tuple(size)} image padded by {padding} holds {grid} blocks of kernel_size "
                       f"{kernel} at dilation {dilation}; each must be at least one", user_source())
    return grid


def _one_hot_kernel(channels: int, kernel: list[int], dtype: np.dtype) -> Tensor:
    """``[C * kh * kw, 1, kh, kw]``: channel ``c * kh * kw + i * kw + j`` is tap (i, j) of channel c
    (torch's column order)."""
    taps = math.prod(kernel)
    return constant(np.tile(np.eye(taps, dtype=dtype).reshape(taps, 1, *kernel), (channels, 1, 1, 1)))


def unfold(x: Tensor, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Tensor:
    """The sliding ``kernel_size`` blocks of ``x`` ``[N, C, H, W]`` (or ``[C, H, W]``) as columns
    ``[N, C * kh * kw, L]``, L blocks in row-major order. Signature: ai.onnx@11::Conv (one-hot kernel)"""
    return batch_of_one("Conv", x, "C, H, W", lambda x: _unfold(x, kernel_size, dilation, padding, stride))


def _unfold(x: Tensor, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> Tensor:
    channels = x.shape[1]
    if not isinstance(channels, int):
        raise op_error("Conv", [x], "unfold needs a static channel count", user_source())
    kernel, dil = ints(kernel_size, 2, "kernel_size"), ints(dilation, 2, "dilation")
    pads, strides = ints(padding, 2, "padding"), ints(stride, 2, "stride")
    _blocks("Conv", x, x.shape[2:], kernel, dil, pads, strides)
    cols = conv2d(x, _one_hot_kernel(channels, kernel, x.dtype.numpy), None, strides, pads, dil, channels)
    return reshape(cols, [x.shape[0], channels * math.prod(kernel), -1])


def fold(x: Tensor, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Tensor:
    """Columns ``[N, C * kh * kw, L]`` (or ``[C * kh * kw, L]``) summed into ``[N, C, *output_size]``
    at their blocks: ``unfold``'s adjoint (overlaps add up). Signature: ai.onnx@11::ConvTranspose (one-hot kernel)"""
    return batch_of_one("ConvTranspose", x, "C * kh * kw, L",
                        lambda x: _fold(x, output_size, kernel_size, dilation, padding, stride))


def _fold(x: Tensor, output_size: Any, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> Tensor:
    kernel, dil = ints(kernel_size, 2, "kernel_size"), ints(dilation, 2, "dilation")
    pads, strides, size = ints(padding, 2, "padding"), ints(stride, 2, "stride"), ints(output_size, 2, "output_size")
    taps, (rows, length) = math.prod(kernel), x.shape[1:]
    if not isinstance(rows, int) or rows % taps:
        raise op_error("ConvTranspose", [x], f"fold needs a static dim 1 divisible by the kernel's {taps} taps "
                       f"(kernel_size {kernel})", user_source())
    grid = _blocks("ConvTranspose", x, tuple(size), kernel, dil, pads, strides)
    if isinstance(length, int) and length != math.prod(grid):
        raise op_error("ConvTranspose", [x], f"dim 2 must be the {grid[0]} x {grid[1]} = {math.prod(grid)} blocks of "
                       f"output_size {size} (kernel_size {kernel}, dilation {dil}, padding {pads}, stride {strides})",
                       user_source())
    # the rows and columns past the last block's reach (fewer than a stride), as ConvTranspose's output_padding
    extra = [n + 2 * p - (g - 1) * s - d * (k - 1) - 1
             for n, g, k, d, p, s in zip(size, grid, kernel, dil, pads, strides)]
    channels = rows // taps
    return conv_transpose2d(reshape(x, [x.shape[0], rows, *grid]), _one_hot_kernel(channels, kernel, x.dtype.numpy),
                            None, strides, pads, extra, channels, dil)


__all__ = ["fold", "unfold"]
