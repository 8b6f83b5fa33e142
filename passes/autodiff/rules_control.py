"""VJP rules of control flow: If (both branches differentiated as subgraphs of a backward If),
Loop and Scan (unrolled when the number of iterations is static, else in reverse mode with a
recorded tape: ``reverse_mode``).

The backward If takes the same condition. Each of its branches is a clone of the forward
branch (recomputing the branch's intermediates, which are invisible outside it) followed by
that branch's gradient nodes; both output the gradients of every differentiable outer value
either branch reads (zeros where a branch does not read it).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.model import CHECKPOINT_KEY
from graphc.passes.autodiff.builder import GradBuilder, attr, folded_array, static_shape
from graphc.passes.autodiff.loops import clone_body, fresh_names
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.reverse_mode import reverse_loop, reverse_scan
from graphc.passes.autodiff.step_slices import StepSlices
from graphc.passes.values import REVERSE_MODE_KEY


def _branch_gradients(g: GradBuilder, branch: ir.Graph, dys, targets: list[ir.Value]) -> ir.Graph:
    from graphc.passes.autodiff.core import backprop  # core imports the rule modules

    clone = branch.clone(allow_outer_scope_values=True)
    sub = g.subgraph_builder(clone)
    names: dict[str, str] = {}
    for node in clone:  # fresh names: the clone must not repeat the forward branch's names
        fresh_names(sub, node, names, "fwd")
    seeds: dict[ir.Value, ir.Value] = {}
    for out, dy in zip(clone.outputs, dys):
        if dy is not None:  # an Identity in the branch takes this branch's output shape, not dy itself
            dy = sub.op("Identity", dy)
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
# The longest Scan whose gradient is unrolled; a longer one's is in reverse mode, a train_step that
# does not grow with T. `bench_recurrent.py --forms` (ort-cpu, 1 thread, a shared 2-core machine;
# ms per step, medians of two runs), unrolled (the steps reading the scanned input off one Split)
# vs reverse mode: a gc.scan tanh cell 32 -> 16, batch 16: T=8 0.14 vs 0.19, T=16 0.22 vs 0.29,
# T=32 0.36-0.38 vs 0.51, T=64 0.66-0.75 vs 0.93-1.01, T=128 1.23 vs 1.74 (session build 0.2-0.4 s
# from T=64, reverse mode 0.02 s); the cell 32 -> 128: T=8 0.30 vs 0.40, T=16 0.64 vs 0.78, T=32
# 1.01-1.19 vs 1.29-1.37, T=64 2.56-2.84 vs 2.59-2.66, T=128 4.77 vs 4.77; the Scan of an LSTM
# 32 -> 128 cell: T=8 1.15 vs 1.58, T=16 2.81 vs 2.94, T=32 5.0-6.0 vs 4.7-5.1, T=64 11.9-12.6 vs
# 9.4-9.9, T=128 26.0 vs 18.4 (a GRU's alike: 0.88 vs 1.10, 2.03 vs 2.19, 4.2-5.6 vs 3.8-4.7,
# 14-16 vs 7.8-12). A Gather per step instead (each step's gradient a scatter into zeros of the
# whole input: quadratic in T) took the LSTM's to 15.6 ms at T=32, 47 at 64, 81 at 128. Up to
# T=32 the unrolled gradient is 1.15-1.4x faster for small cells and within 7-21% for wide ones;
# at 64 wide cells lose 25% and more (a 32 -> 16 cell still gains 1.4x). recurrent.
# MAX_UNROLLED_STEPS (no smaller) sends longer RNNs here as Scans, which stay in reverse mode.
MAX_SCAN_UNROLL = 32


def _unrolled_gradients(g: GradBuilder, node: ir.Node, steps, seeds_fn):
    """Unroll ``steps`` (a function emitting the forward copy and returning its seed map) and
    backpropagate through the copy to the node's inputs and the outer values its body reads. The
    gradient nodes read recomputed copies of the values of the body's checkpoint regions
    (``gc.utils.checkpoint`` in a body; each step's copy its own region, ``_clone_step``)."""
    from graphc.passes.autodiff.core import backprop, captured_values
    from graphc.passes.training.recompute import recompute  # which imports this package

    sub = g.subgraph_builder(g.graph)
    start = len(g.graph)
    seeds = seeds_fn(sub, steps(sub))
    nodes = list(g.graph)[start:]
    body = node.attributes["body"].value
    targets = [v for v in dict.fromkeys([*node.inputs, *captured_values(body)]) if v is not None and g.wants(v)]
    grads = backprop(sub, nodes, seeds, targets)
    recompute(g.graph, {n.name for n in nodes}, g.opset, everywhere=False)
    return {v: grads[v] for v in targets if v in grads}


def _clone_step(sub: GradBuilder, body: ir.Graph, mapping: dict, step: int, slices=None) -> list[ir.Value]:
    """``clone_body`` for one unrolled step, its checkpoint regions made the step's own (a region's
    copy then reads the step's inputs to it, not the region's copies in the steps before)."""
    made = len(sub.graph)
    outs = clone_body(sub, body, mapping, slices)
    for node in list(sub.graph)[made:]:
        if CHECKPOINT_KEY in node.metadata_props:
            node.metadata_props[CHECKPOINT_KEY] += f"/step{step}"
    return outs


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
        return reverse_loop(g, node, dys)
    body = node.attributes["body"].value
    n_carry = len(node.inputs) - 2
    true = None

    def steps(sub):
        nonlocal true
        true = sub.const(True, np.bool_)
        carry = list(node.inputs[2:])
        scans, slices = [], StepSlices(sub, trips)  # x[i] of an outer x: one Split, not a Gather per step
        for i in range(trips):
            mapping = {body.inputs[0]: sub.const(i, np.int64), body.inputs[1]: true}
            mapping.update(zip(body.inputs[2:], carry))
            outs = _clone_step(sub, body, mapping, i, slices)
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
    # Scan with a static sequence length: unrolled like Loop; scanned inputs are read off one
    # Split each (their gradients one Concat) and scan outputs' gradients split per step (axes and directions honoured). A length known
    # only at run time, past MAX_SCAN_UNROLL or marked REVERSE_MODE_KEY goes to reverse mode.
    body = node.attributes["body"].value
    m = attr(node, "num_scan_inputs")
    n_carry = len(node.inputs) - m
    in_axes = list(attr(node, "scan_input_axes", None) or [0] * m)
    in_dirs = list(attr(node, "scan_input_directions", None) or [0] * m)
    n_out = len(body.outputs) - n_carry
    out_axes = list(attr(node, "scan_output_axes", None) or [0] * n_out)
    out_dirs = list(attr(node, "scan_output_directions", None) or [0] * n_out)
    out_axes = [a % (g.rank(o)) for a, o in zip(out_axes, node.outputs[n_carry:])]
    in_axes = [a % g.rank(x) for a, x in zip(in_axes, node.inputs[n_carry:])]
    lengths = set()
    for x, axis in zip(node.inputs[n_carry:], in_axes):
        shape = static_shape(x)
        lengths.add(shape[axis] if isinstance(shape[axis], int) else None)
    length = lengths.pop() if len(lengths) == 1 else None
    if length is None or length > MAX_SCAN_UNROLL or node.metadata_props.get(REVERSE_MODE_KEY) == "true":
        return reverse_scan(g, node, dys, n_carry, (in_axes, in_dirs, out_axes, out_dirs))

    def steps(sub):
        carry, scans, slices = list(node.inputs[:n_carry]), [], StepSlices(sub, length)
        for i in range(length):
            mapping = dict(zip(body.inputs[:n_carry], carry))
            for k, (x, axis, rev) in enumerate(zip(node.inputs[n_carry:], in_axes, in_dirs)):
                element = slices.read(x, axis, length - 1 - i if rev else i)
                element.type, element.shape = body.inputs[n_carry + k].type, body.inputs[n_carry + k].shape
                mapping[body.inputs[n_carry + k]] = element
            outs = _clone_step(sub, body, mapping, i)
            carry = outs[:n_carry]
            scans.append(outs[n_carry:])
        return carry, scans

    return _unrolled_gradients(
        g, node, steps, lambda sub, result: _seeds(sub, result, dys, n_carry, length, out_axes, out_dirs))
