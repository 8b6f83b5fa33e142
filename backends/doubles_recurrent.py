"""Double-precision RNN, GRU and LSTM written out for onnxruntime, in a session's copy of a model
(``doubles.lower_double`` runs them).

onnxruntime 1.31's CPU provider has no double RNN kernel ("Could not find an implementation for RNN(14)"), and
its GRU and LSTM fail at run time ("does not support double yet"). Each direction of such a node becomes one
Scan over time whose body is the cell, in ops with double kernels (MatMul, Add, Mul, Sigmoid, Tanh, Relu, Exp,
Log, Max, Min, Where), as the numpy backend's kernels (``backends/numpy/rnn.py``) define it:

- the input projection ``X W^T`` and the biases that can be folded into it (all but GRU's ``Rbh`` under
  ``linear_before_reset``) are one MatMul over the whole sequence, outside the Scan;
- every activation with its alpha/beta (the ONNX defaults where the lists run out, ``numpy.rnn.activation_params``),
  ``clip`` on the gates' inputs (not on LSTM's h activation), LSTM's peepholes and ``input_forget``, GRU's
  ``linear_before_reset``, ``layout``, ``initial_h``/``initial_c`` (zeros when absent);
- ``sequence_lens``: a row whose sequence has ended keeps its state and emits zeros (the step index is a second
  scanned input);
- only the outputs the node names are written.

A 2-layer bidirectional LSTM 32 -> 128, batch 16, T=128 (ort-cpu, 1 thread, a shared 2-core machine) runs in 76 ms
(numpy backend 312 ms, onnxruntime's fused float32 kernel 16 ms); a GRU of that shape in 58 ms (148, 12).

On the CUDA provider a node cuDNN runs (the default activations, no alpha/beta or clip, LSTM without peepholes or
``input_forget``, GRU with ``linear_before_reset`` 1, layout 0: the provider's ``RNNNeedFallbackToCPU``) is left
to its double kernel; any other would fall back to the CPU provider and is written out.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphc.backends.numpy import rnn as numpy_rnn
from graphc.backends.written_out import Writer
from graphc.errors import BackendError
from graphc.model import node_label, node_source

__all__ = ["LOWERINGS", "cudnn_runs"]

_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_DOUBLE = onnx.TensorProto.DOUBLE


def _attrs(node: onnx.NodeProto) -> dict:
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def _directions(attrs: dict) -> list[bool]:
    """Per direction, whether it runs backwards."""
    return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[attrs.get("direction", "forward")]


def _activation_names(node: onnx.NodeProto, attrs: dict) -> list[str]:
    names = [n.decode() if isinstance(n, bytes) else n for n in attrs.get("activations", [])]
    return names or _DEFAULT_ACTIVATIONS[node.op_type] * len(_directions(attrs))


def cudnn_runs(node: onnx.NodeProto) -> bool:
    """Whether onnxruntime's CUDA provider runs this RNN/GRU/LSTM node on cuDNN (its ``RNNNeedFallbackToCPU``,
    with layout 0 and GRU's ``linear_before_reset`` set to 1 asked for besides)."""
    attrs = _attrs(node)
    defaults = [n.lower() for n in _DEFAULT_ACTIVATIONS[node.op_type] * len(_directions(attrs))]
    return ([n.lower() for n in _activation_names(node, attrs)] == defaults and
            not {"activation_alpha", "activation_beta", "clip"} & attrs.keys() and attrs.get("layout", 0) == 0 and
            not attrs.get("input_forget", 0) and (node.op_type != "GRU" or attrs.get("linear_before_reset", 0) == 1) and
            not (node.op_type == "LSTM" and len(node.input) > 7 and node.input[7]))


def _activation(w: Writer, name: str, alpha: float, beta: float):
    """``name``'s function (ONNX's RNN activations) as ops on a double value."""
    c = lambda v: w.const(v, np.float64)
    key = name.lower()
    if key in ("sigmoid", "tanh", "relu"):
        return lambda v: w.op({"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}[key], v)
    if key == "affine":
        return lambda v: w.op("Add", w.op("Mul", v, c(alpha)), c(beta))
    if key == "leakyrelu":
        return lambda v: w.op("Where", w.op("GreaterOrEqual", v, c(0.0)), v, w.op("Mul", v, c(alpha)))
    if key == "thresholdedrelu":
        return lambda v: w.op("Where", w.op("Greater", v, c(alpha)), v, c(0.0))
    if key == "scaledtanh":
        return lambda v: w.op("Mul", w.op("Tanh", w.op("Mul", v, c(beta))), c(alpha))
    if key == "hardsigmoid":
        return lambda v: w.op("Min", w.op("Max", w.op("Add", w.op("Mul", v, c(alpha)), c(beta)), c(0.0)), c(1.0))
    if key == "elu":
        return lambda v: w.op("Where", w.op("Greater", v, c(0.0)), v,
                              w.op("Mul", w.op("Sub", w.op("Exp", w.op("Min", v, c(0.0))), c(1.0)), c(alpha)))
    if key == "softsign":
        return lambda v: w.op("Div", v, w.op("Add", w.op("Abs", v), c(1.0)))
    # softplus: max(x, 0) + log1p(exp(-|x|))
    return lambda v: w.op("Add", w.op("Relu", v), w.log1p(w.op("Exp", w.op("Neg", w.op("Abs", v)))))


def _refuse(node: onnx.NodeProto, why: str) -> BackendError:
    at = f" at {node_source(node)}" if node_source(node) else ""
    return BackendError(f"onnxruntime has no double kernel for {node.op_type} and graphc writes it out only where "
                        f"{why}: {node_label(node.name)}{at}; run it in float32 or on the numpy backend")


def _part(w: Writer, v: str, start: int, stop: int, axis: int) -> str:
    """``v[..., start:stop, ...]`` along ``axis``."""
    return w.op("Gather", v, w.const(np.arange(start, stop), np.int64), axis=axis)


def _unsqueeze(w: Writer, v: str, axis: int, output: str | None = None) -> str:
    if w.opset >= 13:
        return w.op("Unsqueeze", v, w.const([axis], np.int64), output=output)
    return w.op("Unsqueeze", v, axes=[axis], output=output)


def _recurrent(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    if w.opset < 9:
        raise _refuse(node, f"the model's opset is 9 or later (a Scan without a batch axis), not {w.opset}")
    op, attrs = node.op_type, _attrs(node)
    names = _activation_names(node, attrs)
    unknown = [n for n in names if numpy_rnn.takes_params(n) is None]
    if unknown:
        raise _refuse(node, f"it knows its activations (ONNX has none named {unknown})")
    params = numpy_rnn.activation_params(names, attrs.get("activation_alpha"), attrs.get("activation_beta"))
    per, hidden = len(_DEFAULT_ACTIVATIONS[op]), attrs["hidden_size"]
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    x, weight, recurrence, bias, lens, h0, c0, peep = (list(node.input) + [""] * 8)[:8]
    layout = attrs.get("layout", 0)
    dims = types.get(x, (None, None))[1]
    batch_dim = dims[1 - layout] if dims and len(dims) == 3 else None  # declared in the body: an empty run's Y keeps it
    if layout:  # [B, T, I] -> [T, B, I], states [B, D, H] -> [D, B, H]
        x = w.op("Transpose", x, perm=[1, 0, 2])
        h0, c0 = (w.op("Transpose", s, perm=[1, 0, 2]) if s else s for s in (h0, c0))
    zeros = None
    if not h0 or (op == "LSTM" and not c0):
        batch = _part(w, w.op("Shape", x), 1, 2, 0)
        zeros = w.op("ConstantOfShape", w.op("Concat", batch, w.const([hidden], np.int64), axis=0),
                     value=numpy_helper.from_array(np.zeros(1)))
    lens = lens and w.op("Reshape", w.op("Cast", lens, to=onnx.TensorProto.INT64), w.const([-1, 1], np.int64))
    steps = lens and w.op("Range", w.const(0, np.int64), w.op("Gather", w.op("Shape", x), w.const(0, np.int64)),
                          w.const(1, np.int64))
    ys, last_h, last_c = [], [], []
    for d, backwards in enumerate(_directions(attrs)):
        pick = lambda v, d=d: w.op("Gather", v, w.const(d, np.int64), axis=0)
        xw = w.op("MatMul", x, w.op("Transpose", pick(weight), perm=[1, 0]))  # [T, B, gates H]
        r_t = w.op("Transpose", pick(recurrence), perm=[1, 0])  # [H, gates H]
        r_bias_h = None  # GRU's Rbh under linear_before_reset: inside the reset
        if bias:
            biases = pick(bias)
            w_bias = _part(w, biases, 0, gates * hidden, 0)
            r_bias = _part(w, biases, gates * hidden, 2 * gates * hidden, 0)
            if op == "GRU" and attrs.get("linear_before_reset", 0):
                r_bias_h = _part(w, r_bias, 2 * hidden, 3 * hidden, 0)
                r_bias = w.op("Concat", _part(w, r_bias, 0, 2 * hidden, 0), w.const(np.zeros(hidden), np.float64),
                              axis=0)
            xw = w.op("Add", xw, w.op("Add", w_bias, r_bias))
        states = [pick(h0) if h0 else zeros] + ([pick(c0) if c0 else zeros] if op == "LSTM" else [])
        cell = Writer(node, f"{op.lower()}_cell{d}", w.opset)
        acts = [_activation(cell, name, a, b) for name, (a, b) in zip(names[d * per:(d + 1) * per],
                                                                     params[d * per:(d + 1) * per])]
        weights = {"r_t": r_t, "r_bias_h": r_bias_h}
        if op == "GRU":
            weights.update(r_zr=_part(w, r_t, 0, 2 * hidden, 1), r_h=_part(w, r_t, 2 * hidden, 3 * hidden, 1))
        if peep:
            p = pick(peep)
            weights["peeps"] = [_part(w, p, k * hidden, (k + 1) * hidden, 0) for k in range(3)]
        body = _body(cell, op, attrs, acts, weights, [batch_dim, hidden], lens)
        outs = [f"{cell.prefix}{name}_last" for name in ("h", "c")[:len(states)]] + [f"{cell.prefix}y"]
        scanned = [xw] + ([steps] if lens else [])
        w.op("Scan", *states, *scanned, output=outs, body=body, num_scan_inputs=len(scanned),
             scan_input_directions=[int(backwards)] * len(scanned), scan_output_directions=[int(backwards)])
        ys.append(_unsqueeze(w, outs[-1], 1))  # [T, 1, B, H]
        last_h.append(_unsqueeze(w, outs[0], 0))
        last_c.append(_unsqueeze(w, outs[1], 0) if op == "LSTM" else None)
    wanted = (list(node.output) + ["", "", ""])[:3]
    for i, (parts, perm) in enumerate(((ys, [2, 0, 1, 3]), (last_h, [1, 0, 2]), (last_c, [1, 0, 2]))):
        if wanted[i]:
            if layout:
                w.op("Transpose", w.op("Concat", *parts, axis=1 if i == 0 else 0), perm=perm, output=wanted[i])
            else:
                w.op("Concat", *parts, axis=1 if i == 0 else 0, output=wanted[i])


def _body(w: Writer, op: str, attrs: dict, acts: list, weights: dict, state: list, lens: str) -> onnx.GraphProto:
    """The Scan body of one direction: (h[, c], x_t[, t]) -> (new h[, new c], y_t); ``state`` the states' dims
    [batch (None where unknown), hidden]."""
    value = lambda name, dims=state: helper.make_tensor_value_info(f"{w.prefix}{name}", _DOUBLE, dims)
    hidden = state[1]
    state_in = [value("h")] + ([value("c")] if op == "LSTM" else [])
    x_in = [value("x_t", [state[0], None])] + ([helper.make_tensor_value_info(f"{w.prefix}t", onnx.TensorProto.INT64,
                                                                               [])] if lens else [])
    h, c, x_t = state_in[0].name, state_in[-1].name, x_in[0].name
    clip = attrs.get("clip")
    if clip is not None:
        bound = lambda fn: lambda v: fn(w.op("Min", w.op("Max", v, w.const(-clip, np.float64)),
                                             w.const(clip, np.float64)))
        acts = [bound(fn) if i < 2 else fn for i, fn in enumerate(acts)]  # LSTM's h acts on c unclipped
    new = _cell(w, op, attrs, acts, weights, hidden, x_t, h, c)
    old = [h, c][:len(new)]
    if lens:
        alive = w.op("Less", x_in[1].name, lens)  # [B, 1]
        y = w.op("Where", alive, new[0], w.const(0.0, np.float64))
        new = [w.op("Where", alive, n, o) for n, o in zip(new, old)]
    else:
        y = w.op("Identity", new[0])  # a body output of its own (onnxruntime and repeated Scan outputs)
    outputs = [value(f"{name}_out") for name in ("h", "c")[:len(new)]] + [value("y_t")]
    for made, out in zip([*new, y], outputs):
        w.op("Identity", made, output=out.name)
    return helper.make_graph(w.nodes, f"{w.prefix}body", state_in + x_in, outputs)


def _cell(w: Writer, op: str, attrs: dict, acts: list, weights: dict, hidden: int, x_t: str, h: str, c: str) -> list[str]:
    """One step of a direction: the new [h] ([h, c] for LSTM); ``x_t`` [B, gates H] holds the folded biases."""
    r_t = weights["r_t"]
    if op == "RNN":
        return [acts[0](w.op("Add", x_t, w.op("MatMul", h, r_t)))]
    if op == "GRU":  # gates z, r, h
        f, g = acts
        zr = f(w.op("Add", _part(w, x_t, 0, 2 * hidden, 1), w.op("MatMul", h, weights["r_zr"])))
        z, reset = _part(w, zr, 0, hidden, 1), _part(w, zr, hidden, 2 * hidden, 1)
        r_h, x_h = weights["r_h"], _part(w, x_t, 2 * hidden, 3 * hidden, 1)
        if attrs.get("linear_before_reset", 0):
            recur = w.op("MatMul", h, r_h)
            recur = w.op("Add", recur, weights["r_bias_h"]) if weights["r_bias_h"] else recur
            cand = g(w.op("Add", x_h, w.op("Mul", reset, recur)))
        else:
            cand = g(w.op("Add", x_h, w.op("MatMul", w.op("Mul", reset, h), r_h)))
        keep = w.op("Sub", w.const(1.0, np.float64), z)
        return [w.op("Add", w.op("Mul", keep, cand), w.op("Mul", z, h))]
    f, g, h_act = acts  # LSTM gates i, o, f, c; peepholes i, o, f
    pre = w.op("Add", x_t, w.op("MatMul", h, r_t))
    gate = lambda k: _part(w, pre, k * hidden, (k + 1) * hidden, 1)
    peeps = weights.get("peeps")
    watched = (lambda v, k, state: w.op("Add", v, w.op("Mul", peeps[k], state))) if peeps else (lambda v, k, state: v)
    i = f(watched(gate(0), 0, c))
    forget = w.op("Sub", w.const(1.0, np.float64), i) if attrs.get("input_forget", 0) else f(watched(gate(2), 2, c))
    new_c = w.op("Add", w.op("Mul", forget, c), w.op("Mul", i, g(gate(3))))
    o = f(watched(gate(1), 1, new_c))
    return [w.op("Mul", o, h_act(new_c)), new_c]


LOWERINGS = {"RNN": _recurrent, "GRU": _recurrent, "LSTM": _recurrent}
