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

Checkpoint regions (``gc.utils.checkpoint``, nodes marked ``CHECKPOINT_KEY``) are recomputed
whether or not ``recompute`` is on, as torch's ``checkpoint`` does: every value a region's node
makes that the backward reads is a copy computed again from the region's inputs (what its nodes
read from outside it: data, params, another region's values), expensive ops included, so the
region's inputs are all it keeps alive. Random draws (``draws_random``: a training-mode Dropout too,
which ``gc.grad``'s graphs keep) and nodes holding subgraphs are kept, not drawn or run again: the
copies see the forward's numbers (torch's ``preserve_rng_state``); in the training graphs Dropout's
mask is already a function of the step's noise input. ``gc.grad`` (``gradient_model``) and
``gc.autograd.grad`` call this pass too.
"""

from __future__ import annotations

import contextlib
import math

import onnx_ir as ir

from graphc.model import CHECKPOINT_KEY, RECOMPUTED_KEY
from graphc.passes.autodiff.loops import copy_node
from graphc.passes.emit import Emitter
from graphc.passes.values import draws_random, subgraphs

__all__ = ["CHEAP", "inherited", "marked", "recompute"]

CHEAP = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid",
    "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Clip", "Erf", "Sqrt", "Reciprocal", "Exp", "Cast",
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Where", "Max", "Min", "Pow",
})
_MIN_ELEMENTS = 4096  # smaller values (per-channel statistics, scalars) are kept, not recomputed


def marked(graph: ir.Graph) -> bool:
    """Whether ``graph`` has a checkpoint region (a node marked ``CHECKPOINT_KEY``)."""
    return any(CHECKPOINT_KEY in node.metadata_props for node in graph)


@contextlib.contextmanager
def inherited(graph: ir.Graph, node: ir.Node):
    """The nodes appended to ``graph`` in the block (a pass writing ``node`` out) join ``node``'s region."""
    region, made = node.metadata_props.get(CHECKPOINT_KEY), len(graph)
    yield
    if region is not None:
        for new in list(graph)[made:]:
            new.metadata_props[CHECKPOINT_KEY] = region


def recompute(graph: ir.Graph, forward: set[str], opset: int, everywhere: bool = True) -> int:
    """Make every node not named in ``forward`` (the backward) read recomputed copies of the
    values its checkpoint regions' nodes produce and, ``everywhere``, of the large values that
    cheap forward nodes produce, placed just before their first reader; returns how many inputs
    were redirected. A region's copy reads copies of its own region's values only: its inputs from
    outside stay the forward's. (Forward nodes go by name: a gradient rule may replace one by a copy
    with more outputs, MaxPool's Indices, under the same name.)"""
    if not everywhere and not marked(graph):
        return 0
    e = Emitter(graph, opset, "recompute")
    copies: dict[ir.Value, ir.Value] = {}

    def region(v: ir.Value | None) -> str | None:
        p = v.producer() if v is not None else None
        if p is None or p.name not in forward or draws_random(p) or p.op_type == "Constant" or subgraphs(p):
            return None
        return p.metadata_props.get(CHECKPOINT_KEY)

    def cheap(v: ir.Value | None) -> bool:
        p = v.producer() if v is not None else None
        return (everywhere and p is not None and p.name in forward and p.op_type in CHEAP
                and p.domain in ("", "ai.onnx") and _large(v))

    def copy(v: ir.Value) -> ir.Value:
        if v not in copies:
            producer = v.producer()
            within = region(v)
            for u in producer.inputs:
                if (within is not None and region(u) == within) or cheap(u):
                    copy(u)
            copy_node(e, producer, copies)
            if within is not None:  # onnxruntime sessions keep such copies untold (recompute=True's: told)
                copies[v].producer().metadata_props[RECOMPUTED_KEY] = producer.name
        return copies[v]

    redirected = 0
    for node in [n for n in graph if n.name not in forward]:
        made = len(graph)
        for i, v in enumerate(node.inputs):
            if region(v) is not None or cheap(v):
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
