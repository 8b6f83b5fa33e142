"""``gc.vmap``'s batching rule for the recurrent ops (RNN, GRU, LSTM), added to ``vmap_rules.RULES``: the
examples folded into the op's batch dim N where the weights are the same for all, as its sequences side by
side; mapped weights (an ensemble) either fold them into the hidden size, ``B`` cells of ``H`` units as one
of ``B*H`` with block-diagonal weights (small ``B*H``), or write the op out as a Scan over time whose cell's
MatMuls are batched over the examples' weights; both differentiable."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap_rules import (
    RULES,
    Arg,
    Batching,
    NoRule,
    as_batched,
    node_attrs,
    reemit,
    rewrite,
)
from graphc.dsl.vmap_rules_conv import known_shape, merge_dims, split_dim
from graphc.model import SOURCE_KEY
from graphc.passes.autodiff import recurrent as unrolling
from graphc.passes.autodiff.recurrent import not_unrolled
from graphc.passes.emit import Emitter
from graphc.passes.recurrent import write_out
from graphc.passes.values import static_shape

__all__: list[str] = []

_X, _LENS, _H0, _C0 = 0, 4, 5, 6  # the inputs of ONNX's RNN/GRU/LSTM that hold N
_W, _R, _B, _P = 1, 2, 3, 7  # the weights: [D, G*H, I], [D, G*H, H], [D, 2*G*H], peepholes [D, 3*H]
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _into_n(b: Batching, a: Arg, value: ir.Value, n_axis: int) -> Tensor:
    """An input with N at ``n_axis``, each example's batch side by side in one of ``B*N``."""
    if not a.batched:  # the same for all examples: repeated, example-major as the batched ones
        repeats = [ops.const_i64([1] * n_axis), b.batch_shape(), ops.const_i64([1] * (a.t.ndim - n_axis - 1))]
        return ops.emit("Tile", [a.t, ops.concat(repeats)])
    shape = known_shape(b, a, value)
    if n_axis:
        perm = [*range(1, n_axis + 1), 0, *range(n_axis + 1, a.t.ndim)]
        return merge_dims(ops.transpose(a.t, perm), n_axis, shape and tuple(shape[p] for p in perm))
    return merge_dims(a.t, 0, shape)


def _out_of_n(b: Batching, y: Tensor, n_axis: int) -> Tensor:
    """An output with ``B*N`` at ``n_axis`` as ``(B, ..., N, ...)``."""
    y = split_dim(b, y, n_axis)
    return ops.transpose(y, [n_axis, *(i for i in range(y.ndim) if i != n_axis)]) if n_axis else y


def _recurrent(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """RNN/GRU/LSTM of mapped sequences (or initial states, or lengths): one run over ``B*N``
    sequences; mapped weights: ``_in_hidden``."""
    if any(a is not None and a.batched for i, a in enumerate(args) if i not in (_X, _LENS, _H0, _C0)):
        return _mapped_weights(b, node, args)
    layout = int(node_attrs(node).get("layout", 0))
    x_n, state_n = (1, 1) if layout == 0 else (0, 0)  # X (T, N, I) / (N, T, I); states (D, N, H) / (N, D, H)
    ins = [None if a is None else a.t for a in args]
    ins[_X] = _into_n(b, Arg(as_batched(b, args[_X]), True), node.inputs[_X], x_n)
    for i, axis in ((_LENS, 0), (_H0, state_n), (_C0, state_n)):
        if i < len(args) and args[i] is not None:
            ins[i] = _into_n(b, args[i], node.inputs[i], axis)
    outs = reemit(node, ins)
    # Y (T, D, N, H) / (N, T, D, H); Y_h, Y_c as the states
    y_n = 2 if layout == 0 else 0
    return [Arg(_out_of_n(b, y, y_n if k == 0 else state_n), True) for k, y in enumerate(outs)]


RULES.update(dict.fromkeys(("RNN", "GRU", "LSTM"), _recurrent))

BLOCK_DIAGONAL_UNITS = 64
"""The most units ``B*H`` that mapped weights fold into one op (``_in_hidden``); beyond, and for
mapped lengths or a mapped size not static, the op is written out (``_written_out``)."""


def _mapped_weights(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Mapped weights (an ensemble): ``_in_hidden`` up to ``BLOCK_DIAGONAL_UNITS``, else ``_written_out``.
    The fold does ``B`` times the MatMul work (its zero blocks), the written-out form ``B`` cells' own.
    ``scripts/bench_vmap_rnn.py``: an LSTM ensemble, each member on its own sequences (T 50, N 16, I 32,
    float32, ort-cpu, 1 thread, a shared 2-core machine), median ms forward / forward+backward (``gc.grad``
    by every stacked weight), fold vs written out, and the Scan over the examples (forward only: autodiff
    refuses a recurrent op in its body):
    B*H 32 (B 4, H 8) 0.28 / 1.34 vs 0.46 / 2.11 (0.41); 64 (B 4, H 16) 0.49 / 3.04 vs 0.62 / 2.90 (0.47);
    128 (B 16, H 8) 2.74 / 16.2 vs 1.17 / 9.24 (1.64); 256 (B 16, H 16) 10.1 / 40.5 vs 1.78 / 12.0 (1.95),
    (B 4, H 64) 14.6 / 56.5 vs 2.06 / 34.4 (1.52); 512 (B 64, H 8) 54.6 / 396 vs 8.49 / 30.6 (10.5); 1024
    (B 64, H 16) 397 / 2604 vs 26.5 / 80.5 (21.1), (B 16, H 64) 147 / 2366 vs 28.0 / 135 (22.1); 4096 (B 64,
    H 64) 8188 (a forward, timed with the fold's first version; the script skips it) vs 138 / 1196 (90.6)."""
    r_shape = static_shape(node.inputs[_R])
    hidden = r_shape[-1] if r_shape else None
    lens_mapped = args[_LENS] is not None and args[_LENS].batched
    if not lens_mapped and isinstance(b.size, int) and isinstance(hidden, int) and \
            b.size * hidden <= BLOCK_DIAGONAL_UNITS:
        return _in_hidden(b, node, args, hidden)
    return _written_out(b, node, args)


def _written_out(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Mapped weights: the node written out in standard ops (``passes.recurrent.write_out``, what
    gradients differentiate), those ops rewritten by their own rules: the cell's MatMuls batched over
    the examples' weights. Unmasked runs of at most ``autodiff.recurrent.MAX_UNROLLED_STEPS`` steps
    (read at each call) are unrolled, as autodiff unrolls an un-vmapped layer, else one Scan per
    direction, differentiated in reverse mode (``autodiff/reverse_mode.py``). Before reverse mode
    ran the forward once and kept the cell's products, that Scan's gradient ran the forward twice and
    recomputed each step's cell in a backward Loop adding into a ``(B, H, G*H)`` weight gradient (the
    Loop 189 of 303 ms, LSTM B 64 H 64 T 50 N 16 I 32, ort-cpu). Forward+backward ms then, Scan vs
    unrolled (``bench_vmap_rnn.py``): LSTM H 64 177 vs 130, GRU H 64 203 vs 110, RNN H 64 42 vs 37.
    Measured no faster: the Scan's gradient unrolled (154 ms for that LSTM), the input projection as
    one ``(B, T*N, I) @ (B, I, G*H)``."""
    why = not_unrolled(node)
    if why is not None:
        raise NoRule(f"mapped weights, and {why}")
    opset = b.builder.opset
    graph = ir.Graph([], [], nodes=[], opset_imports={"": opset}, name="written_out")
    emit = Emitter(graph, opset, f"{node.name or node.op_type}/written_out")
    emit.source = node.metadata_props.get(SOURCE_KEY)
    outs = write_out(emit, node, unrolling.MAX_UNROLLED_STEPS)
    made = [v for v in outs if v is not None]
    found = iter(rewrite(b, list(graph), {id(n) for n in graph}, {}, made, outer=dict(b.made)))
    for written in graph:  # no longer a use of the body's values (only these nodes read them)
        for i in range(len(written.inputs)):
            written.replace_input_with(i, None)
    return [None if v is None else Arg(*next(found)) for v in outs]


def _in_hidden(b: Batching, node: ir.Node, args: list, hidden: int) -> list[Arg]:
    """Mapped weights, of a static mapped size ``B`` and ``hidden`` units, shared lengths: the ``B``
    examples as one cell of ``B*H`` units, example ``e``'s units at ``e*H`` in each gate. Every gate is
    unit by unit (activations, clip, LSTM's ``input_forget`` and peepholes, GRU's reset either side of
    the product), so block-diagonal ``R`` (and ``W`` where the sequences are mapped too) keep the
    examples apart; the MatMuls do ``B`` times the work of ``B`` separate cells (the zero blocks)."""
    size, gates = b.size, _GATES[node.op_type]
    ins = [None if a is None else a.t for a in args]
    x_mapped = args[_X].batched
    ins[_X] = _fold(args[_X].t) if x_mapped else args[_X].t
    ins[_W] = _block_diagonal(b, as_batched(b, args[_W]), gates, hidden, x_mapped)
    ins[_R] = _block_diagonal(b, as_batched(b, args[_R]), gates, hidden, True)
    for i, rows in ((_B, 2 * gates), (_P, 3)):
        if i < len(args) and args[i] is not None:  # [D, rows*H] as [D, rows*H, 1] gate by gate
            vector = _by_gate(ops.unsqueeze(as_batched(b, args[i]), [-1]), rows, hidden)
            ins[i] = ops.emit("Reshape", [vector, ops.const_i64([0, -1])])
    for i in (_H0, _C0):
        if i < len(args) and args[i] is not None:
            ins[i] = _fold(as_batched(b, args[i]))
    outs = reemit(node, ins, node_attrs(node, hidden_size=size * hidden))
    return [Arg(_unfold(size, hidden, y), True) for y in outs]


def _by_gate(w: Tensor, gates: int, hidden: int) -> Tensor:
    """Mapped ``(B, D, gates*H, K)`` as ``(D, gates, B, H, K)``."""
    return ops.transpose(ops.emit("Reshape", [w, ops.const_i64([0, 0, gates, hidden, -1])]), [1, 2, 0, 3, 4])


def _block_diagonal(b: Batching, w: Tensor, gates: int, hidden: int, diagonal: bool) -> Tensor:
    """Mapped ``(B, D, gates*H, K)`` as one ``(D, gates*B*H, B*K)`` weight, example ``e``'s block at
    rows ``g*B*H + e*H`` and columns ``e*K`` (``diagonal``; else ``(D, gates*B*H, K)``, the rows only)."""
    w = _by_gate(w, gates, hidden)
    if diagonal:  # (D, G, B, H, 1, K) * eye (B, 1, B, 1): (D, G, B, H, B, K)
        eye = np.eye(b.size).reshape(b.size, 1, b.size, 1)
        w = ops.unsqueeze(w, [4]) * ops.lift(eye, w)
    return ops.emit("Reshape", [w, ops.const_i64([0, gates * b.size * hidden, -1])])


def _fold(t: Tensor) -> Tensor:
    """Mapped ``(B, ..., K)`` as ``(..., B*K)``: each example's features side by side."""
    r = t.ndim
    moved = ops.transpose(t, [*range(1, r - 1), 0, r - 1])
    return ops.emit("Reshape", [moved, ops.const_i64([0] * (r - 2) + [-1])])


def _unfold(size: int, hidden: int, y: Tensor) -> Tensor:
    """An output ``(..., B*H)`` as mapped ``(B, ..., H)``."""
    r = y.ndim
    y = ops.emit("Reshape", [y, ops.const_i64([0] * (r - 1) + [size, hidden])])
    return ops.transpose(y, [r - 1, *range(r - 1), r])
