"""RNNCell, LSTMCell and GRUCell: one time step with ``torch.nn``'s arguments, parameter names
(``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``, gates stacked in PyTorch's order
``i f g o`` and ``r z n``), init and return values; each step is torch's functional cell
(``ops_cells``: ``rnn_tanh_cell``, ``rnn_relu_cell``, ``lstm_cell``, ``gru_cell``), as torch's modules
call them, so ``gc.autocast`` casts a module's step as the cell's policy says. A Python loop over time
steps captures an unrolled graph that autodiff differentiates."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_cells import gru_cell, lstm_cell, rnn_relu_cell, rnn_tanh_cell
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.module import Module
from graphc.nn.rnn import add_gate_parameters, refuse_base
from graphc.nn.signatures import takes_device

_NONLINEARITIES = {"tanh": rnn_tanh_cell, "relu": rnn_relu_cell}


@takes_device
class RNNCellBase(Module):
    gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, dtype: Any = "float32"):
        refuse_base(self, RNNCellBase, "nn.RNNCell, nn.LSTMCell and nn.GRUCell (torch's RNNCellBase num_chunks 1, 4 "
                    "and 3)")
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        add_gate_parameters(self, "", self.gates, input_size, hidden_size, bias, dtype)

    def _checked(self, x: Any, states: tuple[Any, ...]) -> tuple[Tensor, list[Tensor]]:
        """``x`` and the states (zeros where not given, as PyTorch), checked against torch's rules:
        ``x`` is ``(N, input_size)`` or unbatched ``(input_size,)``; each state ``(N, hidden_size)``
        or ``(hidden_size,)``, of ``x``'s rank. An unknown rank is refused, as ``nn.RNN`` does: the
        states' rank follows it."""
        name = type(self).__name__
        x = ops.lift(x)
        if x.shape is None or len(x.shape) not in (1, 2) or x.shape[-1] != self.input_size:
            got = "unknown rank" if x.shape is None else f"shape {list(x.shape)}"
            raise op_error(name, [x], f"expects input (N, {self.input_size}) or ({self.input_size},), got {got}",
                           user_source())
        out = []
        for s in states:
            if s is None:  # zeros of [hidden] broadcast over the batch, as torch's zero state
                out.append(ops.lift(np.zeros(self.hidden_size), x))
                continue
            s = ops.lift(s, x)
            if s.shape is not None and (len(s.shape) != x.ndim or s.shape[-1] != self.hidden_size):
                want = f"(N, {self.hidden_size})" if x.ndim == 2 else f"({self.hidden_size},)"
                raise op_error(name, [x, s], f"expects hidden state {want} for a rank-{x.ndim} input, got shape "
                               f"{list(s.shape)}", user_source())
            out.append(s)
        return x, out

    def _weights(self) -> tuple[Tensor, ...]:
        """``weight_ih, weight_hh`` and, with ``bias``, ``bias_ih, bias_hh``: the cell's weight arguments."""
        return (self.weight_ih, self.weight_hh, *((self.bias_ih, self.bias_hh) if self.bias else ()))

    def extra_repr(self) -> str:
        nonlinearity = getattr(self, "nonlinearity", "tanh")  # RNNCell's, shown unquoted as torch's
        return (f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")
                + ("" if nonlinearity == "tanh" else f", nonlinearity={nonlinearity}"))


@takes_device
class RNNCell(RNNCellBase):
    """``h' = nonlinearity(x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh)``;
    ``forward(input, hx=None) -> h'``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 dtype: Any = "float32"):
        if nonlinearity not in _NONLINEARITIES:
            raise CaptureError(f"RNNCell nonlinearity={nonlinearity!r}; expected 'tanh' or 'relu'")
        super().__init__(input_size, hidden_size, bias, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Any, hx: Any = None) -> Tensor:  # noqa: A002 - torch's names
        x, (h,) = self._checked(input, (hx,))
        return _NONLINEARITIES[self.nonlinearity](x, h, *self._weights())


class LSTMCell(RNNCellBase):
    """``forward(input, hx=None) -> (h', c')`` with ``hx = (h, c)``: gates ``i f g o`` from
    ``x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh``; ``c' = f c + i g``, ``h' = o tanh(c')``."""

    gates = 4

    def forward(self, input: Any, hx: Any = None) -> tuple[Tensor, Tensor]:  # noqa: A002
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise CaptureError(f"LSTMCell hx must be a pair (h, c), got {type(hx).__name__} (at {user_source()})")
        x, hc = self._checked(input, (None, None) if hx is None else tuple(hx))
        return lstm_cell(x, hc, *self._weights())


class GRUCell(RNNCellBase):
    """``forward(input, hx=None) -> h'``: gates ``r z n``, ``n = tanh(x_n + r (h @ W_hn.T + b_hn))``,
    ``h' = (1 - z) n + z h``."""

    gates = 3

    def forward(self, input: Any, hx: Any = None) -> Tensor:  # noqa: A002
        x, (h,) = self._checked(input, (hx,))
        return gru_cell(x, h, *self._weights())

