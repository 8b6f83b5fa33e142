"""Control flow with captured subgraphs: ``gc.cond`` -> If, ``gc.fori_loop`` -> Loop,
``gc.scan`` -> Scan (JAX semantics). Bodies are traced once into ONNX subgraphs; outer values
they use are captured by name, as ONNX allows. A complex value passes as its two real parts
(``complex_carries``). In eager capture the node is evaluated by interpreting its body graphs node by node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl import eager as _eager
from graphc.dsl import complex_carries, ops, renorm
from graphc.dsl.builder import Builder, current, op_error, user_source
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.errors import CaptureError

_lift = ops.lift


def _flatten(tree: Any) -> tuple[list[Tensor | ComplexTensor], bool]:
    """The values of ``tree`` (one, or a tuple or list of them; numbers lifted) and whether it is a sequence."""
    if isinstance(tree, (tuple, list)):
        return [complex_carries.item(t) for t in tree], True
    return [complex_carries.item(tree)], False


def _rebuild(items: list[Tensor | ComplexTensor], is_seq: bool) -> Any:
    return tuple(items) if is_seq else items[0]


def merge_shape(a: Any, b: Any) -> Any:
    """The dims two shapes agree on (None where they differ or are unknown); None for unknown or different ranks."""
    if a is None or b is None or len(a) != len(b):
        return None
    return [x if x == y else None for x, y in zip(a, b)]


def _check_carry(op: str, init: list[Tensor | ComplexTensor], outs: list[Tensor | ComplexTensor], source: str) -> None:
    if len(init) != len(outs):
        raise CaptureError(f"{op}: body returns {len(outs)} carried values, init has {len(init)} (at {source})")
    for i, (a, b) in enumerate(zip(init, outs)):
        if a.dtype != b.dtype:
            raise op_error(op, [a, b], f"carried value {i} changes dtype from {a.dtype} to {b.dtype}", source)
        if a.shape is not None and b.shape is not None:
            if len(a.shape) != len(b.shape) or any(isinstance(x, int) and isinstance(y, int) and x != y
                                                   for x, y in zip(a.shape, b.shape)):
                raise op_error(op, [a, b], f"carried value {i} changes shape", source)


def trace_subgraph(builder: Builder, fn: Callable, args: Sequence[Any], in_types: Sequence[tuple[str, str, Any]],
                   name: str, carries: list | None = None) -> tuple[ir.Graph, list[Tensor], bool]:
    """Trace ``fn(*args, *inputs)`` into a body graph whose inputs have ``in_types``
    (name hint, dtype, shape). Returns (graph, output Tensors, whether fn returned a sequence).
    ``carries``: a list to record in the outer Tensors an embedding's max_norm renormalised in the body,
    for the caller to carry out of it (``renorm``), each rebound to its value before the body; None: the
    body's lookups do not write back."""
    with builder.subgraph(carries) as scope:
        scope.settles = []
        values = [builder.new_value(builder.unique(hint), dtype, shape) for hint, dtype, shape in in_types]
        result = fn(*args, *[Tensor(v) for v in values])
        is_seq = isinstance(result, (tuple, list))
        items = list(result) if is_seq else [result]
        produced = {id(v) for node in scope.nodes for v in node.outputs}
        outs, used = [], set()
        for item in items:  # each output a value of its own made in the body (onnxruntime runs a repeat wrong)
            item = _lift(item)
            if id(item.value) not in produced or id(item.value) in used:
                item = ops.emit("Identity", [item])
                produced.add(id(item.value))
            used.add(id(item.value))
            outs.append(item)
        for settle in scope.settles:
            settle([t.value for t in outs])
    graph = ir.Graph(values, [t.value for t in outs], nodes=scope.nodes, name=builder.unique(name))
    renorm.restore(carries or [])
    return graph, outs, is_seq


# -- public -------------------------------------------------------------------------------------


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``true_fn(*operands) if pred else false_fn(*operands)`` as an ONNX ``If``.

    A Python bool simply picks a branch at capture. Both branches must return the same number
    of values with the same dtypes. Signature: ai.onnx@21::If
    """
    if isinstance(pred, (bool, np.bool_)):
        return true_fn(*operands) if pred else false_fn(*operands)
    builder, source = current(), user_source()
    pred = _lift(pred)
    if pred.dtype != "bool":
        raise op_error("If", [pred], f"predicate must be bool, got {pred.dtype}", source)
    then_c: list[renorm.Carried] = []
    else_c: list[renorm.Carried] = []
    results: list[tuple[list, bool]] = []  # each branch's values (complex ones whole) and whether a sequence

    def branch(fn: Callable) -> Callable:
        def traced(*args: Any) -> list[Tensor]:
            results.append(_flatten(fn(*args)))
            return complex_carries.split(results[-1][0])[0]
        return traced

    then_g, then_outs, _ = trace_subgraph(builder, branch(true_fn), operands, [], "then_branch", then_c)
    else_g, else_outs, _ = trace_subgraph(builder, branch(false_fn), operands, [], "else_branch", else_c)
    (then_items, seq), (else_items, seq2) = results
    if len(then_items) != len(else_items) or seq != seq2:
        raise CaptureError(f"gc.cond: branches return {len(then_items)} and {len(else_items)} values (at {source})")
    for i, (a, b) in enumerate(zip(then_items, else_items)):
        if a.dtype != b.dtype:
            raise op_error("If", [a, b], f"branch output {i} has dtype {a.dtype} vs {b.dtype}", source)
    out_types = [(a.dtype, merge_shape(a.shape, b.shape)) for a, b in zip(then_outs, else_outs)]
    carried = renorm.branch_outputs(then_g, else_g, then_c, else_c)

    def evaluate(arrays: list) -> list:
        graph = then_g if bool(np.asarray(arrays[0]).reshape(-1)[0]) else else_g
        return run_graph(builder, graph, [])

    outs = renorm.emit_carrying("If", [pred], {"then_branch": then_g, "else_branch": else_g}, out_types,
                                len(out_types), carried, source, evaluate)
    return _rebuild(complex_carries.join(outs, [isinstance(a, ComplexTensor) for a in then_items]), seq)


def fori_loop(lower: Any, upper: Any, body_fn: Callable, init: Any) -> Any:
    """``for i in range(lower, upper): carry = body_fn(i, carry)`` as an ONNX ``Loop``;
    ``i`` is an int64 scalar Tensor. Signature: ai.onnx@21::Loop"""
    builder, source = current(), user_source()
    carry, is_seq = _flatten(init)
    flat, kinds = complex_carries.split(carry)
    lo = lower if isinstance(lower, Tensor) else int(lower)
    hi = upper if isinstance(upper, Tensor) else int(upper)
    if isinstance(lo, int) and isinstance(hi, int):
        trip = ops.constant(np.asarray(max(hi - lo, 0), dtype=np.int64))
    else:
        lo_t = ops.cast(_lift(lo), "int64") if isinstance(lo, Tensor) else lo
        hi_t = ops.cast(hi, "int64") if isinstance(hi, Tensor) else hi
        trip = ops.maximum(ops.binary("Sub", hi_t, lo_t), 0)

    def body(iter_num: Tensor, cond_in: Tensor, *state: Tensor):
        i = iter_num if isinstance(lo, int) and lo == 0 else iter_num + (lo if isinstance(lo, int) else lo_t)
        new = body_fn(i, _rebuild(complex_carries.join(state, kinds), is_seq))
        new_items, new_seq = _flatten(new)
        if new_seq != is_seq:
            raise CaptureError(f"gc.fori_loop: body must return the same structure as init (at {source})")
        _check_carry("Loop", carry, new_items, source)
        return [ops.emit("Identity", [cond_in])] + complex_carries.split(new_items)[0]

    in_types = [("iter", "int64", []), ("cond", "bool", [])] + [
        (f"carry{k}", t.dtype, t.shape) for k, t in enumerate(flat)]
    carried: list[renorm.Carried] = []
    graph, outs, _ = trace_subgraph(builder, body, [], in_types, "loop_body", carried)
    out_types = [(t.dtype, merge_shape(t.shape, o.shape)) for t, o in zip(flat, outs[1:])]

    def evaluate(arrays: list) -> list:
        state = list(arrays[2:])
        for it in range(int(arrays[0])):
            res = run_graph(builder, graph, [np.asarray(it, dtype=np.int64), np.asarray(True)] + state)
            state = res[1:]
        return state

    results = renorm.emit_carrying("Loop", [trip, None, *flat], {"body": graph}, out_types, len(flat), carried,
                                   source, evaluate)
    return _rebuild(complex_carries.join(results, kinds), is_seq)


def scan(fn: Callable, init: Any, xs: Any) -> tuple[Any, Any]:
    """JAX ``lax.scan``: ``fn(carry, x) -> (carry, y)`` over axis 0 of ``xs``; returns
    ``(carry, ys)`` with the ``y``s stacked. Signature: ai.onnx@21::Scan"""
    builder, source = current(), user_source()
    carry, carry_seq = _flatten(init)
    x_items, xs_seq = _flatten(xs)
    length = None
    for x in x_items:
        if x.shape is None or len(x.shape) == 0:
            raise op_error("Scan", [x], "scanned inputs need rank >= 1", source)
        length = x.shape[0] if length is None else length
    (flat_carry, carry_kinds), (flat_xs, x_kinds) = complex_carries.split(carry), complex_carries.split(x_items)
    n_carry = len(flat_carry)
    y_box: list[tuple[bool, list[bool]]] = []  # whether fn's ys is a sequence, and which of them are complex

    def body(*vals: Tensor):
        state = complex_carries.join(vals[:n_carry], carry_kinds)
        elems = complex_carries.join(vals[n_carry:], x_kinds)
        result = fn(_rebuild(state, carry_seq), _rebuild(elems, xs_seq))
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise CaptureError(f"gc.scan: fn must return (carry, y) (at {source})")
        new_carry, ys = result
        new_items, new_seq = _flatten(new_carry)
        if new_seq != carry_seq:
            raise CaptureError(f"gc.scan: fn must return a carry with the structure of init (at {source})")
        _check_carry("Scan", carry, new_items, source)
        y_items, y_seq = _flatten(ys)
        flat_ys, y_kinds = complex_carries.split(y_items)
        y_box.append((y_seq, y_kinds))
        return complex_carries.split(new_items)[0] + flat_ys

    in_types = [(f"carry{k}", t.dtype, t.shape) for k, t in enumerate(flat_carry)] + [
        (f"x{k}", x.dtype, x.shape[1:]) for k, x in enumerate(flat_xs)]
    carried: list[renorm.Carried] = []
    graph, outs, _ = trace_subgraph(builder, body, [], in_types, "scan_body", carried)
    out_types = [(t.dtype, merge_shape(t.shape, o.shape)) for t, o in zip(flat_carry, outs[:n_carry])]
    out_types += [(y.dtype, None if y.shape is None else [length, *y.shape]) for y in outs[n_carry:]]
    attrs = {"body": graph, "num_scan_inputs": len(flat_xs)}
    results = renorm.emit_carrying("Scan", [*flat_carry, *flat_xs], attrs, out_types, n_carry, carried, source,
                                   lambda arrays: run_scan(builder, attrs, arrays))
    y_seq, y_kinds = y_box[0]
    return (_rebuild(complex_carries.join(results[:n_carry], carry_kinds), carry_seq),
            _rebuild(complex_carries.join(results[n_carry:], y_kinds), y_seq))


def _no_steps(y: Tensor) -> np.ndarray:
    """A scan output of no steps: empty, of ``y``'s static dims (unknown ones 0), as the backends give it."""
    dims = () if y.shape is None else tuple(d if isinstance(d, int) else 0 for d in y.shape)
    return np.zeros((0, *dims), y.dtype.numpy)


# -- eager interpretation of body graphs ----------------------------------------------------------


def run_graph(builder: Builder, graph: ir.Graph, inputs: Sequence[np.ndarray],
              outer: Callable[[ir.Value], np.ndarray | None] | None = None) -> list[np.ndarray]:
    """Evaluate ``graph`` on ``inputs``. Outer-scope values come from the enclosing body being
    evaluated (``outer``), else from the capture's eager values."""
    env: dict[int, np.ndarray] = {id(v): np.asarray(a) for v, a in zip(graph.inputs, inputs)}

    def get(value: ir.Value | None) -> np.ndarray | None:
        if value is None:
            return None
        if id(value) in env:
            return env[id(value)]
        if outer is not None:
            found = outer(value)
            if found is not None:
                return found
        if id(value) in builder.values:
            return builder.values[id(value)]
        if outer is not None:
            return None
        raise CaptureError(f"no eager value for {value.name!r} while evaluating {graph.name}")

    for node in graph:
        for v, o in zip(node.outputs, evaluate(builder, node, [get(v) for v in node.inputs], get)):
            env[id(v)] = o
    return [get(v) for v in graph.outputs]


def evaluate(builder: Builder, node: ir.Node, args: list, outer: Callable | None = None) -> list[np.ndarray]:
    """``node``'s outputs on ``args``: an If, Loop or Scan by interpreting its bodies (outer-scope values
    from ``outer``, else the capture's), any other op by the numpy backend (``eager.run``)."""
    attrs = {a.name: a.value for a in node.attributes.values()}
    if node.op_type == "If":
        branch = attrs["then_branch"] if bool(np.asarray(args[0]).reshape(-1)[0]) else attrs["else_branch"]
        return run_graph(builder, branch, [], outer)
    if node.op_type == "Loop":
        return run_loop(builder, attrs["body"], args, outer)
    if node.op_type == "Scan":
        return run_scan(builder, attrs, args, outer)
    return _eager.run(node.op_type, args, attrs, builder.opset, node_outputs=len(node.outputs))


def record(builder: Builder, node: ir.Node) -> None:
    """``eager.record`` of ``node`` into the capture's example values, control flow included (a node
    that ``gc.vmap`` or ``gc.func`` copies into the capture: a vmap fallback's Scan, say)."""
    _eager.record(builder.values, node, builder.opset, lambda arrays: evaluate(builder, node, arrays))


def run_loop(builder: Builder, body: ir.Graph, args: list, outer: Callable | None = None) -> list[np.ndarray]:
    """A ``Loop`` node's outputs for its inputs ``args`` (trip count, cond, state): ``body`` runs while its
    cond (absent: true) holds, at most the trip count (absent: unbounded) times; the carried values, then
    each scan output stacked (of no steps as ``_no_steps`` gives it)."""
    n_carry = len(args) - 2
    state, keep, it = list(args[2:]), args[1] is None or bool(args[1]), 0
    ys: list[list[np.ndarray]] = [[] for _ in body.outputs[1 + n_carry:]]
    while keep and (args[0] is None or it < int(args[0])):
        keep, *res = run_graph(builder, body, [np.asarray(it, np.int64), np.asarray(keep)] + state, outer)
        keep, it, state = bool(keep), it + 1, res[:n_carry]
        for k, y in enumerate(res[n_carry:]):
            ys[k].append(y)
    return state + [np.stack(y) if y else _no_steps(Tensor(v)) for y, v in zip(ys, body.outputs[1 + n_carry:])]


def run_scan(builder: Builder, attrs: dict, args: list, outer: Callable | None = None) -> list:
    """A (DSL-made) ``Scan`` node's outputs for its inputs ``args``; scan outputs of no steps as
    ``_no_steps`` gives them."""
    body = attrs["body"]
    n_carry = len(args) - attrs["num_scan_inputs"]
    state, seqs = list(args[:n_carry]), args[n_carry:]
    ys: list[list[np.ndarray]] = [[] for _ in body.outputs[n_carry:]]
    for t in range(seqs[0].shape[0]):
        res = run_graph(builder, body, state + [s[t] for s in seqs], outer)
        state = res[:n_carry]
        for k, y in enumerate(res[n_carry:]):
            ys[k].append(y)
    return state + [np.stack(y) if y else _no_steps(Tensor(v)) for y, v in zip(ys, body.outputs[n_carry:])]


__all__ = ["cond", "evaluate", "fori_loop", "merge_shape", "record", "run_graph", "run_loop", "run_scan", "scan",
           "trace_subgraph"]
