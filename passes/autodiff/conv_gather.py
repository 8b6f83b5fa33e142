"""A Conv's column matrix built by one Gather, and a dense Conv as that matrix times its weight.

The input is laid out batch-innermost and padded, [C, P, N] (P its padded pixels), so each
(kernel tap, output pixel) pair reads one row of N values at a constant flat position (strides
and dilations folded into the index): the columns come out [C * K, O * N], as one GEMM reads
them, in a single pass. The weight gradient (``rules_nn._conv_weight_grad_gathered``) multiplies
them by dy; the CPU training graphs also take some forward Convs and their input gradients as
them times the weight (``gathered_conv``), where onnxruntime's Conv runs one small GEMM per image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter

__all__ = ["batch_innermost", "columns", "gather", "gathered_conv"]


def _index(kernel, out, strides, dilations, padded, flip: bool) -> np.ndarray:
    """[K, O]: the flat padded position that tap k of output pixel o reads (row-major both; the
    taps in reverse order with ``flip``)."""
    n_sp = len(kernel)
    grid = lambda dims: np.indices(dims).reshape(n_sp, -1).T  # row-major positions, [count, n_sp]
    pitch = np.array([math.prod(padded[i + 1:]) for i in range(n_sp)])
    taps = grid(kernel)[::-1] if flip else grid(kernel)
    return (((grid(out) * strides)[None] + (taps * dilations)[:, None]) @ pitch).astype(np.int32)


def batch_innermost(e: Emitter, x: ir.Value, channels: int, spatial: Sequence[int], begin: Sequence[int],
                    end: Sequence[int]) -> ir.Value:
    """``x`` [N, C, *spatial] padded and laid out batch-innermost as [C, P, N], P its padded pixels:
    what ``gather`` reads a Conv's columns from (a run of whole channels of it too)."""
    n_sp = len(spatial)
    xt = e.op("Transpose", x, perm=[*range(1, 2 + n_sp), 0])  # [C, *S, N]
    if any([*begin, *end]):
        xt = e.op("Pad", xt, e.ints([0, *begin, 0, 0, *end, 0]))
    padded = [d + b + a for d, b, a in zip(spatial, begin, end)]
    return e.op("Reshape", xt, e.ints([channels, math.prod(padded), -1]))


def gather(e: Emitter, rows: ir.Value, channels: int, spatial: Sequence[int], kernel: Sequence[int],
           out: Sequence[int], strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
           end: Sequence[int], flip: bool = False) -> ir.Value:
    """The columns [C * K, O * N] of ``channels`` channels laid out by ``batch_innermost``: row
    (c, k) holds what tap k reads at every output pixel o of every image n (n innermost).
    ``flip``: tap k in row K-1-k, as a Conv by the weight flipped in space reads them."""
    padded = [d + b + a for d, b, a in zip(spatial, begin, end)]
    index = e.const(_index(list(kernel), list(out), list(strides), list(dilations), padded, flip))
    cols = e.op("Gather", rows, index, axis=1)  # [C, K, O, N]
    return e.op("Reshape", cols, e.ints([channels * math.prod(kernel), -1]))


def columns(e: Emitter, x: ir.Value, channels: int, spatial: Sequence[int], kernel: Sequence[int],
            out: Sequence[int], strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
            end: Sequence[int], flip: bool = False) -> ir.Value:
    """The columns of ``x`` [N, C, *spatial] for a Conv of this geometry: [C * K, O * N]
    (``gather`` of ``batch_innermost``)."""
    rows = batch_innermost(e, x, channels, spatial, begin, end)
    return gather(e, rows, channels, spatial, kernel, out, strides, dilations, begin, end, flip)


def gathered_conv(e: Emitter, x: ir.Value, weight: ir.Value, out_channels: int, in_channels: int,
                  spatial: Sequence[int], kernel: Sequence[int], out: Sequence[int], dilations: Sequence[int],
                  begin: Sequence[int], end: Sequence[int], bias: ir.Value | None = None,
                  flip: bool = False) -> ir.Value:
    """A dense stride-1 Conv of ``x`` [N, Ci, *spatial] as ``weight`` [Co, Ci * K] times its
    columns, one Gemm (the bias as its C, per row), the product [Co, O * N] turned back to
    [N, Co, *out]. ``flip``: by the weight flipped in space (the columns' taps reversed)."""
    n_sp = len(spatial)
    cols = columns(e, x, in_channels, spatial, kernel, out, [1] * n_sp, dilations, begin, end, flip)
    c = [e.op("Reshape", bias, e.ints([out_channels, 1]))] if bias is not None else []
    y = e.op("Gemm", weight, cols, *c)  # [Co, O * N]
    y = e.op("Transpose", e.op("Reshape", y, e.ints([out_channels, math.prod(out), -1])), perm=[2, 0, 1])
    return e.op("Reshape", y, e.ints([-1, out_channels, *out]))
