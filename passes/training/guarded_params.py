"""Params the loss reads only inside control flow, and whether a step reads them.

torch gives a param that a step's forward does not read (only an ``if`` branch not taken, a loop
that runs zero times reads it) ``grad = None``, and ``torch.optim`` skips it that step: no weight
decay, no moment or momentum update, no ``step`` count (the per-param ``state["step"]``, which
Adam's bias corrections and the like read). graphc's backward gives such a param a zero gradient;
``guards`` finds those params in train_step's forward and ``touched`` emits, per param, the bool
scalar that says whether this step read it: an If's condition (its negation for the else branch),
a Loop's ``trip count > 0 and cond``, a Scan's ``length > 0``, ORed over the nodes that read it.
The update then keeps such a param and its state as they are where it is not touched, as loss
scaling keeps a skipped step (``loss_scaling.held_step`` and ``kept``), and counts its own step
(``<param>.step``, int64) and, with a scheduled momentum, keeps its own running state
(``<param>.mu_product``, ``<param>.momentum_steps``; torch's per-param ``mu_product`` and
momentum buffer). Data-parallel workers' gradients graph outputs each flag
(``expose_touched``) and their update takes the workers' OR as an input (``fed_guards``), as DDP
with ``find_unused_parameters`` gives a param a gradient on every rank when any rank read it.

Liveness runs backward from the loss through float values only (an integer or bool one, an
argmax or a comparison, carries no gradient, as in torch) and through no ``gc.detach`` Identity;
a param read by a live node of the main graph counts as always read (its update as before). One
read through main-graph nodes whose outputs only guarded bodies read (a transpose or Cast before
the branch) is guarded by those bodies, as torch's backward never reaches it either. A Loop or
Scan body is walked the same way: a param read there only under nested control flow (an If in
the body) is touched where some iteration ran it, a flag the body outputs per iteration (a scan
output, summed after the loop). A read's condition is the AND of its node's own with the
conditions under which that node is read (an If inside an If's branch: the inner condition, which
the outer If outputs from that branch, false from the other; an If whose output both branches of
a later If read: its own condition), ORed over the paths by which the loss reaches it, an If's
two branches merging (``c and f or c and not f`` is ``c``, so a constant-trip loop unrolled into a
chain of Ifs gates a param by the Ifs that read it, not by 2^n paths). A body that never runs (an If branch its
constant condition never takes, a Loop of 0 trips, a Scan of length 0) reads nothing: a param read
only there is ``never_read``, and training leaves it out (torch's grad is None on every step).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import is_float
from graphc.passes.autodiff.autograd_functions import regions
from graphc.passes.autodiff.core import gradient_inputs
from graphc.passes.emit import Emitter
from graphc.passes.training import loss_scaling
from graphc.passes.training.graph_outputs import expose, input_with_default
from graphc.passes.training.optimizers import StepContext
from graphc.passes.training.scheduled import running_state
from graphc.passes.values import const_array, stops_gradient, subgraphs

__all__ = ["STEP_SUFFIX", "TOUCHED_SUFFIX", "Gates", "expose_touched", "fed_guards", "guards", "never_read", "own_state",
           "touched"]

STEP_SUFFIX = ".step"  # a gated param's own step count, torch's per-param ``state["step"]``
TOUCHED_SUFFIX = ".touched"  # the gradients graph's bool: did this step read the param

Guard = tuple  # a condition: ("if", node, branch 0 then / 1 else), ("in", If node, branch, inner), ("loop", node),
# ("scan", node), ("nested", Loop/Scan node, inner), ("fed", bool input); inner: a Conj of the body's own guards
Conj = frozenset  # guards that all hold
Dnf = frozenset  # Conjs one of which holds: read under it; ALWAYS: read every step
ALWAYS: Dnf = frozenset({frozenset()})
NEVER: Dnf = frozenset()


def guards(graph: ir.Graph, loss: ir.Value, params: Collection[str]) -> dict[str, list[tuple[Guard, ...]]]:
    """``{param: the ways a step reads it}`` for each of ``params`` that the loss reads only inside
    control flow whose running is not known when the graph is built, in ``params``' order (the
    graphs' ``<param>.step`` inputs follow it); each way is the guards that all hold on it, each
    in its own graph (an If in an If's branch: an ``"in"`` guard of the outer If); params read
    otherwise are left out."""
    need = _needs(graph, {loss: ALWAYS})
    found = {v.name: d for v, d in need.items() if v.name in params and d != ALWAYS}
    return {p: sorted((_sorted(c) for c in found[p]), key=lambda c: [_order(g) for g in c]) for p in params if p in found}


def never_read(graph: ir.Graph, loss: ir.Value, params: Collection[str]) -> list[str]:
    """Those of ``params`` (initializers of ``graph``) that no step reads with a gradient: read only
    inside bodies that never run (an If branch its constant condition never takes, a Loop of 0 trips
    or a constant false condition, a Scan of length 0) or, there, only through ``gc.detach`` or an
    integer or bool value (an argmax, a comparison); torch gives them ``grad = None`` on every step."""
    need = _needs(graph, {loss: ALWAYS})
    return [p for p in params if not need.get(graph.initializers[p])]


def _needs(graph: ir.Graph, need: dict[ir.Value, Dnf]) -> dict[ir.Value, Dnf]:
    """``need`` ({value: when it is read}) grown backward through ``graph``'s nodes: each value
    they read with a gradient, from outside ``graph`` too, with when they run; a body's reads
    under its node's condition ANDed with the node's own need; a ``gc.autograd.Function``'s output
    reads the arguments its backward returns gradients for."""
    nodes = list(graph)
    marked = regions(nodes, None)
    for node in reversed(nodes):
        wanted = _any(need.get(o, NEVER) for o in node.outputs)
        if not wanted:
            continue
        reads = ((v, wanted) for v in gradient_inputs(node, marked)) if node in marked or stops_gradient(node) \
            else _node_reads(node, need, wanted)
        for v, when in reads:
            if v is not None and is_float(v):
                need[v] = _any((need.get(v, NEVER), when))
    return need


def _node_reads(node: ir.Node, need: dict[ir.Value, Dnf], wanted: Dnf) -> Iterable[tuple[ir.Value, Dnf]]:
    """(value, when) for the values ``node``, needed when ``wanted``, reads; a body's outer reads
    under the body's guards (any other node with bodies reads them whole, when wanted)."""
    bodies = subgraphs(node)
    if node.op_type == "If":
        yield from _if_reads(node, need)
    elif node.op_type in ("Loop", "Scan"):
        yield from _loop_reads(node, need, wanted)
    else:
        reads = {v for v in node.inputs if v is not None}.union(*(_outer_reads(g, g.outputs) for g in bodies))
        yield from ((v, wanted) for v in reads)


def _if_reads(node: ir.Node, need: dict[ir.Value, Dnf]) -> Iterable[tuple[ir.Value, Dnf]]:
    """An If's branches: each output's need marked by a placeholder guard, walked through the
    branch, then each read's placeholder replaced by that need ANDed with the branch's guard."""
    marks = {d: ("mark", node, i) for i, d in enumerate(dict.fromkeys(need.get(o, NEVER) for o in node.outputs)) if d}
    unmark = {m: d for d, m in marks.items()}
    for k, name in enumerate(("then_branch", "else_branch")):
        if _static(("if", node, k)) is False:  # a constant condition never takes it: it reads nothing
            continue
        body = node.attributes[name].as_graph()
        start: dict[ir.Value, Dnf] = {}
        for inner, outer in zip(body.outputs, node.outputs):
            if need.get(outer):
                start[inner] = _any((start.get(inner, NEVER), frozenset({frozenset({marks[need[outer]]})})))
        for v, when in _needs(body, start).items():
            if _outside(v, body):
                yield v, _any(_lift(unmark[m], _within(node, k, c - {m})) for c in when for m in c if m in unmark)


def _loop_reads(node: ir.Node, need: dict[ir.Value, Dnf], wanted: Dnf) -> Iterable[tuple[ir.Value, Dnf]]:
    """A Loop's or Scan's body reads, when ``wanted``, under the node's running (or, under nested
    control flow, some iteration's), and its carried inputs as its outputs where it runs none."""
    body = subgraphs(node)[0]
    if node.op_type == "Loop":  # inputs M, cond, carried...; body inputs iter, cond, carried...
        carried, skip = len(node.inputs) - 2, 2
    else:  # inputs states..., scans...; body inputs the same
        carried, skip = len(node.inputs) - node.attributes["num_scan_inputs"].as_int(), 0
    fed = {v: node.inputs[i] for i, v in enumerate(body.inputs) if i >= skip}
    never = _static((node.op_type.lower(), node)) is False  # 0 trips or a length-0 scan: the body reads nothing
    reads = {} if never else _needs(body, dict.fromkeys(filter(is_float, body.outputs), ALWAYS))
    for v, when in reads.items():
        if v in fed or (v not in body.inputs and _outside(v, body)):
            yield fed.get(v, v), _any(_lift(wanted, _iterating(node, c)) for c in when)
    for k in range(carried):  # no iterations: the carried input is the output
        yield node.inputs[skip + k], need.get(node.outputs[k], NEVER)


def _within(node: ir.Node, branch: int, inner: Conj) -> Guard | None:
    """The guard of ``node``'s (an If) ``branch`` with ``inner`` (guards of its own) holding too;
    None for a branch that always runs."""
    if inner:
        return ("in", node, branch, inner)
    return None if _static(("if", node, branch)) else ("if", node, branch)


def _iterating(node: ir.Node, inner: Conj) -> Guard | None:
    """The guard of some iteration of ``node`` (a Loop or Scan) running with ``inner`` (guards
    of its body) holding; None for a node that runs whenever needed."""
    if inner:
        return ("nested", node, inner)
    guard = (node.op_type.lower(), node)
    return None if _static(guard) else guard


def _lift(when: Dnf, guard: Guard | None) -> Dnf:
    """``when`` ANDed with ``guard`` (None: always holds)."""
    return when if guard is None else frozenset(c | {guard} for c in when)


def _any(whens: Iterable[Dnf]) -> Dnf:
    """The OR of ``whens``, simplified: ``c and t`` or ``c and not t`` (an If's two branches) is
    ``c``, and a Conj that holds whenever a smaller one does is dropped."""
    conjs: set[Conj] = set()
    for when in whens:
        if frozenset() in when:
            return ALWAYS
        conjs |= when
    merged = True
    while merged:
        merged = False
        for c in conjs:
            for g in c:
                other = (c - {g}) | {("if", g[1], 1 - g[2])} if g[0] == "if" else None
                if other in conjs:
                    conjs -= {c, other}
                    conjs.add(c - {g})
                    merged = True
                    break
            if merged:
                break
    return frozenset(c for c in conjs if not any(o < c for o in conjs))


def _sorted(conj: Conj) -> tuple[Guard, ...]:
    return tuple(sorted(conj, key=_order))


def _order(guard: Guard) -> tuple:
    """A guard's place: its node's in its graph, then the branch, then its inner guards'."""
    index = list(guard[1].graph).index(guard[1])
    branch = guard[2] if guard[0] in ("if", "in") else -1
    inner = guard[-1] if guard[0] in ("in", "nested") else ()
    return index, branch, [_order(g) for g in _sorted(inner)]


def _outside(value: ir.Value, body: ir.Graph) -> bool:
    return value.producer() is None or value.producer().graph is not body


def _outer_reads(body: ir.Graph, outputs: Iterable[ir.Value], keep_inputs: bool = False) -> set[ir.Value]:
    """The values from outside ``body`` (and, with ``keep_inputs``, its own inputs) that its
    nodes computing ``outputs`` read with a gradient (a Function marker its region's inputs, as ``_needs``);
    nested bodies count whole."""
    live = set(filter(is_float, outputs))
    nodes = list(body)
    marked = regions(nodes, None)
    for node in reversed(nodes):
        if not any(o in live for o in node.outputs):
            continue
        reads = gradient_inputs(node, marked) if node in marked or stops_gradient(node) else node.inputs
        live.update(v for v in reads if v is not None and is_float(v))
        for inner in subgraphs(node):
            live |= _outer_reads(inner, inner.outputs, keep_inputs=True) - set(inner.inputs)
    own = set(body.inputs) if not keep_inputs else set()
    return {v for v in live if _outside(v, body) and v not in own}


def _static(guard: Guard) -> bool | None:
    """Whether the body of ``guard`` (an "if", "loop" or "scan" one) runs, where the graph says it
    (a constant condition, trip count or scan length); None where it depends on the step. A body
    that runs on every step counts as always read; one that never runs reads nothing."""
    kind, node = guard[0], guard[1]
    if kind == "loop":
        trips, cond = (const_array(v) for v in node.inputs[:2])
        if (node.inputs[0] is not None and trips is None) or (node.inputs[1] is not None and cond is None):
            return None
        return bool((trips is None or trips > 0) and (cond is None or cond))
    if kind == "scan":
        x, axis = _scanned(node)
        dim = x.shape[axis] if x.shape is not None else None
        return dim > 0 if isinstance(dim, int) else None
    cond = const_array(node.inputs[0])  # an If's
    return None if cond is None else bool(cond) == (guard[2] == 0)


def _scanned(node: ir.Node) -> tuple[ir.Value, int]:
    """A Scan's first scanned input and its scan axis."""
    first = len(node.inputs) - node.attributes["num_scan_inputs"].as_int()
    axes = node.attributes.get("scan_input_axes")
    axis = axes.as_ints()[0] if axes is not None else 0
    x = node.inputs[first]
    return x, axis if axis >= 0 or x.shape is None else axis + len(x.shape)


def touched(b: Emitter, ways: list[tuple[Guard, ...]], cache: dict) -> ir.Value:
    """The bool scalar: does this step read a param read in ``ways`` (``guards``')? The OR of
    each way's guards ANDed; each guard's condition is emitted once per ``cache``."""
    for way in ways:
        _conditions(b, way, cache)
    out = _all(b, ways[0], cache)
    for way in ways[1:]:
        out = b.op("Or", out, _all(b, way, cache))
    return out


def _conditions(b: Emitter, way: tuple[Guard, ...], cache: dict) -> None:
    for g in way:
        if g not in cache:
            cache[g] = _condition(b, g, cache)


def _all(b: Emitter, way: tuple[Guard, ...], cache: dict) -> ir.Value:
    out = cache[way[0]]
    for g in way[1:]:
        out = b.op("And", out, cache[g])
    return out


def expose_touched(graph: ir.Graph, opset: int, loss: ir.Value, params: Collection[str],
                   gated: Iterable[str]) -> list[str]:
    """Output ``<param>.touched`` (bool scalar: did this step read it, ``touched``) for each of the
    ``gated`` params of the gradients ``graph``; returns their names. Data-parallel workers OR
    them, as DDP with ``find_unused_parameters`` gives a param a gradient, and a step, on every
    rank where any rank read it (None, no step, where none did)."""
    found, cache, b = guards(graph, loss, params), {}, Emitter(graph, opset, "touched")
    names = []
    for p in gated:
        names.append(expose(graph, touched(b, found[p], cache), p + TOUCHED_SUFFIX))
        graph.outputs[-1].dtype, graph.outputs[-1].shape = ir.DataType.BOOL, ir.Shape([])
    return names


def fed_guards(graph: ir.Graph, gated: Iterable[str], flagged: Collection[str]) -> dict[str, list[tuple[Guard, ...]]]:
    """``{param: its guards}`` for the workers' update: a ``flagged`` param's the bool input
    ``<param>.touched`` (the workers' ``expose_touched`` flags ORed), any other's none (stepped
    every step, as artifacts whose gradients graph has no flags)."""
    out: dict[str, list[tuple[Guard, ...]]] = {}
    for p in gated:
        out[p] = []
        if p in flagged:
            flag = ir.Value(name=p + TOUCHED_SUFFIX, type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
            graph.inputs.append(flag)
            out[p].append((("fed", flag),))
    return out


def _condition(b: Emitter, guard: Guard, cache: dict) -> ir.Value:
    kind, node = guard[0], guard[1]
    if kind == "fed":  # a graph input
        return node
    if kind == "nested":
        return _taken_on_any(b, node, guard[2], cache)
    if kind == "in":
        return _taken_with(b, node, guard[2], guard[3], cache)
    if kind == "if":
        return node.inputs[0] if guard[2] == 0 else b.op("Not", node.inputs[0])
    if kind == "scan":
        x, axis = _scanned(node)
        length = b.op("Shape", x, start=axis, end=axis + 1)
        return b.op("Squeeze", b.op("Greater", length, b.ints([0])), b.ints([0]))
    trips, cond = node.inputs[:2]
    parts = ([b.op("Greater", trips, b.const(0, np.int64))] if trips is not None else []) + \
        ([cond] if cond is not None else [])
    return parts[0] if len(parts) == 1 else b.op("And", *parts)


def _inside(b: Emitter, body: ir.Graph, inner: Conj, cache: dict) -> tuple[Emitter, ir.Value]:
    """``inner``'s guards (of ``body``'s own) ANDed, emitted in ``body``."""
    way, emitter = _sorted(inner), Emitter(body, b.opset, b.scope, names=b._names)
    _conditions(emitter, way, cache)
    return emitter, _all(emitter, way, cache)


def _new_output(b: Emitter, node: ir.Node, dtype: ir.DataType, shape: list) -> ir.Value:
    node.resize_outputs(len(node.outputs) + 1)
    out = node.outputs[-1]
    out.name, out.type, out.shape = b.fresh("taken"), ir.TensorType(dtype), ir.Shape(shape)
    return out


def _taken_with(b: Emitter, node: ir.Node, branch: int, inner: Conj, cache: dict) -> ir.Value:
    """Did ``node`` (an If) take ``branch`` with ``inner`` (guards in that branch) holding? That
    branch outputs their AND, the other false (bool scalars); the If's new output."""
    for k, name in enumerate(("then_branch", "else_branch")):
        body = node.attributes[name].as_graph()
        if k == branch:
            emitter, flag = _inside(b, body, inner, cache)
        else:
            emitter = Emitter(body, b.opset, b.scope, names=b._names)
            flag = emitter.const(False, np.bool_)
        body.outputs.append(emitter.op("Reshape", flag, emitter.ints([])))
    return _new_output(b, node, ir.DataType.BOOL, [])


def _taken_on_any(b: Emitter, node: ir.Node, inner: Conj, cache: dict) -> ir.Value:
    """Did any iteration of ``node`` (a Loop or Scan) run with ``inner`` (guards in its body)
    holding? The body outputs their AND each iteration (int64 0/1, a new scan output, empty for
    no iterations); their sum > 0."""
    body = subgraphs(node)[0]
    emitter, flag = _inside(b, body, inner, cache)
    body.outputs.append(emitter.op("Cast", flag, to=ir.DataType.INT64, dtype=ir.DataType.INT64))
    taken = _new_output(b, node, ir.DataType.INT64, [None])
    for key in ("scan_output_axes", "scan_output_directions") if node.op_type == "Scan" else ():
        if key in node.attributes:
            node.attributes[key] = ir.AttrInt64s(key, [*node.attributes[key].as_ints(), 0])
    return b.op("Greater", b.op("ReduceSum", taken, keepdims=0), b.const(0, np.int64))


def own_state(gated: Iterable[str], optimizer: dict) -> dict[str, np.ndarray]:
    """The state each ``gated`` param keeps of its own, with its start: ``<param>.step`` (int64 0)
    and, with a scheduled momentum, ``<param>.mu_product`` / ``<param>.momentum_steps``
    (``scheduled.running_state``)."""
    running = running_state(optimizer)
    return {k: v for p in gated
            for k, v in {p + STEP_SUFFIX: np.array(0, np.int64), **{f"{p}.{n}": x for n, x in running.items()}}.items()}


@dataclass
class Own:
    """One update's step context and skip condition: a gated param's own step count (``step``
    in, ``t`` after this step) and scheduled momentum's running state (``<param>.mu_product``,
    ``<param>.momentum_steps``: torch keeps them per param), else the shared ones."""

    ctx: StepContext
    skip: ir.Value | None
    name: str = ""
    step: ir.Value | None = None
    t: ir.Value | None = None
    gates: "Gates | None" = None

    def next(self) -> list[tuple[str, ir.Value, ir.Value]]:
        """(input name, input, next value) of the own step count and running state, if any."""
        if self.step is None:
            return []
        running = [(f"{self.name}.{n}", v, self.gates.kept(self.skip, v, self.ctx.running_next.get(n, v)))
                   for n, v in self.ctx.running.items()]
        return [(self.name + STEP_SUFFIX, self.step, self.gates.kept(self.skip, self.step, self.t)), *running]


@dataclass
class Gates:
    """The skipped updates of one update graph: loss scaling's ``found_inf`` (or None) for every
    param, and for a gated one also a step that does not read it; ``running``: the scheduled
    momentum's running state and its start, which a gated param keeps its own of."""

    b: Emitter
    found_inf: ir.Value | None
    running: dict[str, np.ndarray] = field(default_factory=dict)  # ``scheduled.running_state``: a gated param's own
    _conditions: dict = field(default_factory=dict)

    def own_step(self, graph: ir.Graph, ctx: StepContext, name: str, param_guards: list | None) -> Own:
        """The context and skip condition of the update of ``name`` (a param or a flat group);
        ``param_guards``: None for an update every step reads, else the param's ``guards``
        (empty: stepped every step, counted on its own, as data-parallel workers' update)."""
        if param_guards is None:
            return Own(ctx, self.found_inf)
        b = self.b
        step = input_with_default(graph, name + STEP_SUFFIX, np.array(0, np.int64))
        running = {n: input_with_default(graph, f"{name}.{n}", v) for n, v in self.running.items()}
        t = b.op("Add", step, b.const(1, np.int64))
        skip = self.found_inf
        if param_guards:
            idle = b.op("Not", touched(b, param_guards, self._conditions))
            skip = idle if skip is None else b.op("Or", skip, idle)
        return Own(replace(ctx, t=t, _cache={}, running=running, running_next={}), skip, name, step, t, self)

    def held_step(self, skip: ir.Value | None, delta: ir.Value, shrink: ir.Value | None):
        return (delta, shrink) if skip is None else loss_scaling.held_step(self.b, skip, delta, shrink)

    def kept(self, skip: ir.Value | None, old: ir.Value, new: ir.Value) -> ir.Value:
        return new if skip is None else loss_scaling.kept(self.b, skip, old, new)
