"""Double-precision Conv, ConvTranspose, AveragePool, LpPool and the global pools written out for onnxruntime,
in a session's copy of a model (``doubles.lower_double`` runs them).

onnxruntime 1.31's CPU provider has no double kernel for these ("Could not find an implementation for
Conv(11)"). Each is written out from ops it has double kernels for, exactly (no float32 round trip):

- the windows: the input zero-padded (a Pad) as far as its windows reach and one strided Slice a tap of the
  kernel, ``[N, C, *out]`` each (an im2col); a ConvTranspose's are those of a stride-1 Conv by the flipped
  kernel over its input spread by the strides (zeros between the elements: Unsqueeze, Pad, Reshape), with
  pads ``dilation (kernel - 1) - pad``;
- Conv and ConvTranspose: the taps stacked (Unsqueeze, Concat) as ``[N, groups, in / groups * taps,
  positions]``, and one MatMul of the weights, ``[groups, out / groups, in / groups * taps]``, by them, then the
  bias;
- AveragePool: the Sum of the taps over a constant count per position (the taps inside the input, or inside
  input and pads with ``count_include_pad``, never those of ceil mode's overhang); LpPool: ``(sum |x|^p)^(1/p)``
  (``p = 2`` as Sqrt of a sum of squares); GlobalAveragePool, GlobalMaxPool, GlobalLpPool: reductions over the
  spatial axes.

Slices against one Gather of constant indices from the flattened input (a zero appended for the pads), 3x3,
pads 1, batch 8, 32x32, 2 threads, 40 runs interleaved on a loaded machine: Conv 16 to 32 channels 1.82 ms
against 2.56 ms at best (medians 12.5 and 17.5 ms), ConvTranspose 32 to 16 channels 4.23 against 10.2 ms
(16.8 and 27.8 ms). Symbolic spatial dims take the same windows sized at run time (``doubles_windows_symbolic``,
opset 11 on); the weight shapes must be static (one channel dim may be symbolic), else ``BackendError``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from graphc.backends import doubles_windows_symbolic as symbolic
from graphc.backends.numpy.conv import geometry
from graphc.backends.written_out import Writer
from graphc.errors import BackendError
from graphc.model import node_label, node_source

__all__ = ["LOWERINGS"]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _refuse(node: onnx.NodeProto, why: str) -> BackendError:
    at = f" at {node_source(node)}" if node_source(node) else ""
    return BackendError(f"onnxruntime has no double kernel for {node.op_type} and graphc writes it out only for "
                        f"{why}: {node_label(node.name)}{at}; give it static sizes or run it in float32")


def _static(node: onnx.NodeProto, types: dict, name: str, what: str) -> list[int]:
    dims = types.get(name, (None, None))[1]
    if dims is None or len(dims) < 3 or not all(isinstance(d, int) for d in dims[2:]):
        raise _refuse(node, f"{what} known before the run ({name!r} has shape "
                            f"{dims if dims is not None else 'unknown'})")
    return list(dims)


def _spatial(w: Writer, node: onnx.NodeProto, types: dict) -> tuple[list[int], str | None]:
    """The input's spatial dims (None where symbolic), and where one is, its ``[n]`` run-time spatial dims."""
    dims = types.get(node.input[0], (None, None))[1]
    if dims is None or len(dims) < 3:
        raise _refuse(node, f"an input of known rank ({node.input[0]!r} has shape "
                            f"{dims if dims is not None else 'unknown'})")
    spatial = [d if isinstance(d, int) else None for d in dims[2:]]
    if all(d is not None for d in spatial):
        return spatial, None
    if w.opset < 11:
        raise _refuse(node, f"spatial dims known before the run below opset 11 ({node.input[0]!r} has shape "
                            f"{list(dims)}, the model opset {w.opset})")
    return spatial, symbolic.spatial(w, node.input[0], len(spatial))


def _reduce(w: Writer, op: str, v: str, axes: list[int], keepdims: int, output: str | None = None) -> str:
    """``op`` (a Reduce*) over ``axes``, the axes an input from opset 13 (ReduceSum) or 18 (the others)."""
    if w.opset >= (13 if op == "ReduceSum" else 18):
        return w.op(op, v, w.const(axes, np.int64), keepdims=keepdims, output=output)
    return w.op(op, v, axes=axes, keepdims=keepdims, output=output)


def _pad(w: Writer, x: str, begin: list[int], end: list[int]) -> str:
    """``x`` zero-padded by ``begin`` and ``end`` along its spatial axes."""
    if not any(begin + end):
        return x
    widths = [0, 0, *begin, 0, 0, *end]
    if w.opset >= 11:
        return w.op("Pad", x, w.const(widths, np.int64), w.const(0.0, np.float64))
    return w.op("Pad", x, pads=widths, value=0.0)


def _unsqueeze(w: Writer, x: str, axes: list[int]) -> str:
    return w.op("Unsqueeze", x, w.const(axes, np.int64)) if w.opset >= 13 else w.op("Unsqueeze", x, axes=axes)


def _dilated(w: Writer, x: str, spatial: list[int] | str, strides: list[int]) -> tuple[str, list[int] | str]:
    """``x`` with ``stride - 1`` zeros after each element along each spatial axis, and its spatial dims (a
    run-time ``[n]`` int64 where ``spatial`` is)."""
    if all(s == 1 for s in strides):
        return x, spatial
    spread = symbolic.spread(w, x, len(strides), strides)
    if isinstance(spatial, str):
        grown = w.op("Mul", spatial, w.const(strides, np.int64))
        return w.op("Reshape", spread, w.op("Concat", w.const([0, 0], np.int64), grown, axis=0)), grown
    grown = [d * s for d, s in zip(spatial, strides)]
    return w.op("Reshape", spread, w.const([0, 0, *grown], np.int64)), grown


def _taps(w: Writer, x: str, spatial: list[int], out: list[int], kernel: list[int], strides: list[int],
          dilations: list[int], begin: list[int], transposed: bool = False) -> list[str]:
    """``x`` under each tap of the kernel (row-major) at the ``out`` positions, ``[N, C, *out]`` each: ``x``
    zero-padded by ``begin`` and as far as the last window reaches, one strided Slice a tap. ``transposed``: a
    ConvTranspose's, a stride-1 Conv's by the flipped kernel over ``x`` spread by the strides."""
    n = len(spatial)
    if transposed:
        x, spatial = _dilated(w, x, spatial, strides)
        begin = [d * (k - 1) - b for k, d, b in zip(kernel, dilations, begin)]
        strides = [1] * n
    reach = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out, strides, kernel, dilations)]
    x = _pad(w, x, [max(b, 0) for b in begin], [max(r - size - b, 0) for r, size, b in zip(reach, spatial, begin)])
    axes, steps = w.const(list(range(2, 2 + n)), np.int64), w.const(strides, np.int64)
    taps = []
    for tap in np.ndindex(*kernel):
        starts = [max(-b, 0) + ((k - 1 - t) if transposed else t) * d
                  for b, k, t, d in zip(begin, kernel, tap, dilations)]
        ends = [start + (o - 1) * s + 1 for start, o, s in zip(starts, out, strides)]
        taps.append(w.op("Slice", x, w.const(starts, np.int64), w.const(ends, np.int64), axes, steps))
    return taps


def _windows(w: Writer, taps: list[str], groups: int, positions: int | None) -> str:
    """The taps as ``[N, groups, C / groups * taps, positions]``: an im2col (``positions`` None: symbolic)."""
    stacked = w.op("Concat", *[_unsqueeze(w, t, [2]) for t in taps], axis=2)  # [N, C, taps, *out]
    if positions is None:  # [N, C, taps, positions], then its 0s keep N and the positions
        stacked = w.op("Reshape", stacked, w.const([0, 0, 0, -1], np.int64))
        return w.op("Reshape", stacked, w.const([0, groups, -1, 0], np.int64))
    return w.op("Reshape", stacked, w.const([0, groups, -1, positions], np.int64))


def _or_any(dim: int | None) -> int:
    """A Reshape's entry for ``dim``: -1 where it is symbolic."""
    return -1 if dim is None else dim


def _conv_layout(w: Writer, node: onnx.NodeProto, types: dict):
    """A Conv's or ConvTranspose's attributes, input spatial dims (None where symbolic) and run-time spatial dims
    (None where all are static: ``_spatial``), the weight's two channel dims (None where symbolic: one at most),
    its kernel, groups, strides and dilations."""
    attrs = _attrs(node)
    spatial, size = _spatial(w, node, types)
    first, second, *kernel = _static(node, types, node.input[1], "a weight shape")
    if first is None and second is None:
        raise _refuse(node, f"a weight of a known channel count ({node.input[1]!r} is symbolic in both)")
    n = len(spatial)
    return (attrs, spatial, size, first, second, kernel, attrs.get("group", 1), attrs.get("strides") or [1] * n,
            attrs.get("dilations") or [1] * n)


def _matmul_conv(w: Writer, node: onnx.NodeProto, taps: list[str], weights: str, groups: int,
                 out_channels: int | None, out: list[int] | str, n: int) -> None:
    """``node``'s output: ``weights`` ``[groups, out / groups, in / groups * taps]`` times the windows, plus the
    bias (input 2); ``out`` the output's ``n`` spatial dims, or a run-time ``[n]`` int64 of them."""
    static = not isinstance(out, str)
    y = w.op("MatMul", weights, _windows(w, taps, groups, math.prod(out) if static else None))
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    channels = [0, _or_any(out_channels)]
    shape = (w.const([*channels, *out], np.int64) if static else
             w.op("Concat", w.const(channels, np.int64), out, axis=0))
    if bias is None:
        w.op("Reshape", y, shape, output=node.output[0])
        return
    per_channel = w.op("Reshape", bias, w.const([-1] + [1] * n, np.int64))
    w.op("Add", w.op("Reshape", y, shape), per_channel, output=node.output[0])


def _conv(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    attrs, spatial, size, m, per_group, kernel, groups, strides, dilations = _conv_layout(w, node, types)
    pads, auto_pad = attrs.get("pads"), attrs.get("auto_pad", b"NOTSET").decode()
    if size is None:
        begin, _, out, _, _ = geometry(spatial, kernel, strides, dilations, pads, auto_pad)
        taps = _taps(w, node.input[0], spatial, out, kernel, strides, dilations, begin)
    else:
        begin, _, out = symbolic.geometry(w, size, kernel, strides, dilations, pads, auto_pad)
        taps = symbolic.taps(w, node.input[0], size, out, kernel, strides, dilations, begin)
    rows = None if m is None else m // groups
    columns = None if per_group is None else per_group * math.prod(kernel)
    weights = w.op("Reshape", node.input[1], w.const([groups, _or_any(rows), _or_any(columns)], np.int64))
    _matmul_conv(w, node, taps, weights, groups, m, out, len(kernel))


def _transposed_pads(w: Writer, spatial: list[int | None], size: str | None, attrs: dict, kernel: list[int],
                     strides: list[int], dilations: list[int]) -> tuple[list[int] | str, list[int] | str]:
    """A ConvTranspose's pads begin and output spatial dims: static lists, or run-time ``[n]`` int64 where
    ``size`` (its input's run-time spatial dims) is given and they depend on it."""
    n = len(kernel)
    pads, extra = list(attrs.get("pads") or [0] * (2 * n)), attrs.get("output_padding") or [0] * n
    auto_pad = attrs.get("auto_pad", b"NOTSET").decode()
    wanted = attrs.get("output_shape")
    # the full output s (d - 1) + extra + (k - 1) dilation + 1, less the pads: s d + these
    base = [e + (k - 1) * dl + 1 - s for s, e, k, dl in zip(strides, extra, kernel, dilations)]
    upper = auto_pad == "SAME_UPPER"
    if wanted and size is not None:  # ONNX's pads from the output shape, at run time
        wanted = list(wanted)[-n:]
        total = w.op("Add", w.op("Mul", size, w.const(strides, np.int64)),
                     w.const([b - o for b, o in zip(base, wanted)], np.int64))
        half = w.op("Div", w.op("Sub", total, w.op("Mod", total, w.const(2, np.int64))), w.const(2, np.int64))
        return (half if upper else w.op("Sub", total, half)), wanted
    if wanted or auto_pad in ("SAME_UPPER", "SAME_LOWER"):  # ONNX's pads from the output shape
        wanted = list(wanted)[-n:] if wanted else [d * s for d, s in zip(spatial, strides)] if size is None else None
        total = ([s * d + b - o for d, s, b, o in zip(spatial, strides, base, wanted)] if wanted else
                 [b for b in base])  # SAME: an output of s d, whatever d
        pads = [t // 2 if upper else t - t // 2 for t in total] + [t - t // 2 if upper else t // 2 for t in total]
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    if size is None:
        return pads[:n], [s * d + b - pads[i] - pads[i + n] for i, (d, s, b) in enumerate(zip(spatial, strides, base))]
    less = w.const([b - pads[i] - pads[i + n] for i, b in enumerate(base)], np.int64)
    return pads[:n], w.op("Add", w.op("Mul", size, w.const(strides, np.int64)), less)


def _conv_transpose(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    attrs, spatial, size, channels, per_group, kernel, groups, strides, dilations = _conv_layout(w, node, types)
    n = len(spatial)
    pads, out = _transposed_pads(w, spatial, size, attrs, kernel, strides, dilations)
    if size is None:
        taps = _taps(w, node.input[0], spatial, out, kernel, strides, dilations, pads, transposed=True)
    else:  # a stride-1 Conv by the flipped kernel over the input spread by the strides
        spread, grown = _dilated(w, node.input[0], size, strides)
        begin = (w.op("Sub", w.const([d * (k - 1) for k, d in zip(kernel, dilations)], np.int64), pads)
                 if isinstance(pads, str) else
                 w.const([d * (k - 1) - b for k, d, b in zip(kernel, dilations, pads)], np.int64))
        out_dims = out if isinstance(out, str) else w.const(out, np.int64)  # static with output_shape
        taps = symbolic.taps(w, spread, grown, out_dims, kernel, [1] * n, dilations, begin, transposed=True)
    # [C, M / G, taps] by groups as [G, M / G, C / G * taps]
    in_group = None if channels is None else channels // groups
    grouped = w.op("Reshape", node.input[1], w.const([groups, _or_any(in_group), _or_any(per_group), len(taps)],
                                                     np.int64))
    columns = None if in_group is None else in_group * len(taps)
    weights = w.op("Reshape", w.op("Transpose", grouped, perm=[0, 2, 1, 3]),
                   w.const([groups, _or_any(per_group), _or_any(columns)], np.int64))
    _matmul_conv(w, node, taps, weights, groups, None if per_group is None else per_group * groups, out, n)


def _pool(w: Writer, node: onnx.NodeProto, types: dict):
    """(a function from a value to its window sums ``[N, C, *out]``, a function giving the counts of taps inside
    the input (and pads, with ``count_include_pad``) at each output position)."""
    attrs = _attrs(node)
    spatial, size = _spatial(w, node, types)
    n, kernel = len(spatial), attrs["kernel_shape"]
    strides, dilations = attrs.get("strides") or [1] * n, attrs.get("dilations") or [1] * n
    pads, auto_pad, ceil = attrs.get("pads"), attrs.get("auto_pad", b"NOTSET").decode(), attrs.get("ceil_mode", 0)
    include_pad = bool(attrs.get("count_include_pad", 0))
    if size is not None:
        where = symbolic.geometry(w, size, kernel, strides, dilations, pads, auto_pad, ceil)

        def symbolic_sums(w: Writer, v: str, output: str | None = None) -> str:
            return w.op("Sum", *symbolic.taps(w, v, size, where[2], kernel, strides, dilations, where[0]),
                        output=output)
        return symbolic_sums, lambda: symbolic.counts(w, size, where, kernel, strides, dilations, include_pad)
    begin, end, out, _, _ = geometry(spatial, kernel, strides, dilations, pads, auto_pad, ceil)
    counts = np.ones(out)
    for axis, (size_, o, k, s, d, b, e) in enumerate(zip(spatial, out, kernel, strides, dilations, begin, end)):
        where = np.arange(o)[:, None] * s - b + np.arange(k)[None, :] * d  # ceil mode's overhang never counts
        low, high = (-b, size_ + e) if include_pad else (0, size_)
        counts = counts * ((where >= low) & (where < high)).sum(axis=1).reshape([-1 if i == axis else 1
                                                                                 for i in range(n)])

    def window_sums(w: Writer, v: str, output: str | None = None) -> str:
        return w.op("Sum", *_taps(w, v, spatial, out, kernel, strides, dilations, begin), output=output)
    return window_sums, lambda: w.const(counts, np.float64)


def _average_pool(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    window_sums, counts = _pool(w, node, types)
    w.op("Div", window_sums(w, node.input[0]), counts(), output=node.output[0])


def _lp(w: Writer, node: onnx.NodeProto, x: str, total) -> None:
    """``(total(|x|^p))^(1/p)`` into ``node``'s output (``p = 2``: Sqrt of a sum of squares); ``total(v, output=None)``
    sums ``v`` over the windows."""
    p = float(_attrs(node).get("p", 2))
    if p == 2.0:
        w.op("Sqrt", total(w.op("Mul", x, x)), output=node.output[0])
    elif p == 1.0:
        total(w.op("Abs", x), node.output[0])
    else:
        powered = total(w.op("Pow", w.op("Abs", x), w.const(p, np.float64)))
        w.op("Pow", powered, w.const(1.0 / p, np.float64), output=node.output[0])


def _lp_pool(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    window_sums, _ = _pool(w, node, types)
    _lp(w, node, node.input[0], lambda v, output=None: window_sums(w, v, output))


def _global(op: str):
    def lowering(w: Writer, node: onnx.NodeProto, types: dict) -> None:
        dims = types.get(node.input[0], (None, None))[1]
        if dims is None:
            raise _refuse(node, f"an input of known rank ({node.input[0]!r})")
        axes = list(range(2, len(dims)))
        if op == "ReduceLp":
            _lp(w, node, node.input[0], lambda v, output=None: _reduce(w, "ReduceSum", v, axes, 1, output))
        else:
            _reduce(w, op, node.input[0], axes, 1, node.output[0])
    return lowering


LOWERINGS = {"Conv": _conv, "ConvTranspose": _conv_transpose, "AveragePool": _average_pool, "LpPool": _lp_pool,
             "GlobalAveragePool": _global("ReduceMean"), "GlobalMaxPool": _global("ReduceMax"),
             "GlobalLpPool": _global("ReduceLp")}
