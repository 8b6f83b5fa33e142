"""What a dynamo export records about torch's gradient that its ONNX ops do not hold, written into
the graph (``mark``): torch's ``detach`` (``imports.mark_detached``) and an embedding's
``scale_grad_by_freq`` (``scale_grad_by_freq``). TorchScript records neither (its training-mode
export refuses ``scale_grad_by_freq``; docs/api.md says so)."""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.emit import Emitter
from graphc.passes.training import imports
from graphc.passes.values import STOP_GRADIENT_KEY, onnx_opset

_FX_NODE = "pkg.torch.onnx.fx_node"
# aten.embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) with scale_grad_by_freq True
_BY_FREQ = re.compile(r"target=torch\.ops\.aten\.embedding\.default\]\(args = \(%\w+, %\w+, -?\d+, True")


def mark(model: ir.Model) -> None:
    """Both rewrites of the module docstring, in place."""
    imports.mark_detached(model)
    scale_grad_by_freq(model)


def scale_grad_by_freq(model: ir.Model) -> list[str]:
    """Each Gather a dynamo export recorded as ``aten.embedding`` with ``scale_grad_by_freq=True``
    followed, as ``gc.nn.Embedding(scale_grad_by_freq=True)`` captures it, by ``rows`` in value and
    ``rows / count`` in gradient (``count``: how often each position's index occurs in the batch,
    a ScatterElements(add) histogram over the table's rows), so each row's gradient is divided by
    its count as torch's; in place, returns the tables' names."""
    graph = model.graph
    lookups = [n for n in graph if n.op_type == "Gather" and _BY_FREQ.search(n.metadata_props.get(_FX_NODE, ""))]
    emit = Emitter(graph, onnx_opset(model, 0), "grad_by_freq")
    for node in lookups:
        table, indices, rows = node.inputs[0], node.inputs[1], node.outputs[0]
        size = table.shape[0] if table.shape is not None else None
        if not isinstance(size, int):
            raise PassError(f"Gather {node.name!r} (an embedding with scale_grad_by_freq): its table "
                            f"{table.name!r} has no static number of rows (shape {table.shape})")
        uses = list(rows.uses())
        flat = emit.op("Reshape", emit.op("Cast", indices, to=ir.DataType.INT64), emit.ints([-1]))
        counts = emit.scatter_elements(emit.const(np.zeros(size, np.int64)), flat,
                                       emit.op("Expand", emit.ints([1]), emit.op("Shape", flat)), axis=0)
        count = emit.unsqueeze(emit.op("Cast", emit.op("Gather", counts, indices, axis=0), to=rows.dtype), [-1])
        held = emit.op("Identity", rows)
        held.producer().metadata_props[STOP_GRADIENT_KEY] = "true"
        scaled = emit.op("Add", held, emit.op("Div", emit.op("Sub", rows, held), count))
        for use in uses:
            use.node.replace_input_with(use.idx, scaled)
        if rows.is_graph_output():
            graph.outputs[graph.outputs.index(rows)] = scaled
            scaled.name, rows.name = rows.name, f"{rows.name}/looked_up"
    if lookups:
        graph.sort()
    return [node.inputs[0].name for node in lookups]
