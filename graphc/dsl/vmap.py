"""``gc.vmap``: torch's ``vmap`` on the DSL. ``func`` is traced once on per-example Tensors (the mapped
dims left out) into a body; then, where every node of the body that reads a mapped value has a batching
rule (``vmap_rules``), the body is rewritten into the graph on the batched values (one node, or a few, a
node); else the nodes that read mapped values run in one ONNX ``Scan`` over the examples and the others
once, outside it. Both ways the result is plain ONNX, which ``gc.grad`` differentiates.

The rewrite is the default because it is much faster: a per-sample MLP (784-256-128-10, float32, its
cross entropy per example) over 256 examples on onnxruntime CPU (2 threads) runs in about 1.0 ms rewritten
vs 7.5-8 ms as a Scan, its ``gc.grad`` in 2.6-2.8 ms vs 42-54 ms; the same model written batched takes
0.4-1.0 ms and 1.2-1.7 ms; per-sample gradients (``vmap(grad(loss))``) of a small CNN over 64 28x28 images
in 7-12 ms vs 18-29 ms (``scripts/bench_vmap.py``; a shared 2-core machine, hence the ranges). A Scan is
announced by ``fallback``: a ``PerformanceWarning`` by default, naming the node no rule rewrote."""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from graphc.dsl import (
    ops,
    vmap_rules,
    vmap_rules_control,
    vmap_rules_conv,
    vmap_rules_index,
    vmap_rules_ragged,
    vmap_rules_random,
    vmap_rules_rnn,
)
from graphc.dsl.builder import Scope, current, user_source
from graphc.dsl.control import run_graph
from graphc.dsl.tensor import Tensor
from graphc.dsl.trees import leaves, rebuild
from graphc.dsl.vmap_renorm import Renormed
from graphc.dsl.vmap_rules import Batching, NoRule, has_random, hoist, rewrite
from graphc.errors import CaptureError, PerformanceWarning
from graphc.model import SOURCE_KEY

__all__ = ["vmap"]

_MORE_RULES = (vmap_rules_control, vmap_rules_conv, vmap_rules_index, vmap_rules_ragged, vmap_rules_random,
               vmap_rules_rnn)  # imported for the rules they add to vmap_rules.RULES and RAGGED

_RANDOMNESS = ("error", "different", "same")
_FALLBACK = ("warn", "scan", "error")


def vmap(func: Callable, in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error",
         chunk_size: int | None = None, *, fallback: str = "warn") -> Callable:
    """torch's ``vmap``: ``func`` mapped over dim ``in_dims`` of its positional arguments (an int or None
    for all, or a tree of tuples, lists and dicts matching the arguments; None: not mapped, the same
    for every example; keyword arguments are never mapped), its outputs stacked along ``out_dims``.
    ``randomness``: "error" refuses random ops in ``func``, "different" draws anew for each example,
    "same" one draw for all. ``chunk_size`` is accepted as torch's, which computes in chunks of that
    many examples with the same results; here the graph maps all examples at once. ``fallback``: what
    a body with an op no batching rule rewrites becomes: "warn" (a Scan and a ``gc.PerformanceWarning``
    once per capture and call site), "scan" (a Scan, silently), "error" (a ``CaptureError``)."""
    for what, value, allowed in (("randomness", randomness, _RANDOMNESS), ("fallback", fallback, _FALLBACK)):
        if value not in allowed:
            raise CaptureError(f"gc.vmap: {what} must be one of {', '.join(map(repr, allowed))}, "
                               f"got {value!r} (at {user_source()})")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise CaptureError(f"gc.vmap: chunk_size must be None or a positive int, got {chunk_size!r} "
                           f"(at {user_source()})")
    _check_dims_tree("in_dims", in_dims)
    _check_dims_tree("out_dims", out_dims)

    @functools.wraps(func)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        return _call(func, in_dims, out_dims, randomness, fallback, args, kwargs, user_source())

    return mapped


# -- trees of arguments and dims -----------------------------------------------------------------


def _check_dims_tree(what: str, dims: Any) -> None:
    if dims is None or (isinstance(dims, int) and not isinstance(dims, bool)):
        return
    if isinstance(dims, (tuple, list)):
        for d in dims:
            _check_dims_tree(what, d)
    elif isinstance(dims, dict):
        for d in dims.values():
            _check_dims_tree(what, d)
    else:
        raise CaptureError(f"gc.vmap: {what} must be an int, None, or a tuple/list/dict of them, got {dims!r} "
                           f"(at {user_source()})")


def _dims_of(what: str, dims: Any, tree: Any, path: str, source: str) -> list[tuple[str, int | None]]:
    """(path, dim) for each leaf of ``tree``: ``dims`` is a prefix of ``tree``, its int/None leaves
    applying to whole subtrees."""
    if dims is None or isinstance(dims, int):
        return [(path + sub, dims) for sub, _ in leaves(tree)]
    if isinstance(dims, (tuple, list)) and isinstance(tree, (tuple, list)) and len(dims) == len(tree):
        return [p for i, (d, t) in enumerate(zip(dims, tree)) for p in _dims_of(what, d, t, f"{path}[{i}]", source)]
    if isinstance(dims, dict) and isinstance(tree, dict) and set(dims) == set(tree):
        return [p for k, t in tree.items() for p in _dims_of(what, dims[k], t, f"{path}[{k!r}]", source)]
    raise CaptureError(f"gc.vmap: {what}{path[len(_ROOT[what]):]} is {dims!r}, which does not match the structure "
                       f"of {path}: {_describe(tree)} (at {source})")


_ROOT = {"in_dims": "args", "out_dims": "outputs"}


def _describe(tree: Any) -> str:
    if isinstance(tree, (tuple, list)):
        return f"a {type(tree).__name__} of {len(tree)}"
    if isinstance(tree, dict):
        return f"a dict with keys {sorted(map(str, tree))}"
    return f"a {type(tree).__name__}"


# -- the mapped call -------------------------------------------------------------------------------


def _call(func: Callable, in_dims: Any, out_dims: Any, randomness: str, fallback: str, args: tuple,
          kwargs: dict, source: str) -> Any:
    builder = current()
    if isinstance(in_dims, (tuple, list)) and len(in_dims) != len(args):
        raise CaptureError(f"gc.vmap: in_dims is a {type(in_dims).__name__} of {len(in_dims)} but the function gets "
                           f"{len(args)} positional arguments (at {source})")
    dims = _dims_of("in_dims", tuple(in_dims) if isinstance(in_dims, list) else in_dims, args, "args", source)
    flat = [leaf for _, leaf in leaves(args)]
    mapped: list[tuple[str, Tensor, int]] = []
    for (path, dim), leaf in zip(dims, flat):
        if dim is None:
            continue
        if not isinstance(leaf, Tensor):
            raise CaptureError(f"gc.vmap: in_dims gives {path} dim {dim}, but it is a {type(leaf).__name__}, not a "
                               f"Tensor: only Tensors are mapped (give it in_dims None) (at {source})")
        if leaf.shape is None:
            raise CaptureError(f"gc.vmap: {path} has an unknown rank: the mapped dim needs one (at {source})")
        if not -leaf.ndim <= dim < leaf.ndim:
            raise CaptureError(f"gc.vmap: in_dims gives {path} dim {dim}, out of range for its rank {leaf.ndim} "
                               f"({leaf.type_str()}) (at {source})")
        mapped.append((path, leaf, dim % leaf.ndim))
    if not mapped:
        raise CaptureError(f"gc.vmap: no argument is mapped (in_dims {in_dims!r}): at least one Tensor must be "
                           f"(at {source})")
    size = _mapped_size(mapped, source)

    with builder.subgraph(lookups=[]) as scope:
        inputs = [builder.new_value(builder.unique("vmap_in"), x.dtype, [*x.shape[:d], *x.shape[d + 1:]])
                  for _, x, d in mapped]
        examples = [Tensor(v) for v in inputs]
        per_example = iter(examples)
        masked = iter(next(per_example) if dim is not None else leaf for (_, dim), leaf in zip(dims, flat))
        try:
            result = func(*rebuild(args, masked), **kwargs)
        except CaptureError as exc:
            raise CaptureError(f"gc.vmap (called at {source}): {exc}") from None
    out_leaves = [leaf for _, leaf in leaves(result)]
    for path, leaf in leaves(result):
        if not isinstance(leaf, Tensor):
            raise CaptureError(f"gc.vmap: the function returned a {type(leaf).__name__} at outputs{path}; it must "
                               f"return Tensors (in tuples, lists or dicts) (at {source})")
    out_dim_list = _dims_of("out_dims", tuple(out_dims) if isinstance(out_dims, list) else out_dims,
                            result, "outputs", source)

    nodes = scope.nodes
    renormed = Renormed.of(nodes, scope.lookups, [(x, t, v, d) for (_, x, d), t, v in zip(mapped, examples, inputs)])
    batched = _batched_nodes(nodes, {id(v) for v in inputs}, randomness, source)
    moved = [ops.transpose(x, [d, *(i for i in range(x.ndim) if i != d)]) if d else x for _, x, d in mapped]
    batching = Batching(builder, size, moved[0], randomness)
    wanted = [t.value for t in out_leaves] + renormed.values
    try:
        outs = _staged(builder, lambda: rewrite(batching, nodes, batched, dict(zip(map(id, inputs), moved)), wanted))
    except NoRule as exc:
        _fall_back(builder, fallback, str(exc), _unruled(nodes, {id(v) for v in inputs}), source)
        outs = _scanned(builder, nodes, batched, inputs, moved, wanted, randomness, source)
    placed = [_place(batching, t, is_batched, dim, path, source)
              for (t, is_batched), (path, dim) in zip(outs, out_dim_list)]
    renormed.write_back(outs[len(out_leaves):], lambda t, is_batched, dim: _place(
        batching, t, is_batched, dim, "an embedding's max_norm weight", source), source)
    return rebuild(result, iter(placed))


_WARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # builder -> the warnings given in its capture


def _unruled(nodes: list[ir.Node], mapped: set[int]) -> list[str]:
    """The op types without any batching rule among the nodes that read per-example values, as the
    rewrite sees them: a mapped value's Shape or Size is the same for all examples."""
    values, found = set(mapped), set()
    for node in nodes:
        reads = [v for v in [*node.inputs, *_subgraph_values(node)] if v is not None]
        if node.op_type in ("Shape", "Size") or not (has_random(node) or any(id(v) in values for v in reads)):
            continue
        values.update(id(v) for v in node.outputs)
        if node.op_type not in vmap_rules.RULES:
            found.add(node.op_type)
    return sorted(found)


def _fall_back(builder, fallback: str, reason: str, unruled: list[str], source: str) -> None:
    """``fallback``'s action for a body that runs as a Scan because of ``reason`` (the node no rule
    rewrote) and the ``unruled`` op types."""
    if fallback == "scan":
        return
    ops_named = f"; ops without a batching rule: {', '.join(unruled)}" if unruled else ""
    message = (f"gc.vmap (called at {source}) runs its function as a Scan over the examples, much slower than "
               f"batched ops: no batching rule for {reason}{ops_named}")
    if fallback == "error":
        raise CaptureError(f"{message} (fallback='error'; pass fallback='scan' to allow the Scan)")
    given = _WARNED.setdefault(builder, set())
    if message in given:
        return
    given.add(message)
    filename, _, line = source.rpartition(":")
    warnings.warn_explicit(PerformanceWarning(f"{message} (pass fallback='scan' to silence this)"),
                           PerformanceWarning, filename or source, int(line) if line.isdigit() else 0)


def _mapped_size(mapped: list[tuple[str, Tensor, int]], source: str) -> Any:
    """The size of the mapped dims, which must agree (``ops.same_dim``'s rule for dim names)."""
    first_path, first, d0 = mapped[0]
    size = first.shape[d0]
    for path, x, d in mapped[1:]:
        other = x.shape[d]
        clash = (isinstance(size, int) and isinstance(other, int) and size != other) or \
            (isinstance(size, str) != isinstance(other, str) and size is not None and other is not None)
        if clash:
            raise CaptureError(f"gc.vmap: the mapped dims differ in size: {first_path} ({first.type_str()}) has "
                               f"{size} at dim {d0}, {path} ({x.type_str()}) has {other} at dim {d} (at {source})")
        size = size if isinstance(size, int) else other if isinstance(other, int) else size
    return size


def _subgraph_values(node: ir.Node) -> list[ir.Value]:
    """The values ``node``'s subgraphs read, at any depth (outer values among them)."""
    found = []
    for attr in node.attributes.values():
        if isinstance(attr.value, ir.Graph):
            for inner in attr.value:
                found += [v for v in inner.inputs if v is not None] + _subgraph_values(inner)
    return found


def _batched_nodes(nodes: list[ir.Node], mapped: set[int], randomness: str, source: str) -> set[int]:
    """ids of the body's nodes that compute per example: those reading a mapped value (their subgraphs
    included) and, with randomness "different", those that draw random numbers."""
    values, batched = set(mapped), set()
    for node in nodes:
        random = has_random(node)
        if random and randomness == "error":
            line = node.metadata_props.get(SOURCE_KEY, "?")
            raise CaptureError(f"gc.vmap: {node.op_type} at {line} draws random numbers, and randomness is 'error' "
                               f"(torch's default); pass randomness='different' (a draw per example) or 'same' "
                               f"(one for all) (vmap called at {source})")
        reads = [v for v in [*node.inputs, *_subgraph_values(node)] if v is not None]
        if any(id(v) in values for v in reads) or (random and randomness == "different"):
            batched.add(id(node))
            values.update(id(v) for v in node.outputs)
    return batched


def _staged(builder, build: Callable[[], Any]) -> Any:
    """``build()`` with its nodes recorded in a scope of their own, which joins the current one only
    when ``build`` returns (``NoRule`` leaves the current scope as it was)."""
    outer = builder.scope
    staged = Scope(eager=outer.eager)
    builder.scopes.append(staged)
    try:
        result = build()
    finally:
        builder.scopes.pop()
    outer.nodes += staged.nodes
    return result


def _scanned(builder, nodes: list[ir.Node], batched: set[int], inputs: list[ir.Value], moved: list[Tensor],
             outputs: list[ir.Value], randomness: str, source: str) -> list[tuple[Tensor, bool]]:
    """The body run by one ``Scan`` over the examples: its batched nodes inside, the others once before."""
    body_nodes = []
    for node in nodes:
        if id(node) not in batched:
            hoist(builder, node)
            continue
        if randomness == "same" and has_random(node):
            raise CaptureError(f"gc.vmap: randomness='same' for {node.op_type} at "
                               f"{node.metadata_props.get(SOURCE_KEY, '?')} on mapped values is not supported by "
                               f"the Scan graphc maps this function with (vmap called at {source})")
        body_nodes.append(node)
    made = {id(v) for node in body_nodes for v in node.outputs}
    per_example = {id(v) for v in inputs} | made
    results, body_outs = [], []
    with builder.subgraph() as extra:
        for value in outputs:
            if id(value) not in per_example:
                results.append((Tensor(value, builder.eager_value(value)), False))
                continue
            if id(value) not in made or value in body_outs:  # a body input, or an output twice
                value = ops.emit("Identity", [Tensor(value)]).value
            results.append(len(body_outs))
            body_outs.append(value)
    graph = ir.Graph(inputs, body_outs, nodes=body_nodes + extra.nodes, name=builder.unique("vmap_body"))
    size = moved[0].shape[0]
    out_types = [(Tensor(v).dtype, None if v.shape is None else [size, *Tensor(v).shape]) for v in body_outs]

    def evaluate(arrays: list) -> list:
        steps = [run_graph(builder, graph, [a[t] for a in arrays]) for t in range(arrays[0].shape[0])]
        return [np.stack([s[k] for s in steps]) if steps else
                np.zeros((0, *(d if isinstance(d, int) else 0 for d in Tensor(v).shape)), Tensor(v).dtype.numpy)
                for k, v in enumerate(body_outs)]

    stacked = ops.emit("Scan", moved, {"body": graph, "num_scan_inputs": len(moved)}, len(body_outs),
                       out_types=out_types, source=source, evaluator=evaluate) if body_outs else []
    stacked = stacked if isinstance(stacked, list) else [stacked]
    return [(stacked[r], True) if isinstance(r, int) else r for r in results]


def _place(batching: Batching, t: Tensor, is_batched: bool, dim: int | None, path: str, source: str) -> Tensor:
    """An output, batched along dim 0 (or not at all), as ``out_dims`` gives it."""
    if dim is None:
        if is_batched:
            raise CaptureError(f"gc.vmap: out_dims is None for {path}, which differs per example "
                               f"({t.type_str()} each); None is only for outputs that do not (at {source})")
        return t
    rank = t.ndim if not is_batched else t.ndim - 1
    if not -(rank + 1) <= dim <= rank:
        raise CaptureError(f"gc.vmap: out_dims gives {path} dim {dim}, out of range for its rank {rank + 1} "
                           f"with the mapped dim (at {source})")
    t = t if is_batched else batching.expand(t)
    dim %= rank + 1
    if dim == 0:
        return t
    perm = list(range(1, rank + 1))
    perm.insert(dim, 0)
    return ops.transpose(t, perm)
