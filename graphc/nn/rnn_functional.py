"""torch's functional multi-layer recurrent ops, ``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh`` and
``torch.rnn_relu``, under their positional signature ``(input, hx, params, has_biases, num_layers, dropout,
train, bidirectional, batch_first)``: ``params`` is the flat weight list of ``nn.LSTM._flat_weights`` (per layer
and direction ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``). Each runs ``graphc.nn.rnn``'s layers (one ONNX RNN/LSTM/GRU
node per layer, or the projected LSTM written out) on a module that holds the given Tensors in place of its
parameters, so gradients reach them as they reach a module's."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops
from graphc.dsl.builder import user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.module import Module
from graphc.nn.rnn import GATES, GRU, LSTM, RNN, RNNBase

__all__ = ["gru", "lstm", "rnn_relu", "rnn_tanh"]


def _held(cls: type, fn: str, x: Any, hx: list[Tensor], params: Any, has_biases: bool, num_layers: int,
          dropout: float, train: bool, bidirectional: bool, batch_first: bool, nonlinearity: str = "tanh") -> RNNBase:
    """A ``cls`` module whose parameters are the Tensors of ``params`` (checked against ``hx``'s widths)."""
    where = f"(at {user_source()})"
    if not isinstance(params, (list, tuple)):
        raise CaptureError(f"torch.{fn}'s params is the list of weights, got {type(params).__name__} {where}")
    if x.shape is None or len(x.shape) != 3:
        raise CaptureError(f"torch.{fn} takes a rank-3 input ({'N, L' if batch_first else 'L, N'}, H_in), got "
                           f"{x.type_str()} {where}")
    params = [ops.lift(p, x) for p in params]  # numpy weights take the input's dtype
    hidden = hx[-1].shape[-1] if hx[-1].shape else None
    proj = hx[0].shape[-1] if cls is LSTM and hx[0].shape and hx[0].shape[-1] != hidden else 0
    directions = 2 if bidirectional else 1
    names = ["weight_ih", "weight_hh", *(["bias_ih", "bias_hh"] if has_biases else []),
             *(["weight_hr"] if proj else [])]
    if len(params) != num_layers * directions * len(names):
        raise CaptureError(f"torch.{fn}: {len(params)} weights for {num_layers} layer(s) x {directions} "
                           f"direction(s) of {', '.join(names)}; expected {num_layers * directions * len(names)} "
                           f"{where}")
    rnn = cls.__new__(cls)
    Module.__init__(rnn)
    rnn.input_size, rnn.hidden_size, rnn.num_layers, rnn.bias = params[0].shape[-1], hidden, num_layers, has_biases
    rnn.batch_first, rnn.dropout, rnn.bidirectional = batch_first, dropout, bidirectional
    rnn.nonlinearity, rnn.proj_size, rnn.training = nonlinearity, proj, bool(train)
    weights = iter(enumerate(params))
    for layer in range(num_layers):
        for suffix in rnn._suffixes(layer):
            for name in names:
                i, weight = next(weights)
                want = _shape(rnn, name, layer)
                if weight.shape is not None and (len(weight.shape) != len(want) or any(
                        isinstance(d, int) and d != w for d, w in zip(weight.shape, want))):
                    raise CaptureError(f"torch.{fn}: params[{i}] ({name}{suffix}) is {weight.type_str()}; expected "
                                       f"{list(want)} for hidden size {hidden}{f', proj_size {proj}' if proj else ''} "
                                       f"(hx's width) {where}")
                setattr(rnn, f"{name}{suffix}", weight)
    return rnn


def _shape(rnn: RNNBase, name: str, layer: int) -> tuple[int, ...]:
    """torch's shape of ``rnn``'s weight ``name`` of ``layer`` (``add_gate_parameters``')."""
    rows, out = GATES[rnn.op][0] * rnn.hidden_size, rnn.proj_size or rnn.hidden_size
    return {"weight_ih": (rows, rnn.input_size if layer == 0 else out * rnn.directions), "weight_hh": (rows, out),
            "bias_ih": (rows,), "bias_hh": (rows,), "weight_hr": (rnn.proj_size, rnn.hidden_size)}[name]


def _packed(fn: str, cls: type) -> CaptureError:
    return CaptureError(f"torch.{fn}(data, batch_sizes, hx, params, ...), the packed form, is not captured: pack "
                        f"with gc.nn.utils.rnn.pack_padded_sequence and run gc.nn.{cls.__name__} on it (at "
                        f"{user_source()})")


def lstm(input: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float,  # noqa: A002
         train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.lstm``: ``(output, h_n, c_n)`` of ``nn.LSTM`` with ``params`` as its flat weights; ``hx`` is
    ``[h_0, c_0]`` (an ``h_0`` narrower than ``c_0``: an LSTM with projections)."""
    if isinstance(has_biases, (list, tuple)):  # (data, batch_sizes, hx, params, ...)
        raise _packed("lstm", LSTM)
    if not isinstance(hx, (list, tuple)) or len(hx) != 2:
        raise CaptureError(f"torch.lstm hx is [h_0, c_0], got {type(hx).__name__} (at {user_source()})")
    x = ops.lift(input)
    h0, c0 = (ops.lift(h, x) for h in hx)
    rnn = _held(LSTM, "lstm", x, [h0, c0], params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    out, (h_n, c_n) = rnn._run(x, (h0, c0))
    return out, h_n, c_n


def _single_state(cls: type, fn: str, nonlinearity: str = "tanh") -> Any:
    def run(input: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float,  # noqa: A002
            train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor]:
        if isinstance(has_biases, (list, tuple)):  # (data, batch_sizes, hx, params, ...)
            raise _packed(fn, cls)
        x = ops.lift(input)
        h0 = ops.lift(hx, x)
        rnn = _held(cls, fn, x, [h0], params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                    nonlinearity)
        out, (h_n,) = rnn._run(x, h0)
        return out, h_n
    run.__name__ = fn
    run.__doc__ = f"``torch.{fn}``: ``(output, h_n)`` of ``nn.{cls.__name__}`` with ``params`` as its flat weights."
    return run


gru = _single_state(GRU, "gru")
rnn_tanh = _single_state(RNN, "rnn_tanh")
rnn_relu = _single_state(RNN, "rnn_relu", "relu")
