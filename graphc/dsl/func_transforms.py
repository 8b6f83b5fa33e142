"""torch.func's transforms inside a capture: ``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``,
``jacfwd``, ``hessian`` (``gc.func.*``).

``func`` is traced into the graph being built, on an ``Identity`` copy of each input differentiated;
the gradient nodes are made by the autodiff pass's rules (``graphc.passes.autodiff.backprop``) from the
traced nodes and join the graph after them, evaluated eagerly where the capture is. So the transforms
nest (``grad(grad(f))`` differentiates the gradient nodes as any others) and compose with ``gc.vmap``
(``vmap(grad(f))``: per-sample gradients). Forward mode is the double vjp, no forward-mode pass:
``J t = d/du <J^T u, t>`` (``jvp``); ``jacrev`` maps a ``vjp`` over the output's basis with ``gc.vmap``,
``jacfwd`` a ``jvp`` over the input's basis.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl import control, ops
from graphc.dsl.builder import Builder, Scope, current, user_source
from graphc.dsl.tensor import Tensor
from graphc.dsl.trees import leaves, rebuild
from graphc.dsl.vmap import vmap
from graphc.errors import CaptureError, GraphError, InferenceError
from graphc.model.dtypes import FLOAT_DTYPES
from graphc.passes.infer import infer
from graphc.passes.values import subgraphs

__all__ = ["grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "vjp"]


# -- trees of Tensors ---------------------------------------------------------------------------


def _tensor_leaves(api: str, what: str, tree: Any, source: str) -> list[Tensor]:
    """The leaves of ``tree``, each a Tensor (numpy arrays lifted), or ``CaptureError`` naming the leaf."""
    out = []
    for path, leaf in leaves(tree):
        if isinstance(leaf, np.ndarray):
            leaf = ops.lift(leaf)
        if not isinstance(leaf, Tensor):
            raise CaptureError(f"{api}: {what}{path} is a {type(leaf).__name__}; expected a Tensor (or a tuple, "
                               f"list or dict of Tensors) (at {source})")
        out.append(leaf)
    return out


# -- the linearization: func traced, its gradient nodes made on demand ---------------------------------


class _Traced:
    """``func`` traced on copies of the inputs it is differentiated by: the nodes it emitted (in
    ``scope``), those copies (``wrt``) and an ``Identity`` copy of each output leaf (``outputs``), which
    the caller gets: a rule that rewrites a traced node (an LSTM unrolled, a MaxPool given its Indices)
    moves the copy's input with it."""

    def __init__(self, api: str, builder: Builder, scope: Scope, nodes: list[ir.Node], wrt: list[Tensor],
                 outputs: list[Tensor], source: str, copied: bool = True):
        self.api, self.builder, self.scope, self.nodes = api, builder, scope, nodes
        self.wrt, self.outputs, self.source, self.copied = wrt, outputs, source, copied
        self.unused: list[int] = []  # the ``wrt`` indices the last ``backward`` found no path to

    def backward(self, cotangents: list[Tensor]) -> list[Tensor]:
        """The gradient of ``sum(<output, cotangent>)`` by each ``wrt`` value (zeros where no path
        reaches it: ``unused`` lists those), emitted in the current scope."""
        from graphc.dsl.autograd import backwards
        from graphc.passes.autodiff import backprop
        from graphc.passes.autodiff.builder import GradBuilder
        from graphc.passes.autodiff.recurrent import UNROLLED, unroll_recurrent
        from graphc.passes.training.recompute import recompute

        builder = self.builder
        before = None if self.copied else [(node, list(node.inputs)) for node in self.nodes]
        graph = ir.Graph([], [], nodes=self.nodes, opset_imports={"": builder.opset}, name="func_transform")
        if any(node.op_type in UNROLLED for node in self.nodes):  # as gc.grad does: no LSTM rule
            unroll_recurrent(ir.Model(graph, ir_version=10))
            kept = {id(n) for n in self.nodes}
            for node in graph:
                if id(node) not in kept:
                    self._typed_with_bodies(node)
        count = len(graph)
        seeds: dict[int, tuple[ir.Value, Tensor]] = {}
        for out, ct in zip(self.outputs, cotangents):
            value = out.value.producer().inputs[0] if self.copied else out.value
            if out.dtype in FLOAT_DTYPES:
                seeds[id(value)] = (value, seeds[id(value)][1] + ct if id(value) in seeds else ct)
        g = GradBuilder(graph, builder.opset)
        wrt = [t.value for t in self.wrt]
        try:
            grads = backprop(g, list(graph), {v: ct.value for v, ct in seeds.values()}, wrt, backwards(builder))
            self.unused = [i for i, w in enumerate(wrt) if w not in grads]
            results = [grads[w] if w in grads else g.zeros_like(w) for w in wrt]
        except GraphError as exc:
            graph.remove(list(graph))
            raise type(exc)(f"{self.api} (called at {self.source}): {exc}") from None
        made = list(graph)
        recompute(graph, {node.name for node in made[:count]}, builder.opset, everywhere=False)  # regions' copies
        made = list(graph)
        graph.remove(made)
        self._replace(made[:count], before)
        for node in made[count:]:
            self._fill_types(node)
            self._claim_names(node)
            builder.scope.nodes.append(node)
            _evaluate(builder, node, builder.eager)
        return [Tensor(v, builder.eager_value(v)) for v in results]

    def _replace(self, forward: list[ir.Node], before: list[tuple[ir.Node, list]] | None) -> None:
        """The traced nodes as the autodiff pass left them, in their place in the scope. ``before``
        (each traced node with its inputs; for values the user computed, which their Tensors hold): a
        node the pass replaced comes back after them, so those Tensors stay valid: an Identity of the copy
        given more outputs (MaxPool's Indices, Dropout's mask), else the node again on its inputs."""
        if [id(n) for n in forward] == [id(n) for n in self.nodes]:
            return
        kept = {id(n) for n in self.nodes}
        copies = {n.name: n for n in forward if id(n) not in kept}  # with_outputs' copy keeps the name
        at = self.scope.nodes.index(self.nodes[0])
        self.scope.nodes[at:at + len(self.nodes)] = forward
        self.nodes = forward
        for node in forward:
            if id(node) not in kept:
                self._fill_types(node)  # a MaxPool given its Indices: int64, which the gradient nodes read
                self._claim_names(node)
                _evaluate(self.builder, node, self.scope.eager)
        present = {id(n) for n in forward}
        restored = [(node, inputs) for node, inputs in before or [] if id(node) not in present]
        for node, inputs in restored:
            twin = copies.get(node.name)
            if twin is not None and twin.op_type == node.op_type and len(node.outputs) == 1:  # given more outputs (a Dropout its mask): read its output, one draw
                node.op_type, node.domain = "Identity", ""
                node.attributes.clear()
                node.resize_inputs(1)
                inputs = [twin.outputs[0]]
            for i, value in enumerate(inputs):
                node.replace_input_with(i, value)
            for value in node.outputs:
                value.name = value.name or node.op_type
            self._claim_names(node)
        self.scope.nodes[at + len(forward):at + len(forward)] = [node for node, _ in restored]

    def _fill_types(self, node: ir.Node) -> None:
        """Dtypes and shapes the pass left unknown, which a later transform of these nodes (a vmap, a
        grad of them) reads; left unknown where inference cannot tell."""
        if any(v.type is None or v.shape is None for v in node.outputs):
            with contextlib.suppress(InferenceError):
                self._typed(node)

    def _typed_with_bodies(self, node: ir.Node) -> None:
        """``_typed`` of ``node`` after the nodes of its subgraphs, in order: the Scan of an LSTM of more than
        ``MAX_UNROLLED_LSTM_STEPS`` steps, whose body's ranks its gradient rule reads."""
        for body in subgraphs(node):
            for inner in body:
                self._typed_with_bodies(inner)
        self._typed(node)

    def _typed(self, node: ir.Node) -> None:
        """Dtypes and shapes of a node the pass made as the DSL infers them (onnx's inference as the
        fallback), which the gradient rules read; its constant known to later inference."""
        builder = self.builder
        if node.op_type == "Constant":
            builder.consts[id(node.outputs[0])] = node.attributes["value"].value.numpy()
        types = infer(node, builder.opset, builder.known, fallback=True)
        for v, (dtype, shape) in zip(node.outputs, types):
            if v.type is None and dtype is not None:
                v.type = ir.TensorType(dtype)
            if v.shape is None and shape is not None:
                v.shape = ir.Shape(list(shape))

    def _claim_names(self, node: ir.Node) -> None:
        """Names the pass gave ``node`` and its outputs, made unique in the capture; a constant known to
        the DSL's inference."""
        if node.op_type == "Constant":
            self.builder.consts[id(node.outputs[0])] = node.attributes["value"].value.numpy()
        node.name = self.builder.unique(node.name or node.op_type)
        for v in node.outputs:
            v.name = self.builder.unique(v.name or "grad")


def _evaluate(builder: Builder, node: ir.Node, eager_scope: bool) -> None:
    """Record ``node``'s example outputs where its scope is evaluated eagerly and its inputs have values."""
    if eager_scope:
        control.record(builder, node)


def _argnums(api: str, argnums: Any, count: int, source: str) -> tuple[int, ...]:
    nums = argnums if isinstance(argnums, tuple) else (argnums,)
    if not nums or any(isinstance(n, bool) or not isinstance(n, int) for n in nums):
        raise CaptureError(f"{api}: argnums must be an int or a non-empty tuple of ints, got {argnums!r} "
                           f"(at {source})")
    if any(not -count <= n < count for n in nums):
        raise CaptureError(f"{api}: argnums {argnums!r} is out of range for the {count} positional argument(s) "
                           f"func was given (at {source})")
    nums = tuple(n % count for n in nums)
    if len(set(nums)) != len(nums):
        raise CaptureError(f"{api}: argnums {argnums!r} names an argument twice (at {source})")
    return nums


def _trace(api: str, func: Callable, args: tuple, diff: tuple[int, ...], has_aux: bool, source: str,
           kwargs: dict | None = None) -> tuple[_Traced, Any, Any]:
    """``func(*args)`` traced with the arguments at ``diff`` differentiated; (traced, output, aux)."""
    builder = current()
    args = list(args)
    wrt: list[Tensor] = []
    for i in diff:
        tensors = _tensor_leaves(api, f"argument {i}", args[i], source)
        for (path, _), leaf in zip(leaves(args[i]), tensors):
            if leaf.dtype not in FLOAT_DTYPES:
                raise CaptureError(f"{api}: argument {i}{path} is {leaf.type_str()}; only floating-point Tensors "
                                   f"can be differentiated (at {source})")
        copies = [ops.emit("Identity", [leaf], source=source) for leaf in tensors]
        wrt += copies
        args[i] = rebuild(args[i], iter(copies))
    scope = builder.scope
    start = len(scope.nodes)
    result = func(*args, **(kwargs or {}))
    aux = None
    if has_aux:
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CaptureError(f"{api}(func, has_aux=True): func must return a tuple (output, aux), got "
                               f"{type(result).__name__} (at {source})")
        result, aux = result
    nodes = list(scope.nodes[start:])
    outputs = [ops.emit("Identity", [t], source=source) for t in _tensor_leaves(api, "func's output", result, source)]
    aux = rebuild(aux, iter(ops.emit("Identity", [t], source=source) if isinstance(t, Tensor) else t
                             for _, t in leaves(aux)))
    return _Traced(api, builder, scope, nodes, wrt, outputs, source), rebuild(result, iter(outputs)), aux


def traced_between(api: str, outputs: list[Tensor], inputs: list[Tensor], source: str) -> _Traced:
    """The nodes of the current scope that may lie between ``inputs`` and ``outputs`` (already computed),
    ready to be differentiated (``backward``) as a traced ``func`` is; ``CaptureError`` for an output made
    in an enclosing scope (a body's ``gc.autograd.grad`` of a value computed outside it)."""
    builder = current()
    scope = builder.scope
    index = {id(node): i for i, node in enumerate(scope.nodes)}
    ends = []
    for k, out in enumerate(outputs):
        producer = out.value.producer()
        if producer is not None and id(producer) not in index and not any(out.value is t.value for t in inputs):
            raise CaptureError(f"{api}: output {k} ({out.type_str()}) was computed outside the body (gc.vmap, "
                               f"gc.cond, gc.scan, ...) this is called in; call it where the output is computed "
                               f"(at {source})")
        ends.append(index.get(id(producer), -1) + 1)
    starts = [index.get(id(t.value.producer()), -1) + 1 for t in inputs]
    start = min(starts)
    nodes = list(scope.nodes[start:max([start, *ends])])
    return _Traced(api, builder, scope, nodes, inputs, outputs, source, copied=False)


def _split(grads: list[Tensor], args: tuple, diff: tuple[int, ...]) -> list[Any]:
    """The flat gradients as one tree per differentiated argument."""
    flat = iter(grads)
    return [rebuild(args[i], flat) for i in diff]


# -- public ---------------------------------------------------------------------------------------


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """torch.func's ``vjp``: ``(output, vjp_fn)`` (``(output, vjp_fn, aux)`` with ``has_aux``), where
    ``vjp_fn(cotangents)`` (a tree like ``output``) returns a tuple with the vector-Jacobian product for
    each primal (a tree like it). Inside ``gc.capture`` only."""
    source = user_source()
    traced, output, aux = _trace("gc.func.vjp", func, primals, tuple(range(len(primals))), has_aux, source)

    def vjp_fn(cotangents: Any) -> tuple:
        where = user_source()
        cts = _tensor_leaves("gc.func.vjp's vjp_fn", "cotangents", cotangents, where)
        if len(cts) != len(traced.outputs):
            raise CaptureError(f"gc.func.vjp's vjp_fn: cotangents have {len(cts)} Tensor(s), the output has "
                               f"{len(traced.outputs)} (at {where})")
        for k, (out, ct) in enumerate(zip(traced.outputs, cts)):
            if ct.dtype != out.dtype or (ct.shape is not None and out.shape is not None and ct.shape != out.shape):
                raise CaptureError(f"gc.func.vjp's vjp_fn: cotangent {k} is {ct.type_str()}; expected "
                                   f"{out.type_str()}, the output's (at {where})")
        return tuple(_split(traced.backward(cts), primals, tuple(range(len(primals)))))

    return (output, vjp_fn, aux) if has_aux else (output, vjp_fn)


def grad_and_value(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """torch.func's ``grad_and_value``: a function returning ``(gradient, output)`` (``(gradient, (output,
    aux))`` with ``has_aux``) of ``func``, whose output must be a scalar Tensor; the gradient is by the
    argument ``argnums`` names (an int: a tree like it; a tuple: a tuple of them)."""
    return _gradient("grad_and_value", func, argnums, has_aux)


def grad(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """torch.func's ``grad``: the gradient of ``func`` (a scalar Tensor output) by the argument(s)
    ``argnums`` names; ``(gradient, aux)`` with ``has_aux``."""
    return _gradient("grad", func, argnums, has_aux)


def _gradient(name: str, func: Callable, argnums: Any, has_aux: bool) -> Callable:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        source = user_source()
        api = f"gc.func.{name}(f)(*args)"
        diff = _argnums(api, argnums, len(args), source)
        traced, output, aux = _trace(api, func, args, diff, has_aux, source, kwargs)
        if not isinstance(output, Tensor):
            raise CaptureError(f"{api}: Expected f(*args) to return a Tensor, got {type(output).__name__} "
                               f"(at {source})")
        if output.shape is None or len(output.shape) != 0:
            dims = "an unknown number of" if output.shape is None else len(output.shape)
            raise CaptureError(f"{api}: Expected f(*args) to return a scalar Tensor, got tensor with {dims} dims "
                               f"({output.type_str()}). Maybe you wanted to use the vjp or jacrev APIs instead? "
                               f"(at {source})")
        if output.dtype not in FLOAT_DTYPES:
            raise CaptureError(f"{api}: f(*args) returned {output.type_str()}; only a floating-point output has "
                               f"a gradient (at {source})")
        grads = _split(traced.backward([ops.scalar(1.0, output)]), args, diff)
        result = grads[0] if isinstance(argnums, int) else tuple(grads)
        if name == "grad":
            return (result, aux) if has_aux else result
        return result, ((output, aux) if has_aux else output)

    return wrapper


def jvp(func: Callable, primals: Any, tangents: Any, has_aux: bool = False) -> tuple:
    """torch.func's ``jvp``: ``(func(*primals), J @ tangents)`` (and ``aux`` with ``has_aux``); ``primals``
    and ``tangents`` are tuples of trees alike. Computed as the double vjp (a vjp of the vjp by its
    cotangent), no forward-mode pass."""
    source = user_source()
    api = "gc.func.jvp"
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise CaptureError(f"{api}: primals and tangents must be tuples, got {type(primals).__name__} and "
                           f"{type(tangents).__name__} (at {source})")
    flat_p = _tensor_leaves(api, "primals", primals, source)
    flat_t = _tensor_leaves(api, "tangents", tangents, source)
    if len(flat_p) != len(flat_t):
        raise CaptureError(f"{api}: tangents have {len(flat_t)} Tensor(s), primals {len(flat_p)} (at {source})")
    for k, (p, t) in enumerate(zip(flat_p, flat_t)):
        if p.dtype != t.dtype or (p.shape is not None and t.shape is not None and p.shape != t.shape):
            raise CaptureError(f"{api}: tangent {k} is {t.type_str()}; expected {p.type_str()}, the primal's "
                               f"(at {source})")
    traced, output, aux = _trace(api, func, primals, tuple(range(len(primals))), has_aux, source)
    zeros = [ops.constant(np.zeros(out.shape, out.dtype.numpy))
             if out.shape is not None and all(isinstance(d, int) for d in out.shape) else out * 0
             for out in traced.outputs]
    linear, _, _ = _trace(api, lambda *u: traced.backward(list(u)), tuple(zeros), tuple(range(len(zeros))),
                          False, source)
    products = linear.backward(flat_t)
    tangent_out = rebuild(output, iter(products))
    return (output, tangent_out, aux) if has_aux else (output, tangent_out)


def _static(api: str, what: str, t: Tensor, source: str) -> tuple[int, ...]:
    if t.shape is None or not all(isinstance(d, int) for d in t.shape):
        raise CaptureError(f"{api}: {what} is {t.type_str()}; a Jacobian needs static dims (at {source})")
    return tuple(t.shape)


def jacrev(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """torch.func's ``jacrev``: the Jacobian of ``func`` by the argument(s) ``argnums`` names, one
    ``vjp`` mapped over the basis of each output with ``gc.vmap``. Each Jacobian has the output's dims then
    the input's; for a tree of outputs, a tree of them; for a tuple ``argnums``, a tuple per output."""
    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        source = user_source()
        api = "gc.func.jacrev(f)(*args)"
        diff = _argnums(api, argnums, len(args), source)
        traced, output, aux = _trace(api, func, args, diff, has_aux, source)
        outs = traced.outputs
        shapes = [_static(api, f"output {k}", out, source) for k, out in enumerate(outs)]
        ins = [_static(api, "a differentiated input", w, source) for w in traced.wrt]
        jacobians = []
        for k, (out, shape) in enumerate(zip(outs, shapes)):
            size = math.prod(shape)
            basis = ops.constant(np.eye(size, dtype=out.dtype.numpy).reshape(size, *shape))

            def row(e: Tensor, k: int = k) -> list[Tensor]:
                return traced.backward([e if j == k else ops.constant(np.zeros(s, o.dtype.numpy))
                                        for j, (o, s) in enumerate(zip(outs, shapes))])

            rows = vmap(row)(basis)
            per_input = [ops.reshape(r, [*shape, *s]) for r, s in zip(rows, ins)]
            grads = _split(per_input, args, diff)
            jacobians.append(grads[0] if isinstance(argnums, int) else tuple(grads))
        result = rebuild(output, iter(jacobians))
        return (result, aux) if has_aux else result

    return wrapper


def jacfwd(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """torch.func's ``jacfwd``: the Jacobian of ``func`` by the argument(s) ``argnums`` names, one ``jvp``
    mapped over the basis of each input with ``gc.vmap``; laid out as ``jacrev``'s. With ``has_aux``, the
    aux comes from one more call of ``func``."""
    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        source = user_source()
        api = "gc.func.jacfwd(f)(*args)"
        diff = _argnums(api, argnums, len(args), source)
        primals = tuple(args[i] for i in diff)
        tensors = _tensor_leaves(api, "a differentiated argument", primals, source)
        shapes = [_static(api, f"argument {i}{path}", leaf, source)
                  for i in diff for (path, _), leaf in zip(leaves(args[i]), _tensor_leaves(api, "", args[i], source))]

        def f(*diffed: Any) -> Any:
            full = list(args)
            for i, value in zip(diff, diffed):
                full[i] = value
            return func(*full)

        columns, mapped = [], None  # per input leaf: each output leaf's Jacobian, [*out, *in]
        for k, (leaf, shape) in enumerate(zip(tensors, shapes)):
            size = math.prod(shape)
            basis = ops.constant(np.eye(size, dtype=leaf.dtype.numpy).reshape(size, *shape))

            def column(e: Tensor, k: int = k) -> Any:
                tangents = [e if j == k else ops.constant(np.zeros(s, x.dtype.numpy))
                            for j, (x, s) in enumerate(zip(tensors, shapes))]
                return jvp(f, primals, rebuild(primals, iter(tangents)), has_aux=has_aux)[1]

            mapped = vmap(column)(basis)
            columns.append([ops.emit("Reshape", [ops.transpose(t, [*range(1, t.ndim), 0]),  # 0: the dim kept
                                                 ops.const_i64([0] * (t.ndim - 1) + list(shape))])
                            for t in _tensor_leaves(api, "func's output", mapped, source)])
        per_output = []
        for o in range(len(columns[0])):
            grads = _split([col[o] for col in columns], args, diff)
            per_output.append(grads[0] if isinstance(argnums, int) else tuple(grads))
        result = rebuild(mapped, iter(per_output))
        return (result, func(*args)[1]) if has_aux else result

    return wrapper


def hessian(func: Callable, argnums: Any = 0) -> Callable:
    """torch.func's ``hessian``: ``jacfwd(jacrev(func, argnums), argnums)``."""
    return jacfwd(jacrev(func, argnums), argnums)

