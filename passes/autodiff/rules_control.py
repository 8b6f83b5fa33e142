"""VJP rules of control flow: If (both branches differentiated as subgraphs of a backward If),
Loop and Scan (unrolled when the number of iterations is static, else in reverse mode with a
recorded tape: ``_reverse_loop``, ``_reverse_scan``).

The backward If takes the same condition. Each of its branches is a clone of the forward
branch (recomputing the branch's intermediates, which are invisible outside it) followed by
that branch's gradient nodes; both output the gradients of every differentiable outer value
either branch reads (zeros where a branch does not read it).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, folded_array, is_float, is_static, static_shape
from graphc.passes.autodiff.loops import copy_graph, copy_node
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.step_slices import StepSlices
from graphc.passes.evaluate import run_graph


def _branch_gradients(g: GradBuilder, branch: ir.Graph, dys, targets: list[ir.Value]) -> ir.Graph:
    from graphc.passes.autodiff.core import backprop  # core imports the rule modules

    clone = branch.clone(allow_outer_scope_values=True)
    sub = g.subgraph_builder(clone)
    for node in clone:  # fresh names: the clone must not repeat the forward branch's names
        for out in node.outputs:
            out.name = sub.fresh("fwd")
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


def _clone_body(g: GradBuilder, body: ir.Graph, mapping: dict[ir.Value, ir.Value],
                slices: StepSlices | None = None) -> list[ir.Value]:
    """Append one copy of ``body``'s nodes to ``g.graph`` with its inputs bound by ``mapping``
    (an If's branches are copied too, reading the bound values; Gathers of one step's slice
    read off ``slices``); returns the copy's outputs (outer-scope values stay as they are)."""
    for node in body:
        if slices is None or not slices.copy_gather(node, mapping):
            copy_node(g, node, mapping)
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
        scans, slices = [], StepSlices(sub, trips)  # x[i] of an outer x: one Split, not a Gather per step
        for i in range(trips):
            mapping = {body.inputs[0]: sub.const(i, np.int64), body.inputs[1]: true}
            mapping.update(zip(body.inputs[2:], carry))
            outs = _clone_body(sub, body, mapping, slices)
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
    # only at run time (or past MAX_SCAN_UNROLL) goes to reverse mode.
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
    if length is None or length > MAX_SCAN_UNROLL:  # a length known only at run time, or a long one
        return _reverse_scan(g, node, dys, n_carry, (in_axes, in_dirs, out_axes, out_dirs))

    def steps(sub):
        carry, scans, slices = list(node.inputs[:n_carry]), [], StepSlices(sub, length)
        for i in range(length):
            mapping = dict(zip(body.inputs[:n_carry], carry))
            for k, (x, axis, rev) in enumerate(zip(node.inputs[n_carry:], in_axes, in_dirs)):
                element = slices.read(x, axis, length - 1 - i if rev else i)
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
    condition, a trip count fed in), in reverse mode with a tape (``_Reverse``): a copy of the
    Loop runs again and also stacks each step's iteration number and carried values; their
    count is the number of steps."""
    body = node.attributes["body"].value
    n_carry = len(node.inputs) - 2
    rev = _Reverse(g, node, body, list(body.inputs[2:]), list(body.outputs[1:1 + n_carry]))
    _check_carried_shapes(g, node, body)
    tape_body = rev.taped_body([body.inputs[0], *body.inputs[2:]])
    outs = g.op("Loop", *node.inputs, num_outputs=len(node.outputs) + 1 + n_carry, body=tape_body)
    for out, like in zip(outs, [*node.outputs, body.inputs[0], *body.inputs[2:]]):
        out.type = like.type
    tape_iter, tapes = outs[len(node.outputs)], outs[len(node.outputs) + 1:]
    steps = g.squeeze(g.op("Shape", tape_iter), [0])

    def bind(sub: GradBuilder, t: ir.Value) -> dict:
        mapping = {body.inputs[0]: sub.op("Gather", tape_iter, t, axis=0), body.inputs[1]: sub.const(True, np.bool_)}
        for value, tape in zip(body.inputs[2:], tapes):
            mapping[value] = rev.typed(sub.op("Gather", tape, t, axis=0), value)
        return mapping

    def scan_seeds(sub: GradBuilder, t: ir.Value):
        return [(out, sub.op("Gather", dy, t, axis=0)) for out, dy in zip(body.outputs[1 + n_carry:], dys[n_carry:])
                if dy is not None]

    dv, acc, _ = rev.run(steps, bind, scan_seeds, [], list(node.outputs[:n_carry]), dys[:n_carry])
    return _summed(g, [*((node.inputs[2 + k], v) for k, v in dv.items()), *acc.items()])


def _check_carried_shapes(g: GradBuilder, node: ir.Node, body: ir.Graph) -> None:
    """Refuse a Loop whose carried values change shape from one step to the next (the tape
    stacks them): found by running one step on zeros of their static shapes (outer constants
    as they are); no check where a shape is not static or the step cannot be run, nor where
    the step holds a Loop whose steps a constant trip count does not bound: on zeros its own
    condition may never turn false (``gc.while_loop`` in a ``gc.while_loop``)."""
    from graphc.passes.autodiff.core import captured_values

    if any(n.op_type == "Loop" and (n.inputs[0] is None or folded_array(n.inputs[0]) is None)
           for n in ir.traversal.RecursiveGraphIterator(body)):
        return

    def probe(value: ir.Value) -> np.ndarray | None:
        array = folded_array(value)
        if array is None and value.dtype is not None and is_static(static_shape(value)):
            array = np.zeros(static_shape(value), value.dtype.numpy())
        return array

    feeds = {body.inputs[0]: np.array(0, np.int64), body.inputs[1]: np.array(True)}
    feeds.update((v, probe(outer)) for v, outer in zip(body.inputs[2:], node.inputs[2:]))
    feeds.update((v, probe(v)) for v in captured_values(body))
    if any(a is None for a in feeds.values()):
        return
    try:
        values = run_graph(body, feeds, g.opset)
    except Exception:  # noqa: BLE001 - a step the evaluator cannot run is not checked
        return
    for value, out in zip(body.inputs[2:], body.outputs[1:]):
        before, after = list(np.shape(feeds[value])), list(np.shape(values[out]))
        if before != after:
            raise GraphError(f"gradient of Loop {node.name!r}: its number of steps is known only at run time, and its "
                             f"carried value {value.name!r} changes shape between iterations ({before} -> {after} in "
                             "one step), which reverse mode cannot record")


def _reverse_scan(g: GradBuilder, node: ir.Node, dys, n_carry: int, layout) -> dict:
    """Gradients of a Scan whose length is known only at run time, in reverse mode
    (``_Reverse``): a copy of the Scan also stacks each step's carried values (the tape); the
    backward Loop reads step t's slices of the scanned inputs and of the scan outputs' dys
    (axes and directions honoured) and stacks the slices' gradients, which are put back in the
    scanned inputs' order and axes."""
    in_axes, in_dirs, out_axes, out_dirs = layout
    body = node.attributes["body"].value
    scanned = list(node.inputs[n_carry:])
    rev = _Reverse(g, node, body, list(body.inputs[:n_carry]), list(body.outputs[:n_carry]))
    steps = g.op("Gather", g.op("Shape", scanned[0]), g.const(in_axes[0], np.int64))
    tapes: list[ir.Value] = []
    if n_carry:
        attrs = {name: a.value for name, a in node.attributes.items() if name != "body"}
        for name in ("scan_output_axes", "scan_output_directions"):
            if name in attrs:
                attrs[name] = [*attrs[name], *[0] * n_carry]
        outs = g.op("Scan", *node.inputs, num_outputs=len(node.outputs) + n_carry,
                    body=rev.taped_body(list(body.inputs[:n_carry])), **attrs)
        tapes = list(outs[len(node.outputs):])
        for tape, value in zip(tapes, body.inputs[:n_carry]):
            tape.type = value.type

    def position(sub: GradBuilder, t: ir.Value, reverse: int) -> ir.Value:
        return sub.op("Sub", rev.last, t) if reverse else t

    def bind(sub: GradBuilder, t: ir.Value) -> dict:
        mapping = {v: rev.typed(sub.op("Gather", tape, t, axis=0), v) for v, tape in zip(body.inputs, tapes)}
        for v, x, axis, reverse in zip(body.inputs[n_carry:], scanned, in_axes, in_dirs):
            mapping[v] = rev.typed(sub.op("Gather", x, position(sub, t, reverse), axis=axis), v)
        return mapping

    def scan_seeds(sub: GradBuilder, t: ir.Value):
        return [(out, sub.op("Gather", dy, position(sub, t, reverse), axis=axis))
                for out, dy, axis, reverse in zip(body.outputs[n_carry:], dys[n_carry:], out_axes, out_dirs)
                if dy is not None]

    sliced = list(body.inputs[n_carry:])
    dv, acc, stacks = rev.run(steps, bind, scan_seeds, sliced, list(node.outputs[:n_carry]), dys[:n_carry])
    pairs = [*((node.inputs[k], v) for k, v in dv.items()), *acc.items()]
    for x, stack, axis, reverse in zip(scanned, stacks, in_axes, in_dirs):
        if stack is None or not g.wants(x):
            continue
        if not reverse:  # the backward Loop stacked the last step first
            stack = g.op("Slice", stack, g.ints([-1]), g.ints([np.iinfo(np.int64).min]), g.ints([0]), g.ints([-1]))
        if axis:
            rank = g.rank(x)
            stack = g.transpose(stack, [*range(1, axis + 1), 0, *range(axis + 1, rank)])
        pairs.append((x, stack))
    return _summed(g, pairs)


def _summed(g: GradBuilder, pairs) -> dict:
    """{value: gradient} of (value, gradient) pairs, summed where the node reads a value twice
    (two carried slots, carried and read in the body, scanned twice)."""
    result: dict[ir.Value, ir.Value] = {}
    for value, grad in pairs:
        if g.wants(value):
            result[value] = g.add(result[value], grad) if value in result else grad
    return result


class _Reverse:
    """Reverse mode through a loop body whose step count is known only at run time.

    A backward Loop runs the ``steps`` steps, t = ``last`` .. 0: ``bind`` reads step t's body
    inputs (off a tape the caller recorded, or its scanned inputs), the body is recomputed
    from them, and backprop takes it the carried values' gradients (the backward Loop's
    loop-carried state, starting from the dys of the final values) plus step t's slice of each
    scan output's dy. The gradients of outer values the body reads are summed in further
    loop-carried accumulators, and those of per-step body inputs (``sliced``) are stacked by
    the backward Loop, step steps-1 first. The body may not carry a sequence."""

    def __init__(self, g: GradBuilder, node: ir.Node, body: ir.Graph, carried_in: list, carried_out: list):
        from graphc.passes.autodiff.core import captured_values

        if any(not isinstance(v.type, ir.TensorType) for v in carried_in):
            raise GraphError(f"gradient of {node.op_type} {node.name!r}: its number of steps is known only at run "
                             "time and it carries a sequence, which is not supported")
        self.g, self.body, self.carried_in, self.carried_out = g, body, carried_in, carried_out
        self.floats = [k for k, v in enumerate(carried_in) if is_float(v)]
        self.captured = [v for v in captured_values(body) if g.wants(v)]

    @staticmethod
    def typed(value: ir.Value, like: ir.Value) -> ir.Value:
        value.type, value.shape = like.type, like.shape
        return value

    def taped_body(self, recorded: list[ir.Value]) -> ir.Graph:
        """A copy of the body (fresh names) that also outputs ``recorded`` (its own inputs)."""
        g, tape = self.g, copy_graph(self.g, self.body, {})
        position = {v: i for i, v in enumerate(self.body.inputs)}
        for value in recorded:
            copy = ir.node("Identity", [tape.inputs[position[value]]], name=g.fresh("Identity"))
            copy.outputs[0].name, copy.outputs[0].type, copy.outputs[0].shape = g.fresh("tape"), value.type, value.shape
            tape.append(copy)
            tape.outputs.append(copy.outputs[0])
        tape.name = g.fresh("tape_body")
        return tape

    def run(self, steps: ir.Value, bind, scan_seeds, sliced: list[ir.Value], finals: list[ir.Value], final_dys):
        """(carried index -> gradient of its initial value, captured value -> gradient, the
        stacked gradients of each ``sliced`` body input, None where none flows). ``finals``:
        the node's outputs of the final carried values, ``final_dys`` their gradients."""
        from graphc.passes.autodiff.core import backprop

        g, body = self.g, self.body
        backward = ir.Graph([], [], nodes=[], name=g.fresh("reverse_body"))
        sub = g.subgraph_builder(backward)
        j = ir.Value(name=g.fresh("j"), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
        cond = ir.Value(name=g.fresh("cond"), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
        dv_in = [self.typed(ir.Value(name=g.fresh("dv")), self.carried_in[k]) for k in self.floats]
        acc_in = [self.typed(ir.Value(name=g.fresh("acc")), c) for c in self.captured]
        backward.inputs.extend([j, cond, *dv_in, *acc_in])
        self.last = g.op("Sub", steps, g.const(1, np.int64))  # once, outside the backward Loop
        t = sub.op("Sub", self.last, j)
        mapping = bind(sub, t)
        start = len(backward)
        _clone_body(sub, body, mapping)
        seeds: dict[ir.Value, ir.Value] = {}

        def seed(value, dy):
            value = mapping.get(value, value)
            seeds[value] = sub.add(seeds[value], dy) if value in seeds else dy

        for k, dv in zip(self.floats, dv_in):
            seed(self.carried_out[k], dv)
        for value, dy in scan_seeds(sub, t):
            seed(value, dy)
        carried = [mapping[self.carried_in[k]] for k in self.floats]
        slices = [mapping[v] for v in sliced]
        grads = backprop(sub, list(backward)[start:], seeds, [*carried, *slices, *self.captured])
        outputs = [sub.op("Identity", cond)]
        outputs += [sub.op("Identity", grads[v]) if v in grads else sub.zeros_like(v) for v in carried]
        outputs += [sub.op("Add", acc, grads[c]) if c in grads else sub.op("Identity", acc)
                    for c, acc in zip(self.captured, acc_in)]
        for value, like in zip(outputs, [cond, *dv_in, *acc_in]):
            self.typed(value, like)
        flowing = [v for v in slices if v in grads]
        for v in flowing:
            outputs.append(self.typed(sub.op("Identity", grads[v]), v))
        backward.outputs.extend(outputs)

        dv0 = [final_dys[k] if final_dys[k] is not None else g.zeros_like(finals[k]) for k in self.floats]
        n_state = len(self.floats) + len(self.captured)
        outs = g.op("Loop", steps, None, *dv0, *(g.zeros_like(c) for c in self.captured),
                    num_outputs=n_state + len(flowing), body=backward)
        outs = (outs,) if n_state + len(flowing) == 1 else outs
        stacked = dict(zip(flowing, outs[n_state:]))
        return (dict(zip(self.floats, outs[:len(self.floats)])), dict(zip(self.captured, outs[len(self.floats):n_state])),
                [stacked.get(v) for v in slices])
