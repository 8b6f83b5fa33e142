"""Conv weights that train_step holds in the order ``dense_conv`` reads them.

A dense kxk conv that reads its input pixel-major (``dense_conv._reads_pixels``) multiplies its
columns [N*P, K*Ci] by its weight as [Co, K, Ci]: each step the weight [Co, Ci, kh, kw] is
brought to that order (a Reshape, a Transpose and a Gather, ``dense_conv._taps_outer``) and its
gradient back. Where every use of a trainable weight is such a chain, train_step takes the param
as [Co, kh, kw, Ci] (``TAPS_ORDER`` of its axes) instead: the chain becomes a Reshape, and the
gradient is the chain's value's own, in the param's order, so that neither way moves a value.
The optimizer's steps are elementwise, so its state is kept in the same order; the gradients,
eval and inference graphs, ``state.safetensors`` and checkpoints keep the model's order
(``Manifest.orders`` says which params are held so; ``Manifest.pack`` and ``unpack`` convert).

Measured (onnxruntime CPU, 2 threads, Trainer steps interleaved at batch 32, 64 px, held vs the
model's order, built second / first): ResNet-18 (4 weights held) 0.974x / 0.978x the step time,
ResNet-50 (6) 0.983x / 0.993x; the bound a timing-only ablation without the chains had given was
0.976x / 0.983x and 0.986x / 0.985x (``dense_conv._taps_outer``). At batch 2 no conv reads its
input pixel-major, so nothing is held. Eval reads the held weights transposed back on the host
once a step (``Trainer._eval_state``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.values import const_array, static_shape

__all__ = ["TAPS_ORDER", "chains", "store"]

TAPS_ORDER = (0, 2, 3, 1)  # [Co, Ci, kh, kw] -> [Co, kh, kw, Ci]


def _only_use(value: ir.Value, op_type: str) -> ir.Node | None:
    uses = value.uses()
    if len(uses) != 1 or uses[0].node.op_type != op_type or uses[0].idx != 0:
        return None
    return uses[0].node


def _chain_root(gather: ir.Node) -> ir.Value | None:
    """The weight whose taps-outer chain ``gather`` ends (Reshape to [Co*Ci, K], Transpose,
    Reshape to [K*Co, Ci], Gather of the rows in [Co, K] order; ``dense_conv._taps_outer``), or
    None where ``gather`` ends no such chain."""
    if gather.op_type != "Gather" or gather.attributes.get_int("axis", 0) != 0 or len(gather.inputs) != 2:
        return None
    rows = gather.inputs[0].producer()
    turn = rows.inputs[0].producer() if rows is not None and rows.op_type == "Reshape" else None
    flat = turn.inputs[0].producer() if turn is not None and turn.op_type == "Transpose" else None
    if flat is None or flat.op_type != "Reshape" or list(turn.attributes.get_ints("perm", [])) != [1, 0]:
        return None
    w = flat.inputs[0]
    shape = static_shape(w)
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
        return None
    co, ci, k = shape[0], shape[1], shape[2] * shape[3]
    wanted = np.arange(k)[None, :] * co + np.arange(co)[:, None]
    index, to_rows, to_flat = (const_array(v) for v in (gather.inputs[1], rows.inputs[1], flat.inputs[1]))
    if any(a is None for a in (index, to_rows, to_flat)) or index.shape != wanted.shape or (index != wanted).any() \
            or list(to_flat) != [co * ci, k] or list(to_rows) != [k * co, ci]:
        return None
    return w


def chains(graph: ir.Graph, params: Sequence[str]) -> dict[str, ir.Value]:
    """Before autodiff: {param: the [Co, K, Ci] value of its taps-outer chain} for each of
    ``params`` (trainable initializers) that one such chain alone reads."""
    out = {}
    for node in graph:
        w = _chain_root(node)
        if w is None or w.name not in params or graph.initializers.get(w.name) is not w:
            continue
        reshape = _only_use(w, "Reshape")
        turn = reshape and _only_use(reshape.outputs[0], "Transpose")
        rows = turn and _only_use(turn.outputs[0], "Reshape")
        if rows is not None and _only_use(rows.outputs[0], "Gather") is node:
            out[w.name] = node.outputs[0]
    return out


def store(graph: ir.Graph, opset: int, taps: Mapping[str, tuple[ir.Value, ir.Value]],
          grads: dict[str, ir.Value]) -> dict[str, list[int]]:
    """After autodiff (and the gradients graph cloned): each param of ``taps`` ({param: (its
    chain's value, that value's gradient)}) becomes a train_step input in ``TAPS_ORDER``, its
    initial value so transposed; every taps-outer chain on it (recomputation's copies included)
    is a Reshape of it, any other use reads it transposed back, and ``grads`` (in place) gives
    the chain's gradient in its shape. Returns {param: TAPS_ORDER} for the manifest."""
    e = Emitter(graph, opset, "taps_params")
    back = [int(i) for i in np.argsort(TAPS_ORDER)]
    orders = {}
    for name, (_, grad) in taps.items():
        old = graph.initializers.pop(name)
        slot = graph.inputs.index(old)
        old.name = e.fresh(f"{name}/model_order")
        array = np.ascontiguousarray(old.const_value.numpy().transpose(TAPS_ORDER))
        held = ir.Value(name=name, type=ir.TensorType(old.dtype), shape=ir.Shape(array.shape),
                        const_value=ir.tensor(array, name=name))
        graph.register_initializer(held)
        graph.inputs[slot] = held
        as_model = e.op("Transpose", held, perm=back)
        old.replace_all_uses_with(as_model)
        co, kh, kw, ci = array.shape
        for node in [u.node for u in as_model.uses()]:  # the chain's head Reshapes, then their Gathers
            for gather in _ends(node):
                if _chain_root(gather) is as_model:
                    gather.outputs[0].replace_all_uses_with(e.op("Reshape", held, e.ints([co, kh * kw, ci])))
        grads[name] = e.op("Reshape", grad, e.ints(list(array.shape)))
        orders[name] = list(TAPS_ORDER)
    return orders


def _ends(head: ir.Node) -> list[ir.Node]:
    """The Gathers three nodes below ``head`` (where a taps-outer chain would end)."""
    level = [head]
    for _ in range(3):
        level = [u.node for n in level for out in n.outputs for u in out.uses()]
    return [n for n in level if n.op_type == "Gather"]
