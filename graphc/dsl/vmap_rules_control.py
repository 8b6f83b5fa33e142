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
  run, so, as for ``If``, an inf or NaN derivative there leaks NaN into the gradient). Scan outputs of a
  Loop have no rule (the body runs as a Scan).

On onnxruntime CPU (2 threads, a shared 2-core machine, medians of 50 runs over three runs, hence the
ranges; ``scripts/bench_vmap.py``), 64 float32 examples: ``gc.scan`` of a tanh RNN cell (16 -> 32, 20
steps) 0.12 ms rewritten vs 2.3-9.4 ms as the Scan fallback; ``gc.fori_loop`` of 20 Newton steps on (64,
32) 0.07 ms vs 6.0-6.5 ms; ``gc.fori_loop`` of 0 to 20 steps per example (a tanh cell, 32 wide) 0.17 ms vs
1.0-1.1 ms; ``gc.cond`` per example on (64, 128) 0.02 ms vs 0.12 ms."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.control import run_graph, run_loop, run_scan
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap_rules import RULES, Arg, Batching, NoRule, as_batched, has_random, node_attrs, rank_of, rewrite
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


def _swapped(t: Tensor, rank: int) -> Tensor:
    """A rank-``rank`` value with its dims 0 and 1 swapped: ``(B, T, ...)`` <-> ``(T, B, ...)``."""
    return ops.transpose(t, [1, 0, *range(2, rank)])


def _scan(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    attrs = node_attrs(node)
    if any(attrs.get(k) and any(attrs[k]) for k in ("scan_input_axes", "scan_output_axes")):
        raise NoRule("scan axes other than 0")
    graph, n_scan = attrs["body"], int(attrs["num_scan_inputs"])
    n_carry = len(args) - n_scan
    scope, inputs, outs, batched = _carried(b, graph, [a.batched for a in args], 0, 0, n_carry)
    ys = outs[n_carry:]
    if any(y.batched and y.t.shape is None for y in ys):
        raise NoRule("a per-example scan output of unknown rank")
    body = _finish(b, scope, outs, batched[:n_carry] + [y.batched for y in ys], "scan_body", inputs)
    ins = [as_batched(b, a) if flag else a.t for a, flag in zip(args[:n_carry], batched)]
    ins += [_swapped(a.t, rank_of(v, a) + 1) if a.batched else a.t for a, v in zip(args[n_carry:], node.inputs[n_carry:])]
    types = [(Tensor(v).dtype, Tensor(v).shape) for v in body.outputs[:n_carry]]
    for v, old in zip(body.outputs[n_carry:], node.outputs[n_carry:]):
        steps, t = static_shape(old), Tensor(v)
        types.append((t.dtype, None if t.shape is None else [steps[0] if steps else None, *t.shape]))
    new_attrs = node_attrs(node, body=body)
    outs = _listed(ops.emit("Scan", ins, new_attrs, len(types), out_types=types,
                            source=node.metadata_props.get(SOURCE_KEY),
                            evaluator=lambda arrays: run_scan(b.builder, new_attrs, arrays)))
    return [Arg(t, flag) for t, flag in zip(outs[:n_carry], batched)] + \
        [Arg(_swapped(t, t.ndim), True) if y.batched else Arg(t, False) for t, y in zip(outs[n_carry:], ys)]


def _loop(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    graph = node.attributes["body"].value
    n_carry = len(args) - 2
    if len(graph.outputs) > 1 + n_carry:
        raise NoRule("scan outputs")
    if any(a is not None and a.batched for a in args[:2]):
        return _masked_loop(b, node, args)
    scope, inputs, outs, batched = _carried(b, graph, [False, False, *(a.batched for a in args[2:])], 2, 1, n_carry)
    if outs[0].batched:
        return _masked_loop(b, node, args)
    body = _finish(b, scope, outs, [False, *batched[2:]], "loop_body", inputs)
    ins = [a and a.t for a in args[:2]] + [as_batched(b, a) if flag else a.t for a, flag in zip(args[2:], batched[2:])]
    types = [(Tensor(v).dtype, Tensor(v).shape) for v in body.outputs[1:]]
    outs = _listed(ops.emit("Loop", ins, {"body": body}, n_carry, out_types=types,
                            source=node.metadata_props.get(SOURCE_KEY),
                            evaluator=lambda arrays: run_loop(b.builder, body, arrays)))
    return [Arg(t, flag) for t, flag in zip(outs, batched[2:])]


def _any(t: Tensor) -> Tensor:
    """A bool vector's any, as a bool scalar (False for no examples)."""
    return ops.cast(ops.emit("ReduceSum", [ops.cast(t, "int64")], {"keepdims": 0}), "bool")


def _masked_loop(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """A per-example trip count or condition (JAX's vmap of ``while_loop``): one Loop while any example
    runs, at most the largest trip count, each example's carries frozen by a ``Where`` once its own
    condition fails or its trips are done; a carried ``active`` flag per example says which run."""
    graph, trip, cond = node.attributes["body"].value, args[0], args[1]
    n_carry = len(args) - 2
    scope, inputs, outs = _body(b, graph, [False, True, *[True] * n_carry], dict(b.made))
    ranks = [rank_of(v, a) for v, a in zip(graph.outputs[1:], outs[1:])]
    active_in, carries_in = Tensor(inputs[1]), [Tensor(v) for v in inputs[2:]]
    b.builder.scopes.append(scope)
    try:
        i = Tensor(inputs[0])
        active = ops.emit("And", [active_in, as_batched(b, outs[0])])
        if trip is not None and trip.batched:
            active = ops.emit("And", [active, ops.emit("Less", [i + ops.const_i64([1]), trip.t])])
        carries = [ops.emit("Where", [ops.unsqueeze(active_in, list(range(1, r + 1))) if r else active_in,
                                      as_batched(b, a), old])
                   for a, old, r in zip(outs[1:], carries_in, ranks)]
        go = _any(active)
    finally:
        b.builder.scopes.pop()
    cond_in = b.builder.new_value(b.builder.unique("cond_in"), "bool", [])
    body = _finish(b, scope, [Arg(go, False), Arg(active, True), *(Arg(c, True) for c in carries)],
                   [False, True, *[True] * n_carry], "loop_body", [inputs[0], cond_in, *inputs[1:]])
    start = as_batched(b, cond) if cond is not None else ops.emit("Expand", [ops.constant(np.asarray(True)),
                                                                               b.batch_shape()])
    count = trip and trip.t
    if trip is not None and trip.batched:
        start = ops.emit("And", [start, ops.emit("Greater", [trip.t, ops.const_i64([0])])])
        count = ops.emit("ReduceMax", [trip.t], {"keepdims": 0})
    ins = [count, _any(start), start, *(as_batched(b, a) for a in args[2:])]
    types = [(Tensor(v).dtype, Tensor(v).shape) for v in body.outputs[1:]]
    outs = _listed(ops.emit("Loop", ins, {"body": body}, n_carry + 1, out_types=types,
                            source=node.metadata_props.get(SOURCE_KEY),
                            evaluator=lambda arrays: run_loop(b.builder, body, arrays)))
    return [Arg(t, True) for t in outs[1:]]


RULES.update({"If": _if, "Scan": _scan, "Loop": _loop})
