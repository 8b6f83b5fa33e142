"""Small-map activations kept pixel-major between the convs ``dense_conv`` turns into GEMMs
(CPU training graphs).

A dense conv on a small map computes its output as rows, [N*P, Co] (``dense_conv``), and hands
it on channel-major, [N, Co, H, W], by a Reshape and a Transpose; a plain 1x1 conv after it
turns its input back into rows by another. Between them run the BatchNorm, the activation and
the residual Add, which need no particular layout: ``keep`` moves them onto the rows (a
BatchNormalization of [N*P, C] has its channels on axis 1 still, its statistics over axis 0),
and a 1x1 conv (or a kxk one that reads its input pixel-major, ``dense_conv._reads_pixels``)
whose input has rows reads those rows; the channel-major form stays only for the readers that
need it (the other kxk convs' taps, a squeeze-excite's pooling, a global pool), and the
Transposes no reader needs any more are dropped. Autodiff then differentiates the rows, so the
backward loses the same Transposes.

Measured (onnxruntime CPU, 2 threads): ResNet-50's Transposes were 46.7 ms of its 370 ms of
kernel time at batch 32, 64 px. BatchNorm's statistics, backward sums and normalisation on rows
against channel-major, ms, N=32: 1024ch on 16 pixels 0.31 vs 1.14; 2048ch on 4 0.25 vs 0.91;
512ch on 4 0.19 vs 0.42; 256ch on 16 0.29 vs 0.18 (as [N*P, C, 1], reduced over axes 0 and 2,
1.56 to 3.34: a rank-2 BatchNorm it is). Trainer steps interleaved, at batch 32, 64 px:
ResNet-50 0.915x the step time, RegNetY-400MF 0.921x, EfficientNet-B0 0.946x, MobileNetV3-small
0.948x, ResNet-18 0.998x (its small-map convs are 3x3, which then read channel-major); at 128 px
(only 4x4 maps left small) ResNet-50 0.995x, RegNetY 0.994x; at batch 2, 64 px, ResNet-50
0.972x, RegNetY 0.975x, MobileNetV3-small 0.936x. (A first form that left the 1x1 conv after a
moved node reading channel-major: ResNet-50 0.962-0.971x.) Graphs for CUDA keep the Transposes
(not measured there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir

from graphc.passes.autodiff.builder import static_shape
from graphc.passes.emit import Emitter

__all__ = ["Dense", "channel_major", "keep"]

# elementwise ops that run on the rows as they do on the channel-major tensor
UNARY = frozenset({"Relu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh"})
BINARY = frozenset({"Add", "Mul"})  # of two tensors of one shape


@dataclass
class Dense:
    """A dense conv ``dense_conv`` rewrote: its ``output`` [N, Co, H, W], the ``rows`` [N*P, Co]
    it is made of, and for a conv that reads its input pixel-major (a plain 1x1 conv, a kxk one
    ``dense_conv._reads_pixels``) its ``input`` and the ``pixels`` [N, Q, Ci] it reads of it
    (else None)."""
    output: ir.Value
    rows: ir.Value
    input: ir.Value | None
    pixels: ir.Value | None


def channel_major(e: Emitter, rows: ir.Value, channels: int, spatial: Sequence[int]) -> ir.Value:
    """[N*P, C] rows as [N, C, *spatial]."""
    rank = len(spatial) + 2
    pixels = e.op("Reshape", rows, e.ints([-1, *spatial, channels]))
    return e.op("Transpose", pixels, perm=[0, rank - 1, *range(1, rank - 1)])


def keep(e: Emitter, graph: ir.Graph, convs: Sequence[Dense]) -> int:
    """Move the BatchNorms and elementwise ops between ``convs`` onto their rows (see the module's
    docstring), in place; returns how many nodes moved."""
    rows = {d.output: d.rows for d in convs}  # channel-major value -> its rows
    spare = [n for d in convs for n in _producers(d.output, 2)]  # Transposes to drop if unread
    moved = 0
    for node in list(graph):  # in order: a node's inputs have their rows before it is seen
        ins = [v for v in node.inputs if v is not None]
        if not ins or not _movable(node, ins, rows):
            continue
        before = node.outputs[0]
        shape, dtype, readers = static_shape(before), before.dtype, list(before.uses())
        source = rows[ins[0]]
        for i, v in enumerate(node.inputs):
            if v in rows:
                node.replace_input_with(i, rows[v])
        before.shape = None if source.shape is None else ir.Shape(list(source.shape))
        after = channel_major(e, before, shape[1], shape[2:])
        after.shape, after.dtype = ir.Shape(shape), dtype
        for user, i in readers:
            user.replace_input_with(i, after)
        rows[after] = before  # ``before`` is rows now, its readers given the channel-major ``after``
        spare += _producers(after, 2)
        moved += 1
    made = set(rows.values())  # a conv's input that a moved node made is rows itself now
    for d in convs:  # a conv that reads its input's pixels reads its rows where they exist
        source = d.input if d.input in made else rows.get(d.input)
        if d.pixels is not None and source is not None:
            spare += _producers(d.pixels, 2)
            d.pixels.replace_all_uses_with(source)
    _drop_unread(graph, spare)
    return moved


def _movable(node: ir.Node, inputs: list[ir.Value], rows: dict) -> bool:
    """Whether ``node`` runs on rows: a BatchNormalization or one of ``UNARY`` whose input has
    rows, or one of ``BINARY`` whose two inputs have rows of one shape; its output 4-D, static
    but for the batch, and not a graph output."""
    if node.outputs[0].is_graph_output() or node.domain not in ("", "ai.onnx"):
        return False
    shape = static_shape(node.outputs[0])
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        return False
    if node.op_type == "BatchNormalization" or node.op_type in UNARY:
        return inputs[0] in rows
    return (node.op_type in BINARY and len(inputs) == 2 and all(v in rows for v in inputs)
            and static_shape(inputs[0]) == static_shape(inputs[1]))


def _producers(value: ir.Value, depth: int) -> list[ir.Node]:
    """The node making ``value`` and the nodes making its first input, ``depth`` deep."""
    nodes = []
    while value is not None and value.producer() is not None and len(nodes) < depth:
        nodes.append(value.producer())
        value = value.producer().inputs[0]
    return nodes


def _drop_unread(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    """Remove, of ``nodes``, those whose outputs nothing reads, until none is left to remove."""
    left = list(dict.fromkeys(nodes))
    while True:
        unread = [n for n in left if n.graph is graph and not any(o.uses() or o.is_graph_output() for o in n.outputs)]
        if not unread:
            return
        for n in unread:
            graph.remove(n, safe=True)
            left.remove(n)
