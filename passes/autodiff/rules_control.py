"""VJP rules of control flow: If (both branches differentiated as subgraphs of a backward If),
Loop and Scan (unrolled when the number of iterations is static).

The backward If takes the same condition. Each of its branches is a clone of the forward
branch (recomputing the branch's intermediates, which are invisible outside it) followed by
that branch's gradient nodes; both output the gradients of every differentiable outer value
either branch reads (zeros where a branch does not read it).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, folded_array, static_shape
from graphc.passes.autodiff.registry import grad_rule


def _branch_gradients(g: GradBuilder, branch: ir.Graph, dys, targets: list[ir.Value]) -> ir.Graph:
    from graphc.passes.autodiff.core import backprop  # core imports the rule modules

    clone = branch.clone(allow_outer_scope_values=True)
    sub = g.subgraph_builder(clone)
    for node in clone:  # fresh names: the clone must not repeat the forward branch's names
        for out in node.outputs:
            out.name = sub.fresh("fwd")
    seeds: dict[ir.Value, ir.Value] = {}
    for out, dy in zip(clone.outputs, dys):
        if dy is not None:
            seeds[out] = sub.add(seeds[out], dy) if out in seeds else dy
    nodes = list(clone)
    grads = backprop(sub, nodes, seeds, targets)
    outputs = []
    for t in targets:
        grad = grads.get(t)
        value = sub.op("Identity", grad) if grad is not None else sub.zeros_like(t)
        value.type, value.shape = t.type, t.shape
        outputs.append(value)
    clone.outputs.clear()
    clone.outputs.extend(outputs)
    clone.name = sub.fresh("branch")
    return clone


@grad_rule("If", multi_output=True)
def grad_if(g, node, dys):
    from graphc.passes.autodiff.core import captured_values

    then_graph = node.attributes["then_branch"].value
    else_graph = node.attributes["else_branch"].value
    targets: dict[ir.Value, None] = {}
    for branch in (then_graph, else_graph):
        for v in captured_values(branch):
            if g.wants(v):
                targets.setdefault(v, None)
    targets_list = list(targets)
    if not targets_list:
        return {}
    then_bwd = _branch_gradients(g, then_graph, dys, targets_list)
    else_bwd = _branch_gradients(g, else_graph, dys, targets_list)
    outs = g.op("If", node.inputs[0], num_outputs=len(targets_list), then_branch=then_bwd, else_branch=else_bwd)
    if len(targets_list) == 1:
        outs = (outs,)
    return dict(zip(targets_list, outs))


# -- Loop and Scan: unrolled when the number of iterations is static -------------------------------
MAX_UNROLL = 4096


def _clone_body(g: GradBuilder, body: ir.Graph, mapping: dict[ir.Value, ir.Value]) -> list[ir.Value]:
    """Append one copy of ``body``'s nodes to ``g.graph`` with its inputs bound by ``mapping``;
    returns the copy's outputs (outer-scope values stay as they are)."""
    for node in body:
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            raise GraphError(f"gradient of a loop body with nested control flow ({node.op_type} "
                             f"{node.name!r}) is not supported")
        attrs = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        copy = ir.Node(node.domain, node.op_type, [mapping.get(v, v) if v is not None else None for v in node.inputs],
                       attrs, num_outputs=len(node.outputs), metadata_props=dict(node.metadata_props),
                       name=g.fresh(node.op_type))
        for old, new in zip(node.outputs, copy.outputs):
            new.name = g.fresh("unrolled")
            new.type, new.shape = old.type, old.shape
            mapping[old] = new
        g.graph.append(copy)
    return [mapping.get(v, v) for v in body.outputs]


def _unrolled_gradients(g: GradBuilder, node: ir.Node, steps, seeds_fn):
    """Unroll ``steps`` (a function emitting the forward copy and returning its seed map) and
    backpropagate through the copy to the node's inputs and the outer values its body reads."""
    from graphc.passes.autodiff.core import backprop, captured_values

    sub = g.subgraph_builder(g.graph)
    start = len(g.graph)
    seeds = seeds_fn(sub, steps(sub))
    nodes = list(g.graph)[start:]
    body = node.attributes["body"].value
    targets = [v for v in dict.fromkeys([*node.inputs, *captured_values(body)]) if v is not None and g.wants(v)]
    grads = backprop(sub, nodes, seeds, targets)
    return {v: grads[v] for v in targets if v in grads}


def _static_trip_count(node: ir.Node) -> int:
    trip = folded_array(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    cond = folded_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else np.array(True)
    if trip is None or cond is None or not bool(cond) or int(trip) > MAX_UNROLL:
        raise GraphError(f"gradient of Loop {node.name!r} needs a constant trip count (<= {MAX_UNROLL}) and "
                         "no loop condition; gc.fori_loop with int bounds gives one")
    body = node.attributes["body"].value
    cond_out = body.outputs[0]
    producer = cond_out.producer()
    passes_cond = cond_out is body.inputs[1] or (producer is not None and producer.op_type == "Identity"
                                                 and producer.inputs[0] is body.inputs[1])
    always = folded_array(cond_out)  # a constant true (TorchScript writes Cast of an outer True)
    if not passes_cond and not (always is not None and bool(always)):
        raise GraphError(f"gradient of Loop {node.name!r}: the body computes its own exit condition")
    return int(trip)


@grad_rule("Loop", multi_output=True)
def grad_loop(g, node, dys):
    # Loop(M, cond, v...) with a constant trip count and no early exit: the forward is unrolled
    # (recomputed) step by step and differentiated like straight-line code.
    trips = _static_trip_count(node)
    body = node.attributes["body"].value
    n_carry = len(node.inputs) - 2
    true = None

    def steps(sub):
        nonlocal true
        true = sub.const(True, np.bool_)
        carry = list(node.inputs[2:])
        scans = []
        for i in range(trips):
            mapping = {body.inputs[0]: sub.const(i, np.int64), body.inputs[1]: true}
            mapping.update(zip(body.inputs[2:], carry))
            outs = _clone_body(sub, body, mapping)
            carry = outs[1:1 + n_carry]
            scans.append(outs[1 + n_carry:])
        return carry, scans

    return _unrolled_gradients(g, node, steps, lambda sub, result: _seeds(sub, result, dys, n_carry, trips, 0, 0))


def _seeds(sub: GradBuilder, result, dys, n_carry: int, length: int, out_axes, reverse) -> dict:
    """Seeds for the unrolled copy: final carries get their dy; stacked outputs' dy is split per step."""
    carry, scans = result
    seeds: dict[ir.Value, ir.Value] = {}

    def add(value, dy):
        seeds[value] = sub.add(seeds[value], dy) if value in seeds else dy

    for value, dy in zip(carry, dys[:n_carry]):
        if dy is not None:
            add(value, dy)
    for j, dy in enumerate(dys[n_carry:]):
        if dy is None or length == 0:
            continue
        axis = out_axes[j] if isinstance(out_axes, list) else out_axes
        flip = reverse[j] if isinstance(reverse, list) else reverse
        parts = sub.split(dy, [1] * length, axis, length)
        for step in range(length):
            part = parts[length - 1 - step if flip else step]
            add(scans[step][j], sub.squeeze(part, [axis]))
    return seeds


@grad_rule("Scan", multi_output=True)
def grad_scan(g, node, dys):
    # Scan with a static sequence length: unrolled like Loop; scanned inputs are read with Gather
    # and scan outputs' gradients split per step (axes and directions honoured).
    body = node.attributes["body"].value
    m = attr(node, "num_scan_inputs")
    n_carry = len(node.inputs) - m
    in_axes = list(attr(node, "scan_input_axes", None) or [0] * m)
    in_dirs = list(attr(node, "scan_input_directions", None) or [0] * m)
    n_out = len(body.outputs) - n_carry
    out_axes = list(attr(node, "scan_output_axes", None) or [0] * n_out)
    out_dirs = list(attr(node, "scan_output_directions", None) or [0] * n_out)
    lengths = set()
    for x, axis in zip(node.inputs[n_carry:], in_axes):
        shape = static_shape(x)
        if shape is None or not isinstance(shape[axis % len(shape)], int):
            raise GraphError(f"gradient of Scan {node.name!r} needs a static sequence length")
        lengths.add(shape[axis % len(shape)])
    length = lengths.pop() if lengths else 0
    if length > MAX_UNROLL:
        raise GraphError(f"gradient of Scan {node.name!r}: {length} steps is more than {MAX_UNROLL}")
    out_axes = [a % (g.rank(o)) for a, o in zip(out_axes, node.outputs[n_carry:])]

    def steps(sub):
        carry, scans = list(node.inputs[:n_carry]), []
        for i in range(length):
            mapping = dict(zip(body.inputs[:n_carry], carry))
            for k, (x, axis, rev) in enumerate(zip(node.inputs[n_carry:], in_axes, in_dirs)):
                index = sub.const(length - 1 - i if rev else i, np.int64)
                element = sub.op("Gather", x, index, axis=axis)
                element.type, element.shape = body.inputs[n_carry + k].type, body.inputs[n_carry + k].shape
                mapping[body.inputs[n_carry + k]] = element
            outs = _clone_body(sub, body, mapping)
            carry = outs[:n_carry]
            scans.append(outs[n_carry:])
        return carry, scans

    return _unrolled_gradients(
        g, node, steps, lambda sub, result: _seeds(sub, result, dys, n_carry, length, out_axes, out_dirs))
