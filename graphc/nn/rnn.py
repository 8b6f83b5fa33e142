"""RNN, LSTM and GRU with ``torch.nn``'s arguments, parameter names (``weight_ih_l0``,
``bias_hh_l1_reverse``, ...), layouts, init and return values, captured as the ONNX RNN/LSTM/GRU
ops (one node per layer, both directions in it), so onnxruntime runs the fused kernels and autodiff
differentiates them as it does imported ones.

PyTorch stacks the gates ``i f g o`` (LSTM) and ``r z n`` (GRU); ONNX wants ``i o f c`` and
``z r h``. The parameters keep PyTorch's layout and the graph reorders them (Slice + Concat), so a
PyTorch ``state_dict`` loads as it is and gradients reach the parameters through the reorder.
"""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_nn import dropout
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn import draws
from graphc.nn.module import Module, Parameter
from graphc.nn.rnn_projected import projected_layer
from graphc.nn.signatures import takes_device
from graphc.nn.utils.rnn import PackedSequence

# op -> (gates, ONNX gate order as indices into PyTorch's)
GATES = {"RNN": (1, [0]), "LSTM": (4, [0, 3, 1, 2]), "GRU": (3, [1, 0, 2])}


def refuse_base(module: Module, base: type, build: str) -> None:
    """A CaptureError when ``module`` is ``base`` itself (torch's ``RNNBase(mode, ...)``,
    ``RNNCellBase(..., num_chunks)``): graphc's bases are for ``isinstance`` checks; ``build`` names the
    classes to build instead."""
    if type(module) is base:
        raise CaptureError(f"nn.{base.__name__} is the base class of {build}, for isinstance checks, "
                           f"and is not built itself: build the concrete module")


def add_gate_parameters(module: Module, suffix: str, gates: int, input_size: int, hidden_size: int, bias: bool,
                        dtype: Any, proj_size: int = 0) -> None:
    """``weight_ih{suffix} [gates*H, input_size]``, ``weight_hh{suffix} [gates*H, H]`` and, with
    ``bias``, ``bias_ih{suffix}``, ``bias_hh{suffix} [gates*H]``; with ``proj_size`` P, ``weight_hh`` is
    ``[gates*H, P]`` and ``weight_hr{suffix} [P, H]`` follows: PyTorch's, each U(+-1/sqrt(H))."""
    rows = gates * hidden_size
    draw = draws.uniform(1.0 / math.sqrt(hidden_size))
    setattr(module, f"weight_ih{suffix}", Parameter(shape=(rows, input_size), init=draw, dtype=dtype))
    setattr(module, f"weight_hh{suffix}", Parameter(shape=(rows, proj_size or hidden_size), init=draw, dtype=dtype))
    if bias:
        setattr(module, f"bias_ih{suffix}", Parameter(shape=(rows,), init=draw, dtype=dtype))
        setattr(module, f"bias_hh{suffix}", Parameter(shape=(rows,), init=draw, dtype=dtype))
    if proj_size:
        setattr(module, f"weight_hr{suffix}", Parameter(shape=(proj_size, hidden_size), init=draw, dtype=dtype))


@takes_device
class RNNBase(Module):
    op = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 nonlinearity: str = "tanh", dtype: Any = "float32", proj_size: int = 0):
        refuse_base(self, RNNBase, "nn.RNN, nn.LSTM and nn.GRU (torch's RNNBase('LSTM', ...) is nn.LSTM(...), "
                    "'GRU' nn.GRU, 'RNN_TANH' nn.RNN, 'RNN_RELU' nn.RNN(..., nonlinearity='relu'))")
        super().__init__()
        if nonlinearity not in ("tanh", "relu"):
            raise CaptureError(f"{self.op} nonlinearity={nonlinearity!r}; expected 'tanh' or 'relu'")
        if not 0.0 <= dropout < 1.0:
            raise CaptureError(f"{self.op} dropout {dropout} must be in [0, 1)")
        if isinstance(proj_size, bool) or not isinstance(proj_size, int) or not 0 <= proj_size < hidden_size:
            raise CaptureError(f"{self.op} proj_size={proj_size!r} must be an int in [0, hidden_size={hidden_size})")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, dropout
        self.bidirectional, self.nonlinearity, self.proj_size = bidirectional, nonlinearity, proj_size
        out = proj_size or hidden_size
        for layer in range(num_layers):
            for suffix in self._suffixes(layer):
                inputs = input_size if layer == 0 else out * self.directions
                add_gate_parameters(self, suffix, GATES[self.op][0], inputs, hidden_size, bias, dtype, proj_size)

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}", f"_l{layer}_reverse"][:self.directions]

    def _onnx_order(self, w: Tensor) -> Tensor:
        """PyTorch's gate blocks (rows) in ONNX's order."""
        h, order = self.hidden_size, GATES[self.op][1]
        if order == sorted(order):
            return w
        return ops.concat([w[g * h:(g + 1) * h] for g in order], axis=0)

    def _stacked(self, layer: int, names: tuple[str, ...]) -> Tensor:
        """``[directions, ...]``: each direction's parameters (``names`` concatenated) reordered."""
        per_dir = []
        for suffix in self._suffixes(layer):
            parts = [self._onnx_order(getattr(self, f"{n}{suffix}")) for n in names]
            per_dir.append(ops.unsqueeze(parts[0] if len(parts) == 1 else ops.concat(parts, axis=0), [0]))
        return per_dir[0] if len(per_dir) == 1 else ops.concat(per_dir, axis=0)

    def _layer(self, layer: int, x: Tensor, h0: Tensor | None, c0: Tensor | None,
               lengths: Tensor | None) -> list[Tensor]:
        """One ONNX node: ``[Y (T, N, D*H), Y_h, (Y_c)]``; ``lengths`` (int32): ``sequence_lens``."""
        attrs: dict[str, Any] = {"hidden_size": self.hidden_size,
                                 "direction": "bidirectional" if self.bidirectional else "forward"}
        if self.op == "GRU":
            attrs["linear_before_reset"] = 1  # PyTorch applies r to (W_hn h + b_hn)
        if self.op == "RNN":
            attrs["activations"] = ["Relu" if self.nonlinearity == "relu" else "Tanh"] * self.directions
        b = self._stacked(layer, ("bias_ih", "bias_hh")) if self.bias else None
        inputs = [x, self._stacked(layer, ("weight_ih",)), self._stacked(layer, ("weight_hh",)), b, lengths, h0]
        if self.op == "LSTM":
            inputs.append(c0)
        outs = ops.emit(self.op, inputs, attrs, num_outputs=3 if self.op == "LSTM" else 2)
        y = ops.transpose(outs[0], [0, 2, 1, 3])  # [T, D, N, H] -> [T, N, D, H]
        width = self.directions * self.hidden_size
        y = ops.emit("Reshape", [y, ops.const_i64([0, 0, width])],
                     out_types=[(y.dtype, [y.shape[0], y.shape[1], width] if y.shape else None)])
        return [y, *outs[1:]]

    def _run(self, x: Tensor | PackedSequence, hx: Any) -> tuple[Tensor | PackedSequence, list[Tensor]]:
        """The output and final states; a PackedSequence in gives one out (torch's packed run: each
        sequence stops at its length, whatever ``batch_first``)."""
        h0, c0 = (hx if isinstance(hx, (tuple, list)) else (hx, None))
        if isinstance(x, PackedSequence):
            self._check_input(x.padded, "(L, N, H_in)")
            out, finals = self._run_batched(x.padded, h0, c0, False, ops.cast(x.lengths, "int32"))
            return x.with_padded(out), finals
        self._check_input(x, f"({'N, L' if self.batch_first else 'L, N'}, H_in) or an unbatched (L, H_in) one")
        if x.ndim == 2:  # unbatched, as PyTorch: a batch of one, states without their batch dim
            h0, c0 = (None if s is None else ops.unsqueeze(s, [1]) for s in (h0, c0))
            out, finals = self._run_batched(ops.unsqueeze(x, [1]), h0, c0, batch_first=False)
            return ops.squeeze(out, [1]), [ops.squeeze(f, [1]) for f in finals]
        return self._run_batched(x, h0, c0, self.batch_first)

    def _check_input(self, x: Tensor, layouts: str) -> None:
        if x.shape is not None and (len(x.shape) not in (2, 3) or x.shape[-1] != self.input_size):
            raise op_error(self.op, [x], f"expects a rank-3 input with {self.input_size} features "
                           f"{layouts}", user_source())

    def _run_batched(self, x: Tensor, h0: Tensor | None, c0: Tensor | None, batch_first: bool,
                     lengths: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        if batch_first:
            x = ops.transpose(x, [1, 0, 2])
        finals: list[list[Tensor]] = []
        d = self.directions
        for state, width in ((h0, self.proj_size or self.hidden_size), (c0, self.hidden_size)):
            want = [self.num_layers * d, x.shape[1] if x.shape else None, width]
            if state is not None and state.shape is not None and (len(state.shape) != 3 or any(
                    isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(state.shape, want))):
                raise op_error(self.op, [state], f"expects a state of shape (num_layers * directions, N, width) "
                               f"{want}", user_source())
        for layer in range(self.num_layers):
            state = [None if s is None else s[layer * d:(layer + 1) * d] for s in (h0, c0)]
            x, *last = self._layer(layer, x, *state, lengths)
            finals.append(last)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = dropout(x, self.dropout, training=True)
        if batch_first:
            x = ops.transpose(x, [1, 0, 2])
        return x, [ops.concat([f[i] for f in finals], axis=0) if len(finals) > 1 else finals[0][i]
                   for i in range(len(finals[0]))]

    def forward(self, x: Tensor, hx: Any = None):
        out, (h_n,) = self._run(x, hx)
        return out, h_n

    def extra_repr(self) -> str:
        given = {"proj_size": (self.proj_size, 0), "num_layers": (self.num_layers, 1), "bias": (self.bias, True),
                 "batch_first": (self.batch_first, False), "dropout": (self.dropout, 0.0),
                 "bidirectional": (self.bidirectional, False)}
        return ", ".join([f"{self.input_size}, {self.hidden_size}",
                          *(f"{k}={v}" for k, (v, default) in given.items() if v != default)])


class RNN(RNNBase):
    """Elman RNN (``nonlinearity`` tanh or relu): ``out, h_n = rnn(x, h0=None)``."""

    op = "RNN"


@takes_device
class GRU(RNNBase):
    """``out, h_n = gru(x, h0=None)``."""

    op = "GRU"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, dtype: Any = "float32"):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, dtype=dtype)


@takes_device
class LSTM(RNNBase):
    """``out, (h_n, c_n) = lstm(x, (h0, c0)=None)``. With ``proj_size`` P (torch's LSTM with projections:
    ``h = (o tanh(c)) @ weight_hr.T``, ``out`` and ``h_n`` of width P) each layer is written in the DSL's ops
    (``projected_layer``: step by step at a static length, a Scan at a symbolic one); without, one ONNX LSTM
    node."""

    op = "LSTM"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, dtype: Any = "float32"):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, dtype=dtype,
                         proj_size=proj_size)

    def _layer(self, layer: int, x: Tensor, h0: Tensor | None, c0: Tensor | None,
               lengths: Tensor | None) -> list[Tensor]:
        if not self.proj_size:
            return super()._layer(layer, x, h0, c0, lengths)
        return projected_layer(self, layer, x, h0, c0, lengths)

    def forward(self, x: Tensor, hx: Any = None):
        out, (h_n, c_n) = self._run(x, hx)
        return out, (h_n, c_n)

