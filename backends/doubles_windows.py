"""Double-precision Conv, ConvTranspose, AveragePool, LpPool and the global pools written out for onnxruntime,
in a session's copy of a model (``doubles.lower_double`` runs them).

onnxruntime 1.31's CPU provider has no double kernel for these ("Could not find an implementation for
Conv(11)"). Each is written out from ops it has double kernels for, exactly (no float32 round trip):

- the windows: the input's spatial dims flattened, one zero appended (a Pad of one element), and one Gather of
  constant indices giving ``[N, C, taps, out positions]``, a tap outside the input reading the zero (an
  im2col). A ConvTranspose's windows are those of the Conv whose input gradient it is: output position ``o``
  and tap ``k`` read input ``(o + pad - k d) / s`` where that divides and lies inside;
- Conv and ConvTranspose: one MatMul of the weights, ``[groups, out / groups, in / groups * taps]``, by the
  windows as ``[N, groups, in / groups * taps, positions]``, then the bias;
- AveragePool: the windows' sum over the taps by a constant count per position (the taps inside the input,
  or inside input and pads with ``count_include_pad``, never those of ceil mode's overhang); LpPool:
  ``(sum |x|^p)^(1/p)`` (``p = 2`` as Sqrt of a sum of squares); GlobalAveragePool, GlobalMaxPool,
  GlobalLpPool: reductions over the spatial axes.

Windows as one Gather against the alternative, a Pad and one strided Slice per tap stacked by Concat: a 3x3
Conv, 16 to 32 channels, batch 8, 32x32, on 2 threads: 7.0 ms against 8.9 ms, its input gradient (a
ConvTranspose) 6.4 ms against 9.4 ms (``scripts``-free measurement, onnxruntime 1.31). The windows need
static spatial dims (the batch and channels may be symbolic); others raise ``BackendError``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

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


def _reduce(w: Writer, op: str, v: str, axes: list[int], keepdims: int, output: str | None = None) -> str:
    """``op`` (a Reduce*) over ``axes``, the axes an input from opset 13 (ReduceSum) or 18 (the others)."""
    if w.opset >= (13 if op == "ReduceSum" else 18):
        return w.op(op, v, w.const(axes, np.int64), keepdims=keepdims, output=output)
    return w.op(op, v, axes=axes, keepdims=keepdims, output=output)


def _tap_sources(spatial, out, kernel, strides, dilations, begin, transposed):
    """(taps, positions) flat input indices read by each tap at each output position, ``-1`` outside."""
    grids = np.meshgrid(*[np.arange(k) for k in kernel], *[np.arange(o) for o in out], indexing="ij")
    n = len(kernel)
    flat, inside = np.zeros(grids[0].shape, np.int64), np.ones(grids[0].shape, bool)
    for axis in range(n):
        tap, pos = grids[axis], grids[n + axis]
        s, d, b = strides[axis], dilations[axis], begin[axis]
        if transposed:
            shifted = pos + b - tap * d
            inside &= shifted % s == 0
            source = shifted // s
        else:
            source = pos * s - b + tap * d
        inside &= (source >= 0) & (source < spatial[axis])
        flat = flat * spatial[axis] + np.clip(source, 0, spatial[axis] - 1)
    return np.where(inside, flat, -1).reshape(math.prod(kernel), math.prod(out))


def _windows(w: Writer, x: str, spatial: list[int], sources: np.ndarray) -> str:
    """``[N, C, taps, positions]`` of ``x`` at ``sources`` (``_tap_sources``), 0 where it is -1."""
    size = math.prod(spatial)
    flat = w.op("Reshape", x, w.const([0, 0, size], np.int64))
    if (sources < 0).any():
        widths = w.const([0, 0, 0, 0, 0, 1], np.int64)
        flat = (w.op("Pad", flat, widths, w.const(0.0, np.float64)) if w.opset >= 11 else
                w.op("Pad", flat, pads=[0, 0, 0, 0, 0, 1], value=0.0))
    return w.op("Gather", flat, w.const(np.where(sources < 0, size, sources), np.int64), axis=2)


def _matmul_conv(w: Writer, node: onnx.NodeProto, cols: str, weights: str, groups: int, out_channels: int,
                 out: list[int]) -> None:
    """``node``'s output: ``weights`` ``[groups, out / groups, in / groups * taps]`` times ``cols``, plus the
    bias (input 2)."""
    taps_per_group = w.const([0, groups, -1, math.prod(out)], np.int64)
    y = w.op("MatMul", weights, w.op("Reshape", cols, taps_per_group))
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    shape = w.const([0, out_channels, *out], np.int64)
    if bias is None:
        w.op("Reshape", y, shape, output=node.output[0])
        return
    per_channel = w.op("Reshape", bias, w.const([out_channels] + [1] * len(out), np.int64))
    w.op("Add", w.op("Reshape", y, shape), per_channel, output=node.output[0])


def _conv(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    attrs = _attrs(node)
    spatial = _static(node, types, node.input[0], "spatial dims")[2:]
    m, per_group, *kernel = _static(node, types, node.input[1], "a weight shape")
    groups, n = attrs.get("group", 1), len(spatial)
    strides, dilations = attrs.get("strides") or [1] * n, attrs.get("dilations") or [1] * n
    begin, _, out, _, _ = geometry(spatial, kernel, strides, dilations, attrs.get("pads"),
                             attrs.get("auto_pad", b"NOTSET").decode())
    cols = _windows(w, node.input[0], spatial, _tap_sources(spatial, out, kernel, strides, dilations, begin, False))
    weights = w.op("Reshape", node.input[1], w.const([groups, m // groups, per_group * math.prod(kernel)], np.int64))
    _matmul_conv(w, node, cols, weights, groups, m, out)


def _conv_transpose(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    attrs = _attrs(node)
    spatial = _static(node, types, node.input[0], "spatial dims")[2:]
    channels, per_group, *kernel = _static(node, types, node.input[1], "a weight shape")
    groups, n = attrs.get("group", 1), len(spatial)
    strides, dilations = attrs.get("strides") or [1] * n, attrs.get("dilations") or [1] * n
    pads, extra = list(attrs.get("pads") or [0] * (2 * n)), attrs.get("output_padding") or [0] * n
    auto_pad = attrs.get("auto_pad", b"NOTSET").decode()
    wanted = attrs.get("output_shape")
    if wanted or auto_pad in ("SAME_UPPER", "SAME_LOWER"):  # ONNX's pads from the output shape
        wanted = list(wanted)[-n:] if wanted else [d * s for d, s in zip(spatial, strides)]
        total = [s * (d - 1) + e + (k - 1) * dl + 1 - o
                 for d, s, e, k, dl, o in zip(spatial, strides, extra, kernel, dilations, wanted)]
        upper = auto_pad == "SAME_UPPER"
        pads = [t // 2 if upper else t - t // 2 for t in total] + [t - t // 2 if upper else t // 2 for t in total]
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    out = [s * (d - 1) + e + (k - 1) * dl + 1 - pads[i] - pads[i + n]
           for i, (d, s, e, k, dl) in enumerate(zip(spatial, strides, extra, kernel, dilations))]
    cols = _windows(w, node.input[0], spatial, _tap_sources(spatial, out, kernel, strides, dilations, pads[:n], True))
    taps = math.prod(kernel)
    # [C, M / G, taps] by groups as [G, M / G, C / G * taps]
    grouped = w.op("Reshape", node.input[1], w.const([groups, channels // groups, per_group, taps], np.int64))
    weights = w.op("Reshape", w.op("Transpose", grouped, perm=[0, 2, 1, 3]),
                   w.const([groups, per_group, channels // groups * taps], np.int64))
    _matmul_conv(w, node, cols, weights, groups, per_group * groups, out)


def _pool_geometry(node: onnx.NodeProto, types: dict):
    attrs = _attrs(node)
    spatial = _static(node, types, node.input[0], "spatial dims")[2:]
    n, kernel = len(spatial), attrs["kernel_shape"]
    strides, dilations = attrs.get("strides") or [1] * n, attrs.get("dilations") or [1] * n
    begin, end, out, _, _ = geometry(spatial, kernel, strides, dilations, attrs.get("pads"),
                               attrs.get("auto_pad", b"NOTSET").decode(), attrs.get("ceil_mode", 0))
    sources = _tap_sources(spatial, out, kernel, strides, dilations, begin, False)
    return attrs, spatial, out, sources, (kernel, strides, dilations, begin, end)


def _window_sum(w: Writer, x: str, spatial: list[int], sources: np.ndarray) -> str:
    return _reduce(w, "ReduceSum", _windows(w, x, spatial, sources), [2], 0)


def _average_pool(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    attrs, spatial, out, sources, (kernel, strides, dilations, begin, end) = _pool_geometry(node, types)
    if attrs.get("count_include_pad", 0):  # taps inside input and pads: the windows of a padded input
        padded = [d + b + e for d, b, e in zip(spatial, begin, end)]
        counted = _tap_sources(padded, out, kernel, strides, dilations, [0] * len(spatial), False) >= 0
    else:
        counted = sources >= 0
    counts = w.const(counted.sum(axis=0).astype(np.float64), np.float64)
    mean = w.op("Div", _window_sum(w, node.input[0], spatial, sources), counts)
    w.op("Reshape", mean, w.const([0, 0, *out], np.int64), output=node.output[0])


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
    _, spatial, out, sources, _ = _pool_geometry(node, types)
    shape = w.const([0, 0, *out], np.int64)
    _lp(w, node, node.input[0], lambda v, output=None: w.op("Reshape", _window_sum(w, v, spatial, sources), shape,
                                                       output=output))


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
