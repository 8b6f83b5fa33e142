"""Double-precision Resize, Upsample, InstanceNormalization and PRelu written out for onnxruntime, in a
session's copy of a model (``doubles.lower_double`` runs them).

onnxruntime 1.31's CPU provider has no double kernel for these ("Could not find an implementation for
Resize(19)"). Each is written out from ops it has double kernels for, exactly (no float32 round trip):

- Resize and Upsample: axis by axis, as the numpy backend resamples (``backends/numpy/resize.plan``, which
  gives each resized axis's source indices or weights): nearest one Gather of constant indices; linear and
  cubic one Gather of each output position's taps (the nonzero weights of its row, ``[out, taps]``), times
  their constant weights, summed over the taps (a MatMul by the whole weight matrix would spread a NaN or an
  infinity over every output of its row); ``tf_crop_and_resize``'s positions outside the input take
  ``extrapolation_value``. The resized axes' sizes and the scales, sizes and roi must be known before the run;
- InstanceNormalization: ``(x - mean) / sqrt(var + epsilon) * scale + bias`` over the spatial axes (biased
  variance);
- PRelu: ``Where(x < 0, x * slope, x)``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphc.backends.numpy import resize as numpy_resize
from graphc.backends.written_out import Writer
from graphc.errors import BackendError
from graphc.model import node_label, node_source

__all__ = ["LOWERINGS"]


def _refuse(node: onnx.NodeProto, why: str, kind: str = "double") -> BackendError:
    at = f" at {node_source(node)}" if node_source(node) else ""
    return BackendError(f"onnxruntime has no {kind} kernel for {node.op_type} and graphc writes it out only where "
                        f"{why}: {node_label(node.name)}{at}; run it in float32 or on the numpy backend")


def _resize(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    dtype, dims = types.get(node.input[0], (None, None))
    kind = "int64" if dtype == onnx.TensorProto.INT64 else "double"  # backends/integers.py writes int64 ones too
    if dims is None:
        raise _refuse(node, f"the rank of its input {node.input[0]!r} is known", kind)
    legacy = node.op_type == "Upsample" or w.opset < 11
    names = ["roi", "scales", "sizes"]
    given = dict(zip(["scales"] if legacy else names, node.input[1:]))
    values = {k: w.constant(v) for k, v in given.items() if v}
    if "scales" in attrs:  # Upsample-7
        values["scales"] = np.asarray(attrs.pop("scales"), np.float32)
    unknown = [given[k] for k in given if given[k] and values[k] is None]
    if unknown:
        raise _refuse(node, f"its {', '.join(repr(u) for u in unknown)} are constants", kind)
    shape = [1 if d is None else d for d in dims]  # a symbolic axis that is not resized keeps its size
    plans = numpy_resize.plan(shape, legacy=legacy, **values, **attrs)
    symbolic = [a for a, *_ in plans if dims[a] is None]
    if symbolic:
        raise _refuse(node, f"the resized axes of {node.input[0]!r} have static sizes (axis {symbolic[0]} of "
                            f"shape {dims} is symbolic)", kind)
    y, outside = node.input[0], None
    for axis, taken, out in plans:
        y = (w.op("Gather", y, w.const(taken, np.int64), axis=axis) if taken.ndim == 1 else
             _weighted(w, y, axis, len(dims), taken))
        if out is not None:
            outside = out if outside is None else outside | out
    if outside is None:
        w.op("Identity", y, output=node.output[0])
    else:
        w.op("Where", w.const(outside, np.bool_), w.const(attrs.get("extrapolation_value", 0.0), np.float64), y,
             output=node.output[0])


def _weighted(w: Writer, y: str, axis: int, rank: int, matrix: np.ndarray) -> str:
    """``matrix`` (out, in) applied along ``axis`` of the rank-``rank`` ``y`` by its rows' nonzero taps."""
    taps = max(1, int((matrix != 0).sum(axis=1).max()))
    order = np.argsort(matrix == 0, axis=1, kind="stable")[:, :taps]  # each row's nonzero columns first
    weights = np.take_along_axis(matrix, order, axis=1)
    gathered = w.op("Gather", y, w.const(order, np.int64), axis=axis)  # [..., out, taps, ...]
    product = w.op("Mul", gathered, w.const(weights.reshape(*weights.shape, *[1] * (rank - 1 - axis)), np.float64))
    if w.opset >= 13:
        return w.op("ReduceSum", product, w.const([axis + 1], np.int64), keepdims=0)
    return w.op("ReduceSum", product, axes=[axis + 1], keepdims=0)


def _instance_norm(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x, scale, bias = node.input[:3]
    dims = types.get(x, (None, None))[1]
    if dims is None:
        raise _refuse(node, f"the rank of its input {x!r} is known")
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    spatial = list(range(2, len(dims)))
    centred = w.op("Sub", x, w.reduce_mean(x, spatial))
    var = w.reduce_mean(w.op("Mul", centred, centred), spatial)
    normed = w.op("Div", centred, w.op("Sqrt", w.op("Add", var, w.const(eps, np.float64))))
    per_channel = w.const([-1] + [1] * len(spatial), np.int64)
    w.op("Add", w.op("Mul", normed, w.op("Reshape", scale, per_channel)), w.op("Reshape", bias, per_channel),
         output=node.output[0])


def _prelu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x, slope = node.input[:2]
    w.op("Where", w.op("Less", x, w.const(0.0, np.float64)), w.op("Mul", x, slope), x, output=node.output[0])


LOWERINGS = {"Resize": _resize, "Upsample": _resize, "InstanceNormalization": _instance_norm, "PRelu": _prelu}
