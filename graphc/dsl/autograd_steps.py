"""Which values reach a capture's outputs, and at which steps of a control-flow body: what a deferred
``gc.autograd.Function`` (a module's backward hooks, ``graphc.nn.backward_hooks``) is given None by.

A body is traced once, and a Function applied in it is captured once, given a gradient for each output reaching the
body's outputs (``autograd.settle``); torch, running the loop in Python, gives None at a step where the loss does
not reach that output: a body output the graph's outputs do not read, or a carried value only the next step reads
(none after the last). ``step_reaches`` gives, per body, the values reaching the graph's outputs at each kind of
step, for the warning ``autograd`` gives where those differ from what the body's backward was given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import onnx_ir as ir

from graphc.passes.values import subgraph_reads

__all__ = ["ancestors", "step_reaches"]

Links = Mapping[ir.Value, Sequence[ir.Value]]


def ancestors(values: Iterable[ir.Value], seen: set[ir.Value], links: Links | None = None) -> set[ir.Value]:
    """``seen`` with ``values`` and every value they are computed from (read inside a subgraph too) or, through
    ``links`` (a Function's marker: the values its backward sends gradients to), get a gradient from."""
    stack = [v for v in values if v not in seen]
    seen.update(stack)
    while stack:
        value = stack.pop()
        node = value.producer()
        reads = [] if node is None else [*node.inputs, *subgraph_reads(node)]
        for v in (*reads, *(links or {}).get(value, ())):
            if v is not None and v not in seen:
                seen.add(v)
                stack.append(v)
    return seen


def step_reaches(nodes: Iterable[ir.Node], reached: set[ir.Value], links: Links
                 ) -> dict[ir.Graph, list[set[ir.Value]]]:
    """Each If branch and Loop/Scan body under ``nodes`` (nested ones too) mapped to the distinct sets of its
    values that reach the graph's outputs at a step (a Loop's or Scan's last step, then each before it, back
    to a set seen before), ``reached`` being the values of ``nodes``' graph that do."""
    found: dict[ir.Graph, list[set[ir.Value]]] = {}
    for node in nodes:
        for attr in node.attributes.values():
            if attr.type != ir.AttributeType.GRAPH:
                continue
            body = attr.value
            sets = found.setdefault(body, [])
            for step in _steps(node, body, reached, links):
                if step not in sets:
                    sets.append(step)
                    for inner, more in step_reaches(body, step, links).items():
                        kept = found.setdefault(inner, [])
                        kept.extend(s for s in more if s not in kept)
    return found


def _steps(node: ir.Node, body: ir.Graph, reached: set[ir.Value], links: Links) -> list[set[ir.Value]]:
    first = 1 if node.op_type == "Loop" else 0  # a Loop body's first output is its condition
    outputs = body.outputs[first:]
    if node.op_type not in ("Loop", "Scan"):  # an If branch: one step
        return [ancestors([o for o, v in zip(outputs, node.outputs) if v in reached], set(), links)]
    if node.op_type == "Loop":
        count, carried = len(node.inputs) - 2, body.inputs[2:]
    else:
        count = len(node.inputs) - node.attributes["num_scan_inputs"].as_int()
        carried = body.inputs[:count]
    scanned = [o for o, v in zip(outputs[count:], node.outputs[count:]) if v in reached]
    step = ancestors([*(o for o, v in zip(outputs, node.outputs[:count]) if v in reached), *scanned], set(), links)
    steps: list[set[ir.Value]] = []
    while step not in steps:  # the last step, then each before it: a carry reaches where the next step reads it
        steps.append(step)
        step = ancestors([*(o for o, v in zip(outputs[:count], carried) if v in step), *scanned], set(), links)
    return steps
