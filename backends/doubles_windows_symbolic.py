"""The windows of ``doubles_windows`` where a float64 Conv's, ConvTranspose's or pool's spatial dims are symbolic:
the same zero Pad and one strided Slice a tap, with the pads, output dims, starts and ends computed at run time
from the input's Shape (int64 vectors over the spatial axes, as ``backends/numpy/conv.geometry`` computes them),
so that one session runs every size.

Against the static form on the same sizes (ort-cpu, 2 threads, 100 runs interleaved on 2 cores loaded ~5 by
other jobs; best / median, two runs): Conv 16 to 32 channels, 3x3, pads 1, batch 8, 32x32: 1.78 / 14.6 and 1.90 /
21.6 ms against 1.78 / 14.6 and 2.13 / 19.6 static; ConvTranspose 32 to 16 channels, stride 2, pads 1,
output_padding 1, 16x16: 8.95 / 20.8 and 6.59 / 24.8 against 3.33 / 21.1 and 9.93 / 24.8; AveragePool 3x3, stride
2, ceil mode, 16 channels: 0.53 / 0.65 and 0.52 / 0.60 against 0.50 / 0.61 and 0.49 / 0.56 (its counts: the same
taps over a [1, 1, H, W] mask of ones). The Shape arithmetic is a few int64 ops on [2] vectors: equal within the
noise, the pools' run-time counts ~5%; static dims keep the static form.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, numpy_helper

from graphc.backends.written_out import Writer

__all__ = ["counts", "geometry", "spatial", "spread", "taps"]


def _ints(w: Writer, values) -> str:
    return w.const(values, np.int64)


def _max0(w: Writer, v: str) -> str:
    """max(v, 0) of an int64 ``v`` (Max has no int64 kernel before opset 12)."""
    zero = _ints(w, 0)
    return w.op("Where", w.op("Less", v, zero), zero, v)


def _pads(w: Writer, begin: str, end: str) -> str:
    """A Pad's pads of an ``[N, C, *spatial]`` value: none on the batch and channels."""
    return w.op("Concat", _ints(w, [0, 0]), begin, _ints(w, [0, 0]), end, axis=0)


def spatial(w: Writer, x: str, n: int) -> str:
    """``x``'s ``n`` spatial dims, ``[n]`` int64."""
    return w.op("Slice", w.op("Shape", x), _ints(w, [2]), _ints(w, [2 + n]))


def geometry(w: Writer, size: str, kernel: list[int], strides: list[int], dilations: list[int], pads, auto_pad: str,
             ceil_mode: int = 0) -> tuple[str, str, str]:
    """(pads begin, pads end, output dims) over the run-time spatial dims ``size``, each ``[n]`` int64."""
    n = len(kernel)
    s, one = _ints(w, strides), _ints(w, 1)
    eff = _ints(w, [(k - 1) * d + 1 for k, d in zip(kernel, dilations)])
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = w.op("Div", w.op("Add", size, w.op("Sub", s, one)), s)
        total = _max0(w, w.op("Sub", w.op("Add", w.op("Mul", w.op("Sub", out, one), s), eff), size))
        small = w.op("Div", total, _ints(w, 2))
        big = w.op("Sub", total, small)
        return (small, big, out) if auto_pad == "SAME_UPPER" else (big, small, out)
    pads = [0] * (2 * n) if auto_pad == "VALID" or not pads else list(pads)
    begin, end = _ints(w, pads[:n]), _ints(w, pads[n:])
    span = w.op("Sub", w.op("Add", size, _ints(w, [b + e for b, e in zip(pads[:n], pads[n:])])), eff)
    if not ceil_mode:
        return begin, end, w.op("Add", w.op("Div", span, s), one)
    out = w.op("Add", w.op("Div", w.op("Add", span, w.op("Sub", s, one)), s), one)
    # the last window would start in the end padding: one fewer
    late = w.op("Not", w.op("Less", w.op("Mul", w.op("Sub", out, one), s), w.op("Add", size, begin)))
    return begin, end, w.op("Sub", out, w.op("Cast", late, to=TensorProto.INT64))


def spread(w: Writer, x: str, n: int, strides: list[int]) -> str:
    """``x`` ``[N, C, *S]`` as ``[N, C, S1, s1, S2, s2, ...]``, ``stride - 1`` zeros after each element."""
    axes = [3 + 2 * i for i in range(n)]
    grown = w.op("Unsqueeze", x, _ints(w, axes)) if w.opset >= 13 else w.op("Unsqueeze", x, axes=axes)
    widths = [0] * (2 + 2 * n) * 2
    for i, s in enumerate(strides):
        widths[2 + 2 * n + 3 + 2 * i] = s - 1
    if w.opset >= 11:
        return w.op("Pad", grown, _ints(w, widths), w.const(0.0, np.float64))
    return w.op("Pad", grown, pads=widths, value=0.0)


def taps(w: Writer, x: str, size: str, out: str, kernel: list[int], strides: list[int], dilations: list[int],
         begin: str, transposed: bool = False) -> list[str]:
    """``x`` (of spatial dims ``size``) under each tap of the kernel (row-major) at the ``out`` positions,
    ``[N, C, *out]`` each: ``x`` zero-padded by ``begin`` (cropped where it is negative) and as far as the last
    window reaches, one strided Slice a tap; ``transposed``: the kernel flipped."""
    one, s = _ints(w, 1), _ints(w, strides)
    span = w.op("Add", w.op("Mul", w.op("Sub", out, one), s), one)  # (out - 1) stride + 1
    reach = w.op("Add", span, _ints(w, [(k - 1) * d for k, d in zip(kernel, dilations)]))
    padded = w.op("Pad", x, _pads(w, _max0(w, begin), _max0(w, w.op("Sub", w.op("Sub", reach, size), begin))),
                  w.const(0.0, np.float64))
    low = _max0(w, w.op("Neg", begin))
    axes = _ints(w, list(range(2, 2 + len(kernel))))
    result = []
    for tap in np.ndindex(*kernel):
        start = w.op("Add", low, _ints(w, [((k - 1 - t) if transposed else t) * d
                                           for k, t, d in zip(kernel, tap, dilations)]))
        result.append(w.op("Slice", padded, start, w.op("Add", start, span), axes, s))
    return result


def counts(w: Writer, size: str, geometry_: tuple[str, str, str], kernel: list[int], strides: list[int],
           dilations: list[int], include_pad: bool) -> str:
    """An AveragePool's counts of taps inside the input (and pads, with ``include_pad``; never ceil mode's
    overhang), ``[1, 1, *out]``: the window sums of a mask of ones."""
    begin, end, out = geometry_
    one = numpy_helper.from_array(np.ones(1))
    mask = w.op("ConstantOfShape", w.op("Concat", _ints(w, [1, 1]), size, axis=0), value=one)
    if include_pad:
        mask = w.op("Pad", mask, _pads(w, begin, end), w.const(1.0, np.float64))
        size, begin = w.op("Add", size, w.op("Add", begin, end)), _ints(w, [0] * len(kernel))
    return w.op("Sum", *taps(w, mask, size, out, kernel, strides, dilations, begin))
