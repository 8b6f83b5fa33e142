"""Torch's in-place renormalisation by an embedding with ``max_norm`` (``embedding_renorm_``) in a
captured forward: ``renorm_in_place`` rebinds the weight to itself with the rows looked up renormalised,
so that a later read sees them; ``drop_unread``, at the end of capture, removes such a write-back that
nothing reads (the training graphs write it back again from the lookup's record).

Inside a ``gc.cond``/``gc.fori_loop``/``gc.scan``/``gc.while_loop`` body, a weight from outside it is
rebound in the body too and recorded (``Carried``); when the body is traced, ``emit_carrying`` makes it a
carried value of the Loop or Scan (``branch_outputs``: an output of both If branches), so each iteration reads
the weight the one before left, and rebinds the weight to the node's output, as torch's Python loop leaves it.
Inside a ``gc.vmap`` body, a lookup of a weight from outside it is recorded (``OuterLookup``) and made again
after the call on every example's indices (``vmap_renorm``). A body that can do neither (an If or Loop inside
a vmap body) looks up the renormalised rows only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
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


@dataclass
class Carried:
    """A Tensor from outside a control-flow body that the body's lookups renormalised: its value (and
    example value) before the body, and the body's last value of it (``restore`` sets it)."""

    tensor: Tensor
    before: ir.Value
    eager: np.ndarray | None
    after: ir.Value | None = None


@dataclass(eq=False)
class OuterLookup:
    """A max_norm lookup, in a ``gc.vmap`` body, of a weight from outside it: the weight, the indices,
    the lookup's ``max_norm`` and ``norm_type``, its rows' node and its record (param, line)."""

    weight: Tensor
    indices: Tensor
    norms: tuple[float, float]
    rows: ir.Node
    record: dict[str, str]


def renorm_in_place(weight: Tensor, indices: Tensor, scaled: Tensor, norms: tuple[float, float],
                    at: str | None = None) -> None:
    """``weight`` rebound, as torch's ``embedding_renorm_`` writes it, to itself with the rows at
    ``indices`` replaced by their ``scaled`` values (a ScatterND; a repeated index writes the same
    row), so that later reads (a tied output layer, another lookup) see them; the gradient still
    reaches ``weight`` as it was (a straight-through sum). The new value's stop-gradient Identity is
    marked ``MAX_NORM_KEY`` with the param it renormalises and the line: the training graphs step
    the param from its last such value (``passes/training/max_norm.py``). A weight from outside the
    control-flow body being traced is rebound in the body and recorded to be carried out of it
    (``Carried``); in a ``gc.vmap`` body it is not rebound but recorded (``OuterLookup``); where the body
    can do neither, ``scaled`` is marked ``MAX_NORM_ROWS_KEY`` instead, which the training graphs refuse
    for a trained param. ``norms``: the lookup's ``max_norm`` and ``norm_type``; ``at``: its line
    (default: the caller's)."""
    param, builder = renormed_param(weight), current()
    record = {"param": param, "at": at or user_source()}
    if outside_body(weight) and builder.scope.lookups is not None:
        builder.scope.lookups.append(OuterLookup(weight, indices, norms, scaled.value.producer(), record))
        return
    if outside_body(weight) and builder.scope.carries is None:
        refuse(scaled.value.producer(), record)
        return
    start, read = len(builder.scope.nodes), weight.value
    rows = ops.reshape(scaled, [-1, weight.shape[1]])
    _write(weight, ops.emit("ScatterND", [ops.detach(weight), ops.reshape(ops.cast(indices, "int64"), [-1, 1]), rows]),
           record)
    if len(builder.scopes) == 1:  # a body's own weight: the body's graph is not the captured one
        builder.write_backs.append(WriteBack(record, scaled.value.producer(), read, indices.value,
                                             builder.scope.nodes[start:], weight.value))


def _write(weight: Tensor, new: Tensor, record: dict[str, str]) -> None:
    """``weight`` rebound to ``new``'s value (a stop-gradient Identity marked ``MAX_NORM_KEY``) with its
    own gradient (a straight-through sum); recorded as ``Carried`` where it is from outside the body."""
    new = ops.detach(new)
    new.value.producer().metadata_props[MAX_NORM_KEY] = f"{record['param']} at {record['at']}"
    scope = current().scope
    if outside_body(weight) and not any(c.tensor is weight for c in scope.carries):
        scope.carries.append(Carried(weight, weight.value, weight.eager_value))
    rebind(weight, new + (weight - ops.detach(weight)), f"{weight.name} was renormalised in place by an "
           f"embedding with max_norm at {record['at']}")


def restore(carries: list[Carried]) -> None:
    """After a body's trace: each of ``carries`` rebound to its value before the body, its last value
    in the body kept as ``after``."""
    for c in carries:
        c.after = c.tensor.value
        rebind(c.tensor, Tensor(c.before, c.eager), f"{c.tensor.name} was renormalised in a control-flow body")


# What comes before a Loop's or Scan's carried values: among its (and its body's) inputs, among its body's outputs
_BEFORE_STATE = {"Loop": (2, 1), "Scan": (0, 0)}


def emit_carrying(op: str, inputs: list[Tensor | None], attrs: dict[str, Any], out_types: list[tuple[Any, Any]],
                  n_state: int, carries: list[Carried], source: str,
                  evaluator: Callable[[list], list]) -> list[Tensor]:
    """The If, Loop or Scan ``op`` (``inputs``, ``attrs``, ``out_types``: its own) emitted with ``carries``, recorded
    while its bodies were traced, carried out of it as outputs after its first ``n_state``: a Loop's or Scan's
    made carried values of its body (``_carry``) and inputs of the node after its own state, an If's already
    outputs of both branches (``branch_outputs``). Each of ``carries`` is rebound to its output (``write_back``);
    returns the node's other outputs."""
    if op != "If":
        before_in, before_out = _BEFORE_STATE[op]
        at = before_in + n_state
        _carry(attrs["body"], carries, at, before_out + n_state)
        inputs = [*inputs[:at], *(c.tensor for c in carries), *inputs[at:]]
    types = out_types[:n_state] + [(c.tensor.dtype, c.tensor.shape) for c in carries] + out_types[n_state:]
    results = ops.emit(op, inputs, attrs, len(types), out_types=types, source=source, evaluator=evaluator)
    results = results if len(types) > 1 else [results]
    end = n_state + len(carries)
    write_back(results[n_state:end], carries, source)
    return results[:n_state] + results[end:]


def _carry(graph: ir.Graph, carries: list[Carried], at_in: int, at_out: int) -> None:
    """Each of ``carries`` made a carried value of the Loop or Scan body ``graph``: an input from ``at_in``
    on, which the body (its nested bodies too) reads where it read the value before the body, and its
    last value an output from ``at_out`` on."""
    for k, c in enumerate(carries):
        state = ir.Value(name=current().unique(f"{c.before.name}_carried"), type=c.before.type,
                         shape=None if c.before.shape is None else ir.Shape(list(c.before.shape)))
        for node in ir.traversal.RecursiveGraphIterator(graph):
            for i, v in enumerate(node.inputs):
                if v is c.before:
                    node.replace_input_with(i, state)
        graph.inputs.insert(at_in + k, state)
        graph.outputs.insert(at_out + k, _own_output(graph, c.after, c.after in graph.outputs))


def branch_outputs(then_g: ir.Graph, else_g: ir.Graph, then_c: list[Carried], else_c: list[Carried]) -> list[Carried]:
    """Each Tensor either If branch renormalised (the then branch's first), appended to both branches'
    outputs: its last value in the branch, or, in a branch that did not, its value before the If."""
    union = then_c + [c for c in else_c if not any(c.tensor is d.tensor for d in then_c)]
    for graph, own in ((then_g, then_c), (else_g, else_c)):
        for c in union:
            mine = next((d for d in own if d.tensor is c.tensor), None)
            value = c.before if mine is None else mine.after
            graph.outputs.append(_own_output(graph, value, mine is None or value in graph.outputs))
    return union


def _own_output(graph: ir.Graph, value: ir.Value, copy: bool) -> ir.Value:
    """``value``, or with ``copy`` an Identity of it appended to ``graph``: a body output of its own."""
    if not copy:
        return value
    node = ir.Node("", "Identity", [value], num_outputs=1)
    node.outputs[0].name, node.outputs[0].type = current().unique(f"{value.name}_out"), value.type
    node.outputs[0].shape = value.shape
    graph.append(node)
    return node.outputs[0]


def write_back(results: list[Tensor], carries: list[Carried], at: str) -> None:
    """After a control-flow node: each of ``carries`` rebound to its output among ``results`` (the
    body's last value), a write-back marked at ``at``; inside a body that cannot carry it, not rebound:
    the output's node is marked ``MAX_NORM_ROWS_KEY``, which the training graphs refuse."""
    for c, out in zip(carries, results):
        record = {"param": renormed_param(c.tensor), "at": at}
        if outside_body(c.tensor) and current().scope.carries is None:
            refuse(out.value.producer(), record)
        else:
            _write(c.tensor, out, record)


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


def refuse(rows: ir.Node, record: dict[str, str]) -> None:
    """Mark the lookup's ``rows`` ``MAX_NORM_ROWS_KEY`` with ``record`` and no weight: a write-back the
    body could not make, which the training graphs refuse for a trained param."""
    rows.metadata_props[MAX_NORM_ROWS_KEY] = json.dumps(record)


def renormed_param(weight: Tensor) -> str:
    """The name of the value ``weight`` held before any ``renorm_in_place`` rebound it: back through
    each ``new + (previous - detach(previous))``."""
    value = weight.value
    while True:
        add = value.producer()
        new = add.inputs[0].producer() if add is not None and add.op_type == "Add" else None
        if new is None or MAX_NORM_KEY not in new.metadata_props:
            return value.name
        value = add.inputs[1].producer().inputs[0]
