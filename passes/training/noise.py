"""The ``noise_shapes`` graph: the shapes of train_step's Dropout noise inputs, from the batch.

A noise input has the shape of the Dropout input it stands beside. Where the batch inputs' dims
name every dim of it (a captured model's ``[N, 128]``) a trainer binds them itself. Where a dim
is computed inside the model (an imported model's reshapes), the artifacts carry this graph: the
batch inputs in, ``<noise>.shape`` (int64, one entry per dim) out for each such noise input. It
is train_step's forward up to those values, with the trainable params and BatchNorm statistics
as zeros of their shapes (their values never decide a shape, and the file keeps no copy of the
weights) and every noise input as a constant of its value's shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from graphc.passes.emit import Emitter
from graphc.passes.training.modes import DROPOUT_INPUT_KEY

__all__ = ["SHAPE_SUFFIX", "shape_graph", "unbound"]

SHAPE_SUFFIX = ".shape"


def unbound(graph: ir.Graph, noise: Sequence[str], batch: Sequence[str]) -> list[str]:
    """The ``noise`` inputs of ``graph`` with a dim that is neither fixed nor a dim name of one
    of the ``batch`` inputs."""
    inputs = {v.name: v for v in graph.inputs}
    named = {d.value for n in batch for d in (inputs[n].shape or ()) if isinstance(d, ir.SymbolicDim)}
    named.discard(None)
    return [n for n in noise if inputs[n].shape is None
            or any(not isinstance(d, int) and d.value not in named for d in inputs[n].shape)]


def shape_graph(step: ir.Model, noise: Sequence[str], wanted: Sequence[str], batch: Sequence[str],
                weights: Sequence[str]) -> ir.Model:
    """The graph (see the module docstring) of ``step`` (train_step; ``noise`` its noise inputs)
    giving the shapes of the ``wanted`` noise inputs from the ``batch`` inputs; ``weights`` are
    the initializers that become zeros of their shape."""
    model = step.clone()
    graph = model.graph
    b = Emitter(graph, graph.opset_imports.get("", 0), "noise_shapes")
    produced = {v.name: v for node in graph for v in node.outputs}
    produced.update((v.name, v) for v in graph.inputs)
    inputs = {v.name: v for v in graph.inputs}
    beside = {node.inputs[0].name: produced[node.metadata_props[DROPOUT_INPUT_KEY]]
              for node in graph if DROPOUT_INPUT_KEY in node.metadata_props}
    outputs = []
    for name in noise:
        shape = b.op("Shape", beside[name], name=f"{name}{SHAPE_SUFFIX}" if name in wanted else None)
        if name in wanted:
            shape.shape = ir.Shape([None])
            outputs.append(shape)
        inputs[name].replace_all_uses_with(b.op("ConstantOfShape", shape, value=ir.tensor(np.array([0.5], np.float32))))
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    _keep_inputs(graph, batch)
    graph.sort()
    RemoveUnusedNodesPass()(model)
    for name in weights:
        value = graph.initializers.get(name)
        if value is not None:
            del graph.initializers[name]
            value.replace_all_uses_with(b.op("ConstantOfShape", b.ints(value.shape.numpy()),
                                             value=ir.tensor(np.zeros(1, dtype=value.dtype.numpy()))))
    graph.sort()
    _keep_inputs(graph, [v.name for v in graph.inputs if v.uses()])
    return model


def _keep_inputs(graph: ir.Graph, names: Sequence[str]) -> None:
    kept = [v for v in graph.inputs if v.name in names]
    graph.inputs.clear()
    graph.inputs.extend(kept)
