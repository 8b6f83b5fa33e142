"""VJP rules of control flow: If (both branches differentiated as subgraphs of a backward If),
Loop and Scan (unrolled when the number of iterations is static; any other Loop in reverse mode
with a recorded tape, ``_reverse_loop``).

The backward If takes the same condition. Each of its branches is a clone of the forward
branch (recomputing the branch's intermediates, which are invisible outside it) followed by
that branch's gradient nodes; both output the gradients of every differentiable outer value
either branch reads (zeros where a branch does not read it).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, folded_array, is_float, static_shape
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
    # (recomputed) step by step and differentiated like straight-line code. Any other Loop runs
    # again recording each step's carried values, and a backward Loop walks them in reverse.
    try:
        trips = _static_trip_count(node)
    except GraphError:
        return _reverse_loop(g, node, dys)
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


def _reverse_loop(g: GradBuilder, node: ir.Node, dys) -> dict:
    """Gradients of a Loop whose number of steps is known only at run time (its own exit
    condition, a trip count fed in): reverse mode with a tape.

    1. A copy of the Loop runs again and also stacks, as scan outputs, each step's iteration
       number and carried values (the tape). The step count T is the tape's length.
    2. A backward Loop runs T steps, t = T-1 .. 0: it reads step t's values off the tape,
       recomputes the body from them, and backpropagates through it the carried values'
       gradients (its loop-carried state, starting from the outputs' dys) and step t's slice
       of each scan output's dy; the gradients of outer values the body reads are summed in
       further loop-carried accumulators.
    Exact for any number of steps, zero included (then the carried values' gradients are the
    dys themselves). The body may not hold control flow of its own."""
    from graphc.passes.autodiff.core import backprop, captured_values

    body = node.attributes["body"].value
    n_carry = len(node.inputs) - 2
    carried_in, carried_out = list(body.inputs[2:]), list(body.outputs[1:1 + n_carry])
    scan_out = list(body.outputs[1 + n_carry:])
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for n in body for a in n.attributes.values()):
        raise GraphError(f"gradient of Loop {node.name!r}: its step count is known only at run time and its "
                         "body holds control flow, which is not supported")
    if any(not isinstance(v.type, ir.TensorType) for v in carried_in):
        raise GraphError(f"gradient of Loop {node.name!r}: its step count is known only at run time and it "
                         "carries a sequence, which is not supported")
    floats = [k for k, v in enumerate(carried_in) if is_float(v)]
    captured = [v for v in captured_values(body) if g.wants(v)]

    # 1. the recording Loop: the body again, plus (iteration, carried values) as scan outputs
    record = body.clone(allow_outer_scope_values=True)
    for value in [*record.inputs, *(out for n in record for out in n.outputs)]:
        value.name = g.fresh("tape")
    tape_outputs = []
    for value in [record.inputs[0], *record.inputs[2:]]:
        copy = ir.node("Identity", [value], name=g.fresh("Identity"))
        copy.outputs[0].name, copy.outputs[0].type = g.fresh("tape"), value.type
        record.append(copy)
        tape_outputs.append(copy.outputs[0])
    record.outputs.extend(tape_outputs)
    record.name = g.fresh("tape_body")
    outs = g.op("Loop", *node.inputs, num_outputs=len(node.outputs) + 1 + n_carry, body=record)
    for out, like in zip(outs, [*node.outputs, record.inputs[0], *carried_in]):
        out.type = like.type
    tape_iter, tapes = outs[len(node.outputs)], outs[len(node.outputs) + 1:]
    steps = g.squeeze(g.op("Shape", tape_iter), [0])
    last = g.op("Sub", steps, g.const(1, np.int64))

    # 2. the backward Loop's body: (j, cond, dv..., acc...) -> (cond, dv'..., acc'...)
    backward = ir.Graph([], [], nodes=[], name=g.fresh("reverse_body"))
    sub = g.subgraph_builder(backward)
    j = ir.Value(name=g.fresh("j"), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    cond = ir.Value(name=g.fresh("cond"), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    dv_in = [ir.Value(name=g.fresh("dv"), type=carried_in[k].type, shape=carried_in[k].shape) for k in floats]
    acc_in = [ir.Value(name=g.fresh("acc"), type=c.type, shape=c.shape) for c in captured]
    backward.inputs.extend([j, cond, *dv_in, *acc_in])
    t = sub.op("Sub", last, j)
    mapping = {body.inputs[0]: sub.op("Gather", tape_iter, t, axis=0), body.inputs[1]: sub.const(True, np.bool_)}
    for k, tape in enumerate(tapes):
        mapping[carried_in[k]] = value = sub.op("Gather", tape, t, axis=0)
        value.type, value.shape = carried_in[k].type, carried_in[k].shape
    start = len(backward)
    _clone_body(sub, body, mapping)
    seeds: dict[ir.Value, ir.Value] = {}
    for k, dv in zip(floats, dv_in):
        out = mapping.get(carried_out[k], carried_out[k])
        seeds[out] = sub.add(seeds[out], dv) if out in seeds else dv
    for value, dy in zip(scan_out, dys[n_carry:]):
        if dy is not None:
            out, part = mapping.get(value, value), sub.op("Gather", dy, t, axis=0)
            seeds[out] = sub.add(seeds[out], part) if out in seeds else part
    targets = [mapping[carried_in[k]] for k in floats] + captured
    grads = backprop(sub, list(backward)[start:], seeds, targets)
    results = [sub.op("Identity", cond)]
    for k in floats:
        value = mapping[carried_in[k]]
        results.append(sub.op("Identity", grads[value]) if value in grads else sub.zeros_like(value))
    for c, acc in zip(captured, acc_in):
        results.append(sub.op("Add", acc, grads[c]) if c in grads else sub.op("Identity", acc))
    for value, like in zip(results, [cond, *dv_in, *acc_in]):
        value.type, value.shape = like.type, like.shape
    backward.outputs.extend(results)

    dv0 = [dys[k] if dys[k] is not None else g.zeros_like(node.outputs[k]) for k in floats]
    acc0 = [g.zeros_like(c) for c in captured]
    final = g.op("Loop", steps, None, *dv0, *acc0, num_outputs=len(floats) + len(captured), body=backward)
    final = (final,) if len(floats) + len(captured) == 1 else final
    result = {node.inputs[2 + k]: dv for k, dv in zip(floats, final) if g.wants(node.inputs[2 + k])}
    result.update(zip(captured, final[len(floats):]))
    return result
