"""RNN, GRU and LSTM unrolled over their (static) sequence into the ops the ONNX spec defines
them with (MatMul, Sigmoid, Tanh, Mul, Add), so autodiff differentiates them with the rules
those ops have. Used for the gradient graphs only; inference graphs keep the fused ops.

Supported: default activations, any direction, layout 0 or 1, bias, initial states, LSTM
peepholes, GRU ``linear_before_reset``, and ``sequence_lens`` only when every length is the full
sequence. Other forms stay as they are; autodiff then names the op and ``not_unrolled``'s reason.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import attr, const_array, static_shape
from graphc.passes.emit import Emitter

__all__ = ["UNROLLED", "not_unrolled", "unroll_recurrent"]

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
UNROLLED = frozenset(_GATES)
_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def unroll_recurrent(model: ir.Model) -> int:
    """Unroll, in place, every main-graph RNN/GRU/LSTM node it supports; returns how many."""
    graph = model.graph
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
    count = 0
    for node in list(graph):
        if node.op_type in _GATES and node.domain in ("", "ai.onnx") and not_unrolled(node) is None:
            emit = Emitter(graph, opset, f"{node.name or node.op_type}/unrolled")
            new_outputs = _unroll(emit, node)
            for old, new in zip(node.outputs, new_outputs):
                if new is not None:
                    name = old.name
                    new.type, new.shape = old.type, old.shape
                    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
                    old.name = None
                    new.name = name
            graph.remove(node, safe=True)
            count += 1
    if count:
        graph.sort()
    return count


def not_unrolled(node: ir.Node) -> str | None:
    """Why ``unroll_recurrent`` leaves this RNN/GRU/LSTM node as it is (None: it unrolls it,
    when the node is in the main graph)."""
    op = node.op_type
    acts = attr(node, "activations")
    default = _DEFAULT_ACTIVATIONS[op] * (2 if attr(node, "direction", "forward") == "bidirectional" else 1)
    if acts is not None and [a.decode() if isinstance(a, bytes) else a for a in acts] != default:
        return f"activations other than the default {default}"
    for name in ("clip", "activation_alpha", "activation_beta"):
        if attr(node, name) is not None:
            return f"the {name} attribute"
    if attr(node, "input_forget", 0):
        return "input_forget=1"
    shape = static_shape(node.inputs[0])
    steps = None if shape is None or len(shape) != 3 else shape[1] if attr(node, "layout", 0) else shape[0]
    if not isinstance(steps, int):
        return "a sequence length that is not static"
    lens = node.inputs[4] if len(node.inputs) > 4 else None
    if lens is not None:
        known = const_array(lens)
        if known is None or not np.all(known == steps):
            return "sequence_lens that are not all the full sequence length"
    return None


def _unroll(e: Emitter, node: ir.Node) -> list[ir.Value | None]:
    """The node's outputs (None where unused) from per-step ops. Per step and direction: one
    MatMul of the state with every gate's recurrence weights, the input projection of every step
    (one MatMul, biases folded in) split off once, states kept [1, B, H] so Y is one Concat."""
    op, inputs = node.op_type, list(node.inputs) + [None] * 8
    x, w, r, b = inputs[:4]
    init_h = inputs[5]
    init_c = inputs[6] if op == "LSTM" else None
    peep = inputs[7] if op == "LSTM" else None
    hidden, gates, lbr = attr(node, "hidden_size"), _GATES[op], attr(node, "linear_before_reset", 0)
    layout, direction = attr(node, "layout", 0), attr(node, "direction", "forward")
    wanted = [bool(v.name and (v.uses() or v.is_graph_output())) for v in node.outputs] + [False] * 3
    if layout:  # [B, T, I] -> [T, B, I]; states [B, D, H] -> [D, B, H]
        x = e.op("Transpose", x, perm=[1, 0, 2])
        init_h = e.op("Transpose", init_h, perm=[1, 0, 2]) if init_h is not None else None
        init_c = e.op("Transpose", init_c, perm=[1, 0, 2]) if init_c is not None else None
    steps = static_shape(node.inputs[0])[1 if layout else 0]
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    dtype = (x.dtype or ir.DataType.FLOAT).numpy()
    batch = static_shape(x)[1] if static_shape(x) is not None else None
    if isinstance(batch, int):  # a constant keeps every shape static for the rules
        zero_state = e.const(np.zeros((1, batch, hidden), dtype=dtype), hint="zero_state")
    else:
        shape = e.op("Concat", e.ints([1]), e.op("Slice", e.op("Shape", x), e.ints([1]), e.ints([2])),
                     e.ints([hidden]), axis=0)
        zero_state = e.op("ConstantOfShape", shape, value=ir.tensor(np.zeros(1, dtype=dtype)))
    ys, last_h, last_c = [], [], []
    for d, backwards in enumerate(reverse):
        pick = lambda v: e.op("Gather", v, e.const(d, np.int64), axis=0)  # noqa: E731
        xw = e.op("MatMul", x, e.op("Transpose", pick(w), perm=[1, 0]))  # [T, B, gates*H]
        r_t = e.op("Transpose", pick(r), perm=[1, 0])  # [H, gates*H]
        r_bias = None  # GRU's linear_before_reset: the h gate's Rb stays inside the reset
        if b is not None:
            w_bias, r_bias = e.split(pick(b), [gates * hidden] * 2, axis=0, count=2)
            if op == "GRU" and lbr:
                r_zr, r_bias = e.split(r_bias, [2 * hidden, hidden], axis=0, count=2)
                w_bias = e.op("Add", w_bias, e.op("Concat", r_zr, e.const(np.zeros(hidden, dtype)), axis=0))
            else:
                w_bias, r_bias = e.op("Add", w_bias, r_bias), None
            xw = e.op("Add", xw, w_bias)
        x_steps = e.split(xw, [1] * steps, axis=0, count=steps)  # each [1, B, gates*H]
        h, c = (zero_state if v is None else v if len(reverse) == 1 else e.split(v, [1, 1], axis=0, count=2)[d]
                for v in (init_h, init_c))  # [1, B, H]
        peeps = e.split(pick(peep), [hidden] * 3, axis=0, count=3) if peep is not None else None
        if op == "GRU":
            r_zr, r_h = e.split(r_t, [2 * hidden, hidden], axis=1, count=2)
        outs: dict[int, ir.Value] = {}
        for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
            x_t = x_steps[t]
            if op == "RNN":
                h = e.op("Tanh", e.op("Add", x_t, e.op("MatMul", h, r_t)))
            elif op == "GRU":  # gates z, r, h
                x_zr, x_h = e.split(x_t, [2 * hidden, hidden], axis=2, count=2)
                z, reset = e.split(e.op("Sigmoid", e.op("Add", x_zr, e.op("MatMul", h, r_zr))), [hidden] * 2,
                                   axis=2, count=2)
                if lbr:
                    recur = e.op("MatMul", h, r_h)
                    recur = e.op("Add", recur, r_bias) if r_bias is not None else recur
                    cand = e.op("Tanh", e.op("Add", x_h, e.op("Mul", reset, recur)))
                else:
                    cand = e.op("Tanh", e.op("Add", x_h, e.op("MatMul", e.op("Mul", reset, h), r_h)))
                h = e.op("Add", cand, e.op("Mul", z, e.op("Sub", h, cand)))  # (1 - z) cand + z h
            else:  # LSTM, gates i, o, f, c; peepholes i, o, f
                pre = e.op("Add", x_t, e.op("MatMul", h, r_t))
                if peeps is None:
                    sig, pre_c = e.split(pre, [3 * hidden, hidden], axis=2, count=2)
                    i_g, o_g, f_g = e.split(e.op("Sigmoid", sig), [hidden] * 3, axis=2, count=3)
                    c = e.op("Add", e.op("Mul", f_g, c), e.op("Mul", i_g, e.op("Tanh", pre_c)))
                else:
                    pre_i, pre_o, pre_f, pre_c = e.split(pre, [hidden] * 4, axis=2, count=4)
                    i_g = e.op("Sigmoid", e.op("Add", pre_i, e.op("Mul", peeps[0], c)))
                    f_g = e.op("Sigmoid", e.op("Add", pre_f, e.op("Mul", peeps[2], c)))
                    c = e.op("Add", e.op("Mul", f_g, c), e.op("Mul", i_g, e.op("Tanh", pre_c)))
                    o_g = e.op("Sigmoid", e.op("Add", pre_o, e.op("Mul", peeps[1], c)))
                h = e.op("Mul", o_g, e.op("Tanh", c))
            outs[t] = h
        if wanted[0]:
            ys.append(e.unsqueeze(e.op("Concat", *[outs[t] for t in range(steps)], axis=0), [1]))  # [T, 1, B, H]
        last_h.append(h)
        last_c.append(c)
    y = e.op("Concat", *ys, axis=1) if wanted[0] else None  # [T, D, B, H]
    y_h = e.op("Concat", *last_h, axis=0) if wanted[1] else None  # [D, B, H]
    y_c = e.op("Concat", *last_c, axis=0) if wanted[2] else None
    if layout:
        y = e.op("Transpose", y, perm=[2, 0, 1, 3]) if y is not None else None
        y_h = e.op("Transpose", y_h, perm=[1, 0, 2]) if y_h is not None else None
        y_c = e.op("Transpose", y_c, perm=[1, 0, 2]) if y_c is not None else None
    return [y, y_h, y_c][:len(node.outputs)]
