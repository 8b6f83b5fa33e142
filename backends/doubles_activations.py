"""Double-precision activations, Hardmax, Mean and NonZero written out for onnxruntime, in a session's copy of a
model (``doubles.lower_double`` runs them).

onnxruntime 1.31's CPU provider has no double kernel for these ("Could not find an implementation for Elu(6)"),
nor for the ops of HardSwish's and Mish's function bodies (HardSigmoid, Softplus): a float64 model imported from
torch.onnx fails to load. Each is written out from ops it has double kernels for, as the numpy backend computes
it (its attributes, float32 in ONNX, taken as they are):

- LeakyRelu ``Where(x >= 0, x, alpha x)``, ThresholdedRelu ``Where(x > alpha, x, 0)``, PRelu's form;
- Elu, Selu and Celu by ``alpha expm1(min(x, 0))`` below 0 (``Writer.expm1``: no cancellation near 0);
- HardSigmoid ``clip(alpha x + beta, 0, 1)``, HardSwish ``x clip(x / 6 + 1/2, 0, 1)``, both through Max and Min
  held to NaN (Where);
- Softplus ``max(x, 0) + log1p(exp(-|x|))`` (no overflow, no loss far below 0), Mish ``x tanh(softplus x)``,
  Softsign ``x / (1 + |x|)``;
- Hardmax one-hot of ArgMax (its first maximum, else its first NaN), compared with the axis's positions; before opset 13 on the input
  flattened to 2-D at ``axis``; Mean ``Sum / n``; NonZero of ``x != 0``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphc.backends.written_out import Writer

__all__ = ["LOWERINGS"]

# the ONNX defaults (float32 values, as the numpy backend's)
_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def _attr(node: onnx.NodeProto, name: str, default):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _c(w: Writer, value: float) -> str:
    return w.const(value, np.float64)


def _clip01(w: Writer, v: str) -> str:
    """``v`` held to [0, 1], NaN kept."""
    held = w.op("Min", w.op("Max", v, _c(w, 0.0)), _c(w, 1.0))
    return w.op("Where", w.op("IsNaN", v), v, held)


def _negative_part(w: Writer, x: str, alpha: float, scale: float = 1.0) -> str:
    """``alpha expm1(min(x, 0) / scale)``."""
    low = w.op("Min", x, _c(w, 0.0))
    return w.op("Mul", w.expm1(low if scale == 1.0 else w.op("Div", low, _c(w, scale))), _c(w, alpha))


def _elu_like(w: Writer, node: onnx.NodeProto, alpha: float, scale: float = 1.0, output: str | None = None) -> str:
    x = node.input[0]
    return w.op("Where", w.op("Greater", x, _c(w, 0.0)), x, _negative_part(w, x, alpha, scale), output=output)


def _elu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    _elu_like(w, node, _attr(node, "alpha", 1.0), output=node.output[0])


def _celu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    alpha = _attr(node, "alpha", 1.0)
    _elu_like(w, node, alpha, alpha, output=node.output[0])


def _selu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    gamma = _attr(node, "gamma", _SELU_GAMMA)
    w.op("Mul", _elu_like(w, node, _attr(node, "alpha", _SELU_ALPHA)), _c(w, gamma), output=node.output[0])


def _leaky_relu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    w.op("Where", w.op("GreaterOrEqual", x, _c(w, 0.0)), x, w.op("Mul", x, _c(w, _attr(node, "alpha", 0.01))),
         output=node.output[0])


def _thresholded_relu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    w.op("Where", w.op("Greater", x, _c(w, _attr(node, "alpha", 1.0))), x, _c(w, 0.0), output=node.output[0])


def _hard_sigmoid(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    linear = w.op("Add", w.op("Mul", node.input[0], _c(w, _attr(node, "alpha", 0.2))), _c(w, _attr(node, "beta", 0.5)))
    w.op("Identity", _clip01(w, linear), output=node.output[0])


def _hard_swish(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    gate = _clip01(w, w.op("Add", w.op("Div", x, _c(w, 6.0)), _c(w, 0.5)))
    w.op("Mul", x, gate, output=node.output[0])


def _softplus_of(w: Writer, x: str, output: str | None = None) -> str:
    tail = w.log1p(w.op("Exp", w.op("Neg", w.op("Abs", x))))
    # a NaN comes through the tail whatever Max makes of it
    return w.op("Add", w.op("Max", x, _c(w, 0.0)), tail, output=output)


def _softplus(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    _softplus_of(w, node.input[0], node.output[0])


def _mish(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    w.op("Mul", x, w.op("Tanh", _softplus_of(w, x)), output=node.output[0])


def _softsign(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    w.op("Div", x, w.op("Add", w.op("Abs", x), _c(w, 1.0)), output=node.output[0])


def _hardmax(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    coerced = w.opset < 13
    axis = _attr(node, "axis", 1 if coerced else -1)
    if coerced:  # [prod(shape[:axis]), prod(shape[axis:])], one-hot along its rows
        flat, axis, rank = w.op("Flatten", x, axis=axis), 1, 2
    else:
        rank = len(types[x][1])
        flat, axis = x, axis % rank
    # the first NaN where there is one (numpy's and torch's argmax; onnxruntime's passes over NaN)
    nan = w.op("Cast", w.op("IsNaN", flat), to=onnx.TensorProto.DOUBLE)
    first = w.op("Where", w.op("Greater", w.op("ReduceMax", nan, axes=[axis], keepdims=1) if w.opset < 18 else
                                w.op("ReduceMax", nan, w.const([axis], np.int64), keepdims=1), _c(w, 0.0)),
                 w.op("ArgMax", nan, axis=axis, keepdims=1), w.op("ArgMax", flat, axis=axis, keepdims=1))
    size = w.op("Slice", w.op("Shape", flat), w.const([axis], np.int64), w.const([axis + 1], np.int64))
    positions = w.op("CumSum", w.op("ConstantOfShape", size, value=helper.make_tensor("", onnx.TensorProto.INT64,
                                                                                     [1], [1])),
                     w.const(0, np.int64), exclusive=1)
    positions = w.op("Reshape", positions, w.const([-1] + [1] * (rank - 1 - axis), np.int64))
    hot = w.op("Cast", w.op("Equal", positions, first), to=onnx.TensorProto.DOUBLE)
    if coerced:
        w.op("Reshape", hot, w.op("Shape", x), output=node.output[0])
    else:
        w.op("Identity", hot, output=node.output[0])


def _mean(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    w.op("Div", w.op("Sum", *node.input), _c(w, float(len(node.input))), output=node.output[0])


def _nonzero(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    w.op("NonZero", w.op("Not", w.op("Equal", x, _c(w, 0.0))), output=node.output[0])


LOWERINGS = {"Elu": _elu, "Celu": _celu, "Selu": _selu, "LeakyRelu": _leaky_relu,
             "ThresholdedRelu": _thresholded_relu, "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish,
             "Softplus": _softplus, "Mish": _mish, "Softsign": _softsign, "Hardmax": _hardmax, "Mean": _mean,
             "NonZero": _nonzero}
