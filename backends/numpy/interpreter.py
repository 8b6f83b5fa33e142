"""Plan a graph once, run it many times.

``Plan`` does all the per-model work at prepare time: initializers become arrays once, nodes
are put in a stable topological order, each node's kernel is looked up for its opset and its
attributes decoded (subgraph attributes become ``Plan``s themselves), and for every set of
requested outputs a schedule is cached that runs only the nodes those outputs need and drops
each intermediate right after its last use. A run is then one tight loop over tuples.
"""

from __future__ import annotations

import heapq
from typing import Any
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from graphc.backends.cancel import CancelToken
from graphc.backends.numpy import sizes
from graphc.backends.numpy.kernels import lookup, missing, normalize_domain
from graphc.errors import BackendError, GraphcError, GraphError, InputError, MissingKernel
from graphc.model import node_source
from graphc.passes.values import exact_attributes


class Context:
    """What a context kernel (control flow, random ops) sees: the seeded RNG, the values of
    the graph that is running (a subgraph reads outer-scope values from ``scope``), the run's
    ``CancelToken`` (None: the run cannot be cancelled) and its ``max_tensor_bytes`` (None: no
    bound), which its subgraphs apply too."""

    __slots__ = ("rng", "scope", "cancel", "max_tensor_bytes")

    def __init__(self, rng: np.random.Generator, scope: Mapping[str, np.ndarray] | None = None,
                 cancel: CancelToken | None = None, max_tensor_bytes: int | None = None):
        self.rng = rng
        self.scope = scope if scope is not None else {}
        self.cancel = cancel
        self.max_tensor_bytes = max_tensor_bytes


def decode_attribute(attr: onnx.AttributeProto, opsets: dict[str, int], functions: dict | None = None):
    """An attribute as a plain Python value; graphs become ``Plan``s."""
    kind = attr.type
    A = onnx.AttributeProto
    if kind == A.GRAPH:
        return Plan(attr.g, opsets, subgraph=True, functions=functions)
    if kind == A.GRAPHS:
        return [Plan(g, opsets, subgraph=True, functions=functions) for g in attr.graphs]
    if kind == A.TENSOR:
        return numpy_helper.to_array(attr.t)
    if kind == A.TENSORS:
        return [numpy_helper.to_array(t) for t in attr.tensors]
    if kind == A.SPARSE_TENSOR:
        return _dense(attr.sparse_tensor)
    if kind == A.STRING:
        return attr.s.decode("utf-8")
    if kind == A.STRINGS:
        return [s.decode("utf-8") for s in attr.strings]
    value = onnx.helper.get_attribute_value(attr)
    return list(value) if isinstance(value, Sequence) else value


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    out = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:
        out.reshape(-1)[indices] = values
    else:
        out[tuple(indices.T)] = values
    return out


def _value_dtype(value: onnx.ValueInfoProto) -> np.dtype | None:
    elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
    return onnx.helper.tensor_dtype_to_np_dtype(elem) if elem else None


def _value_dims(value: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """A tensor's static dims, 0 for those not known (as onnxruntime sizes a Loop's scan output of
    no iterations); None for an unknown rank."""
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim)


def _label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


class Step:
    """One planned node: its kernel, decoded attributes and value names."""

    __slots__ = ("node", "label", "op", "fn", "context", "inputs", "outputs", "attrs", "uses", "size")

    def __init__(self, node: onnx.NodeProto, index: int, opsets: dict[str, int], functions: dict):
        self.node = node
        self.label = _label(node, index)
        domain = normalize_domain(node.domain)
        self.op = node.op_type if not domain else f"{domain}::{node.op_type}"
        # what the node would allocate, where its inputs' values size it (None: their shapes do)
        self.size = sizes.SIZES.get(node.op_type) if not domain else None
        if domain not in opsets:
            raise GraphError(f"node {self.label!r} ({node.op_type}) uses domain {domain or 'ai.onnx'!r}, "
                             "which the model does not import")
        found = lookup(node.op_type, opsets[domain], domain)
        if found is None and (domain, node.op_type) in functions:
            self._call_function(functions[domain, node.op_type], opsets, functions)
            return
        if found is None:
            raise missing(node.op_type, opsets[domain], domain, self.label, _where(node))
        names = [a.name for a in node.attribute]
        unknown = found.check_attributes(names)
        if unknown:
            raise MissingKernel(f"the numpy kernel of {node.op_type!r} (node {self.label!r}) does not "
                                f"support attribute(s) {', '.join(unknown)}" + _where(node))
        self.fn, self.context = found.fn, found.context
        # doubles float32 attributes round, from the node's metadata
        self.attrs = exact_attributes(node, {a.name: decode_attribute(a, opsets, functions) for a in node.attribute})
        if found.attributes is not None and "_outputs" in found.attributes:
            # outputs asked for: up to the last named one (an empty name skips a position)
            self.attrs["_outputs"] = max((i + 1 for i, o in enumerate(node.output) if o), default=0)
        self.inputs = tuple(node.input)
        self.outputs = tuple(node.output)
        outer = set()
        for value in self.attrs.values():
            for plan in value if isinstance(value, list) else [value]:
                if isinstance(plan, Plan):
                    outer |= plan.free_names
        self.uses = tuple(n for n in self.inputs if n) + tuple(sorted(outer - set(self.inputs)))

    def _call_function(self, function: onnx.FunctionProto, opsets: dict[str, int], functions: dict) -> None:
        """A call of a model-local function: its body, with the call's attributes bound, runs
        as a plan of its own (function bodies see no outer scope)."""
        body_opsets = {**opsets, **{normalize_domain(o.domain): o.version for o in function.opset_import}}
        plan = Plan(_function_body(function, self.node), body_opsets, functions=functions)
        self.fn = lambda ctx, *args: tuple(plan.call(Context(ctx.rng, cancel=ctx.cancel,
                                                             max_tensor_bytes=ctx.max_tensor_bytes), args))
        self.context, self.attrs = True, {}
        self.inputs, self.outputs = tuple(self.node.input), tuple(self.node.output)
        self.uses = tuple(n for n in self.inputs if n)

    def fail(self, exc: Exception, args: Sequence[Any] = (), output: Any = None) -> BackendError:
        """The error naming this node, its op, source line and the shapes involved: the inputs'
        (``args``) when the kernel failed, the result's when handing out ``output`` did."""
        if output is not None:
            shapes = f" (its output {_describe(output)} is too large to hand out)"
        else:
            shapes = f" on inputs ({', '.join(_describe(a) for a in args)})" if args else ""
        return BackendError(f"node {self.label!r} ({self.op}) failed{_where(self.node)}{shapes}: "
                            f"{type(exc).__name__}: {exc}")


def _function_body(function: onnx.FunctionProto, call: onnx.NodeProto) -> onnx.GraphProto:
    """The function's nodes as a graph, attribute references replaced by the call's values
    (or the function's defaults; an unset reference drops the attribute)."""
    given = {a.name: a for a in call.attribute}
    given.update({a.name: a for a in function.attribute_proto if a.name not in given})
    nodes = []
    for node in function.node:
        bound = onnx.NodeProto()
        bound.CopyFrom(node)
        del bound.attribute[:]
        for attr in node.attribute:
            if not attr.ref_attr_name:
                bound.attribute.append(attr)
            elif attr.ref_attr_name in given:
                value = onnx.AttributeProto()
                value.CopyFrom(given[attr.ref_attr_name])
                value.name = attr.name
                bound.attribute.append(value)
        nodes.append(bound)
    inputs = [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in function.input]
    outputs = [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in function.output]
    return onnx.helper.make_graph(nodes, function.name, inputs, outputs)


def _describe(value: Any) -> str:
    """``float32[100000,10000000]`` for an array, the type name for anything else."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}[{','.join(map(str, value.shape))}]"
    return "none" if value is None else type(value).__name__


def _where(node: onnx.NodeProto) -> str:
    source = node_source(node)
    return f" at {source}" if source else ""


class Plan:
    """A graph compiled for the numpy kernels."""

    def __init__(self, graph: onnx.GraphProto, opsets: dict[str, int], subgraph: bool = False,
                 functions: dict[tuple[str, str], onnx.FunctionProto] | None = None):
        """``functions``: the model's local functions by (domain, name); a node calling one
        runs its body."""
        functions = functions or {}
        self.name = graph.name
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for sparse in graph.sparse_initializer:
            self.consts[sparse.values.name] = _dense(sparse)
        self.input_names = [v.name for v in graph.input]
        self.output_names = [v.name for v in graph.output]
        self.output_dtypes = [_value_dtype(v) for v in graph.output]
        self.output_dims = [_value_dims(v) for v in graph.output]
        self.required = frozenset(n for n in self.input_names if n not in self.consts)
        steps = [Step(node, i, opsets, functions) for i, node in enumerate(graph.node)]
        defined = set(self.consts) | set(self.input_names)
        self.steps = _toposort(steps, defined, subgraph)
        produced = defined | {o for s in self.steps for o in s.outputs}
        used = {n for s in self.steps for n in s.uses} | set(self.output_names)
        self.free_names = frozenset(used - produced)  # outer-scope values a subgraph reads
        self._schedules: dict[tuple[str, ...], list[tuple]] = {}

    # -- scheduling ---------------------------------------------------------------------------
    def producer(self, name: str) -> Step | None:
        """The step whose output ``name`` is (``None`` for inputs and initializers)."""
        return next((step for step in self.steps if name in step.outputs), None)

    def schedule(self, wanted: tuple[str, ...]) -> list[tuple]:
        cached = self._schedules.get(wanted)
        if cached is None:
            cached = self._schedules[wanted] = self._build_schedule(wanted)
        return cached

    def _build_schedule(self, wanted: tuple[str, ...]) -> list[tuple]:
        known = set(self.consts) | set(self.input_names) | set(self.free_names)
        known |= {o for s in self.steps for o in s.outputs if o}
        missing = [n for n in wanted if n not in known]
        if missing:
            raise GraphError(f"unknown value name(s) {missing}: not a graph input, initializer or "
                             "node output of this model")
        needed, kept = set(wanted), []
        for step in reversed(self.steps):
            if any(o in needed for o in step.outputs):
                kept.append(step)
                needed.update(step.uses)
        kept.reverse()
        last_use: dict[str, int] = {}
        for i, step in enumerate(kept):
            for name in step.uses:
                last_use[name] = i
            for name in step.outputs:
                last_use.setdefault(name, i)  # produced but never read: drop at once
        frees: list[list[str]] = [[] for _ in kept]
        keep = set(wanted) | set(self.free_names)
        for name, i in last_use.items():
            if name and name not in keep:
                frees[i].append(name)
        return [(s.fn, s.context, s.inputs, s.outputs, s.attrs, tuple(f), s)
                for s, f in zip(kept, frees)]

    # -- running ------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray], wanted: Sequence[str], rng: np.random.Generator,
            scope: Mapping[str, np.ndarray] | None = None, cancel: CancelToken | None = None,
            max_tensor_bytes: int | None = None) -> dict[str, np.ndarray]:
        """The ``wanted`` values; ``cancel`` is checked here and before each node (a cancelled
        token raises ``RunCancelled``); a node whose inputs' values size its output (``sizes``)
        that would allocate more than ``max_tensor_bytes`` raises ``TensorTooLarge`` before it runs."""
        wanted = tuple(wanted)
        schedule = self.schedule(wanted)
        if cancel is not None:  # here too: a subgraph of no nodes (a Loop's body) still stops
            cancel.check(f"before graph {self.name!r}")
        if scope is not None and self.free_names:
            env = {n: scope[n] for n in self.free_names if n in scope}
            env.update(self.consts)
        else:
            env = dict(self.consts)
        env.update(feeds)
        for fn, context, ins, outs, attrs, frees, step in schedule:
            if cancel is not None and cancel.cancelled:
                cancel.check(f"before node {step.label!r} ({step.op})")
            try:
                args = [env[n] if n else None for n in ins]
                if max_tensor_bytes is not None and step.size is not None:
                    sizes.check(step.size, f"node {step.label!r}", step.op, args, attrs, max_tensor_bytes)
                if context:
                    res = fn(Context(rng, env, cancel, max_tensor_bytes), *args, **attrs)
                else:
                    res = fn(*args, **attrs)
            except GraphcError:
                raise
            except KeyError as exc:
                raise step.fail(KeyError(f"value {exc.args[0]!r} is not available")) from exc
            except Exception as exc:  # MemoryError and ValueError from kernels included
                raise step.fail(exc, args) from None
            for name, value in zip(outs, res):
                if name:  # numpy returns scalars for 0-d results; sequences stay lists
                    env[name] = np.asarray(value) if isinstance(value, np.generic) else value
            for name in frees:
                del env[name]
        return {n: env[n] for n in wanted}

    def call(self, ctx: Context, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run as a subgraph: inputs bound by position, outputs returned in order."""
        feeds = {n: a for n, a in zip(self.input_names, args)}
        out = self.run(feeds, self.output_names, ctx.rng, ctx.scope, ctx.cancel, ctx.max_tensor_bytes)
        return [out[n] for n in self.output_names]

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> None:
        if not self.required.issubset(feeds.keys()):
            missing = sorted(self.required - feeds.keys())
            raise InputError(f"missing input(s) {', '.join(missing)}")


def _toposort(steps: list[Step], defined: set[str], subgraph: bool) -> list[Step]:
    """Stable topological order (Kahn's algorithm with the original index as priority)."""
    producer = {}
    for i, step in enumerate(steps):
        for name in step.outputs:
            if name:
                producer[name] = i
    waiting = [0] * len(steps)
    consumers: list[list[int]] = [[] for _ in steps]
    for i, step in enumerate(steps):
        for name in set(step.uses):
            if name in producer and name not in defined:
                waiting[i] += 1
                consumers[producer[name]].append(i)
            elif name not in defined and not subgraph:
                raise GraphError(f"input {name!r} of node {step.label!r} ({step.op}) is not a graph "
                                 "input, an initializer or the output of any node" + _where(step.node))
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(steps[i])
        for j in consumers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(steps):
        stuck = [s.label for s in steps if s not in order][:5]
        raise GraphError(f"the graph has a cycle through node(s) {stuck}")
    return order
