"""RNN, GRU and LSTM written out in the ops the ONNX spec defines them with (MatMul, Add, Mul, the
activations, Clip, Where): the one form of their semantics graphc writes, for autodiff (unrolled
up to a cap, else a Scan: ``autodiff/recurrent.py``), for ``gc.vmap``'s rule for mapped weights
(``dsl/vmap_rules_rnn.py``) and for float64 on onnxruntime's CPU provider, which has no double
kernels for them (``backends/doubles_recurrent.py``: its activations in ops that have some).

Every form the ONNX ops have is covered: any direction and layout, bias, initial states, LSTM
peepholes and ``input_forget``, GRU ``linear_before_reset``, ``clip`` (on the gates' inputs, not on
LSTM's h activation), any activations with their alpha/beta (``recurrent_activations``), and
``sequence_lens`` (constant or fed at run time): a row whose sequence has ended keeps its state and
emits zeros, as onnxruntime does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.evaluate import folded_array
from graphc.passes.recurrent_activations import DEFAULT_ACTIVATIONS, activation_names, activation_params, takes_params
from graphc.passes.values import REVERSE_MODE_KEY, attr, static_shape

__all__ = ["GATES", "Activation", "ActivationWriter", "op_activation", "unknown_activations", "write_out"]

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_PLAIN = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "softsign": "Softsign", "softplus": "Softplus"}

Activation = Callable[[ir.Value], ir.Value]
# (emitter, the activation's name in lower case, alpha, beta) -> the activation, emitting ops
ActivationWriter = Callable[[Emitter, str, float, float], Activation]


def unknown_activations(node: ir.Node) -> list[str]:
    """The RNN/GRU/LSTM node's activations ONNX has none of that name of (``write_out`` takes none of them)."""
    return [a for a in _activation_names(node) if takes_params(a) is None]


def _activation_names(node: ir.Node) -> list[str]:
    dirs = 2 if attr(node, "direction", "forward") == "bidirectional" else 1
    return activation_names(node.op_type, attr(node, "activations"), dirs)


def _activations(e: Emitter, node: ir.Node, clip: float | None, activation: ActivationWriter) -> list[list[Activation]]:
    """Per direction, the node's activation functions (f, g[, h]), each emitting ops."""
    names = _activation_names(node)
    params = activation_params(names, attr(node, "activation_alpha"), attr(node, "activation_beta"))
    functions = [activation(e, name.lower(), alpha, beta) for name, (alpha, beta) in zip(names, params)]
    per = len(DEFAULT_ACTIVATIONS[node.op_type])
    if clip is not None:  # bounds the gates' inputs (f, g); LSTM's h acts on the cell state unclipped
        functions = [fn if i % per == 2 else
                     (lambda v, fn=fn: fn(e.op("Clip", v, e.scalar(-clip, v), e.scalar(clip, v))))
                     for i, fn in enumerate(functions)]
    return [functions[d * per:(d + 1) * per] for d in range(len(functions) // per)]


def op_activation(e: Emitter, key: str, alpha: float, beta: float) -> Activation:
    """The activation ``key`` (lower case) as the ONNX op of that name (Affine and ScaledTanh, which
    have none, in Mul, Add and Tanh)."""
    if key in _PLAIN:
        return lambda v: e.op(_PLAIN[key], v)
    if key == "affine":
        return lambda v: e.op("Add", e.op("Mul", v, e.scalar(alpha, v)), e.scalar(beta, v))
    if key == "scaledtanh":
        return lambda v: e.op("Mul", e.op("Tanh", e.op("Mul", v, e.scalar(beta, v))), e.scalar(alpha, v))
    if key == "hardsigmoid":
        return lambda v: e.op("HardSigmoid", v, alpha=alpha, beta=beta)
    return lambda v: e.op({"leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu", "elu": "Elu"}[key], v,
                          alpha=alpha)


def write_out(e: Emitter, node: ir.Node, max_unrolled: int | None = None,
              activation: ActivationWriter = op_activation) -> list[ir.Value | None]:
    """The node's outputs (None where unused) from per-step ops, unrolled where the sequence is
    unmasked and at most ``max_unrolled`` steps long (None: never), else one Scan per direction;
    ``activation`` writes each activation. Per step and direction: one Gemm of the state with
    every gate's recurrence weights (a GRU's: z and r, then h), the input projection of every step
    (one MatMul or Gemm, biases folded in) computed once, states [B, H] (B and I known before run
    time, else [1, B, H] and MatMuls). X of unknown rank takes Scans."""
    op, inputs = node.op_type, list(node.inputs) + [None] * 8
    x, w, r, b, lens = inputs[:5]
    init_h = inputs[5]
    init_c = inputs[6] if op == "LSTM" else None
    peep = inputs[7] if op == "LSTM" else None
    hidden, gates, lbr = attr(node, "hidden_size"), GATES[op], attr(node, "linear_before_reset", 0)
    layout, direction = attr(node, "layout", 0), attr(node, "direction", "forward")
    clip = attr(node, "clip")
    wanted = [bool(v.name and (v.uses() or v.is_graph_output())) for v in node.outputs] + [False] * 3
    if layout:  # [B, T, I] -> [T, B, I]; states [B, D, H] -> [D, B, H]
        x = e.op("Transpose", x, perm=[1, 0, 2])
        init_h = e.op("Transpose", init_h, perm=[1, 0, 2]) if init_h is not None else None
        init_c = e.op("Transpose", init_c, perm=[1, 0, 2]) if init_c is not None else None
    x_shape = static_shape(node.inputs[0])
    steps = x_shape[1 if layout else 0] if x_shape is not None and len(x_shape) == 3 else None
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    clip = None if clip is None else float(clip)
    acts = _activations(e, node, clip, activation)
    dtype = (x.dtype or ir.DataType.FLOAT).numpy()
    batch = static_shape(x)[1] if static_shape(x) is not None else None
    if isinstance(batch, int):  # a constant keeps every shape static for the rules
        zero_state = e.const(np.zeros((1, batch, hidden), dtype=dtype), hint="zero_state")
    else:
        shape = e.op("Concat", e.ints([1]), e.op("Slice", e.op("Shape", x), e.ints([1]), e.ints([2])),
                     e.ints([hidden]), axis=0)
        zero_state = e.op("ConstantOfShape", shape, value=ir.tensor(np.zeros(1, dtype=dtype)))
    known = folded_array(lens)  # None for a graph input: its default may not be what is fed
    if lens is not None and known is not None and np.all(known == steps):
        lens = None  # every sequence is full: nothing to mask
    # the cell steps on [B, ...] matrices (``_rows_unrolled``), B and I known before run time (B by a name
    # at least); unrolled, the input projection is one Gemm of x's [T*B, I] rows
    rows = batch is not None and x_shape is not None and isinstance(x_shape[2], int)
    alive_lens = None if lens is None else e.op("Reshape", e.op("Cast", lens, to=int(ir.DataType.INT64)),
                                                e.ints([-1, 1] if rows else [1, -1, 1]))
    unrolled = max_unrolled is not None and isinstance(steps, int) and steps <= max_unrolled and alive_lens is None
    x_rows = e.op("Reshape", x, e.ints([-1, x_shape[2]])) if rows and unrolled else None
    ys, last_h, last_c = [], [], []
    for d, backwards in enumerate(reverse):
        pick = lambda v: e.op("Gather", v, e.const(d, np.int64), axis=0)
        w_d = pick(w)
        xw = None if x_rows is not None else e.op("MatMul", x, e.op("Transpose", w_d, perm=[1, 0]))  # [T, B, gates*H]
        r_d = pick(r)
        r_t = r_d if rows else e.op("Transpose", r_d, perm=[1, 0])  # [H, gates*H]; rows: R [gates*H, H]
        r_bias = None  # GRU's linear_before_reset: the h gate's Rb stays inside the reset
        if b is not None:
            w_bias, r_bias = e.split(pick(b), [gates * hidden] * 2, axis=0, count=2)
            if op == "GRU" and lbr:
                r_zr, r_bias = e.split(r_bias, [2 * hidden, hidden], axis=0, count=2)
                w_bias = e.op("Add", w_bias, e.op("Concat", r_zr, e.const(np.zeros(hidden, dtype)), axis=0))
            else:
                w_bias, r_bias = e.op("Add", w_bias, r_bias), None
            xw = None if x_rows is not None else e.op("Add", xw, w_bias)
        h, c = (zero_state if v is None else v if len(reverse) == 1 else e.split(v, [1, 1], axis=0, count=2)[d]
                for v in (init_h, init_c))  # [1, B, H]
        peeps = e.split(pick(peep), [hidden] * 3, axis=0, count=3) if peep is not None else None
        r_zr, r_h = e.split(r_t, [2 * hidden, hidden], axis=0 if rows else 1, count=2) if op == "GRU" else (None, None)
        weights = {"r_t": r_t, "r_zr": r_zr, "r_h": r_h, "r_bias": r_bias, "peeps": peeps, "rows": rows}

        def cell(em: Emitter, x_t, h, c, t, activations):
            """One step: (output, new h, new c), x_t [1, B, gates*H] ([B, gates*H] and states [B, H] for
            ``rows``), t the step's index."""
            new_h, new_c = _cell(em, op, x_t, h, c, weights, activations, hidden, lbr, attr(node, "input_forget", 0))
            if alive_lens is None:
                return new_h, new_h, new_c if new_c is not None else c
            alive = em.op("Less", t, alive_lens)  # rows whose sequence has ended keep their state, emit zeros
            return (em.op("Where", alive, new_h, em.const(np.zeros((), dtype))), em.op("Where", alive, new_h, h),
                    em.op("Where", alive, new_c, c) if new_c is not None else c)

        if rows:
            h, c = (e.op("Reshape", v, e.ints([-1, hidden])) if v is not None else None
                    for v in (h, c if op == "LSTM" else None))
            for v in (h, c) if op == "LSTM" else (h,):  # B by name: shapes equal
                v.shape = ir.Shape([batch, hidden])
        if x_rows is not None:
            bias = [w_bias] if b is not None else []
            y_d, h, c = _rows_unrolled(e, cell, e.op("Gemm", x_rows, w_d, *bias, transB=1), h, c, steps,
                                       hidden, gates, batch, backwards, acts[d], wanted[0])
            if wanted[0]:
                ys.append(y_d)
        elif not unrolled:
            y_d, h, c_last = _scan_steps(e, node, cell, xw, h, c if op == "LSTM" else None, backwards,
                                         alive_lens is not None, clip, d, activation, rows)
            c = c_last if op == "LSTM" else c
            if wanted[0]:
                ys.append(e.unsqueeze(y_d, [1]) if rows else y_d)
        else:
            x_steps = e.split(xw, [1] * steps, axis=0, count=steps)  # each [1, B, gates*H]
            outs: dict[int, ir.Value] = {}
            for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
                outs[t], h, c = cell(e, x_steps[t], h, c, e.const(np.array(t, np.int64)), acts[d])
            if wanted[0]:
                ys.append(e.unsqueeze(e.op("Concat", *[outs[t] for t in range(steps)], axis=0), [1]))  # [T, 1, B, H]
        last_h.append(h)
        last_c.append(c)
    y = e.op("Concat", *ys, axis=1) if wanted[0] else None  # [T, D, B, H]
    y_h = e.op("Concat", *last_h, axis=0) if wanted[1] else None  # [D, B, H]
    y_c = e.op("Concat", *last_c, axis=0) if wanted[2] else None
    if rows:  # the states were [B, H]
        y_h, y_c = (e.op("Reshape", v, e.ints([len(reverse), -1, hidden])) if v is not None else None
                    for v in (y_h, y_c))
    if layout:
        y = e.op("Transpose", y, perm=[2, 0, 1, 3]) if y is not None else None
        y_h = e.op("Transpose", y_h, perm=[1, 0, 2]) if y_h is not None else None
        y_c = e.op("Transpose", y_c, perm=[1, 0, 2]) if y_c is not None else None
    return [y, y_h, y_c][:len(node.outputs)]


def _cell(e: Emitter, op: str, x_t, h, c, weights: dict, activations, hidden: int, lbr: int, input_forget: int):
    """One step of an RNN, GRU or LSTM direction: the new (h, c) (c None but for LSTM)."""
    f_act, g_act, h_act = (list(activations) + [None, None])[:3]
    rows = weights["rows"]
    axis = 1 if rows else 2

    def affine(a, r, bias):  # a R' + bias: one Gemm on rows (R [n, H], as stored), else MatMul and Add
        if rows:
            return e.op("Gemm", a, r, *([bias] if bias is not None else []), transB=1)
        product = e.op("MatMul", a, r)
        return product if bias is None else e.op("Add", bias, product)

    if op == "RNN":
        return f_act(affine(h, weights["r_t"], x_t)), None
    if op == "GRU":  # gates z, r, h
        x_zr, x_h = e.split(x_t, [2 * hidden, hidden], axis=axis, count=2)
        z, reset = e.split(f_act(affine(h, weights["r_zr"], x_zr)), [hidden] * 2, axis=axis, count=2)
        if lbr:
            cand = g_act(e.op("Add", x_h, e.op("Mul", reset, affine(h, weights["r_h"], weights["r_bias"]))))
        else:
            cand = g_act(affine(e.op("Mul", reset, h), weights["r_h"], x_h))
        return e.op("Add", cand, e.op("Mul", z, e.op("Sub", h, cand))), None  # (1 - z) cand + z h
    return _lstm_step(e, affine(h, weights["r_t"], x_t), c, weights["peeps"], f_act, g_act, h_act, hidden,
                      input_forget, axis)


def _scan_steps(e: Emitter, node: ir.Node, cell, xw: ir.Value, h: ir.Value, c: ir.Value | None, backwards: bool,
                masked: bool, clip: float | None, direction: int, activation: ActivationWriter, rows: bool = False):
    """One direction as a Scan over xw [T, B, gates*H] (and the step indices, for
    ``sequence_lens``) whose body is ``cell``, differentiated in reverse mode at any length
    (``REVERSE_MODE_KEY``): (Y of this direction [T, 1, B, H], last h, last c).
    ``rows``: the states are [B, H], the body's x_t [B, gates*H] is read as it is and Y is [T, B, H]."""
    body = ir.Graph([], [], nodes=[], name=e.fresh("cell"))
    be = Emitter(body, e.opset, e.scope, names=e._names)
    be.source = e.source
    state_type = h.type or ir.TensorType(xw.dtype)
    # the body's inputs ranked ([1, B, H] states, [B, H] for rows; x_t [B, gates*H]), as gc.vmap's rules need
    hidden = attr(node, "hidden_size")
    batch = next((s[-2] for s in (h.shape, c is not None and c.shape) if s), None)
    state_shape = [batch, hidden] if rows else [1, batch, hidden]
    h_in = ir.Value(name=be.fresh("h"), type=state_type, shape=ir.Shape(state_shape))
    states = [h_in]
    if c is not None:
        states.append(ir.Value(name=be.fresh("c"), type=state_type, shape=ir.Shape(state_shape)))
    x_in = ir.Value(name=be.fresh("x_t"), type=ir.TensorType(xw.dtype or ir.DataType.FLOAT),
                    shape=ir.Shape([batch, GATES[node.op_type] * hidden]))
    t_in = ir.Value(name=be.fresh("t"), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([])) if masked else None
    body.inputs.extend([*states, x_in, *([t_in] if masked else [])])
    acts = _activations(be, node, clip, activation)[direction]
    x_t = x_in if rows else be.unsqueeze(x_in, [0])
    out, new_h, new_c = cell(be, x_t, h_in, states[1] if c is not None else None, t_in, acts)
    results = [be.op("Identity", new_h)] + ([be.op("Identity", new_c)] if c is not None else []) + [be.op("Identity", out)]
    for value, like in zip(results, [*states, h_in]):
        value.type = like.type
    body.outputs.extend(results)
    scanned = [xw]
    if masked:
        steps = e.op("Gather", e.op("Shape", xw), e.const(0, np.int64))
        scanned.append(e.op("Range", e.const(0, np.int64), steps, e.const(1, np.int64)))
    outs = e.op("Scan", h, *([c] if c is not None else []), *scanned, num_outputs=len(results), body=body,
                num_scan_inputs=len(scanned), scan_input_directions=[int(backwards)] * len(scanned),
                scan_output_directions=[int(backwards)])
    outs[0].producer().metadata_props[REVERSE_MODE_KEY] = "true"
    for value, like in zip(outs, results):
        value.type = like.type
    return outs[-1], outs[0], outs[1] if c is not None else c


def _lstm_step(e: Emitter, pre, c, peeps, f_act, g_act, h_act, hidden: int, input_forget: int, axis: int = 2):
    """One LSTM step from the gates' inputs ``pre`` (i, o, f, c along ``axis``; peepholes i, o, f): the
    new (h, c). A clip is inside the activations, so it bounds each gate's whole input, peephole term
    included (onnxruntime)."""
    if peeps is None and not input_forget:  # one activation over the three sigmoid-like gates
        sig, pre_c = e.split(pre, [3 * hidden, hidden], axis=axis, count=2)
        i_g, o_g, f_g = e.split(f_act(sig), [hidden] * 3, axis=axis, count=3)
        new_c = e.op("Add", e.op("Mul", f_g, c), e.op("Mul", i_g, g_act(pre_c)))
    else:
        pre_i, pre_o, pre_f, pre_c = e.split(pre, [hidden] * 4, axis=axis, count=4)
        peep = (lambda v, k, state: e.op("Add", v, e.op("Mul", peeps[k], state))) if peeps is not None \
            else (lambda v, k, state: v)
        i_g = f_act(peep(pre_i, 0, c))
        f_g = e.op("Sub", e.scalar(1.0, i_g), i_g) if input_forget else f_act(peep(pre_f, 2, c))
        new_c = e.op("Add", e.op("Mul", f_g, c), e.op("Mul", i_g, g_act(pre_c)))
        o_g = f_act(peep(pre_o, 1, new_c))
    return e.op("Mul", o_g, h_act(new_c)), new_c


def _rows_unrolled(e: Emitter, cell, xw: ir.Value, h: ir.Value, c: ir.Value, steps: int, hidden: int, gates: int,
                   batch, backwards: bool, activations, want_y: bool):
    """One direction unrolled on matrices: xw [T*B, gates*H] (one Gemm, biases in) split
    by steps, the states h (and an LSTM's c) [B, H], each step's gates' inputs one
    ``Gemm(h, R, x_t, transB=1)`` (a GRU's: one for z and r, one for h). Its
    gradient then reads every step's h and dgates as they are (no per-step Reshape into the stacked
    rows of dR's Gemm) and dR comes out [gates*H, H] without a Transpose. (Y of this direction
    [T, 1, B, H] or None, last h [B, H], last c [B, H]).

    ``bench_recurrent.py --model lm`` (LSTM 256, batch 16, AdamW, ort-cpu; 1-thread CPU ms per step,
    interleaved, median), the [1, B, H] form (MatMul + Add a step, dR's rows Reshaped per step) vs
    this: T=16 13.9 / 13.5, T=32 24.4 / 23.6, T=64 42.9-43.2 / 42.0-42.9 (PyTorch 41.3). The same
    cell in the Scan (``_scan_steps(rows=True)``), T=128: 72.1 -> 69.1 (PyTorch 71.6) once reverse
    mode reads h off its tape as a factor of dR's stacked Gemm (accumulating dR in the backward's
    body instead, a [4H, H] Add a step: 77.9 vs 80.4 in one run); the Scan is then faster than
    this form from T=16 on (``autodiff/recurrent.MAX_UNROLLED_LSTM_STEPS``)."""
    x_steps = (xw,)
    if steps > 1:  # B known at run time (h is [B, H]): T copies of it
        sizes = e.ints([batch] * steps) if isinstance(batch, int) else \
            e.op("Expand", e.op("Gather", e.op("Shape", h), e.ints([0])), e.ints([steps]))
        x_steps = e.op("Split", xw, sizes, axis=0, num_outputs=steps)
    for x_t in x_steps:  # B by name, so the rules see the steps' operands' shapes equal
        x_t.shape = ir.Shape([batch, gates * hidden])
    outs: dict[int, ir.Value] = {}
    for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
        outs[t], h, c = cell(e, x_steps[t], h, c, None, activations)
    y = e.op("Reshape", e.op("Concat", *[outs[t] for t in range(steps)], axis=0), e.ints([steps, 1, -1, hidden])) \
        if want_y else None
    return y, h, c
