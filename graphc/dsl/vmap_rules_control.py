"""``gc.vmap``'s batching rules for control flow, added to ``vmap_rules.RULES``: its body rewritten by the
rules into a body on the batched values (recursively), as torch's and JAX's vmap do.

* ``If`` (``gc.cond``) on a condition the same for every example: one If of the rewritten branches; on a
  per-example condition, both branches computed for all examples and each example's picked by a
  ``Where`` (JAX's vmap of ``cond``), where neither branch draws random numbers or writes a buffer and
  their outputs have one shape per example. As in JAX, a branch an example does not take still runs on
  it: its gradient is zero there unless that branch's own derivative is inf or NaN at the example's values
  (``sqrt`` of a negative), which then leaks through as NaN.
* ``Scan`` (``gc.scan``): mapped carries batched (a carry the body makes per example becomes batched
  too), mapped scanned inputs ``(B, T, ...)`` scanned as ``(T, B, ...)``, per-example outputs stacked
  ``(T, B, ...)`` and moved back to ``(B, T, ...)``.
* ``Loop`` (``gc.fori_loop``): likewise for its carries; a per-example trip count or condition (the
  body's too) runs while any example runs, at most the largest trip count, each example's carries frozen
  by a ``Where`` after its own last step (JAX's vmap of ``while_loop``; a frozen example's steps still
  run, so, as for ``If``, an inf or NaN derivative there leaks NaN into the gradient). Its scan outputs
  (``gc.func.grad``'s tape of a ``gc.while_loop``) stacked ``(B, T, ...)``; of a per-example number of
  steps, to the largest, each example's own count kept for the ops that read them
  (``vmap_rules_ragged``).

On onnxruntime CPU (2 threads, a shared 2-core machine, medians of 50 runs over three runs, hence the
ranges; ``scripts/bench_vmap.py``), 64 float32 examples: ``gc.scan`` of a tanh RNN cell (16 -> 32, 20
steps) 0.12 ms rewritten vs 2.3-9.4 ms as the Scan fallback; ``gc.fori_loop`` of 20 Newton steps on (64,
32) 0.07 ms vs 6.0-6.5 ms; ``gc.fori_loop`` of 0 to 20 steps per example (a tanh cell, 32 wide) 0.17 ms vs
1.0-1.1 ms; ``gc.cond`` per example on (64, 128) 0.02 ms vs 0.12 ms; ``vmap(grad)`` of a
``gc.while_loop`` of 0 to about 20 steps per example (a tanh cell, 32 wide) 0.95-1.0 ms vs 15.5-17.9 ms; a
Scan along axis 1 (the tanh RNN above) 0.10-0.11 ms vs 5.6-6.9 ms."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.control import run_graph, run_loop, run_scan
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap_rules import (
    RULES,
    Arg,
    Batching,
    NoRule,
    as_batched,
    has_random,
    node_attrs,
    rank_of,
    rewrite,
)
from graphc.model import SOURCE_KEY
from graphc.passes.values import BUFFER_WRITE_KEY, static_shape

__all__: list[str] = []


def _branch(b: Batching, graph: ir.Graph, outer: dict[int, Arg]) -> tuple[list, list[Arg]]:
    """``graph``'s nodes rewritten in a scope of their own: (its nodes, its outputs)."""
    with b.builder.subgraph() as scope:
        outs = rewrite(b, list(graph), {id(n) for n in graph}, {}, list(graph.outputs), outer=dict(outer))
    return scope, [Arg(*o) for o in outs]


def _finish(b: Batching, scope, outs: list[Arg], batched: list[bool], name: str,
            inputs: list[ir.Value] = ()) -> ir.Graph:
    """The body's graph: each output batched where ``batched`` says (expanded where it was not), made
    in the body and once."""
    b.builder.scopes.append(scope)
    try:
        values, made = [], {id(v) for node in scope.nodes for v in node.outputs}
        for a, flag in zip(outs, batched):
            t = b.expand(a.t) if flag and not a.batched else a.t
            if id(t.value) not in made or t.value in values:
                t = ops.emit("Identity", [t])
            made.add(id(t.value))
            values.append(t.value)
    finally:
        b.builder.scopes.pop()
    return ir.Graph(list(inputs), values, nodes=scope.nodes, name=b.builder.unique(name))


def _shape(b: Batching, a: Arg, batched: bool) -> tuple | None:
    """The shape of a branch's output, batched (expanded where it was not) when ``batched``."""
    if a.t.shape is None:
        return None
    return (b.size, *a.t.shape) if batched and not a.batched else tuple(a.t.shape)


def _merged(x: tuple | None, y: tuple | None) -> list | None:
    """One shape for both branches' output: dims that differ unknown."""
    if x is None or y is None or len(x) != len(y):
        return None
    return [d if d == e else None for d, e in zip(x, y)]


def _listed(outs: Tensor | list[Tensor]) -> list[Tensor]:
    return outs if isinstance(outs, list) else [outs]


def _if(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    if args[0].batched:
        return _selected(b, node, args[0].t)
    outer = dict(b.made)
    then_scope, then_outs = _branch(b, node.attributes["then_branch"].value, outer)
    else_scope, else_outs = _branch(b, node.attributes["else_branch"].value, outer)
    batched = [x.batched or y.batched for x, y in zip(then_outs, else_outs)]
    then_g = _finish(b, then_scope, then_outs, batched, "then_branch")
    else_g = _finish(b, else_scope, else_outs, batched, "else_branch")
    out_types = [(x.t.dtype, _merged(_shape(b, x, flag), _shape(b, y, flag)))
                 for x, y, flag in zip(then_outs, else_outs, batched)]

    def evaluate(arrays: list) -> list:
        return run_graph(b.builder, then_g if bool(np.asarray(arrays[0]).reshape(-1)[0]) else else_g, [])

    outs = ops.emit("If", [args[0].t], {"then_branch": then_g, "else_branch": else_g}, len(out_types),
                    out_types=out_types, source=node.metadata_props.get(SOURCE_KEY), evaluator=evaluate)
    return [Arg(t, flag) for t, flag in zip(_listed(outs), batched)]


def _effects(node: ir.Node) -> bool:
    """``node`` (or a node of its subgraphs) draws random numbers or writes a buffer."""
    return has_random(node) or BUFFER_WRITE_KEY in node.metadata_props or any(
        _effects(inner) for attr in node.attributes.values() if isinstance(attr.value, ir.Graph) for inner in attr.value)


def _example_shape(a: Arg, value: ir.Value) -> tuple | None:
    shape = tuple(a.t.shape[a.batched:]) if a.t.shape is not None else static_shape(value)
    return None if shape is None or not all(isinstance(d, (int, str)) for d in shape) else tuple(shape)


def _selected(b: Batching, node: ir.Node, cond: Tensor) -> list[Arg]:
    """A per-example condition: both branches rewritten where the If is (they run for every example),
    each output a ``Where`` of the condition (one value per example) between them."""
    branches = [node.attributes[k].value for k in ("then_branch", "else_branch")]
    if any(_effects(n) for graph in branches for n in graph):
        raise NoRule("a per-example condition of a branch that draws random numbers or writes a buffer")
    outer = dict(b.made)
    then_outs, else_outs = ([Arg(*o) for o in rewrite(b, list(g), {id(n) for n in g}, {}, list(g.outputs),
                                                      outer=dict(outer))] for g in branches)
    outs = []
    for k, (x, y) in enumerate(zip(then_outs, else_outs)):
        sx, sy = _example_shape(x, branches[0].outputs[k]), _example_shape(y, branches[1].outputs[k])
        if sx is None or sx != sy:
            raise NoRule(f"a per-example condition with branch outputs of shapes {sx} and {sy}, not one known shape")
        pick = ops.emit("Reshape", [cond, ops.concat([b.batch_shape(), ops.const_i64([1] * len(sx))])])
        outs.append(Arg(ops.emit("Where", [pick, as_batched(b, x), as_batched(b, y)],
                                 source=node.metadata_props.get(SOURCE_KEY)), True))
    return outs


def _body(b: Batching, graph: ir.Graph, batched: list[bool], outer: dict[int, Arg]
          ) -> tuple[list, list[ir.Value], list[Arg]]:
    """``graph``, a Loop's or Scan's body, rewritten with its inputs batched where ``batched`` says:
    (its nodes, its new inputs, its outputs)."""
    builder = b.builder
    with builder.subgraph() as scope:
        inputs, env, known = [], {}, dict(outer)
        for value, flag in zip(graph.inputs, batched):
            t = Tensor(value)
            new = builder.new_value(builder.unique(value.name or "body_in"), t.dtype,
                                    None if t.shape is None else [b.size, *t.shape] if flag else t.shape)
            inputs.append(new)
            if flag:
                env[id(value)] = Tensor(new)
            else:
                known[id(value)] = Arg(Tensor(new), False)
        outs = rewrite(b, list(graph), {id(n) for n in graph}, env, list(graph.outputs), outer=known)
    return scope, inputs, [Arg(*o) for o in outs]


def _carried(b: Batching, graph: ir.Graph, batched: list[bool], first: int, out_first: int, count: int
             ) -> tuple[list, list[ir.Value], list[Arg], list[bool]]:
    """``_body`` with the ``count`` carries (body inputs from ``first``, outputs from ``out_first``)
    batched where the body makes them per example, until that holds: (nodes, inputs, outputs, the
    inputs' batched flags)."""
    outer, batched = dict(b.made), list(batched)
    while True:
        scope, inputs, outs = _body(b, graph, batched, outer)
        grown = [k for k in range(count) if outs[out_first + k].batched and not batched[first + k]]
        if not grown:
            return scope, inputs, outs, batched
        for k in grown:
            batched[first + k] = True


def _axes(attrs: dict, key: str, ranks: list[int]) -> list[int]:
    """A Scan's ``scan_input_axes``/``scan_output_axes`` (default 0) as non-negative axes of values of
    per-example ``ranks``."""
    given = attrs.pop(key, None) or [0] * len(ranks)
    return [int(a) % r for a, r in zip(given, ranks)]


def _scanned_in(a: Arg, rank: int, axis: int) -> Tensor:
    """A scanned input (per-example rank ``rank``) scanned along ``axis``, with the steps first:
    ``(T, B, ...)`` where batched."""
    if not a.batched:
        return ops.transpose(a.t, [axis, *(i for i in range(rank) if i != axis)]) if axis else a.t
    return ops.transpose(a.t, [axis + 1, 0, *(i for i in range(1, rank + 1) if i != axis + 1)])


def _scanned_out(t: Tensor, batched: bool, axis: int) -> Tensor:
    """A scan output stacked with the steps first (``(T, B, ...)`` where batched) with its steps at
    the per-example ``axis``."""
    lead = [1, *range(2, axis + 2), 0] if batched else [*range(1, axis + 1), 0]
    rest = range(len(lead), t.ndim)
    return ops.transpose(t, [*lead, *rest]) if batched or axis else t


def _scan(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """The body rewritten; scanned inputs and scan outputs along an axis other than 0
    (``scan_input_axes``/``scan_output_axes``) moved by Transposes around a Scan along axis 0 (the
    batched Scan scans ``(T, B, ...)``; timed in the module's docstring)."""
    attrs = node_attrs(node)
    graph, n_scan = attrs["body"], int(attrs["num_scan_inputs"])
    n_carry = len(args) - n_scan
    in_axes = _axes(attrs, "scan_input_axes", [rank_of(v, a) for v, a in zip(node.inputs[n_carry:], args[n_carry:])])
    scope, inputs, outs, batched = _carried(b, graph, [a.batched for a in args], 0, 0, n_carry)
    ys = outs[n_carry:]
    if any(y.batched and y.t.shape is None for y in ys):
        raise NoRule("a per-example scan output of unknown rank")
    out_axes = _axes(attrs, "scan_output_axes", [rank_of(v, y) + 1 for v, y in zip(graph.outputs[n_carry:], ys)])
    body = _finish(b, scope, outs, batched[:n_carry] + [y.batched for y in ys], "scan_body", inputs)
    ins = [as_batched(b, a) if flag else a.t for a, flag in zip(args[:n_carry], batched)]
    ins += [_scanned_in(a, rank_of(v, a), axis) for a, v, axis in zip(args[n_carry:], node.inputs[n_carry:], in_axes)]
    types = [(Tensor(v).dtype, Tensor(v).shape) for v in body.outputs[:n_carry]]
    for v, old, axis in zip(body.outputs[n_carry:], node.outputs[n_carry:], out_axes):
        steps, t = static_shape(old), Tensor(v)
        types.append((t.dtype, None if t.shape is None else [steps[axis] if steps else None, *t.shape]))
    new_attrs = {**attrs, "body": body}
    outs = _listed(ops.emit("Scan", ins, new_attrs, len(types), out_types=types,
                            source=node.metadata_props.get(SOURCE_KEY),
                            evaluator=lambda arrays: run_scan(b.builder, new_attrs, arrays)))
    return [Arg(t, flag) for t, flag in zip(outs[:n_carry], batched)] + \
        [Arg(_scanned_out(t, y.batched, axis), y.batched) for t, y, axis in zip(outs[n_carry:], ys, out_axes)]


def _loop(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    graph = node.attributes["body"].value
    n_carry = len(args) - 2
    if any(a is not None and a.batched for a in args[:2]):
        return _masked_loop(b, node, args)
    scope, inputs, outs, batched = _carried(b, graph, [False, False, *(a.batched for a in args[2:])], 2, 1, n_carry)
    if outs[0].batched:
        return _masked_loop(b, node, args)
    ys = outs[1 + n_carry:]
    if any(y.batched and y.t.shape is None for y in ys):
        raise NoRule("a per-example scan output of unknown rank")
    body = _finish(b, scope, outs, [False, *batched[2:], *(y.batched for y in ys)], "loop_body", inputs)
    ins = [a and a.t for a in args[:2]] + [as_batched(b, a) if flag else a.t for a, flag in zip(args[2:], batched[2:])]
    outs = _listed(ops.emit("Loop", ins, {"body": body}, len(body.outputs) - 1, out_types=_loop_types(body, n_carry),
                            source=node.metadata_props.get(SOURCE_KEY),
                            evaluator=lambda arrays: run_loop(b.builder, body, arrays)))
    return [Arg(t, flag) for t, flag in zip(outs, batched[2:])] + \
        [Arg(_scanned_out(t, y.batched, 0), y.batched) for t, y in zip(outs[n_carry:], ys)]


def _loop_types(body: ir.Graph, n_carry: int) -> list[tuple]:
    """The output types of a Loop of ``body``: its carries', then its scan outputs' of unknown steps."""
    types = [(Tensor(v).dtype, Tensor(v).shape) for v in body.outputs[1:]]
    return types[:n_carry] + [(dtype, None if shape is None else [None, *shape]) for dtype, shape in types[n_carry:]]


def _any(t: Tensor) -> Tensor:
    """A bool vector's any, as a bool scalar (False for no examples)."""
    return ops.cast(ops.emit("ReduceSum", [ops.cast(t, "int64")], {"keepdims": 0}), "bool")


def _rows(flag: Tensor, rank: int) -> Tensor:
    """A per-example bool ``(B,)`` against the rows of a batched value of per-example rank ``rank``."""
    return ops.unsqueeze(flag, list(range(1, rank + 1))) if rank else flag


def _masked_loop(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """A per-example trip count or condition (JAX's vmap of ``while_loop``): one Loop while any example
    runs, at most the largest trip count, each example's carries frozen by a ``Where`` once its own
    condition fails or its trips are done; a carried ``active`` flag per example says which run.

    Scan outputs (the per-step values ``gc.func.grad`` of a ``gc.while_loop`` records) are stacked to
    the largest number of steps, ``(B, T_max, ...)``: an example's own steps first, then zeros for the
    steps it did not run, its own number of steps carried too and kept in ``b.ragged``, so that the
    only ops that read them (``vmap_rules_ragged``) see each example's own length: its ``Shape``, and
    ``Gather`` of its steps, negative indices counted from its own end; any other op that reads them
    has no rule, so the zeros never reach the vmapped function's outputs or gradients."""
    graph, trip, cond = node.attributes["body"].value, args[0], args[1]
    n_carry = len(args) - 2
    scope, inputs, outs = _body(b, graph, [False, True, *[True] * n_carry], dict(b.made))
    ranks = [rank_of(v, a) for v, a in zip(graph.outputs[1:], outs[1:])]
    ys = outs[1 + n_carry:]
    active_in, carries_in = Tensor(inputs[1]), [Tensor(v) for v in inputs[2:]]
    steps_in = Tensor(b.builder.new_value(b.builder.unique("steps_in"), "int64", [b.size]))
    b.builder.scopes.append(scope)
    try:
        i = Tensor(inputs[0])
        active = ops.emit("And", [active_in, as_batched(b, outs[0])])
        if trip is not None and trip.batched:
            active = ops.emit("And", [active, ops.emit("Less", [i + ops.const_i64([1]), trip.t])])
        carries = [ops.emit("Where", [_rows(active_in, r), as_batched(b, a), old])
                   for a, old, r in zip(outs[1:], carries_in, ranks)]
        rows = [ops.emit("Where", [_rows(active_in, r), as_batched(b, y), ops.scalar(0, y.t)])
                for y, r in zip(ys, ranks[n_carry:])]
        steps = [steps_in + ops.cast(active_in, "int64")] if ys else []
        go = _any(active)
    finally:
        b.builder.scopes.pop()
    cond_in = b.builder.new_value(b.builder.unique("cond_in"), "bool", [])
    state = [active, *carries, *steps]
    body = _finish(b, scope, [Arg(go, False), *(Arg(t, True) for t in [*state, *rows])],
                   [False, *[True] * (len(state) + len(rows))], "loop_body",
                   [inputs[0], cond_in, *inputs[1:], *[steps_in.value][:len(steps)]])
    start = as_batched(b, cond) if cond is not None else ops.emit("Expand", [ops.constant(np.asarray(True)),
                                                                               b.batch_shape()])
    count = trip and trip.t
    if trip is not None and trip.batched:
        start = ops.emit("And", [start, ops.emit("Greater", [trip.t, ops.const_i64([0])])])
        count = ops.emit("ReduceMax", [trip.t], {"keepdims": 0})
    zeros = [ops.emit("Expand", [ops.const_i64([0]), b.batch_shape()])][:len(steps)]
    ins = [count, _any(start), start, *(as_batched(b, a) for a in args[2:]), *zeros]
    n_state = len(state)
    outs = _listed(ops.emit("Loop", ins, {"body": body}, len(body.outputs) - 1, out_types=_loop_types(body, n_state),
                            source=node.metadata_props.get(SOURCE_KEY),
                            evaluator=lambda arrays: run_loop(b.builder, body, arrays)))
    stacked = [_scanned_out(t, True, 0) for t in outs[n_state:]]
    for t in stacked:
        b.ragged[id(t.value)] = outs[n_state - 1]
    return [Arg(t, True) for t in [*outs[1:1 + n_carry], *stacked]]


RULES.update({"If": _if, "Scan": _scan, "Loop": _loop})
