"""Opt-in recomputation (activation checkpointing) for training graphs.

The backward pass reads forward values: a model's every BatchNorm, activation and residual sum
stays alive from the forward until the backward reaches it. With ``recompute``, the backward
reads copies of the cheap ones (elementwise ops and reshapes) recomputed from the nearest
expensive values (Conv, MatMul, Gemm, pooling and reduction outputs, which stay checkpoints).
A runtime that frees each value after its last use then holds only the checkpoints across the
step, at the price of running those elementwise ops twice.

onnxruntime's common-subexpression elimination would merge the copies back into the
originals, and its default execution order may run them early: sessions of such graphs turn the
one off and order nodes by priority (``keep_recomputation``; the Trainer does so from the
manifest).
"""

from __future__ import annotations

import math

import onnx_ir as ir

from graphc.passes.autodiff.loops import copy_node
from graphc.passes.emit import Emitter

__all__ = ["CHEAP", "recompute"]

CHEAP = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid",
    "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Clip", "Erf", "Sqrt", "Reciprocal", "Exp", "Cast",
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Where", "Max", "Min", "Pow",
})
_MIN_ELEMENTS = 4096  # smaller values (per-channel statistics, scalars) are kept, not recomputed


def recompute(graph: ir.Graph, forward: set[str], opset: int) -> int:
    """Make every node not named in ``forward`` (the backward) read recomputed copies of the
    large values that cheap forward nodes produce, placed just before their first reader;
    returns how many inputs were redirected. (Forward nodes go by name: a gradient rule may replace one by a copy with
    more outputs, MaxPool's Indices, under the same name.)"""
    e = Emitter(graph, opset, "recompute")
    copies: dict[ir.Value, ir.Value] = {}

    def cheap(v: ir.Value | None) -> bool:
        p = v.producer() if v is not None else None
        return (p is not None and p.name in forward and p.op_type in CHEAP and p.domain in ("", "ai.onnx")
                and _large(v))

    def copy(v: ir.Value) -> ir.Value:
        if v not in copies:
            producer = v.producer()
            for u in producer.inputs:
                if cheap(u):
                    copy(u)
            copy_node(e, producer, copies)
        return copies[v]

    redirected = 0
    for node in [n for n in graph if n.name not in forward]:
        made = len(graph)
        for i, v in enumerate(node.inputs):
            if cheap(v):
                node.replace_input_with(i, copy(v))
                redirected += 1
        new = list(graph)[made:]  # the copies this node is the first to read: run them just before it
        if new:
            graph.remove(new)
            graph.insert_before(node, new)
    return redirected


def _large(v: ir.Value) -> bool:
    """A value worth recomputing: a symbolic (batch) dim or many elements; an unknown shape is kept."""
    if v.shape is None:
        return False
    dims = list(v.shape)
    return any(not isinstance(d, int) for d in dims) or math.prod(dims) >= _MIN_ELEMENTS
