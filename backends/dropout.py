"""Which onnxruntime optimizer a model's training-mode Dropout needs switched off.

onnxruntime 1.31's ``EliminateDropout`` rewrite (graph optimization level "basic" and above; an
inference build, without ``ENABLE_TRAINING``) removes every opset 12/13 Dropout whose mask output is
unused and whose output can be renamed away (any Dropout but one writing a graph output), whatever
its ``training_mode``: a constant true or a fed true came out as the identity, so a
``gc.capture(..., training=True)`` Dropout1d/2d/3d, AlphaDropout, or Dropout before another op,
did not drop on ort-cpu while the numpy backend did. A session of such a model runs without that
rewrite; one whose Dropouts all stay in inference mode keeps it.
"""

from __future__ import annotations

import math

import onnx

from graphc.model.file import model_graphs

__all__ = ["eliminating"]


def eliminating(model: onnx.ModelProto) -> tuple[str, ...]:
    """``("EliminateDropout",)`` when a Dropout of ``model`` (in any graph or local function) may
    train: its ``training_mode`` is given and is not a constant false; else ``()``."""
    graphs = model_graphs(model)
    fed = {i.name for g in graphs for i in g.input}
    false = {t.name for g in graphs for t in g.initializer if t.name not in fed and _is_false(t)}
    false |= {node.output[0] for g in graphs for node in g.node if node.op_type == "Constant" and node.domain in (
        "", "ai.onnx") and any(a.name == "value" and _is_false(a.t) for a in node.attribute)}
    training = any(node.op_type == "Dropout" and node.domain in ("", "ai.onnx") and len(node.input) > 2
                   and node.input[2] and node.input[2] not in false for g in graphs for node in g.node)
    return ("EliminateDropout",) if training else ()


def _is_false(tensor: onnx.TensorProto) -> bool:
    """A one-element bool tensor holding false (other tensors are not read)."""
    if tensor.data_type != onnx.TensorProto.BOOL or math.prod(tensor.dims) != 1:
        return False
    return not onnx.numpy_helper.to_array(tensor).reshape(()).item()
