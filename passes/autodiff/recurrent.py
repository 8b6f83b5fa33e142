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
                if old.name and (old.uses() or old.is_graph_output()):
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


def _unroll(e: Emitter, node: ir.Node) -> list[ir.Value]:
    op, inputs = node.op_type, list(node.inputs) + [None] * 8
    x, w, r, b = inputs[:4]
    init_h = inputs[5]
    init_c = inputs[6] if op == "LSTM" else None
    peep = inputs[7] if op == "LSTM" else None
    hidden, gates = attr(node, "hidden_size"), _GATES[op]
    layout, direction = attr(node, "layout", 0), attr(node, "direction", "forward")
    if layout:  # [B, T, I] -> [T, B, I]; states [B, D, H] -> [D, B, H]
        x = e.op("Transpose", x, perm=[1, 0, 2])
        init_h = e.op("Transpose", init_h, perm=[1, 0, 2]) if init_h is not None else None
        init_c = e.op("Transpose", init_c, perm=[1, 0, 2]) if init_c is not None else None
    steps = static_shape(node.inputs[0])[1 if layout else 0]
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    dtype = (x.dtype or ir.DataType.FLOAT).numpy()
    batch = static_shape(x)[1] if static_shape(x) is not None else None
    if isinstance(batch, int):  # a constant keeps every shape static for the rules
        zero_state = e.const(np.zeros((batch, hidden), dtype=dtype), hint="zero_state")
    else:
        zero_state = e.op("ConstantOfShape", e.op("Concat", e.op("Slice", e.op("Shape", x), e.ints([1]), e.ints([2])),
                                                 e.ints([hidden]), axis=0), value=ir.tensor(np.zeros(1, dtype=dtype)))
    ys, last_h, last_c = [], [], []
    for d, backwards in enumerate(reverse):
        pick = lambda v: e.op("Gather", v, e.const(d, np.int64), axis=0)  # noqa: E731
        w_d, r_d = pick(w), pick(r)
        xw = e.op("MatMul", x, e.op("Transpose", w_d, perm=[1, 0]))  # [T, B, gates*H]
        r_bias = None
        if b is not None:
            b_d = e.op("Split", pick(b), e.ints([gates * hidden, gates * hidden]), axis=0, num_outputs=2)
            xw = e.op("Add", xw, b_d[0])
            r_bias = b_d[1]
        h = pick(init_h) if init_h is not None else zero_state
        c = pick(init_c) if init_c is not None else zero_state
        peeps = e.op("Split", pick(peep), e.ints([hidden] * 3), axis=0, num_outputs=3) if peep is not None else None
        r_parts = e.op("Split", r_d, e.ints([hidden] * gates), axis=0, num_outputs=gates) if gates > 1 else (r_d,)
        rb_parts = (e.op("Split", r_bias, e.ints([hidden] * gates), axis=0, num_outputs=gates)
                    if r_bias is not None and gates > 1 else (r_bias,))
        outs: dict[int, ir.Value] = {}
        for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
            x_t = e.op("Gather", xw, e.const(t, np.int64), axis=0)  # [B, gates*H]
            x_parts = e.op("Split", x_t, e.ints([hidden] * gates), axis=1, num_outputs=gates) if gates > 1 else (x_t,)

            def recur(k, state):  # state R_k^T + Rb_k
                value = e.op("MatMul", state, e.op("Transpose", r_parts[k], perm=[1, 0]))
                return e.op("Add", value, rb_parts[k]) if rb_parts[0] is not None else value

            if op == "RNN":
                h = e.op("Tanh", e.op("Add", x_parts[0], recur(0, h)))
            elif op == "GRU":  # gates z, r, h
                z = e.op("Sigmoid", e.op("Add", x_parts[0], recur(0, h)))
                reset = e.op("Sigmoid", e.op("Add", x_parts[1], recur(1, h)))
                if attr(node, "linear_before_reset", 0):
                    cand = e.op("Tanh", e.op("Add", x_parts[2], e.op("Mul", reset, recur(2, h))))
                else:
                    cand = e.op("Tanh", e.op("Add", x_parts[2], recur(2, e.op("Mul", reset, h))))
                h = e.op("Add", e.op("Mul", e.op("Sub", e.scalar(1.0, z), z), cand), e.op("Mul", z, h))
            else:  # LSTM, gates i, o, f, c; peepholes i, o, f
                pre = [e.op("Add", x_parts[k], recur(k, h)) for k in range(4)]
                if peeps is not None:
                    pre[0], pre[2] = e.op("Add", pre[0], e.op("Mul", peeps[0], c)), e.op("Add", pre[2], e.op("Mul", peeps[2], c))
                i_g, f_g, c_g = e.op("Sigmoid", pre[0]), e.op("Sigmoid", pre[2]), e.op("Tanh", pre[3])
                c = e.op("Add", e.op("Mul", f_g, c), e.op("Mul", i_g, c_g))
                o_in = e.op("Add", pre[1], e.op("Mul", peeps[1], c)) if peeps is not None else pre[1]
                h = e.op("Mul", e.op("Sigmoid", o_in), e.op("Tanh", c))
            outs[t] = h
        ys.append(e.op("Concat", *[e.unsqueeze(outs[t], [0]) for t in range(steps)], axis=0))  # [T, B, H]
        last_h.append(e.unsqueeze(h, [0]))
        last_c.append(e.unsqueeze(c, [0]))
    y = e.op("Concat", *[e.unsqueeze(v, [1]) for v in ys], axis=1)  # [T, D, B, H]
    y_h, y_c = e.op("Concat", *last_h, axis=0), e.op("Concat", *last_c, axis=0)  # [D, B, H]
    if layout:
        y = e.op("Transpose", y, perm=[2, 0, 1, 3])
        y_h, y_c = e.op("Transpose", y_h, perm=[1, 0, 2]), e.op("Transpose", y_c, perm=[1, 0, 2])
    return [y, y_h, y_c][:len(node.outputs)]
