"""``gc.vmap``'s batching rule for the recurrent ops (RNN, GRU, LSTM), added to ``vmap_rules.RULES``: the
examples folded into the op's batch dim N (the weights the same for all), as its sequences side by side."""

from __future__ import annotations

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
)
from graphc.dsl.vmap_rules_conv import known_shape, merge_dims, split_dim

__all__: list[str] = []

_X, _LENS, _H0, _C0 = 0, 4, 5, 6  # the inputs of ONNX's RNN/GRU/LSTM that hold N


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
    sequences; mapped weights have no rule."""
    if any(a is not None and a.batched for i, a in enumerate(args) if i not in (_X, _LENS, _H0, _C0)):
        raise NoRule("mapped weights")
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
