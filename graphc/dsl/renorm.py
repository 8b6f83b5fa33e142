"""Torch's in-place renormalisation by an embedding with ``max_norm`` (``embedding_renorm_``) in a
captured forward: ``renorm_in_place`` rebinds the weight to itself with the rows looked up renormalised,
so that a later read sees them; ``drop_unread``, at the end of capture, removes such a write-back that
nothing reads (the training graphs write it back again from the lookup's record). Inside a
control-flow body, a weight from outside it is not rebound: the body looks up the renormalised rows only."""

from __future__ import annotations

import json
from dataclasses import dataclass

import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.builder import current, user_source
from graphc.dsl.inplace import outside_body, rebind
from graphc.dsl.tensor import Tensor
from graphc.passes.values import MAX_NORM_KEY, MAX_NORM_ROWS_KEY


@dataclass
class WriteBack:
    """One ``renorm_in_place`` in the main graph: the param and line (``record``), the lookup's scaled
    rows' node, the weight and indices values it read, the nodes it emitted and the weight's new value."""

    record: dict[str, str]
    rows: ir.Node
    weight: ir.Value
    indices: ir.Value
    nodes: list[ir.Node]
    result: ir.Value


def renorm_in_place(weight: Tensor, indices: Tensor, scaled: Tensor) -> None:
    """``weight`` rebound, as torch's ``embedding_renorm_`` writes it, to itself with the rows at
    ``indices`` replaced by their ``scaled`` values (a ScatterND; a repeated index writes the same
    row), so that later reads (a tied output layer, another lookup) see them; the gradient still
    reaches ``weight`` as it was (a straight-through sum). The new value's stop-gradient Identity is
    marked ``MAX_NORM_KEY`` with the param it renormalises and the line: the training graphs step
    the param from its last such value (``passes/training/max_norm.py``). A weight from outside the
    control-flow body being traced is not rebound (the body cannot): ``scaled`` is marked
    ``MAX_NORM_ROWS_KEY`` instead, which the training graphs refuse for a trained param."""
    param, builder = _renormed_param(weight), current()
    record = {"param": param, "at": user_source()}
    if outside_body(weight):
        scaled.value.producer().metadata_props[MAX_NORM_ROWS_KEY] = json.dumps(record)
        return
    start, read = len(builder.scope.nodes), weight.value
    rows = ops.reshape(scaled, [-1, weight.shape[1]])
    new = ops.detach(ops.emit("ScatterND", [ops.detach(weight), ops.reshape(ops.cast(indices, "int64"), [-1, 1]), rows]))
    new.value.producer().metadata_props[MAX_NORM_KEY] = f"{param} at {record['at']}"
    rebind(weight, new + (weight - ops.detach(weight)), f"{weight.name} was renormalised in place by an "
           f"embedding with max_norm at {record['at']}")
    if len(builder.scopes) == 1:  # a body's own weight: the body's graph is not the captured one
        builder.write_backs.append(WriteBack(record, scaled.value.producer(), read, indices.value,
                                             builder.scope.nodes[start:], weight.value))


def drop_unread(graph: ir.Graph, write_backs: list[WriteBack]) -> None:
    """Remove from ``graph`` (the captured main graph) each write-back whose new weight nothing reads
    (its nodes that nothing else reads), and record on its lookup's rows (``MAX_NORM_ROWS_KEY``) the
    names of the weight and indices values, from which the training graphs write it back. Only a
    weight's last write-back can be unread: every lookup after one reads it."""
    for wb in write_backs:
        if wb.result.uses() or wb.result.is_graph_output():
            continue
        for node in reversed(wb.nodes):
            if not any(v.uses() or v.is_graph_output() for v in node.outputs):
                graph.remove(node, safe=True)
        wb.rows.metadata_props[MAX_NORM_ROWS_KEY] = json.dumps(
            {**wb.record, "weight": wb.weight.name, "indices": wb.indices.name})


def _renormed_param(weight: Tensor) -> str:
    """The name of the value ``weight`` held before any ``renorm_in_place`` rebound it: back through
    each ``new + (previous - detach(previous))``."""
    value = weight.value
    while True:
        add = value.producer()
        new = add.inputs[0].producer() if add is not None and add.op_type == "Add" else None
        if new is None or MAX_NORM_KEY not in new.metadata_props:
            return value.name
        value = add.inputs[1].producer().inputs[0]
