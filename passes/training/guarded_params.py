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

Liveness runs backward from the loss, through no ``gc.detach`` Identity; a param read by a live
node of the main graph counts as always read (its update as before). One read through main-graph
nodes whose outputs only guarded bodies read (a transpose or Cast before the branch) is guarded
by those bodies, as torch's backward never reaches it either. A Loop or Scan body is walked the
same way: a param read there only under nested control flow (an If in the body) is touched
where some iteration ran it, a flag the body outputs per iteration (a scan output, summed after
the loop). An If's branches count whole (an If inside an If: only the outer condition gates),
and a control node reached only through guarded bodies gates its reads by those bodies' guards,
not by its own (over-stepping, never under-stepping: ``h = cond(f1, a, ...)`` read by both
branches of ``cond(f2, ...)`` is stepped every step, where torch skips ``a`` when ``f1`` is false).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.training import loss_scaling
from graphc.passes.training.graph_outputs import expose, input_with_default
from graphc.passes.training.optimizers import StepContext
from graphc.passes.training.scheduled import running_state
from graphc.passes.values import const_array, stops_gradient, subgraphs

__all__ = ["STEP_SUFFIX", "TOUCHED_SUFFIX", "Gates", "expose_touched", "fed_guards", "guards", "own_state", "touched"]

STEP_SUFFIX = ".step"  # a gated param's own step count, torch's per-param ``state["step"]``
TOUCHED_SUFFIX = ".touched"  # the gradients graph's bool: did this step read the param

Guard = tuple  # ("if", node, branch 0 then / 1 else), ("loop", node), ("scan", node), ("fed", bool input)


def guards(graph: ir.Graph, loss: ir.Value, params: Collection[str]) -> dict[str, list[Guard]]:
    """``{param: the control-flow nodes (and If branches) whose bodies read it}`` for each of
    ``params`` that the loss reads only inside control flow whose running is not known when the
    graph is built, in ``params``' order (the graphs' ``<param>.step`` inputs follow it); params
    read otherwise are left out."""
    live, found = _reads(graph, {loss})
    guarded = {v.name: g for v, g in found.items() if v.name in params and v not in live}
    return {p: sorted(guarded[p], key=_order) for p in params if p in guarded}


def _reads(graph: ir.Graph, live: set[ir.Value]) -> tuple[set[ir.Value], dict[ir.Value, set]]:
    """(values ``graph``'s nodes computing ``live`` read unguarded, {value: the guards it is read
    under}), backward through ``graph``."""
    found: dict[ir.Value, set] = {}  # values read only under these guards
    for node in reversed(list(graph)):
        if stops_gradient(node):
            continue
        if not any(o in live for o in node.outputs):  # read, if at all, under guards: so are its inputs
            under = set().union(*(found.get(o, ()) for o in node.outputs))
            reads = {v for v in node.inputs if v is not None}.union(*(_outer_reads(g, g.outputs) for g in subgraphs(node)))
            for v in reads if under else ():
                found.setdefault(v, set()).update(under)
            continue
        if not subgraphs(node):
            live.update(v for v in node.inputs if v is not None)
            continue
        for guard, reads, passed in _control_reads(node, live):
            live.update(passed)
            known = _static(guard)
            for v in reads:
                if known is None:
                    found.setdefault(v, set()).add(guard)
                else:  # a body that always runs: read as before
                    live.add(v)
    return live, found


def _order(guard: Guard) -> tuple:
    """A guard's place: its node's in its graph, then the branch, then a nested guard's own."""
    index = list(guard[1].graph).index(guard[1])
    if guard[0] == "if":
        return index, guard[2]
    return (index, *_order(guard[2])) if guard[0] == "nested" else (index,)


def _control_reads(node: ir.Node, live: set[ir.Value]) -> Iterable[tuple[Guard, set[ir.Value], set[ir.Value]]]:
    """(guard, outer values its body reads live, values passed through unguarded) for a live If,
    Loop or Scan of the main graph (any other node with bodies: one guard that never gates)."""
    out_live = [o in live for o in node.outputs]
    if node.op_type == "If":
        for k, name in enumerate(("then_branch", "else_branch")):
            body = node.attributes[name].as_graph()
            yield ("if", node, k), _outer_reads(body, [o for o, on in zip(body.outputs, out_live) if on]), set()
        return
    body = subgraphs(node)[0]
    if node.op_type == "Loop":  # inputs M, cond, carried...; body inputs iter, cond, carried...
        carried, skip = len(node.inputs) - 2, 2
    elif node.op_type == "Scan":  # inputs states..., scans...; body inputs the same
        carried, skip = len(node.inputs) - node.attributes["num_scan_inputs"].as_int(), 0
    else:
        yield ("other", node), {v for v in node.inputs if v is not None} | _outer_reads(body, body.outputs), set()
        return
    inner_live, inner_found = _reads(body, set(body.outputs))
    through = {node.inputs[skip + k] for k in range(carried) if out_live[k]}  # a carried value's output
    fed = {v: node.inputs[i] for i, v in enumerate(body.inputs) if i >= skip}

    def outer(values) -> set[ir.Value]:
        """``values`` from outside the body, a body input as the node's input that feeds it."""
        out = {fed.get(v, v) for v in values if v in fed or (v not in body.inputs and _outside(v, body))}
        return {v for v in out if v is not None}

    guard = (node.op_type.lower(), node)
    yield guard, outer(inner_live), through
    # read in the body only under nested control flow: on the steps where some iteration runs it
    for inner in sorted(set().union(*inner_found.values()), key=_order):
        yield ("nested", node, inner), outer(v for v, gs in inner_found.items() if inner in gs and v not in inner_live), set()


def _outside(value: ir.Value, body: ir.Graph) -> bool:
    return value.producer() is None or value.producer().graph is not body


def _outer_reads(body: ir.Graph, outputs: Iterable[ir.Value], keep_inputs: bool = False) -> set[ir.Value]:
    """The values from outside ``body`` (and, with ``keep_inputs``, its own inputs) that its
    nodes computing ``outputs`` read with a gradient; nested bodies count whole."""
    live = set(outputs)
    for node in reversed(list(body)):
        if stops_gradient(node) or not any(o in live for o in node.outputs):
            continue
        live.update(v for v in node.inputs if v is not None)
        for inner in subgraphs(node):
            live |= _outer_reads(inner, inner.outputs, keep_inputs=True) - set(inner.inputs)
    own = set(body.inputs) if not keep_inputs else set()
    return {v for v in live if _outside(v, body) and v not in own}


def _static(guard: Guard) -> bool | None:
    """Whether the guarded body runs, where the graph says it (a constant trip count or scan
    length); None where it depends on the step."""
    kind, node = guard[0], guard[1]
    if kind == "nested":  # an iteration's own condition
        return None
    if kind == "loop":
        trips, cond = (const_array(v) for v in node.inputs[:2])
        if (node.inputs[0] is not None and trips is None) or (node.inputs[1] is not None and cond is None):
            return None
        return bool((trips is None or trips > 0) and (cond is None or cond))
    if kind == "scan":
        x, axis = _scanned(node)
        dim = x.shape[axis] if x.shape is not None else None
        return dim > 0 if isinstance(dim, int) else None
    if kind == "if":
        cond = const_array(node.inputs[0])
        return None if cond is None else bool(cond) == (guard[2] == 0)
    return True


def _scanned(node: ir.Node) -> tuple[ir.Value, int]:
    """A Scan's first scanned input and its scan axis."""
    first = len(node.inputs) - node.attributes["num_scan_inputs"].as_int()
    axes = node.attributes.get("scan_input_axes")
    axis = axes.as_ints()[0] if axes is not None else 0
    x = node.inputs[first]
    return x, axis if axis >= 0 or x.shape is None else axis + len(x.shape)


def touched(b: Emitter, param_guards: list[Guard], cache: dict) -> ir.Value:
    """The bool scalar: does this step read a param under ``param_guards`` (``guards``')? Each
    guard's condition is emitted once per ``cache``."""
    for g in param_guards:
        if g not in cache:
            cache[g] = _condition(b, g)
    out = cache[param_guards[0]]
    for g in param_guards[1:]:
        out = b.op("Or", out, cache[g])
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


def fed_guards(graph: ir.Graph, gated: Iterable[str], flagged: Collection[str]) -> dict[str, list[Guard]]:
    """``{param: its guards}`` for the workers' update: a ``flagged`` param's the bool input
    ``<param>.touched`` (the workers' ``expose_touched`` flags ORed), any other's none (stepped
    every step, as artifacts whose gradients graph has no flags)."""
    out: dict[str, list[Guard]] = {}
    for p in gated:
        out[p] = []
        if p in flagged:
            flag = ir.Value(name=p + TOUCHED_SUFFIX, type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
            graph.inputs.append(flag)
            out[p].append(("fed", flag))
    return out


def _condition(b: Emitter, guard: Guard) -> ir.Value:
    kind, node = guard[0], guard[1]
    if kind == "fed":  # a graph input
        return node
    if kind == "nested":
        return _taken_on_any(b, node, guard[2])
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


def _taken_on_any(b: Emitter, node: ir.Node, inner: Guard) -> ir.Value:
    """Did any iteration of ``node`` (a Loop or Scan) run the body of ``inner``, a guard in its
    body? The body outputs ``inner``'s condition each iteration (int64 0/1, a new scan output,
    empty for no iterations); their sum > 0."""
    body = subgraphs(node)[0]
    inside = Emitter(body, b.opset, b.scope, names=b._names)
    body.outputs.append(inside.op("Cast", _condition(inside, inner), to=ir.DataType.INT64, dtype=ir.DataType.INT64))
    node.resize_outputs(len(node.outputs) + 1)
    taken = node.outputs[-1]
    taken.name, taken.type, taken.shape = b.fresh("taken"), ir.TensorType(ir.DataType.INT64), ir.Shape([None])
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
