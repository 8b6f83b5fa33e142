"""A Conv's column matrix built by one Gather, and a dense Conv as that matrix times its weight.

The input is laid out batch-innermost, [C, P, N] (P its pixels; a Conv with pads adds one zero
row, which the taps that read the padding take), so each (kernel tap, output pixel) pair reads
one row of N values at a constant flat position (pads, strides and dilations folded into the
index): the columns come out [C * K, O * N], as one GEMM reads them, in a single pass. The
weight gradient (``rules_nn._conv_weight_grad_gathered``) multiplies them by dy; the CPU training
graphs also take some forward Convs and their input gradients as them times the weight
(``gathered_conv``), where onnxruntime's Conv runs one small GEMM per image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter

__all__ = ["batch_innermost", "columns", "gather", "gathered_conv"]


def _index(kernel, out, strides, dilations, spatial, begin, flip: bool) -> np.ndarray:
    """[K, O]: the flat unpadded position that tap k of output pixel o reads (row-major both; the
    taps in reverse order with ``flip``), or P, the zero row ``batch_innermost`` adds, where it
    reads the padding."""
    n_sp = len(kernel)
    grid = lambda dims: np.indices(dims).reshape(n_sp, -1).T  # row-major positions, [count, n_sp]
    taps = grid(kernel)[::-1] if flip else grid(kernel)
    at = (grid(out) * strides)[None] + (taps * dilations)[:, None] - np.array(begin)  # [K, O, n_sp]
    inside = ((at >= 0) & (at < np.array(spatial))).all(axis=-1)
    pitch = np.array([math.prod(spatial[i + 1:]) for i in range(n_sp)])
    return np.where(inside, at @ pitch, math.prod(spatial)).astype(np.int32)


def batch_innermost(e: Emitter, x: ir.Value, channels: int, spatial: Sequence[int], begin: Sequence[int],
                    end: Sequence[int]) -> ir.Value:
    """``x`` [N, C, *spatial] laid out batch-innermost as [C, P, N], P its pixels, and where the Conv
    has pads one zero row after them, [C, P + 1, N], which every tap that reads the padding
    gathers: what ``gather`` reads a Conv's columns from (a run of whole channels of it too).
    The zero row in place of the padded grid ([C, *padded, N]): the same Gather, its Pad a
    third of the time in the step's profile (1 thread, fastest of 6 interleaved profiles, ms:
    ResNet-18 at batch 32, 64 px, its 3x3 convs' dW Pads 1.10 -> 0.46, the stride-2 ones' 0.19 ->
    0.08; ResNet-50 1.01 -> 0.42 and 0.35 -> 0.15; the dW alone, ``bench_lowerings.py --only
    dense_dw``, 2-5 % less CPU time). Padding x in NCHW before the Transpose was no faster."""
    n_sp = len(spatial)
    xt = e.op("Transpose", x, perm=[*range(1, 2 + n_sp), 0])  # [C, *S, N]
    rows = e.op("Reshape", xt, e.ints([channels, math.prod(spatial), -1]))
    if any([*begin, *end]):
        rows = e.op("Pad", rows, e.ints([0, 0, 0, 0, 1, 0]))
    return rows


def gather(e: Emitter, rows: ir.Value, channels: int, spatial: Sequence[int], kernel: Sequence[int],
           out: Sequence[int], strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
           flip: bool = False) -> ir.Value:
    """The columns [C * K, O * N] of ``channels`` channels laid out by ``batch_innermost``: row
    (c, k) holds what tap k reads at every output pixel o of every image n (n innermost).
    ``flip``: tap k in row K-1-k, as a Conv by the weight flipped in space reads them."""
    index = e.const(_index(list(kernel), list(out), list(strides), list(dilations), list(spatial), list(begin), flip))
    cols = e.op("Gather", rows, index, axis=1)  # [C, K, O, N]
    return e.op("Reshape", cols, e.ints([channels * math.prod(kernel), -1]))


def columns(e: Emitter, x: ir.Value, channels: int, spatial: Sequence[int], kernel: Sequence[int],
            out: Sequence[int], strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
            end: Sequence[int], flip: bool = False) -> ir.Value:
    """The columns of ``x`` [N, C, *spatial] for a Conv of this geometry: [C * K, O * N]
    (``gather`` of ``batch_innermost``)."""
    rows = batch_innermost(e, x, channels, spatial, begin, end)
    return gather(e, rows, channels, spatial, kernel, out, strides, dilations, begin, flip)


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
