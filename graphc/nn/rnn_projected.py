"""One layer of torch's LSTM with projections (``proj_size`` P > 0), which ONNX's LSTM op cannot hold:
written in the DSL's ops (one MatMul of the whole sequence's inputs, then per step the recurrent MatMul, the
gates, ``c = f c + i g`` and ``h = (o tanh(c)) @ weight_hr.T``), so autodiff differentiates it as any graph: a
static sequence length of up to ``MAX_WRITTEN_OUT_STEPS`` written out step by step, a longer or symbolic one
(``T`` read at run time) as a ``gc.scan`` per direction (the reverse one over the steps flipped, its outputs
flipped back), whose gradient is a Scan in reverse mode. A packed sequence's row past its length keeps its
state and emits zeros, as torch's packed run (the reverse direction starts at each row's last step)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.control import scan
from graphc.dsl.ops_array import arange, chunk
from graphc.dsl.ops_nn import linear
from graphc.dsl.tensor import Tensor
from graphc.passes.values import REVERSE_MODE_KEY

# A static length up to this is written out step by step, a longer one is a Scan marked for reverse mode (its
# backward a Scan too, not unrolled up to autodiff's MAX_SCAN_UNROLL). Input 32, hidden 64, proj 16, batch 16,
# gc.grad of sum(out ** 2), ort-cpu 1 thread, CPU ms per step (median of 60-400, interleaved; a shared 2-core
# machine), written out vs Scan (train nodes): T=1 0.055 / 0.066 (90 / 56), T=2 0.086 / 0.097, T=4 0.147 /
# 0.154, T=5 0.176 / 0.180, T=6 0.210 / 0.202, T=8 0.287 / 0.265 (425 / 56), T=16 0.62 / 0.47 (800 / 55), T=32
# 3.7 / 1.34, T=128 34.2 / 4.85 (6063 / 56); 2 layers bidirectional T=2 0.299 / 0.340, T=4 0.626 / 0.630, T=8
# 1.99 / 1.40. The Scan with its gradient unrolled (not marked) was no faster than either: T=4 0.176, T=8 0.359.
# The forward alone (inference) is about even: T=8 0.090 / 0.092, T=16 0.168 / 0.169, T=64 0.647 / 0.614.
MAX_WRITTEN_OUT_STEPS = 4


def projected_layer(lstm: Any, layer: int, x: Tensor, h0: Tensor | None, c0: Tensor | None,
                    lengths: Tensor | None) -> list[Tensor]:
    """``[Y (T, N, D*P), h_n (D, N, P), c_n (D, N, H)]`` of ``lstm``'s layer ``layer`` over ``x (T, N, in)``;
    ``h0 (D, N, P)``, ``c0 (D, N, H)`` (zeros if None); ``lengths`` (int32, ``[N]``) for a packed input."""
    steps = x.shape[0] if x.shape else None
    outs, finals_h, finals_c = [], [], []
    for d, suffix in enumerate(lstm._suffixes(layer)):
        w = {n: getattr(lstm, f"{n}{suffix}") for n in ("weight_ih", "weight_hh", "weight_hr")}
        b = {n: getattr(lstm, f"{n}{suffix}") if lstm.bias else None for n in ("bias_ih", "bias_hh")}
        h = _state(h0, d, lstm.proj_size, x)
        c = _state(c0, d, lstm.hidden_size, x)
        xw = linear(x, w["weight_ih"], b["bias_ih"])  # [T, N, 4H]: every step's input projection at once

        def cell(h, c, xw_t, t, w=w, b=b):
            """One step: the new (h, c) and the step's output; a row whose sequence ends before step ``t``
            (a Python int, or a 0-d int32 read in a scan) keeps its state and emits zeros."""
            i, f, g, o = chunk(xw_t + linear(h, w["weight_hh"], b["bias_hh"]), 4, dim=-1)
            c_new = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
            h_new = linear(ops.sigmoid(o) * ops.tanh(c_new), w["weight_hr"])
            if lengths is None:
                return h_new, c_new, h_new
            live = ops.unsqueeze(lengths > (ops.lift(np.int32(t)) if isinstance(t, int) else t), [1])  # [N, 1]
            return ops.where(live, h_new, h), ops.where(live, c_new, c), ops.where(live, h_new, ops.scalar(0.0, h_new))

        if isinstance(steps, int) and steps <= MAX_WRITTEN_OUT_STEPS:
            ys: list[Tensor | None] = [None] * steps
            for t in (reversed(range(steps)) if d else range(steps)):
                h, c, ys[t] = cell(h, c, xw[t], t)
            y = ops.concat([ops.unsqueeze(y, [0]) for y in ys], axis=0)
        else:
            h, c, y = _scanned(cell, h, c, xw, reverse=bool(d))
        outs.append(y)
        finals_h.append(ops.unsqueeze(h, [0]))
        finals_c.append(ops.unsqueeze(c, [0]))
    return [_joined(outs, -1), _joined(finals_h, 0), _joined(finals_c, 0)]


def _scanned(cell: Any, h: Tensor, c: Tensor, xw: Tensor, reverse: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``cell`` over ``xw``'s steps (axis 0) as one Scan marked for reverse mode, from the last step back where
    ``reverse``: the final ``h``, ``c`` and the outputs ``[T, N, P]`` in step order."""
    t = arange(xw.shape[0], dtype="int32")
    if reverse:
        xw, t = xw[::-1], t[::-1]

    def body(carry, step):
        h, c, y = cell(*carry, *step)
        return (h, c), y

    (h, c), ys = scan(body, (h, c), (xw, t))
    h.value.producer().metadata_props[REVERSE_MODE_KEY] = "true"
    return h, c, ys[::-1] if reverse else ys


def _state(given: Tensor | None, d: int, width: int, x: Tensor) -> Tensor:
    """Direction ``d``'s initial state ``[N, width]``: ``given[d]``, or zeros of ``x``'s batch."""
    return given[d] if given is not None else _zeros(x, width)


def _zeros(x: Tensor, width: int) -> Tensor:
    """Zeros ``[N, width]`` of ``x``'s dtype, ``N`` being ``x``'s dim 1 at run time."""
    return ops.emit("Expand", [ops.lift(np.zeros((1, width)), x), ops.concat(
        [ops.dim_read(x, 1), ops.const_i64([width])], 0)],
        out_types=[(x.dtype, [x.shape[1] if x.shape else None, width])])


def _joined(parts: list[Tensor], axis: int) -> Tensor:
    return parts[0] if len(parts) == 1 else ops.concat(parts, axis=axis)
