"""``gc.autograd``: torch's ``autograd.Function``, a forward with a gradient of the user's own.

``Fn.apply(*args)`` runs ``Fn.forward(ctx, *args)`` as ``gc.no_grad`` code (each input read through a
``gc.detach``), so its nodes are plain ONNX that no gradient passes through, and reads each differentiable
output through a stop-gradient Identity marked ``AUTOGRAD_KEY``. ``Fn.backward(ctx, *grads)`` is captured at
once, in a scope of its own, on a placeholder per marked output: its nodes become a model-local function of
the ``graphc.autograd`` domain that no node calls, its inputs those gradients and the forward values it reads
(saved tensors, ctx attributes). Autodiff copies that body in where the gradient reaches the markers
(``graphc.passes.autodiff.autograd_functions``); inference graphs and exports drop it.

The namespace also holds torch's ``autograd.grad`` (``graphc.dsl.autograd_grad``), ``autograd.functional``
(``graphc.dsl.autograd_functional``) and the grad-mode switches, graphc's own (``grad_mode``).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from graphc.dsl import autograd_functional as functional
from graphc.dsl import grad_mode, ops
from graphc.dsl.autograd_grad import grad
from graphc.dsl.autograd_steps import ancestors, step_reaches
from graphc.dsl.builder import Builder, Scope, active, no_grad, user_source
from graphc.dsl.grad_mode import enable_grad, inference_mode, set_grad_enabled
from graphc.dsl.ops_array import zeros_like
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES
from graphc.passes.values import AUTOGRAD_DOMAIN, AUTOGRAD_KEY, STOP_GRADIENT_KEY, static_shape

__all__ = ["Function", "FunctionCtx", "enable_grad", "functional", "grad", "grad_mode", "inference_mode", "no_grad",
           "set_grad_enabled"]

_FUNCTIONS_KEY = "graphc.autograd"  # Builder.finishers: the backwards of this capture's Functions


class FunctionCtx:
    """torch's ``ctx``: ``save_for_backward``/``saved_tensors``, ``needs_input_grad``,
    ``mark_non_differentiable``, ``set_materialize_grads(True)``; any other attribute holds what
    ``forward`` leaves for ``backward`` (ints, shapes, Tensors)."""

    def __init__(self, where: str, needs_input_grad: tuple[bool, ...]) -> None:
        self._where = where
        self.needs_input_grad = needs_input_grad
        self._saved: tuple[Tensor | None, ...] = ()
        self._non_differentiable: set[int] = set()

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise CaptureError(f"{self._where}: save_for_backward takes Tensors or None; argument {i} is "
                                   f"{type(t).__name__}")
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple[Tensor | None, ...]:
        return self._saved

    def mark_non_differentiable(self, *tensors: Tensor) -> None:
        self._non_differentiable.update(id(t.value) for t in tensors)

    def set_materialize_grads(self, value: bool) -> None:
        """torch's switch; graphc always passes zeros for an output the loss does not reach."""
        if value is not True:
            raise CaptureError(f"{self._where}: set_materialize_grads(False) is not supported; backward gets zeros "
                               "for an output the loss does not reach")


class Function:
    """torch's ``autograd.Function``: subclass it with ``@staticmethod forward(ctx, *args)`` (or
    ``forward(*args)`` and ``setup_context(ctx, inputs, output)``) and ``@staticmethod backward(ctx,
    *grads)``, returning one gradient (or None) per forward argument; call ``Fn.apply(*args)``."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any) -> Any:
        raise NotImplementedError("a gc.autograd.Function subclass defines forward")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("a gc.autograd.Function subclass defines backward")

    @classmethod
    def apply(cls, *args: Any) -> Any:
        return _apply(cls, args, user_source())


def backwards(builder: Builder) -> dict[ir.OperatorIdentifier, ir.Function]:
    """The backwards of the Functions applied so far in ``builder``'s capture, by identifier: what
    ``gc.autograd.grad`` and ``gc.func``'s transforms differentiate a Function's region by (a deferred backward
    captured now, given every output's gradient)."""
    finisher = builder.finishers.get(_FUNCTIONS_KEY)
    if finisher is None:
        return {}
    finisher.settle(None)
    return {e.function.identifier(): e.function for entry in finisher.pending for e in (entry, *entry.variants)}


def settle(builder: Builder, outputs: list[ir.Value]) -> None:
    """The capture's graph ``outputs`` known: capture the deferred backwards, each given None for an output of its
    Function that reaches none of ``outputs``, through the forward or a later Function's gradient; with several
    float outputs, captured again for each output that would give it other Nones were it the loss (a *variant*,
    which autodiff takes where the gradients reaching the markers are that variant's)."""
    finisher = builder.finishers.get(_FUNCTIONS_KEY)
    if finisher is None:
        return
    reached = [ancestors(outputs, set())]
    if len(outputs) > 1:
        reached += [ancestors([o], set()) for o in outputs if o.dtype is not None and o.dtype.is_floating_point()]
    finisher.settle(reached)
    finisher.warn_steps(builder.scopes[0].nodes, reached[0])


def rebind(builder: Builder, old: ir.Value, new: ir.Value) -> None:
    """The Functions applied so far whose gradient goes to ``old`` send it to ``new`` instead: a hook put between
    ``old`` and its readers (``graphc.dsl.grad_hooks``) sees the gradient through a Function that read ``old``."""
    builder.finishers.get(_FUNCTIONS_KEY, _Finisher()).rebind(old, new)


def discard(builder: Builder, marker: ir.Node) -> None:
    """Forget the Function whose marker is ``marker`` (a removed hook's): its backward stays out of the model."""
    builder.finishers.get(_FUNCTIONS_KEY, _Finisher()).discard(marker)


def _apply(cls: type, args: tuple, source: str) -> Any:
    builder = active()
    where = f"gc.autograd.Function {cls.__name__} (applied at {source})"
    needs = tuple(isinstance(a, Tensor) and a.value.dtype is not None and a.value.dtype.is_floating_point()
                  for a in args)
    ctx = FunctionCtx(where, needs)
    if builder is None:  # outside a capture: values only, no gradient to take
        return _forward(cls, ctx, args)
    inside = next((scope.backward_of for scope in builder.scopes if scope.backward_of), None)
    if inside is not None:
        raise CaptureError(f"{where} is inside the backward of {inside}; graphc takes a Function's backward as "
                           "plain ops: apply this Function outside that backward")
    state = builder.set_gradients(False)
    try:
        result = _forward(cls, ctx, args)
    finally:
        builder.restore_gradients(state)
    outputs = result if isinstance(result, tuple) else (result,)
    for i, out in enumerate(outputs):
        if not isinstance(out, Tensor):
            raise CaptureError(f"{where}: forward returned {type(out).__name__} as output {i}; it returns a "
                               "gc.Tensor or a tuple of them")
    # torch's rule: a Tensor returned twice is its last output; the earlier ones get zero gradients
    last = {id(o.value): i for i, o in enumerate(outputs)}
    marked = [last[id(o.value)] == i and id(o.value) not in ctx._non_differentiable and o.dtype in FLOAT_DTYPES
              for i, o in enumerate(outputs)]
    if not any(marked) or not builder.gradients_enabled or not any(needs):
        return result
    name = builder.unique(cls.__name__)
    own = {i: _mark(outputs[i]) if marked[i] else ops.detach(outputs[i]) if outputs[i].dtype in FLOAT_DTYPES
           else outputs[i] for i in sorted(last.values())}
    marks = [own[last[id(o.value)]] for o in outputs]
    backward = _Backward(cls, ctx, builder, name, source, args, outputs, marked)
    if getattr(cls, "_deferred", False) and (len(builder.scopes) == 1 or builder.scope.settles is not None):
        builder.finishers.setdefault(_FUNCTIONS_KEY, _Finisher()).defer(backward, marks)
    else:
        backward.capture(marks)
    return tuple(marks) if isinstance(result, tuple) else marks[0]


def _forward(cls: type, ctx: FunctionCtx, args: tuple) -> Any:
    """The user's forward, torch's two styles: ``forward(ctx, *args)`` or ``forward(*args)`` with ``setup_context``."""
    if getattr(cls, "setup_context", None) is not None:
        result = cls.forward(*args)
        cls.setup_context(ctx, args, result)
        return result
    return cls.forward(ctx, *args)


def _mark(t: Tensor) -> Tensor:
    """``t`` read through a stop-gradient Identity, which ``_Finisher`` marks with its region's record."""
    out = ops.emit("Identity", [t], name_hint="autograd")
    out.value.producer().metadata_props[STOP_GRADIENT_KEY] = "true"
    return out


class _Backward:
    """The backward of one ``apply``, captured in a scope of its own and checked against the inputs."""

    def __init__(self, cls: type, ctx: FunctionCtx, builder: Builder, name: str, source: str, args: tuple,
                 outputs: tuple, marked: list[bool]) -> None:
        self.cls, self.ctx, self.builder, self.name, self.source = cls, ctx, builder, name, source
        self.args, self.outputs, self.marked = args, outputs, marked
        self.where = ctx._where
        line = getattr(getattr(cls.backward, "__code__", None), "co_firstlineno", "?")
        self.backward_at = f"{cls.__name__}.backward (line {line})"

    def given(self, marks: list[Tensor], reached: set[ir.Value] | None) -> tuple[int, ...]:
        """The marked outputs (their indices among them) that get a gradient where ``reached`` reach the loss."""
        marked = [mark for mark, m in zip(marks, self.marked) if m]
        return tuple(j for j, mark in enumerate(marked) if reached is None or mark.value in reached)

    def capture(self, marks: list[Tensor], reached: set[ir.Value] | None = None,
                primary: _Entry | None = None) -> _Entry:
        """Capture backward as a function; register it and the region's record with the capture's finisher (as
        a variant of ``primary``'s where given). ``reached``: the values that reach the graph's outputs; a marked
        output not among them gets None (None: every marked output gets its gradient)."""
        builder = self.builder
        name = self.name if primary is None else builder.unique(f"{self.name}.given")
        params = [builder.new_value(builder.unique(f"{name}.grad"), o.dtype, static_shape(o.value))
                  for o, m in zip(self.outputs, self.marked) if m]
        state = builder.set_gradients(True)
        try:
            with builder.subgraph() as scope:
                scope.backward_of = self.where
                given = dict(zip((i for i, m in enumerate(self.marked) if m), params))
                grads = [(None if reached is not None and marks[i].value not in reached else Tensor(given[i]))
                         if i in given else zeros_like(o) if o.dtype in FLOAT_DTYPES else None
                         for i, o in enumerate(self.outputs)]
                gradients = self._checked(self.cls.backward(self.ctx, *grads))
                made = {id(v) for node in scope.nodes for v in node.outputs}
                returned = []  # each a value of the body's own, once (ONNX refuses a function's output twice)
                for i, g in gradients:
                    if id(g.value) not in made:
                        g = ops.emit("Identity", [g])
                    made.discard(id(g.value))
                    returned.append((i, g))
        finally:
            builder.restore_gradients(state)
        body = ir.Graph(params, [g.value for _, g in returned], nodes=scope.nodes, opset_imports={"": builder.opset},
                        name=name)
        # a saved output is read as the Function's output (its marker), as torch's saved output carries its
        # history: differentiating the backward (create_graph=True) goes through this backward again
        outputs = {id(o.value): mark.value for o, mark, m in zip(self.outputs, marks, self.marked) if m}
        reads = [outputs.get(id(v), v) for v in _reads(body, set(params))]
        record = {"function": name, "class": self.cls.__name__, "source": self.source}
        entry = _Entry(ir.Function(AUTOGRAD_DOMAIN, name, graph=body, attributes=[]), record,
                       [self.args[i].value for i, _ in returned], reads, [mark for mark, m in zip(marks, self.marked) if m],
                       self.given(marks, reached))
        builder.finishers.setdefault(_FUNCTIONS_KEY, _Finisher()).add(entry, primary)
        return entry

    def _checked(self, result: Any) -> list[tuple[int, Tensor]]:
        """(argument index, gradient) for each forward argument backward gave a gradient for."""
        grads = result if isinstance(result, tuple) else (result,)
        count = len(self.args)
        if len(grads) < count or any(g is not None for g in grads[count:]):
            raise CaptureError(f"{self.where}: {self.backward_at} returned {len(grads)} gradient(s); forward took "
                               f"{count} argument(s), and backward returns one per argument (None for no gradient)")
        out = []
        for i, (arg, g) in enumerate(zip(self.args, grads)):
            if g is None:
                continue
            if not isinstance(arg, Tensor) or not self.ctx.needs_input_grad[i]:
                what = "a Tensor that is not floating-point" if isinstance(arg, Tensor) else type(arg).__name__
                raise CaptureError(f"{self.where}: {self.backward_at} returned a gradient for argument {i}, which is "
                                   f"{what}; return None there")
            if not isinstance(g, Tensor):
                raise CaptureError(f"{self.where}: {self.backward_at} returned {type(g).__name__} as the gradient of "
                                   f"argument {i}; it returns a gc.Tensor or None")
            want, got = static_shape(arg.value), static_shape(g.value)
            if g.dtype != arg.dtype or (want is not None and got is not None and _differ(want, got)):
                raise CaptureError(f"{self.where}: {self.backward_at} returned a gradient of {g.type_str()} for "
                                   f"argument {i}, which is {arg.type_str()}; a gradient has its input's dtype and "
                                   "shape")
            out.append((i, g))
        return out


def _differ(want: tuple, got: tuple) -> bool:
    return len(want) != len(got) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                        for a, b in zip(want, got))


def _reads(body: ir.Graph, params: set[ir.Value]) -> list[ir.Value]:
    """The outer values ``body`` (and its subgraphs) reads, each replaced by a new input of ``body``;
    the outer values in the order of those inputs."""
    inner = list(ir.traversal.RecursiveGraphIterator(body))
    made = {v for node in inner for v in node.outputs} | params
    for node in inner:
        for sub in (a.value for a in node.attributes.values() if a.type == ir.AttributeType.GRAPH):
            made.update(sub.inputs)
    outer: dict[ir.Value, ir.Value] = {}
    for node in inner:
        for i, v in enumerate(node.inputs):
            if v is None or v in made:
                continue
            if v not in outer:
                outer[v] = ir.Value(name=f"{body.name}.{v.name}", type=v.type, shape=v.shape)
                body.inputs.append(outer[v])
            node.replace_input_with(i, outer[v])
    return list(outer)


@dataclass
class _Entry:
    """One captured backward: its function, the region's record, the values its outputs are the gradients of, the
    forward values it reads, the markers, the marked outputs it was ``given`` gradients for; ``variants``: the same
    backward captured for the other ``given`` a single graph output as the loss would make."""

    function: ir.Function
    record: dict
    inputs: list
    reads: list
    marks: list
    given: tuple[int, ...]
    variants: list[_Entry] = field(default_factory=list)


class _Finisher:
    """Once the capture ends (names final): each Function's backward added to the model, its record
    written on its markers with the names of the values it binds."""

    def __init__(self) -> None:
        self.pending: list[_Entry] = []
        # (backward, marks, rebinds before it, the scope it was applied in)
        self.deferred: list[tuple[_Backward, list[Tensor], int, Scope]] = []
        self.rebinds: list[tuple[ir.Value, ir.Value]] = []
        self.in_bodies: list[tuple[_Backward, _Entry]] = []  # captured once a body's outputs were (``warn_steps``)

    def defer(self, backward: _Backward, marks: list[Tensor]) -> None:
        """Capture ``backward`` once the graph's outputs are known (``settle``), or, applied in a control-flow
        body, once the body's are: given None for an output reaching none of them, as torch at every step."""
        scope = backward.builder.scope
        if scope.settles is not None and all(entry[3] is not scope for entry in self.deferred):
            scope.settles.append(lambda outputs: self.settle([ancestors(outputs, set())], scope))
        self.deferred.append((backward, marks, len(self.rebinds), scope))

    def settle(self, reached: list[set[ir.Value]] | None, scope: Scope | None = None) -> None:
        """Capture the deferred backwards, the last applied first, so that an earlier one's output reaches where a
        later one's backward sends a gradient to it (``reached``: the values reaching the outputs, then those
        reaching each float output, each extended as the backwards are captured; None: every output reached).
        Each backward is captured once per marked outputs given a gradient (the first: the region's own; then its
        variants), and not for a variant given none (no gradient reaches the region there). ``scope``: only those
        applied in that body."""
        deferred = [entry for entry in self.deferred if scope is None or entry[3] is scope]
        self.deferred = [entry for entry in self.deferred if all(entry is not e for e in deferred)]
        for backward, marks, start, _ in reversed(deferred):
            captured: dict[tuple[int, ...], _Entry] = {}
            for k, values in enumerate(reached or [None]):
                given = backward.given(marks, values)
                entry = captured.get(given)
                if entry is None and (k == 0 or given):
                    primary = captured[next(iter(captured))] if captured else None
                    entry = captured[given] = backward.capture(marks, values, primary)
                    if self.rebinds[start:]:  # rebound since its forward: written anew
                        for old, new in self.rebinds[start:]:
                            entry.inputs[:] = [new if v is old else v for v in entry.inputs]
                        self._write(primary or entry)
                if values is not None and entry is not None:
                    ancestors(entry.inputs, values)
            if scope is not None and captured:
                self.in_bodies.append((backward, captured[next(iter(captured))]))

    def warn_steps(self, nodes: list[ir.Node], reached: set[ir.Value]) -> None:
        """Warn of each backward captured in a body where, at a step at which torch calls it, it was given a
        gradient for an output reaching none of the graph's outputs (``reached``) at that step."""
        if not self.in_bodies:
            return
        links = {mark.value: entry.inputs for entry in self.pending for mark in entry.marks}
        steps = step_reaches(nodes, reached, links)
        warned = set()
        for backward, entry in self.in_bodies:
            given = [entry.marks[j].value for j in entry.given]
            sets = steps.get(given[0].producer().graph, []) if given else []
            called = [s for s in sets if any(v in s for v in given)]  # the steps torch calls the hooks at
            missed = [s for s in called if any(v not in s for v in given)]
            what = getattr(backward.cls, "describe", lambda ctx: backward.where)(backward.ctx)
            if missed and what not in warned:
                warned.add(what)
                when = "at every step" if len(missed) == len(called) else "at some steps"
                warnings.warn(
                    f"{what}, in a gc.cond/gc.scan/gc.fori_loop/gc.while_loop body: torch, running the loop in "
                    f"Python, gives the hooks None {when} for an output that reaches no graph output there (a "
                    "body output no graph output reads, or a carried value only the next step reads); graphc "
                    "traces the body once and runs the hooks once, giving them zeros for it at every step, so what "
                    "they compute from it can differ from torch's: return from the body only what the graph's "
                    "outputs read", UserWarning, stacklevel=2)

    def add(self, entry: _Entry, primary: _Entry | None) -> None:
        """A region's backward (``primary`` None), or a variant of ``primary``'s."""
        if primary is None:
            self.pending.append(entry)
        else:
            primary.variants.append(entry)
        self._write(primary or entry)  # at once too: a gc.func transform then names the Function

    def rebind(self, old: ir.Value, new: ir.Value) -> None:
        """The Functions whose gradient goes to ``old`` send it to ``new`` instead (``rebind``)."""
        self.rebinds.append((old, new))
        for entry in self.pending:
            if any(v is old for e in (entry, *entry.variants) for v in e.inputs):
                for e in (entry, *entry.variants):
                    e.inputs[:] = [new if v is old else v for v in e.inputs]
                self._write(entry)

    def discard(self, marker: ir.Node) -> None:
        """Forget the Function whose marker is ``marker`` (``discard``)."""
        self.pending = [e for e in self.pending if all(m.value.producer() is not marker for m in e.marks)]
        self.deferred = [entry for entry in self.deferred if all(m.value.producer() is not marker for m in entry[1])]

    @staticmethod
    def _write(entry: _Entry) -> None:
        def names(e: _Entry) -> dict:
            return {"inputs": [v.name for v in e.inputs], "reads": [v.name for v in e.reads]}

        variants = [{"given": list(v.given), "function": v.function.name, **names(v)} for v in entry.variants]
        record = {**entry.record, **names(entry), **({"variants": variants} if variants else {})}
        for j, mark in enumerate(entry.marks):
            mark.value.producer().metadata_props[AUTOGRAD_KEY] = json.dumps({**record, "output": j})

    def __call__(self, model: ir.Model) -> None:
        if self.deferred:  # a capture that did not settle: every output gets its gradient
            with self.deferred[0][0].builder.activated():
                self.settle(None)
        for entry in self.pending:
            for e in (entry, *entry.variants):
                model.functions[e.function.identifier()] = e.function
            self._write(entry)
        model.opset_imports[AUTOGRAD_DOMAIN] = 1
