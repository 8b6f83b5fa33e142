"""RNN, GRU and LSTM unrolled over their sequence into the ops the ONNX spec defines them with
(``passes/recurrent.write_out``, every form of the ONNX ops), so autodiff differentiates them with
the rules those ops have, up to each kind's cap (``MAX_UNROLLED_RNN_STEPS`` 32, ``_GRU_`` 4,
``_LSTM_`` 4, never past ``MAX_UNROLLED_STEPS``); a longer sequence, one whose length is known only
at run time, or a masked one becomes a Scan per direction over the same cell, marked for reverse
mode (``REVERSE_MODE_KEY``) at any length. Used for the gradient graphs (inference graphs keep the
fused ops). A node this cannot take (an unknown activation, an input of unknown rank) stays as it
is and autodiff names ``not_unrolled``'s reason.

A masked run (``sequence_lens``) is a Scan even when it is short: each unrolled masked step cost
~210 train_step nodes (the Where masks' gradients). models/packed_lstm.py (2-layer bidirectional
LSTM, hidden 16, batch 16, ort-cpu, 1 thread), train_step nodes / session load / ms per step: the
old unrolled form T=8 7000 / 2.2 s / 3.2, T=16 14032 / 9.0 s / 9.0, T=32 28096 / 36.8 s / 21.3;
the Scan in reverse mode, remeasured with the cells on [B, H] (CPU time, a shared 2-core machine),
716 nodes at every T, 3.8 / 5.4 / 7.6 ms (T=128: 28.2; was 2.8 / 4.8 / 8.8 / 34).
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.recurrent import GATES, unknown_activations, write_out
from graphc.passes.values import onnx_opset, static_shape

__all__ = ["MAX_UNROLLED_GRU_STEPS", "MAX_UNROLLED_LSTM_STEPS", "MAX_UNROLLED_RNN_STEPS", "MAX_UNROLLED_STEPS", "UNROLLED", "not_unrolled", "unroll_recurrent"]

UNROLLED = frozenset(GATES)
# The longest unmasked sequence any kind unrolls (each kind's own cap below is lower) and the cap of
# gc.vmap's written-out layers; a longer one is a Scan whose train_step does not grow with T.
# First measured by `bench_recurrent.py --forms` (DSL LSTM / GRU 32 -> 128, batch 16, ort-cpu,
# 1 thread, a shared 2-core machine; train_step nodes, session build s, ms per step median): LSTM unrolled
# T=8 483 / 0.10 / 0.80, T=32 1299 / 0.23 / 3.18, T=64 2387 / 1.31 / 14.3, T=128 4563 / 1.07 /
# 17.6, T=512 17619 / 15.3 / 119; as a Scan in reverse mode 219 / 0.03-0.09 at every T, 1.31 /
# 4.42 / 14.3 / 17.0 / 123 (T=2048: 403). GRU unrolled 563 / 0.19 / 0.70, 1619 / 0.33 / 3.01,
# 3027 / 0.58 / 13.4, 5843 / 3.6 / 48.4, 22739 / 72.8 / 213; Scan 218 nodes, 1.08 / 7.83 / 12.4
# / 35.4 / 153 (T=2048: 509). The unrolled step is faster up to T=32, about even at 64 and no
# faster from 128 on, where its session build takes seconds. Remeasured: LSTM unrolled T=16 1.94,
# T=32 3.56-4.42, T=64 9.6-10.4, T=128 21.4 vs the Scan in reverse mode 2.94, 4.7-5.1, 9.4-9.9,
# 18.4 (GRU 1.41, 3.0-4.7, 8.4-13.4, 19.5 vs 2.19, 3.8-4.7, 7.8-12.3, 15.3). The Scan's gradient
# unrolled instead (its steps reading xw off one Split) is 1.2-1.5x slower than the unrolled layer
# at every T, and rules_control.MAX_SCAN_UNROLL keeps a Scan longer than this cap in reverse mode.
# Since then every cell steps on [B, H] matrices (``passes/recurrent._rows_unrolled``) and a Scan
# written out for a layer is differentiated in reverse mode at any length (``REVERSE_MODE_KEY``).
MAX_UNROLLED_STEPS = 64
# Each kind's own cap (the lower of it and MAX_UNROLLED_STEPS applies; gc.vmap's written-out layers
# take MAX_UNROLLED_STEPS alone). The RNN's: ``bench_recurrent.py --model lm`` RNN
# 256, AdamW, ort-cpu, 1 thread, CPU ms per step (thread time, interleaved, median; a shared 2-core
# machine), batch 16, unrolled vs Scan in reverse mode: T=8 4.47 / 4.74, T=32 10.58 / 10.54,
# T=64 17.5 / 16.8, T=128 (a Scan either way) 37.3; the [1, B, H] form 4.54, 10.85, -, 38.1
# (PyTorch 7.19, 19.5, 33.6, 73.6).
MAX_UNROLLED_RNN_STEPS = 32
# The GRU's own cap. Same bench, GRU 256, unrolled vs Scan in
# reverse mode, batch 16: T=8 8.33 / 7.93, T=16 12.47 / 11.47, T=32 18.77 / 17.62 (20.61 / 18.97
# in another run), T=64 37.2 / 33.0; batch 64: T=4 10.20 / 10.10, T=32 59.5 / 58.7. The [1, B, H]
# form unrolled, batch 16: T=32 21.4, T=64 38.1, T=128 (Scan) 65.3 vs 63.1 now (PyTorch 34.9,
# 65.2, 123). Its step on rows as one Gemm(h, R) [B, 3H] (linear_before_reset's Rb its bias, z and
# r adding x_t after it) instead of two (z and r folding x_t in, h): T=16 13.1 vs 12.5, T=64 38.0
# vs 38.1, so two.
MAX_UNROLLED_GRU_STEPS = 4
# The LSTM's own cap. Its cell steps on [B, H] matrices (one
# Gemm(h, R, x_t) a step, ``passes/recurrent._rows_unrolled``), and its Scan's backward reads h off the
# tape as a factor of dR's one stacked Gemm: the Scan in reverse mode is then the faster form from
# T=16 on. ``bench_recurrent.py --model lm`` LSTM 256, AdamW, ort-cpu, 1 thread, CPU ms per step
# (thread time, interleaved, median; a shared 2-core machine), batch 16: unrolled vs Scan in
# reverse mode T=16 14.1 / 13.5, T=32 25.5 / 23.7, T=40 27.6 / 25.6, T=48 33.0 / 31.0, T=64 43.1
# / 40.2 (batch 64: 162 / 151). A Scan of up to ``rules_control.MAX_SCAN_UNROLL`` steps had its
# gradient unrolled (26.2 at T=32, slower than the unrolled layer), so the LSTM unrolled up to 32;
# marked for reverse mode (``REVERSE_MODE_KEY``) it is the faster form from T=8: T=4 6.84 / 6.77,
# T=8 9.04 / 8.78, T=16 15.3 / 14.8, T=32 24.3 / 22.6 (PyTorch 7.70, 9.62, 17.0, 23.5).
MAX_UNROLLED_LSTM_STEPS = 4


def unroll_recurrent(model: ir.Model) -> int:
    """Unroll, in place, every main-graph RNN/GRU/LSTM node it supports; returns how many."""
    graph = model.graph
    opset = onnx_opset(model, 17)
    count = 0
    for node in list(graph):
        if node.op_type in GATES and node.domain in ("", "ai.onnx") and not_unrolled(node) is None:
            emit = Emitter(graph, opset, f"{node.name or node.op_type}/unrolled")
            own = {"RNN": MAX_UNROLLED_RNN_STEPS, "GRU": MAX_UNROLLED_GRU_STEPS, "LSTM": MAX_UNROLLED_LSTM_STEPS}
            cap = min(MAX_UNROLLED_STEPS, own[node.op_type])
            new_outputs = write_out(emit, node, cap)
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
    unknown = unknown_activations(node)
    if unknown:
        return f"it does not know the activations {unknown}"
    shape = static_shape(node.inputs[0])
    if shape is None or len(shape) != 3:
        return "the rank of its input X is not known before run time"
    return None
