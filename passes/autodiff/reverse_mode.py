"""Reverse mode through a Loop or Scan whose steps are not unrolled (``reverse_loop``,
``reverse_scan``; ``rules_control`` sends them here): a taped copy of the node replaces it in the
forward, and a backward Scan (for a Loop of run-time length, a backward Loop) walks its steps last
to first (``Reverse``).

What a step's backward reads is kept, not recomputed: the taped copy stacks each step's carried
values and the outputs of its matrix products and of the activations whose gradient reads their
output (``TAPED``: an LSTM's gate Sigmoid and two Tanhs), and drops the tapes the backward does not
read (a product only an activation reads); but a checkpoint region's (``gc.utils.checkpoint``) are
recomputed by the backward step, and the gradients of what its nodes read from outside the body are
summed step by step, not stacked. A weight the body reads whose
per-step gradient is ``A^T @ B`` (MatMul's and Gemm's rules: a Gemm with transA) is summed by one
Gemm over all steps' stacked A and B after the loop, not by an Add into an accumulator per step (a
bias's ``ReduceSum`` by one ReduceSum over the stacked steps).
Measured on a language model (Embedding 1000 -> 256, LSTM or GRU 256 -> 256, Linear -> 1000 on every
step, batch 16, AdamW, ort-cpu, 2 threads; a 2-core machine shared with other jobs, load 8-11, so
only the ratios mean much; ms per step median / fastest, interleaved): a recomputing backward Loop
with the forward run twice (before) vs this, and PyTorch eager: LSTM T=128 448 / 269 -> 304 / 213
(torch - / 113), T=512 1038 / 697 -> 788 / 437 (torch - / 446); GRU T=128 145 / 101 -> 139 / 95
(torch 309 / 171), T=512 1178 / 804 -> 994 / 596 (torch - / 1556; "-": a median the load made
meaningless). The backward body of an LSTM went from two MatMuls, a Gemm and an accumulator Add per
step to one MatMul (dh). The three changes were timed together, not one by one.
Then, timed as CPU ms per step at 1 thread (process time, which the load barely moves; median of
12, interleaved), LSTM T=128, two runs: the backward Loop 77.1 -> a backward Scan 75.6 (no Gather
per tape, no index, no Slice putting x's gradient back: 46 -> 39 nodes a step) -> the activations
taped too 73.8 (the body's Add, Split, Sigmoid, two Tanhs, two Muls and an Add not recomputed: 39
-> 30 nodes a step, the forward's 18 -> 20; GRU 54 -> 40, 19 -> 20); and 77.3 -> 75.0 (taped) ->
74.2 with the tapes the backward does not read dropped. PyTorch's step (a fused oneDNN LSTM
layer, forward and backward) takes 66.8. Old vs new at 1 thread, torch's in brackets: LSTM T=512
344.5 -> 329.1 (382.6), GRU T=128 66.7 -> 64.0 (130.8); T=64, unrolled and unchanged, LSTM 43.5
(35.0). At 2 threads the load (8-11 on 2 cores) made wall times meaningless (torch's LSTM T=128
median 901 ms, fastest 164; graphc old 314 / 140, new 285 / 161).
The weight Gemm's factors come off stacks the graph already holds where their steps line up (a
tape; x's stacked gradient, forward direction), not re-stacked by the backward, and x's step is
not scanned only for its shape: LSTM 256 LM T=128 backward body 5 -> 3 scan outputs, 7 -> 5 scanned
inputs, 4 nodes a step fewer; 1-thread CPU ms per step, median of 16 interleaved: LSTM 70.3 -> 69.6,
GRU 59.7 -> 58.9 (fastest 68.1 -> 66.8, 58.1 -> 57.2).
Tried and not kept (the same LM, batch 16, AdamW; 1-thread CPU ms per step, median of 36-48 interleaved,
old / tried): the backward body's work that reads only tapes (``1 - tanh^2``, ``s (1 - s)``, the gate
Split; ``(d a) b`` regrouped ``d (a b)`` first) done once on the stacks before the backward Scan and
scanned in, 21 -> 12 nodes a step: LSTM T=16 12.29 / 12.37, T=64 38.1 / 38.5, T=128 72.5 / 74.9
(likely: the [T, B, H] stacks it writes leave the cache), GRU T=64 31.9 / 31.2, T=128 55.5 / 57.0; at 2
threads, T=128, 90 steps interleaved with PyTorch's: 76.3 / 75.6 (fastest 38.2 / 38.7; PyTorch 71.5 /
37.0). The Scan bodies' output Identities removed (the producer writes the stacked output; 8 nodes, 5
a forward step and 3 a backward one): T=128 64.18 / 64.24. The steps' Gemm [16, 256] x [256, 1024]
scales with threads (58.3 -> 31.5 us at 2), and PyTorch's 1-thread step (74 ms at T=128) spends 12.6
ms in oneDNN's fused LSTM layer forward and 22.4 backward against an estimated ~33 of graphc's for
both (its step less the head, loss and update). At 2 threads (``bench_recurrent.py --model lm``,
PyTorch / graphc, median; fastest ms) T=16 1.02x (6.35 / 6.24), T=64 (19.6 / 20.3), T=128 0.94x (39.0 /
40.7): where that 3-6 % goes, a 2-core machine shared at load 2.5-17 did not let these runs resolve.
Not tried: batched (``gc.vmap``) weights, whose per-step gradient is a batched MatMul that still
accumulates.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.model import CHECKPOINT_KEY
from graphc.passes.autodiff.builder import (GradBuilder, attr, folded_array, is_float, is_static, static_shape,
                                            take_outputs)
from graphc.passes.autodiff.loops import copy_graph, copy_node
from graphc.passes.autodiff.step_terms import (hoist_invariants, prune, same_shape_every_step,
                                               summed_over_steps, terms, unreshaped)
from graphc.passes.evaluate import run_graph

__all__ = ["TAPED", "Reverse", "reverse_loop", "reverse_scan"]

# body ops whose outputs the taped copy stacks for the backward instead of its recomputing them: the
# matrix products, and the activations whose gradient reads their output (an RNN cell's gates)
TAPED = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Sigmoid", "Tanh"})
def reverse_loop(g: GradBuilder, node: ir.Node, dys) -> dict:
    """Gradients of a Loop whose number of steps is known only at run time (its own exit
    condition, a trip count fed in), in reverse mode with a tape (``Reverse``): a copy of the
    Loop that also stacks each step's iteration number, carried values and products takes the
    Loop's place; the count of its iteration numbers is the number of steps."""
    body, inputs = node.attributes["body"].value, list(node.inputs)  # the taped copy takes the node's place
    n_carry = len(inputs) - 2
    rev = Reverse(g, node, body, list(body.inputs[2:]), list(body.outputs[1:1 + n_carry]))
    _check_carried_shapes(g, node, body)
    recorded = [body.inputs[0], *body.inputs[2:]]
    outs = rev.taped_node(recorded, len(node.outputs), "Loop", *inputs)
    tape_iter, tapes = outs[len(node.outputs)], outs[len(node.outputs) + 1:len(node.outputs) + len(recorded)]
    steps = g.squeeze(g.op("Shape", tape_iter), [0])

    def bind(sub: GradBuilder) -> dict:
        mapping = {body.inputs[0]: rev.read(sub, tape_iter, body.inputs[0]), body.inputs[1]: sub.const(True, np.bool_)}
        mapping.update((value, rev.read(sub, tape, value)) for value, tape in zip(body.inputs[2:], tapes))
        return mapping

    def scan_seeds(sub: GradBuilder):
        return [(out, rev.read(sub, dy, out)) for out, dy in zip(body.outputs[1 + n_carry:], dys[n_carry:])
                if dy is not None]

    dv, acc, _ = rev.run(bind, scan_seeds, [], list(outs[:n_carry]), dys[:n_carry], steps=steps)
    rev.drop_unread_tapes()
    return summed(g, [*((inputs[2 + k], v) for k, v in dv.items()), *acc.items()])


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


def reverse_scan(g: GradBuilder, node: ir.Node, dys, n_carry: int, layout) -> dict:
    """Gradients of a Scan in reverse mode (``Reverse``): a copy of the Scan that also stacks
    each step's carried values and taped outputs takes its place; a backward Scan reads, last
    step first, the tapes and the slices of the scanned inputs and of the scan outputs' dys (axes
    and directions honoured), and stacks the slices' gradients along the scanned inputs' own axes
    and directions."""
    in_axes, in_dirs, out_axes, out_dirs = layout
    body, inputs = node.attributes["body"].value, list(node.inputs)  # the taped copy takes the node's place
    scanned = inputs[n_carry:]
    rev = Reverse(g, node, body, list(body.inputs[:n_carry]), list(body.outputs[:n_carry]))
    tapes: list[ir.Value] = []
    finals = list(node.outputs[:n_carry])  # the node's final carried values (none without carried ones)
    if n_carry:
        recorded = list(body.inputs[:n_carry])
        attrs = {name: a.value for name, a in node.attributes.items() if name != "body"}
        for name in ("scan_output_axes", "scan_output_directions"):
            if name in attrs:
                attrs[name] = [*attrs[name], *[0] * (len(recorded) + len(rev.products))]
        outs = rev.taped_node(recorded, len(node.outputs), "Scan", *inputs, **attrs)
        tapes, finals = list(outs[len(node.outputs):len(node.outputs) + n_carry]), list(outs[:n_carry])

    # the backward walks the forward's steps last to first: a slice the forward read first comes last
    def bind(sub: GradBuilder) -> dict:
        mapping = {v: rev.read(sub, tape, v) for v, tape in zip(body.inputs, tapes)}
        for v, x, axis, reverse in zip(body.inputs[n_carry:], scanned, in_axes, in_dirs):
            mapping[v] = rev.read(sub, x, v, axis, not reverse)
        return mapping

    def scan_seeds(sub: GradBuilder):
        return [(out, rev.read(sub, dy, out, axis, not reverse))
                for out, dy, axis, reverse in zip(body.outputs[n_carry:], dys[n_carry:], out_axes, out_dirs)
                if dy is not None]

    sliced = [(v, axis, not reverse) for v, axis, reverse in zip(body.inputs[n_carry:], in_axes, in_dirs)]
    dv, acc, stacks = rev.run(bind, scan_seeds, sliced, finals, dys[:n_carry])
    rev.drop_unread_tapes()
    pairs = [*((inputs[k], v) for k, v in dv.items()), *acc.items()]
    pairs += [(x, Reverse.typed(stack, x)) for x, stack in zip(scanned, stacks) if stack is not None]  # in x's layout
    return summed(g, pairs)


def summed(g: GradBuilder, pairs) -> dict:
    """{value: gradient} of (value, gradient) pairs, summed where the node reads a value twice
    (two carried slots, carried and read in the body, scanned twice)."""
    result: dict[ir.Value, ir.Value] = {}
    for value, grad in pairs:
        if g.wants(value):
            result[value] = g.add(result[value], grad) if value in result else grad
    return result


class Reverse:
    """Reverse mode through a loop body whose steps are not unrolled.

    A backward Scan (a Loop where the number of steps is the tape's) runs the steps last to
    first: ``bind`` reads a step's body inputs (off a tape the caller recorded, or its scanned
    inputs; ``read``), the body is copied from them with its ``TAPED`` outputs read off their
    tapes, and backprop takes it the carried values' gradients (the backward's state, starting
    from the dys of the final values) plus the step's slice of each scan output's dy. Gradients
    of outer values the body reads are summed in further state accumulators, but for their
    ``A^T @ B`` and ``ReduceSum`` terms, whose operands the backward stacks for one Gemm or
    ReduceSum after it (``summed_over_steps``); those of per-step body inputs (``sliced``) are
    stacked by the backward. The body may not carry a sequence."""

    def __init__(self, g: GradBuilder, node: ir.Node, body: ir.Graph, carried_in: list, carried_out: list):
        from graphc.passes.autodiff.core import captured_values

        if any(not isinstance(v.type, ir.TensorType) for v in carried_in):
            raise GraphError(f"gradient of {node.op_type} {node.name!r}: its number of steps is known only at run "
                             "time and it carries a sequence, which is not supported")
        self.g, self.node, self.body, self.carried_in, self.carried_out = g, node, body, carried_in, carried_out
        self.floats = [k for k, v in enumerate(carried_in) if is_float(v)]
        self.captured = [v for v in captured_values(body) if g.wants(v)]
        per_step = set(body.inputs)
        for inner in body:
            if any(v in per_step for v in inner.inputs):
                per_step.update(inner.outputs)
        stable: dict = {}
        self.products = [n.outputs[0] for n in body if n.op_type in TAPED and n.domain in ("", "ai.onnx")
                         and CHECKPOINT_KEY not in n.metadata_props and n.outputs[0] in per_step and is_float(n.outputs[0])
                         and same_shape_every_step(n.outputs[0], body, stable)]
        self.regions_read = {v for n in body if CHECKPOINT_KEY in n.metadata_props for v in n.inputs}
        self.product_tapes: list[ir.Value] = []
        self.taped: ir.Node | None = None  # none for a Scan that carries nothing: it runs as it is
        self.n_outputs = 0

    @staticmethod
    def typed(value: ir.Value, like: ir.Value) -> ir.Value:
        value.type, value.shape = like.type, like.shape
        return value

    def taped_node(self, recorded: list[ir.Value], n_outputs: int, op_type: str, *inputs, **attrs):
        """The outputs of a copy of the node (``op_type`` on ``inputs`` with ``attrs``) whose body
        also stacks ``recorded`` (its own inputs) and the products; the copy takes the node's place
        in the graph (the forward runs once) and its name."""
        g, node = self.g, self.node
        body = copy_graph(g, self.body, {})
        copies = dict(zip(self.body.inputs, body.inputs))
        for old, new in zip(self.body, body):
            copies.update(zip(old.outputs, new.outputs))
        for value in [*recorded, *self.products]:
            copy = ir.node("Identity", [copies[value]], name=g.fresh("Identity"))
            copy.outputs[0].name, copy.outputs[0].type, copy.outputs[0].shape = g.fresh("tape"), value.type, value.shape
            body.append(copy)
            body.outputs.append(copy.outputs[0])
        body.name = g.fresh("tape_body")
        outs = g.op(op_type, *inputs, num_outputs=n_outputs + len(recorded) + len(self.products), body=body, **attrs)
        for out, like in zip(outs, [*node.outputs[:n_outputs], *recorded, *self.products]):
            out.type = like.type
        self.product_tapes = list(outs[n_outputs + len(recorded):])
        self.taped, self.n_outputs = outs[0].producer(), n_outputs
        if node.graph is g.graph:
            taped = outs[0].producer()
            g.graph.remove(taped)
            g.graph.insert_after(node, taped)
            take_outputs(node.outputs, outs)
            g.graph.remove(node, safe=True)
            taped.name = node.name
        return outs

    def read(self, sub: GradBuilder, stack: ir.Value, like: ir.Value, axis: int = 0, reverse: bool = True) -> ir.Value:
        """The backward's step of ``stack`` (an outer value holding one ``like`` per forward step
        along ``axis``), read last to first where ``reverse``: a Gather by the step's index in the
        backward Loop, a scanned input (``axis``, direction) of the backward Scan."""
        if self.steps is not None:
            index = self.t if reverse else self.j
            return self.typed(sub.op("Gather", stack, index, axis=axis), like)
        value = self.typed(ir.Value(name=sub.fresh("step")), like)
        self.scanned.append((value, stack, axis, int(reverse)))
        return value

    def run(self, bind, scan_seeds, sliced: list[tuple], finals: list[ir.Value], final_dys, steps: ir.Value | None = None):
        """(carried index -> gradient of its initial value, captured value -> gradient, the
        stacked gradients of each ``sliced`` (body input, axis, read last first) in that input's
        own layout, None where none flows). ``finals``: the node's outputs of the final carried
        values, ``final_dys`` their gradients. ``bind(sub)`` and ``scan_seeds(sub)`` read the
        step's values with ``read``: a backward Scan, or with ``steps`` (a count known only once
        the tape is stacked) a backward Loop of that many steps."""
        from graphc.passes.autodiff.core import backprop

        g, body = self.g, self.body
        backward = ir.Graph([], [], nodes=[], name=g.fresh("reverse_body"))
        sub = g.subgraph_builder(backward)
        self.steps, self.scanned = steps, []
        dv_in = [self.typed(ir.Value(name=g.fresh("dv")), self.carried_in[k]) for k in self.floats]
        loop_inputs = []
        if steps is not None:
            self.j = ir.Value(name=g.fresh("j"), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
            loop_inputs = [self.j, ir.Value(name=g.fresh("cond"), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))]
            self.t = sub.op("Sub", g.op("Sub", steps, g.const(1, np.int64)), self.j)  # the forward step
        mapping = bind(sub)
        taped = [self.read(sub, tape, p) for p, tape in zip(self.products, self.product_tapes)]
        start = len(backward)
        for node in body:
            copy_node(sub, node, mapping)
        seeds: dict[ir.Value, ir.Value] = {}

        def seed(value, dy):
            value = mapping.get(value, value)
            seeds[value] = sub.add(seeds[value], dy) if value in seeds else dy

        for k, dv in zip(self.floats, dv_in):
            seed(self.carried_out[k], dv)
        for value, dy in scan_seeds(sub):
            seed(value, dy)
        carried = [mapping[self.carried_in[k]] for k in self.floats]
        slices = [mapping[v] for v, _, _ in sliced]
        grads = backprop(sub, list(backward)[start:], seeds, [*carried, *slices, *self.captured])
        for product, value in zip(self.products, taped):  # the backward reads the tape, not a recomputed product
            mapping[product].replace_all_uses_with(value)
        after: dict[ir.Value, list[tuple]] = {}  # captured -> its terms summed over the steps after the loop
        rest: dict[ir.Value, ir.Value] = {}  # captured -> its other terms' sum
        for c in (c for c in self.captured if c in grads):
            others = []
            for term in terms(grads[c], backward):
                form = None if c in self.regions_read else summed_over_steps(
                    term, c, backward, frozenset(r[0] for r in self.scanned))
                (after.setdefault(c, []).append(form) if form else others.append(term))
            if others:
                rest[c] = others[0] if len(others) == 1 else sub.op("Sum", *others)
        acc_in = [self.typed(ir.Value(name=g.fresh("acc")), c) for c in rest]
        outputs = [sub.op("Identity", loop_inputs[1])] if steps is not None else []
        outputs += [sub.op("Identity", grads[v]) if v in grads else sub.zeros_like(v) for v in carried]
        outputs += [sub.op("Add", acc, rest[c]) for c, acc in zip(rest, acc_in)]
        for value, like in zip(outputs, [*loop_inputs[1:], *dv_in, *acc_in]):
            self.typed(value, like)
        flowing = [k for k, v in enumerate(slices) if v in grads]
        factors = [unreshaped(v, backward) for forms in after.values() for form in forms for v in form[1:]
                   if isinstance(v, ir.Value)]
        sources: dict[ir.Value, tuple] = {}  # a factor -> where its stack of all steps is, in the same step order
        if steps is None:  # what the backward Scan reads or stacks last step first along axis 0 is in forward order
            sources.update((r[0], ("outer", r[1])) for r in self.scanned if r[2] == 0 and r[3] == 1)
            sources.update((unreshaped(grads[slices[k]], backward), ("out", n_out_at))
                           for n_out_at, k in enumerate(flowing) if sliced[k][1] == 0 and sliced[k][2])
        own = [v for v in dict.fromkeys(factors) if v not in sources]  # stacked by the backward itself
        sources.update((v, ("out", len(flowing) + j)) for j, v in enumerate(own))
        for v, like in [*((grads[slices[k]], slices[k]) for k in flowing), *((v, v) for v in own)]:
            outputs.append(self.typed(sub.op("Identity", v), like))
        backward.outputs.extend(outputs)
        backward.inputs.extend([*loop_inputs, *dv_in, *acc_in, *(r[0] for r in self.scanned)])
        prune(backward)
        self._shapes_outside()
        hoist_invariants(backward, g.graph)
        read = [r for r in self.scanned if r[0].uses()] or self.scanned[:1]  # a Scan scans one input at least
        for r in self.scanned:
            if r not in read:
                backward.inputs.remove(r[0])

        dv0 = [final_dys[k] if final_dys[k] is not None else g.zeros_like(finals[k]) for k in self.floats]
        n_state = len(self.floats) + len(rest)
        n_out = n_state + len(flowing) + len(own)
        state = [*dv0, *(g.zeros_like(c) for c in rest)]
        if steps is not None:
            outs = g.op("Loop", steps, None, *state, num_outputs=n_out, body=backward)
        else:  # each flowing gradient stacked along its input's axis, in its order; the factors in any order
            outs = g.op("Scan", *state, *(r[1] for r in read), num_outputs=n_out, body=backward,
                        num_scan_inputs=len(read), scan_input_axes=[r[2] for r in read],
                        scan_input_directions=[r[3] for r in read],
                        scan_output_axes=[sliced[k][1] for k in flowing] + [0] * len(own),
                        scan_output_directions=[int(sliced[k][2]) for k in flowing] + [1] * len(own))
        outs = (outs,) if n_out == 1 else outs
        stacked = dict(zip(flowing, outs[n_state:]))
        captured = dict(zip(rest, outs[len(self.floats):n_state]))
        stacks = iter(src[1] if src[0] == "outer" else outs[n_state + src[1]] for src in map(sources.get, factors))
        for c, forms in after.items():
            for form in forms:
                if form[0] == "rows":  # every step's rows in one product: [steps * rows, k]^T @ [steps * rows, m]
                    total = g.op("Gemm", *(g.op("Reshape", next(stacks), g.ints([-1, n])) for n in static_shape(c)),
                                 transA=1)
                else:
                    total = g.op("ReduceSum", next(stacks), g.ints([0, *(a + 1 for a in form[2])]), keepdims=0)
                self.typed(total, c)
                captured[c] = g.add(captured[c], total) if c in captured else total
        return (dict(zip(self.floats, outs[:len(self.floats)])), captured, [stacked.get(k) for k in range(len(slices))])

    def _shapes_outside(self) -> None:
        """Where the backward reads a scanned step only for its ``Shape`` (x's slice, for the shape
        of its gradient), take that shape off the outer stack once, so the Scan need not slice it."""
        for value, stack, axis, _ in self.scanned:
            readers, step_shape = [use.node for use in value.uses()], static_shape(value)
            if not readers or step_shape is None or any(
                    n.op_type != "Shape" or attr(n, "start", 0) != 0 or "end" in n.attributes for n in readers):
                continue
            shape = self.g.op("Gather", self.g.op("Shape", stack),
                              self.g.ints([d for d in range(len(step_shape) + 1) if d != axis]), axis=0)
            for n in readers:
                n.outputs[0].replace_all_uses_with(shape)
                n.graph.remove(n, safe=True)

    def drop_unread_tapes(self) -> None:
        """Rebuild the taped node without the tapes the backward does not read (a product read only
        by an activation, which is taped itself): a copy per step less."""
        node = self.taped
        unread = [k for k in range(self.n_outputs, len(node.outputs) if node is not None else 0)
                  if not node.outputs[k].uses() and not node.outputs[k].is_graph_output()]
        if not unread:
            return
        body, graph = node.attributes["body"].value, node.graph
        first = 1 if node.op_type == "Loop" else 0  # a Loop body's outputs start with the condition
        n_carry = len(node.inputs) - (2 if node.op_type == "Loop" else attr(node, "num_scan_inputs"))
        attrs = {name: a.value for name, a in node.attributes.items()}
        for k in reversed(unread):
            copy = body.outputs.pop(first + k).producer()
            body.remove(copy, safe=True)
            for name in ("scan_output_axes", "scan_output_directions"):
                if name in attrs:
                    attrs[name] = [v for i, v in enumerate(attrs[name]) if i != k - n_carry]
        kept = [v for k, v in enumerate(node.outputs) if k not in unread]
        new = ir.node(node.op_type, list(node.inputs), attrs, num_outputs=len(kept), name=node.name)
        graph.insert_after(node, new)
        take_outputs(kept, new.outputs)
        graph.remove(node, safe=True)
