"""RNN/GRU/LSTM activation parameters written out in full, in an onnxruntime session's copy of a model.

Where ``activation_alpha``/``activation_beta`` run out before an activation that takes them, ONNX
gives it the defaults of the op of that name (ThresholdedRelu alpha 1, Affine alpha 1 and beta 0,
ScaledTanh 1 and 1: ``passes/recurrent_activations.py``), as graphc's numpy kernels and written-out
form do; onnxruntime 1.31 takes 0 for those three instead. The session's copy lists every activation's
parameters; the model itself is not changed.
"""

from __future__ import annotations

import onnx
from onnx import helper

from graphc.model.file import all_graphs
from graphc.passes.recurrent_activations import activation_params, takes_params

__all__ = ["with_full_params"]

_RECURRENT = frozenset({"RNN", "GRU", "LSTM"})


def with_full_params(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when every recurrent node's activation parameters are given in full (or
    its activations take none), else a copy in which they are, subgraphs included."""
    if not any(_full_params(node) is not None for graph in all_graphs(model.graph) for node in graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for graph in all_graphs(copy.graph):
        for node in graph.node:
            full = _full_params(node)
            if full is not None:
                kept = [a for a in node.attribute if a.name not in ("activation_alpha", "activation_beta")]
                del node.attribute[:]
                node.attribute.extend(kept + [helper.make_attribute(name, values)
                                              for name, values in zip(("activation_alpha", "activation_beta"), full)
                                              if values])
    return copy


def _full_params(node: onnx.NodeProto) -> tuple[list[float], list[float]] | None:
    """(alphas, betas) in full for a recurrent node whose lists fall short, else None."""
    if node.op_type not in _RECURRENT or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: a for a in node.attribute}
    if "activations" not in attrs:  # the defaults (Sigmoid, Tanh) take no parameters
        return None
    names = [n.decode() for n in attrs["activations"].strings]
    if any(takes_params(n) is None for n in names):  # onnxruntime names what it does not know
        return None
    given = [list(attrs[k].floats) if k in attrs else [] for k in ("activation_alpha", "activation_beta")]
    params = activation_params(names, *given)
    full = ([a for n, (a, _) in zip(names, params) if takes_params(n) >= 1],
            [b for n, (_, b) in zip(names, params) if takes_params(n) >= 2])
    return None if [len(v) for v in full] == [len(v) for v in given] else full
