"""Params an embedding with ``max_norm`` renormalises in place (torch's ``embedding_renorm_``): torch's
optimizer steps each from its renormalised value, so the training graphs do too.

``gc.capture`` rebinds the weight to a ScatterND of the renormalised rows into it, its stop-gradient
Identity marked ``MAX_NORM_KEY``; a write-back nothing in the forward reads it drops, recording on the
lookup's rows (``MAX_NORM_ROWS_KEY``) the weight and indices it read, and ``renormed`` writes it back
again here. A lookup inside a control-flow body of a weight from outside it writes back in the body, and
the body carries the weight out (a Loop's or Scan's carried value, an If's output) to a write-back after
the node (``gc.vmap``'s makes it after the call: ``graphc/dsl/vmap_renorm.py``); one whose body could not
(a ``gc.vmap`` body reading the weight besides such lookups), or whose write-back after the node is gone, is
refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.emit import Emitter
from graphc.passes.training.graph_outputs import by_name
from graphc.passes.values import MAX_NORM_KEY, MAX_NORM_ROWS_KEY

__all__ = ["param_of", "renormed"]


def renormed(graph: ir.Graph, opset: int, params: Sequence[str]) -> dict[str, str]:
    """``{param: the name of its value after the forward}`` for each of ``params`` that an embedding
    with ``max_norm`` renormalises in place: its last write-back in graph order (each reads the one
    before), appended to ``graph`` from the lookup's record where capture dropped it. A PassError for
    a lookup inside a control-flow body that does not carry the weight out of it."""
    last: dict[str, ir.Node] = {}
    in_body: dict[str, ir.Node] = {}  # a body's write-back not yet followed by one in the main graph
    for node in ir.traversal.RecursiveGraphIterator(graph):
        param = param_of(node)
        if param in params:
            if MAX_NORM_KEY not in node.metadata_props and (node.graph is not graph or "weight" not in _where(node)[0]):
                _refuse_in_body(node)  # a body's lookup, or one it left in the main graph (gc.vmap's rewrite)
            (in_body if node.graph is not graph else last)[param] = node
            if node.graph is graph:
                in_body.pop(param, None)
    if in_body:
        param, node = next(iter(in_body.items()))
        at = node.metadata_props[MAX_NORM_KEY].partition(" at ")[2]
        raise PassError(f"the embedding of {param!r} with max_norm at {at} "
                        f"renormalises it inside a control-flow body, and the write-back of the weight the body "
                        f"carries out is no longer in the model (a pass removed it), so the training graphs cannot "
                        f"step it from its renormalised value; generate the training graphs from the model as "
                        f"gc.capture made it")
    return {param: node.outputs[0].name if MAX_NORM_KEY in node.metadata_props else _write_back(graph, opset, node)
            for param, node in last.items()}


def param_of(node: ir.Node | None) -> str | None:
    """The param ``node`` is marked as renormalising: a write-back's new weight (``MAX_NORM_KEY``) or
    the rows of a lookup whose write-back capture dropped (``MAX_NORM_ROWS_KEY``); None if neither."""
    if node is None:
        return None
    if MAX_NORM_KEY in node.metadata_props:
        return node.metadata_props[MAX_NORM_KEY].partition(" at ")[0]
    if MAX_NORM_ROWS_KEY in node.metadata_props:
        return json.loads(node.metadata_props[MAX_NORM_ROWS_KEY])["param"]
    return None


def _where(rows: ir.Node) -> tuple[dict, str]:
    record = json.loads(rows.metadata_props[MAX_NORM_ROWS_KEY])
    return record, f"the embedding of {record['param']!r} with max_norm at {record['at']}"


def _refuse_in_body(rows: ir.Node) -> None:
    record, where = _where(rows)
    raise PassError(f"{where} is trained inside a control-flow body that does not carry the weight out (a "
                    f"gc.vmap body that reads the weight it closes over besides its lookups with one max_norm and "
                    f"norm_type, or looks it up inside a gc.cond/gc.fori_loop/gc.scan/gc.while_loop body of its "
                    f"own, or a model captured before such bodies carried it): torch renormalises the rows it "
                    f"looks up in the weight in place and its optimizer steps the renormalised weight, but this "
                    f"body only renormalises the rows it looks up, the weight stays as stored; capture the model again, look it up outside such a body, freeze the "
                    f"weight (frozen=[{record['param']!r}]) or train without max_norm")


def _write_back(graph: ir.Graph, opset: int, rows: ir.Node) -> str:
    """The name of the weight with the renormalised ``rows`` written at the indices they were looked
    up from (the record capture left on ``rows``), appended to ``graph``: the write-back it dropped."""
    record, where = _where(rows)
    try:
        weight, indices = by_name(graph, record["weight"]), by_name(graph, record["indices"])
    except KeyError as missing:
        raise PassError(f"{where}: the value {missing} it looked up is no longer in the model, so the training "
                        f"graphs cannot write the renormalised rows back into the weight; generate the training "
                        f"graphs from the model as gc.capture made it") from None
    e = Emitter(graph, opset)
    flat = e.op("Reshape", e.op("Cast", indices, to=ir.DataType.INT64), e.ints([-1, 1]))
    columns = graph.initializers[record["param"]].shape[1]
    return e.op("ScatterND", weight, flat, e.op("Reshape", rows.outputs[0], e.ints([-1, columns]))).name
