"""The lowest DSL layer: the capture ``Builder``, on ``ir.Value``s (it knows no ``gc.Tensor``).

A ``Builder`` is active while ``gc.capture`` runs. Every DSL op calls ``emit(op_type, inputs,
attrs)``, which records one ``ir.Node`` in the current scope (the main graph, or a control-flow
body), infers its output dtype/shape through ``passes/infer.py`` as the passes do (fast rules,
then ONNX's per-node inference; symbolic dims kept; an ``InferenceError`` becomes a
``CaptureError`` naming op, operands and line), stamps the user's ``file.py:LINE`` and, when example
arrays were given, evaluates the node eagerly. The layers above wrap the values it returns in
``gc.Tensor``s.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl import eager as _eager
from graphc.dsl import seeding
from graphc.dsl.sources import user_source
from graphc.errors import CaptureError, GraphError
from graphc.model import EMITTED_OPSETS
from graphc.model.dtypes import as_dtype, to_onnx, type_text
from graphc.passes.emit import make_node
from graphc.passes.infer import InferenceError, infer, takes_widened
from graphc.passes.values import STOP_GRADIENT_KEY, static_shape

# The captures running in this thread / asyncio task, the innermost last (torch keeps its state per thread)
_CURRENT: contextvars.ContextVar[tuple["Builder", ...]] = contextvars.ContextVar("graphc_builders", default=())
_NARROW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
# this thread's / task's Builder for ops outside any capture (``Outside``), made on first use
_OUTSIDE: contextvars.ContextVar["Outside | None"] = contextvars.ContextVar("graphc_outside", default=None)
_OUTSIDE_KEY = "graphc.outside"  # an ir.Value's meta key: computed by an Outside Builder


def active() -> "Builder | None":
    """The Builder of the capture running now, None outside ``gc.capture``."""
    builders = _CURRENT.get()
    return builders[-1] if builders else None


# the grad mode outside a capture (per thread / task), where it only answers is_grad_enabled
_GRAD_OUTSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("graphc_grad_outside", default=True)


def set_grad_mode(enabled: bool) -> Any:
    """Switch the grad mode (of the capture running, else outside one); returns what restores it.
    Off, what is computed has no gradient (``Builder.set_gradients``)."""
    builder = active()
    if builder is None:
        previous = _GRAD_OUTSIDE.get()
        _GRAD_OUTSIDE.set(enabled)
        return None, previous
    return builder, builder.set_gradients(enabled)


def restore_grad_mode(state: Any) -> None:
    """Undo ``set_grad_mode`` with what it returned."""
    builder, previous = state
    if builder is None:
        _GRAD_OUTSIDE.set(previous)
    else:
        builder.restore_gradients(previous)


def grad_mode() -> bool:
    """Whether gradients are computed now (torch's ``is_grad_enabled``)."""
    builder = active()
    return _GRAD_OUTSIDE.get() if builder is None else builder.gradients_enabled


@contextlib.contextmanager
def no_grad():
    """``gc.no_grad()``, torch's ``no_grad`` block: what the block computes has no gradient (``gc.grad``
    and the training graphs send none back through it), as if each float value made before the block
    that it reads were ``gc.detach``ed (``Builder.set_gradients``)."""
    state = set_grad_mode(False)
    try:
        yield
    finally:
        restore_grad_mode(state)


def current() -> "Builder":
    """The Builder DSL ops record into: the innermost capture's, else this thread's ``Outside`` one."""
    builders = _CURRENT.get()
    if builders:
        return builders[-1]
    if _OUTSIDE.get() is None:
        _OUTSIDE.set(Outside())
    return _OUTSIDE.get()


def made_outside(value: ir.Value) -> bool:
    """Whether ``value`` was computed outside any capture (by an ``Outside`` Builder)."""
    return bool(value.meta.get(_OUTSIDE_KEY))


def known_value(t: Any, eager: bool = False) -> np.ndarray | None:
    """The array of a Tensor ``t`` where a ``Constant`` node of the current capture made it (``eager``: its
    example value first, where it has one), else None."""
    if eager and t.eager_value is not None:
        return t.eager_value
    return current().known(t.value)


def operand_text(operand: Any) -> str:
    """``float32[N,4]`` for a Tensor (anything with ``type_str()``) or an ``ir.Value``, the repr of
    anything else."""
    if isinstance(operand, ir.Value):
        return type_str(operand)
    if hasattr(operand, "type_str"):
        return operand.type_str()
    return "None" if operand is None else repr(operand)


def type_str(value: ir.Value) -> str:
    """``float32[N,4]``: the dtype and dims of ``value`` (``?`` where unknown)."""
    return type_text(None if value.dtype is None else as_dtype(int(value.dtype)), static_shape(value))


class Scope:
    """Nodes of one graph being built (the main graph or a subgraph body)."""

    _serial = itertools.count(1)  # next() is atomic: scopes of captures in two threads get distinct ids

    def __init__(self, eager: bool, carries: list | None = None, lookups: list | None = None):
        self.nodes: list[ir.Node] = []
        self.eager = eager
        self.id = next(Scope._serial)
        # a body whose node can carry a weight an embedding's max_norm renormalises out of it: the list
        # ``renorm`` records each such outer Tensor in (None: the body cannot, its lookups do not write back)
        self.carries = carries
        # a ``gc.vmap`` body: the list ``renorm`` records each max_norm lookup of a weight from outside it
        # in (``renorm.OuterLookup``), which ``vmap_renorm`` makes again after the call on every example's rows
        self.lookups = lookups
        self.backward_of: str | None = None  # a ``gc.autograd.Function``'s backward being captured: where it was applied
        # a control-flow body's (``control.trace_subgraph``): what runs on its outputs once traced (a deferred
        # ``gc.autograd.Function`` backward, ``autograd._Finisher.defer``); None: another scope
        self.settles: list | None = None


class Builder:
    """State of one capture: scopes, name counters, initializers, opset, eager values.

    ``values`` maps ``id(ir.Value)`` to its example value (eager capture; initializers and
    constants always), ``consts`` the outputs of ``Constant`` nodes to their arrays (inference
    reads them, so a Reshape's target shape gives its output dims).
    """

    def __init__(self, opset: int, training: bool, eager: bool, seed: int | None = None):
        if opset not in EMITTED_OPSETS:
            raise CaptureError(f"opset {opset} is not supported; graphc emits ai.onnx opsets "
                               f"{EMITTED_OPSETS[0]}..{EMITTED_OPSETS[-1]}")
        self.opset = opset
        self.training = training
        self.scopes = [Scope(eager)]
        self.initializers: list[ir.Value] = []
        # id(Parameter) -> its Tensor in this capture; (id(Parameter), scope id) -> a frozen one's detach there
        self.param_tensors: dict[int | tuple[int, int], Any] = {}
        self.rooted: set[int] | None = None  # ids of the captured Module's parameters (None: a function)
        self.buffers: list[str] = []
        # id(Tensor) -> (the Tensor, its Module, its initializer) for each buffer of the captured Module read
        self.buffer_tensors: dict[int, tuple[Any, Any, ir.Value]] = {}
        # (id(Module), name) -> what the Module's last call computed of a value computed once per call
        # (``Module.register_computed(..., per_call=True)``: torch's weight_norm/spectral_norm hooks)
        self.called_values: dict[tuple[int, str], Any] = {}
        self.write_backs: list[Any] = []  # an embedding's max_norm write-backs in the main graph (``renorm``)
        # key -> called with the captured ir.Model once the capture ends (a module's record of what it captured)
        self.finishers: dict[str, Callable[[ir.Model], None]] = {}
        self._no_grad: dict[int, ir.Value | None] | None = None  # in gc.no_grad: id(value) -> its detached copy
        self.module_path: list[str] = []
        self.seed = seeding.initial_seed() if seed is None else seed  # None: gc.manual_seed's (0 unless set)
        self.rng, self.node_seeds = seeding.streams(self.seed)  # parameters'; random nodes' seed attributes
        self.dim_sources: dict[str, tuple[ir.Value, int]] = {}  # a dim name -> (a graph input, its axis)
        self.values: dict[int, np.ndarray] = {}
        self.consts: dict[int, np.ndarray] = {}
        self._const_cache: dict[tuple, ir.Value] = {}
        self._counters: dict[str, int] = {}
        self._names: set[str] = set()

    @contextlib.contextmanager
    def activated(self):
        """Make this the Builder that DSL ops record into (``current()``) for the block."""
        token = _CURRENT.set((*_CURRENT.get(), self))
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    @contextlib.contextmanager
    def in_module(self, path: str | None):
        """Prefix the names of the nodes emitted in the block with the module's ``path``."""
        if not path:
            yield
            return
        self.module_path.append(path)
        try:
            yield
        finally:
            self.module_path.pop()

    @contextlib.contextmanager
    def subgraph(self, carries: list | None = None, lookups: list | None = None):
        """Record the block's nodes in a new (never eager) scope: a control-flow body (``carries``,
        ``lookups``: ``Scope``'s)."""
        scope = Scope(eager=False, carries=carries, lookups=lookups)
        self.scopes.append(scope)
        try:
            yield scope
        finally:
            self.scopes.pop()

    # -- naming ---------------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        base = base or "v"
        n = self._counters.get(base, 0)
        name = base if n == 0 and base not in self._names else f"{base}_{n}"
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._counters[base] = n + 1
        self._names.add(name)
        return name

    def reserve(self, name: str) -> str:
        if name in self._names:
            raise CaptureError(f"duplicate graph name {name!r}")
        self._names.add(name)
        return name

    def initializer_names(self) -> set[str]:
        return {v.name for v in self.initializers}

    def rename_output(self, value: ir.Value, key: str) -> None:
        """Name ``value`` (a node output) ``key``; an automatic value of that name (``relu``,
        ``add_3``) is renamed, an input's or a parameter's name is refused."""
        if key in self._names and key != value.name:
            self._free_name(key)
        self._names.discard(value.name)
        value.name = self.reserve(key)

    def _free_name(self, name: str) -> None:
        if name in self.initializer_names():
            raise CaptureError(f"output name {name!r} is already a parameter's name; pick another key")
        for node in nested_nodes(self.scopes[0].nodes):
            for v in node.outputs:
                if v.name == name:
                    v.name = self.unique(name)
                    self._names.discard(name)
                    return
        raise CaptureError(f"output name {name!r} is already an input's name; pick another key")

    @property
    def scope(self) -> Scope:
        return self.scopes[-1]

    @property
    def eager(self) -> bool:
        return self.scope.eager

    # -- values ---------------------------------------------------------------------------------
    def new_value(self, name: str, dtype: str, shape: Sequence | None) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(ir.DataType(to_onnx(dtype))),
                        shape=ir_shape(shape))

    def eager_value(self, value: ir.Value) -> np.ndarray | None:
        """``value``'s example value where the current scope is evaluated eagerly, else None."""
        return self.values.get(id(value)) if self.scope.eager else None

    def known(self, value: ir.Value) -> np.ndarray | None:
        """The array of ``value`` where a ``Constant`` node made it (``consts``), else None."""
        return self.consts.get(id(value))

    def add_initializer(self, name: str, array: np.ndarray, exact: bool = True) -> ir.Value:
        """An initializer named ``name`` (``exact=False``: suffixed ``_1``, ... if taken)."""
        name = self.reserve(name) if exact else self.unique(name)
        value = ir.Value(name=name, type=ir.TensorType(ir.DataType(to_onnx(as_dtype(array.dtype)))),
                         shape=ir.Shape(list(array.shape)), const_value=ir.Tensor(array, name=name))
        self.initializers.append(value)
        self.values[id(value)] = array
        return value

    def constant(self, array: np.ndarray) -> ir.Value:
        """A ``Constant`` node's output (not an initializer: constants are not parameters)."""
        array = np.asarray(array)
        key = (self.scope.id, array.dtype.str, array.shape, array.tobytes()) if array.size <= 16 else None
        if key is not None and key in self._const_cache:
            return self._const_cache[key]
        (out,) = self.emit("Constant", [], {"value": ir.Tensor(array)}, name_hint="const")
        self.values[id(out)] = self.consts[id(out)] = array
        if key is not None:
            self._const_cache[key] = out
        return out

    @property
    def gradients_enabled(self) -> bool:
        return self._no_grad is None

    def set_gradients(self, enabled: bool) -> dict[int, ir.Value | None] | None:
        """Turn gradients on or off (``gc.no_grad``, ``gc.set_grad_enabled``); returns the previous state
        for ``restore_gradients``. Off, each float value made while on that a node reads is read through
        a stop-gradient Identity (one per value), so nothing made while off has a gradient; the map of
        those copies survives a block turning them on in between."""
        previous = self._no_grad
        self._no_grad = None if enabled else (previous if previous is not None else {})
        return previous

    def restore_gradients(self, previous: dict[int, ir.Value | None] | None) -> None:
        self._no_grad = previous

    def _detached(self, value: ir.Value | None) -> ir.Value | None:
        """``value`` as a node in a ``gc.no_grad`` block reads it (see ``set_gradients``)."""
        made = self._no_grad  # a value made in the block maps to itself, one made outside to its copy
        if value is None or id(value) in self.consts or value.dtype is None or not value.dtype.is_floating_point():
            return value
        if id(value) in made:
            return made[id(value)]
        out = ir.Value(name=self.unique("no_grad"), type=ir.TensorType(value.dtype),
                       shape=None if value.shape is None else ir.Shape(list(value.shape)))
        node = make_node("Identity", [value], {}, outputs=[out], name=self.unique("Identity"), source=user_source())
        node.metadata_props[STOP_GRADIENT_KEY] = "true"
        self.scope.nodes.append(node)
        if id(value) in self.values:
            self.values[id(out)] = self.values[id(value)]
        made[id(value)], made[id(out)] = out, out
        return out

    # -- emitting nodes -------------------------------------------------------------------------
    def emit(self, op_type: str, inputs: Sequence[ir.Value | None], attrs: dict[str, Any] | None = None,
             num_outputs: int = 1, *, out_types: Sequence[tuple[str, Sequence | None]] | None = None,
             name_hint: str | None = None, source: str | None = None, operands: Sequence[Any] | None = None,
             evaluator: Callable[[list[np.ndarray | None]], list[np.ndarray]] | None = None) -> list[ir.Value]:
        """Record one node on ``inputs``; return its outputs. ``operands`` (the Tensors the
        inputs came from) are what an error message shows."""
        source = source or user_source()
        if self._no_grad is not None:
            inputs = [self._detached(v) for v in inputs]
        attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        operands = inputs if operands is None else operands
        narrow = {v.dtype for v in inputs if v is not None and v.dtype in _NARROW}
        if len(narrow) == 1 and out_types is None and \
                takes_widened(op_type, self.opset, tuple(v and v.dtype for v in inputs), *narrow):
            return self._in_float32(op_type, inputs, attrs, num_outputs, *narrow, name_hint=name_hint, source=source,
                                    operands=operands, evaluator=evaluator)
        prefix = self.module_path[-1] if self.module_path else ""
        node_name = self.unique(f"{prefix}/{op_type}" if prefix else op_type)
        base = name_hint or op_type.lower()
        out_values = [ir.Value(name=self.unique(f"{prefix}.{base}" if prefix else base)) for _ in range(num_outputs)]
        node = make_node(op_type, inputs, attrs, outputs=out_values, name=node_name, source=source)
        types = self._infer(node, operands, source) if out_types is None else \
            [(None if dtype is None else ir.DataType(to_onnx(dtype)), shape) for dtype, shape in out_types]
        for value, (dtype, shape) in zip(out_values, types):
            if dtype is not None:
                value.type = ir.TensorType(dtype)
            value.shape = ir_shape(shape)
        self.scope.nodes.append(node)
        if self._no_grad is not None:
            self._no_grad.update((id(v), v) for v in out_values)
        if self.eager:
            arrays = [None if v is None else self.values.get(id(v)) for v in inputs]
            if all(a is not None for v, a in zip(inputs, arrays) if v is not None):
                results = evaluator(arrays) if evaluator is not None else \
                    self._evaluate(node, arrays, attrs, operands, source)
                for v, r in zip(out_values, results):
                    self.values[id(v)] = r
        return out_values

    def _in_float32(self, op_type: str, inputs: Sequence[ir.Value | None], attrs: dict[str, Any], num_outputs: int,
                    narrow: ir.DataType, **kwargs: Any) -> list[ir.Value]:
        """``emit`` of an op whose schema takes no ``narrow`` float at this opset (Conv, MaxPool, Sin or
        Mish on bfloat16 before opset 22): its ``narrow`` inputs cast to float32 and its float32 outputs
        back, one rounding, as torch's CPU kernels compute them (onnxruntime's CPU provider has no
        bfloat16 kernel for them at any opset)."""
        def cast(v: ir.Value, dtype: ir.DataType) -> ir.Value:
            return self.emit("Cast", [v], {"to": int(dtype)}, source=kwargs["source"])[0]

        wide = [cast(v, ir.DataType.FLOAT) if v is not None and v.dtype == narrow else v for v in inputs]
        outputs = self.emit(op_type, wide, attrs, num_outputs, **kwargs)
        return [cast(v, narrow) if v.dtype == ir.DataType.FLOAT else v for v in outputs]

    def _infer(self, node: ir.Node, operands: Sequence[Any], source: str) -> list[tuple]:
        try:
            return infer(node, self.opset, self.known, fallback=True)
        except InferenceError as exc:
            raise op_error(node.op_type, operands, str(exc), source) from None

    def _evaluate(self, node: ir.Node, arrays: list, attrs: dict, operands: Sequence[Any],
                  source: str) -> list[np.ndarray]:
        try:
            return _eager.run(node.op_type, arrays, attrs, self.opset, node_outputs=len(node.outputs))
        except GraphError:
            raise
        except Exception as exc:
            vals = ", ".join(f"{operand_text(t)}" for t in operands)
            raise CaptureError(f"{node.op_type} failed on example values ({vals}) at {source}: {exc}") from None


def ir_shape(shape: Sequence | None) -> ir.Shape | None:
    """``shape`` (ints, dim names, None) as an ``ir.Shape``, each name a plain ``str`` (never a ``Tensor.shape``
    ``DimName``, whose arithmetic builds nodes: the passes read these shapes)."""
    return None if shape is None else ir.Shape([str(d) if isinstance(d, str) else d for d in shape])


class Outside(Builder):
    """Where DSL ops go outside any capture, as torch's in a module's ``__init__`` (``nn.Parameter(1e-6 *
    gc.ones(dim))``): each node is evaluated and dropped, its outputs' arrays kept while they live. ``np.asarray``
    of such a Tensor is its value; a capture reads one as a constant (``ops.emit``). Random draws: per thread, from
    ``gc.manual_seed``'s seed (0 unless set)."""

    def __init__(self) -> None:
        super().__init__(21, training=False, eager=True)

    def emit(self, *args: Any, **kwargs: Any) -> list[ir.Value]:
        outs = super().emit(*args, **kwargs)
        if len(self.scopes) == 1:  # a control-flow body's nodes make its graph
            self.scope.nodes.clear()
        for value in outs:
            value.meta[_OUTSIDE_KEY] = True
            weakref.finalize(value, lambda key, kept=(self.values, self.consts): [d.pop(key, None) for d in kept],
                             id(value))
        return outs


def nested_nodes(node_list):
    """``node_list`` and the nodes of their subgraphs, depth first."""
    for node in node_list:
        yield node
        for attr in node.attributes.values():
            if isinstance(attr.value, ir.Graph):
                yield from nested_nodes(attr.value)


def op_error(op: str, operands: Sequence[Any], msg: str, source: str) -> CaptureError:
    """The one CaptureError template: op, operand types, what is wrong, user's line."""
    parts = [operand_text(t) for t in operands]
    vals = [f"{operand_text(t)}={_short(t.eager_value)}" for t in operands  # a Tensor's (a ComplexTensor has none)
            if hasattr(type(t), "eager_value") and t.eager_value is not None]
    extra = f"; values {', '.join(vals)}" if vals else ""
    return CaptureError(f"{op}({', '.join(parts)}): {msg} at {source}{extra}")


def _short(array: np.ndarray) -> str:
    return np.array2string(np.asarray(array), threshold=6, edgeitems=2, precision=4).replace("\n", "")


__all__ = ["Builder", "Outside", "Scope", "active", "current", "made_outside", "nested_nodes", "operand_text", "op_error", "type_str",
           "user_source"]
