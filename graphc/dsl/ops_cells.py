"""torch's functional recurrent cells (``rnn_tanh_cell``, ``rnn_relu_cell``, ``lstm_cell``, ``gru_cell``:
one step on positional weights ``w_ih`` ``[gates * hidden, input]``, ``w_hh``, ``b_ih``, ``b_hh``, gates in
torch's order ``i f g o`` and ``r z n``) and convolutions (``convolution``, ``conv_tbc``) over the DSL's
layers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphc.dsl import ops
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_array import chunk, permute
from graphc.dsl.ops_layers import (
    conv1d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
)
from graphc.dsl.ops_nn import conv2d, linear
from graphc.dsl.tensor import Tensor


def _gates(fn: str, x: Any, h: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, gates: int) -> tuple[Tensor, Tensor]:
    """``x @ w_ih.T + b_ih`` and ``h @ w_hh.T + b_hh``, the weights checked to hold ``gates`` blocks."""
    x, h, w_ih, w_hh = ops.lift(x), ops.lift(h), ops.lift(w_ih), ops.lift(w_hh)
    for name, w, width in (("w_ih", w_ih, x.shape[-1] if x.ndim else None), ("w_hh", w_hh, h.shape[-1] if h.ndim else None)):
        if w.ndim != 2 or w.shape[0] != gates * (h.shape[-1] if h.ndim else -1) or w.shape[1] != width:
            raise op_error(fn, [x, h, w], f"{name} must be [{gates} * hidden, {width}] for input {x.type_str()} and "
                           f"hx {h.type_str()}, got {w.type_str()}", user_source())
    return linear(x, w_ih, b_ih), linear(h, w_hh, b_hh)


@autocast_op()
def rnn_tanh_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None) -> Tensor:
    """``torch.rnn_tanh_cell``: ``tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)``."""
    gi, gh = _gates("rnn_tanh_cell", input, hx, w_ih, w_hh, b_ih, b_hh, 1)
    return ops.tanh(gi + gh)


@autocast_op()
def rnn_relu_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None) -> Tensor:
    """``torch.rnn_relu_cell``: ``relu(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)``."""
    gi, gh = _gates("rnn_relu_cell", input, hx, w_ih, w_hh, b_ih, b_hh, 1)
    return ops.relu(gi + gh)


@autocast_op()
def lstm_cell(input: Any, hx: Sequence[Any], w_ih: Any, w_hh: Any, b_ih: Any = None,
              b_hh: Any = None) -> tuple[Tensor, Tensor]:
    """``torch.lstm_cell``: ``(h', c')`` from ``hx = (h, c)``; ``c' = f c + i g``, ``h' = o tanh(c')``."""
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise op_error("lstm_cell", [ops.lift(input)], f"hx must be a pair (h, c), got {type(hx).__name__}",
                       user_source())
    gi, gh = _gates("lstm_cell", input, hx[0], w_ih, w_hh, b_ih, b_hh, 4)
    i, f, g, o = chunk(gi + gh, 4, dim=-1)
    c = ops.sigmoid(f) * ops.lift(hx[1]) + ops.sigmoid(i) * ops.tanh(g)
    return ops.sigmoid(o) * ops.tanh(c), c


@autocast_op()
def gru_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None) -> Tensor:
    """``torch.gru_cell``: ``n = tanh(x_n + r (h @ W_hn.T + b_hn))``, ``h' = (1 - z) n + z h``."""
    gi, gh = _gates("gru_cell", input, hx, w_ih, w_hh, b_ih, b_hh, 3)
    (i_r, i_z, i_n), (h_r, h_z, h_n) = chunk(gi, 3, dim=-1), chunk(gh, 3, dim=-1)
    r, z = ops.sigmoid(i_r + h_r), ops.sigmoid(i_z + h_z)
    n = ops.tanh(i_n + r * h_n)
    return n + z * (ops.lift(hx) - n)


_CONVS = {1: conv1d, 2: conv2d, 3: conv3d}
_TRANSPOSED = {1: conv_transpose1d, 2: conv_transpose2d, 3: conv_transpose3d}


@autocast_op()
def convolution(input: Any, weight: Any, bias: Any, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> Tensor:
    """``torch.convolution``: ``conv{1,2,3}d`` or, ``transposed``, ``conv_transpose{1,2,3}d`` by ``input``'s
    rank (batched: 3 to 5)."""
    x = ops.lift(input)
    nd = x.ndim - 2
    if nd not in _CONVS:
        raise op_error("convolution", [x], f"input must be batched (N, C, *spatial) with 1 to 3 spatial dims, got "
                       f"{x.type_str()}", user_source())
    if transposed:
        return _TRANSPOSED[nd](x, weight, bias, stride, padding, output_padding, groups, dilation)
    if any(output_padding if isinstance(output_padding, (list, tuple)) else [output_padding]):
        raise op_error("convolution", [x], f"output_padding is for transposed convolutions only, got {output_padding}",
                       user_source())
    return _CONVS[nd](x, weight, bias, stride, padding, dilation, groups)


@autocast_op()
def conv_tbc(input: Any, weight: Any, bias: Any, pad: int = 0) -> Tensor:
    """``torch.conv_tbc``: a 1-D convolution of time-batch-channel ``input`` ``(T, B, C_in)`` with ``weight``
    ``(k, C_in, C_out)`` and ``bias`` ``(C_out,)``, ``pad`` zeros each side of time: ``(T + 2 pad - k + 1, B,
    C_out)``."""
    x, w, b = ops.lift(input), ops.lift(weight), ops.lift(bias)

    def fail(message: str):
        raise op_error("conv_tbc", [x, w, b], message, user_source())

    for name, t, rank, dims in (("input", x, 3, "(T, B, C_in)"), ("weight", w, 3, "(k, C_in, C_out)"),
                                ("bias", b, 1, "(C_out,)")):
        if t.ndim != rank:
            fail(f"{name} must be {dims}, got {t.type_str()}")
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        fail(f"pad must be a non-negative int, got {pad!r}")
    for what, got, dim in (("input's C_in (dim 2)", x.shape[2], 1), ("bias's size", b.shape[0], 2)):
        if isinstance(got, int) and isinstance(w.shape[dim], int) and got != w.shape[dim]:
            fail(f"{what} must equal weight's dim {dim}, {w.shape[dim]}; got {got}")
    if isinstance(x.shape[0], int) and isinstance(w.shape[0], int) and x.shape[0] + 2 * pad < w.shape[0]:
        fail(f"the kernel ({w.shape[0]} wide) is longer than input's T = {x.shape[0]} with pad = {pad} each side")
    out = conv1d(permute(x, [1, 2, 0]), permute(w, [2, 1, 0]), b, 1, pad)
    return permute(out, [2, 0, 1])


__all__ = ["conv_tbc", "convolution", "gru_cell", "lstm_cell", "rnn_relu_cell", "rnn_tanh_cell"]
