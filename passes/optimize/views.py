"""Level 2's rewrites of ops that only re-view, reorder or cut data: Pad, Reshape, Transpose, Slice."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.optimize.pipeline import Declared, all_nodes
from graphc.passes.optimize.rules import int64_initializer
from graphc.passes.values import fixed_array

__all__ = ["ViewSimplification"]


def _replace(node: ir.Node, op_type: str, inputs: list, attributes=()) -> None:
    """Put a new ``op_type`` node computing ``node``'s one output in its place (an ``Identity``
    keeps a graph output's name; identity elimination then removes it)."""
    new = ir.Node("", op_type, inputs, attributes=attributes, metadata_props=dict(node.metadata_props))
    new.outputs[0].shape, new.outputs[0].type = node.outputs[0].shape, node.outputs[0].type
    ir.convenience.replace_nodes_and_values(node.graph, node, [node], [new], node.outputs, new.outputs)


def _zero_pad(node: ir.Node) -> bool:
    """``Pad(x, pads)`` -> x when the constant pads are all 0: every mode (constant, reflect,
    edge, wrap) then adds nothing and removes nothing, and the constant value is never read.
    (An exporter computes the pads from the input's shape, e.g. up to a multiple of a window
    size; with a static shape that is already a multiple, they fold to zeros.)"""
    pads = fixed_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if pads is None or np.any(pads != 0) or node.inputs[0] is None:
        return False
    _replace(node, "Identity", [node.inputs[0]])
    return True


def _plain_reshape(node: ir.Node) -> bool:
    """``Reshape(x, s, allowzero=1)`` -> ``Reshape(x, s)`` when the constant s holds no 0:
    ``allowzero`` only decides what a 0 in s means (a 0-sized dim, or "copy x's dim"), so
    without one both read alike, and the rules that need ``allowzero=0`` apply (the dynamo
    exporter writes every Reshape with ``allowzero=1``)."""
    shape = fixed_array(node.inputs[1])
    if not node.attributes.get_int("allowzero", 0) or shape is None or np.any(shape == 0):
        return False
    node.attributes.pop("allowzero")
    return True


def _transpose_as_reshape(node: ir.Node) -> bool:
    """``Transpose(x, perm)`` -> ``Reshape(x, y's shape)`` when perm moves only axes of static
    size 1 and keeps the other axes in their order: the row-major order of the elements is
    the order of the indices over the axes bigger than 1, which a permutation that keeps
    those in order leaves unchanged, so the Transpose is a re-view. y's shape must be static
    but for at most one dim (written -1) and hold no 0 (a Reshape's 0 copies a dim). The
    Reshape then merges with a neighbouring one (an LSTM's ``[T, 1, B, H]`` output)."""
    x, y = node.inputs[0], node.outputs[0]
    if x is None or x.shape is None or y.shape is None:
        return False
    perm = list(node.attributes.get_ints("perm", None) or range(len(x.shape))[::-1])
    if perm == sorted(perm):  # the identity: onnxscript's no-op rule removes it
        return False
    moved = [a for a in perm if x.shape[a] != 1]
    unknown = [d for d in y.shape if not isinstance(d, int)]
    if moved != sorted(moved) or len(unknown) > 1 or 0 in y.shape or len(y.shape) != len(perm):
        return False
    target = [d if isinstance(d, int) else -1 for d in y.shape]
    shape = int64_initializer(node.graph, f"{node.name or 'Transpose'}/as_reshape", np.array(target))
    _replace(node, "Reshape", [x, shape])
    return True


def _slice_params(node: ir.Node, rank: int) -> list[tuple[int, int, int, int]] | None:
    """(axis, start, end, step) per sliced axis of a Slice with constant parameters (axes
    normalized to ``0 <= axis < rank``), or None."""
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = fixed_array(ins[1]), fixed_array(ins[2])
    if starts is None or ends is None:
        return None
    axes = fixed_array(ins[3]) if ins[3] is not None else np.arange(len(starts))
    steps = fixed_array(ins[4]) if ins[4] is not None else np.ones(len(starts), np.int64)
    if axes is None or steps is None or not (len(axes) == len(starts) == len(ends) == len(steps)):
        return None
    if any(not -rank <= int(a) < rank for a in axes):
        return None
    return [(int(a) % rank, int(s), int(e), int(t)) for a, s, e, t in zip(axes, starts, ends, steps)]


def _slice_of_slice(node: ir.Node) -> bool:
    """``Slice(Slice(x, axes A), axes B)`` -> one ``Slice(x, axes A + B)`` when A and B share no
    axis (all parameters constant, x's rank known): slicing one axis leaves every other axis of
    x as it is, so the outer slice's start/end/step on its axes mean the same on x, and slices
    of distinct axes commute. The inner Slice stays for any other reader (each reading Slice
    merges on its own, so it dies when all of them do)."""
    inner = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    if inner is None or inner.op_type != "Slice" or inner.domain not in ("", "ai.onnx") or inner.graph is not node.graph:
        return False
    x = inner.inputs[0]
    if x is None or x.shape is None:
        return False
    first, second = _slice_params(inner, len(x.shape)), _slice_params(node, len(x.shape))
    if first is None or second is None or {a for a, *_ in first} & {a for a, *_ in second}:
        return False
    merged = np.array(first + second, np.int64).T
    base = node.name or "Slice"
    params = [int64_initializer(node.graph, f"{base}/{what}", merged[i])
              for i, what in ((1, "starts"), (2, "ends"), (0, "axes"), (3, "steps"))]
    _replace(node, "Slice", [x, *params])
    return True


_RULES = {"Pad": _zero_pad, "Reshape": _plain_reshape, "Transpose": _transpose_as_reshape, "Slice": _slice_of_slice}


class ViewSimplification(Declared, ir.passes.InPlacePass):
    """Each node of an op in ``_RULES`` is rewritten by its rule where the rule applies (each
    rule's docstring states the identity and why it holds):

    1. ``Pad`` by constant zeros -> its input (``_zero_pad``);
    2. ``Reshape(allowzero=1)`` to a constant shape without 0 -> plain ``Reshape`` (``_plain_reshape``);
    3. ``Transpose`` that moves only size-1 axes -> ``Reshape`` (``_transpose_as_reshape``);
    4. ``Slice`` of a ``Slice`` on other axes -> one ``Slice`` (``_slice_of_slice``).

    Safe for training graphs: no rule reads or changes a parameter."""

    name = "ViewSimplification"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            rule = _RULES.get(node.op_type)
            if rule is not None and node.domain in ("", "ai.onnx") and node.graph is not None and rule(node):
                modified = True
        return ir.passes.PassResult(model, modified)
