"""Loops whose number of iterations the constants decide, unrolled for autodiff, and the
sequences they build lowered to plain tensors.

``grad_loop`` unrolls a Loop with a constant trip count and no exit condition of its own, and
takes any other Loop in reverse mode, but neither way through a carried sequence. Exporters
write loops with an exit condition, Ifs and a sequence, yet decided by constants alone: torch.onnx's dynamo
exporter writes ``F.embedding_bag`` as a Loop that carries a bag index from 0 while
``index < num_bags``, takes each bag's rows under Ifs that test constant offsets, and appends
each row to a sequence that ``ConcatFromSequence`` joins. Such a Loop is run ahead on its
integer part alone (``_iterations``) to learn how many steps it takes; then its body is copied
that many times into the main graph (``unroll_static_loops``), after which the Ifs'
conditions fold and the sequence becomes a Concat (``lower_sequences``). Gradient graphs only:
the eval and inference graphs keep the Loop.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import folded_array, node_attrs
from graphc.passes.emit import Emitter
from graphc.passes.evaluate import run_node
from graphc.passes.values import AUTOGRAD_KEY, onnx_opset, rebind_autograd_copy

__all__ = ["clone_body", "copy_graph", "copy_node", "fresh_names", "lower_sequences", "unroll_static_loops"]

MAX_STEPS = 4096
_SEQUENCE_BUILDERS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert"})


def unroll_static_loops(model: ir.Model) -> int:
    """Replace, in place, each main-graph Loop whose step count the constants decide and that
    ``grad_loop`` would not unroll itself (its body computes its own exit condition, carries a
    sequence or holds control flow) by copies of its body; returns how many Loops went. Its
    Ifs can then fold, and its sequences be lowered, which reverse mode could not do."""
    graph = model.graph
    opset = onnx_opset(model, 17)
    count = 0
    for node in list(graph):
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx") or not _beyond_grad_loop(node):
            continue
        steps = _iterations(node, opset)
        if steps is None:
            continue
        _unroll(Emitter(graph, opset, f"{node.name or 'Loop'}/unrolled"), node, steps)
        count += 1
    if count:
        graph.sort()
    return count


def _beyond_grad_loop(node: ir.Node) -> bool:
    body = node.attributes["body"].value
    cond_out, producer = body.outputs[0], body.outputs[0].producer()
    own_condition = not (cond_out is body.inputs[1] or (producer is not None and producer.op_type == "Identity"
                                                        and producer.inputs[0] is body.inputs[1]))
    nested = any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for n in body for a in n.attributes.values())
    sequences = any(isinstance(v.type, ir.SequenceType) for v in body.inputs[2:])
    return own_condition or nested or sequences


def _iterations(node: ir.Node, opset: int) -> int | None:
    """How many steps the Loop takes, found by running the part of its body that computes the
    exit condition (and the carried values that part reads) on the constants; None when that
    part reads anything not known before run time, or more than MAX_STEPS steps."""
    from graphc.errors import GraphcError

    body = node.attributes["body"].value
    cone = _condition_cone(body)
    if cone is None:
        return None
    nodes, carried = cone
    env: dict[ir.Value, np.ndarray | None] = {}

    def known(value: ir.Value) -> np.ndarray | None:  # outer constants are folded once
        if value not in env:
            env[value] = folded_array(value) if isinstance(value.type, ir.TensorType) else None
        return env[value]

    trip = known(node.inputs[0]) if node.inputs[0] is not None else np.array(MAX_STEPS + 1)
    cond = known(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else np.array(True)
    for k in carried:
        env[body.inputs[2 + k]] = known(node.inputs[2 + k])
    if trip is None or cond is None or any(env[body.inputs[2 + k]] is None for k in carried):
        return None
    step, limit = 0, min(int(trip), MAX_STEPS + 1)
    while step < limit and bool(cond):
        env[body.inputs[0]], env[body.inputs[1]] = np.array(step, np.int64), np.array(True)
        for inner in nodes:
            inputs = [None if v is None else known(v) for v in inner.inputs]
            if any(a is None and v is not None for a, v in zip(inputs, inner.inputs)):
                return None
            try:
                outs = run_node(inner.op_type, inputs, node_attrs(inner), opset, inner.domain,
                                num_outputs=len(inner.outputs))
            except GraphcError:
                return None
            env.update(zip(inner.outputs, outs))
        cond = known(body.outputs[0])
        updates = {body.inputs[2 + k]: known(body.outputs[1 + k]) for k in carried}
        if cond is None or any(a is None for a in updates.values()):
            return None
        env.update(updates)
        step += 1
    if step > MAX_STEPS or (step == 0 and len(body.outputs) > len(node.inputs) - 1):
        return None  # too long, or scan outputs of zero steps (their shape is unknown)
    return step


def _condition_cone(body: ir.Graph) -> tuple[list[ir.Node], list[int]] | None:
    """(the body nodes the exit condition depends on, in order; the carried inputs it reads,
    whose updates join the cone), or None when that needs a node with a subgraph."""
    position = {v: k for k, v in enumerate(body.inputs[2:])}
    wanted, carried, stack = set(), set(), [body.outputs[0]]
    while stack:
        value = stack.pop()
        if value in position and position[value] not in carried:
            carried.add(position[value])
            stack.append(body.outputs[1 + position[value]])
        producer = value.producer()
        if producer is None or producer.graph is not body or producer in wanted:
            continue
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in producer.attributes.values()):
            return None
        wanted.add(producer)
        stack.extend(v for v in producer.inputs if v is not None)
    return [n for n in body if n in wanted], sorted(carried)


def _unroll(e: Emitter, node: ir.Node, steps: int) -> None:
    body = node.attributes["body"].value
    n_carry = len(node.inputs) - 2
    carry, scans = list(node.inputs[2:]), []
    for step in range(steps):
        mapping = {body.inputs[0]: e.const(step, np.int64), body.inputs[1]: e.const(True, np.bool_)}
        mapping.update(zip(body.inputs[2:], carry))
        for inner in body:
            copy_node(e, inner, mapping)
        outs = [mapping.get(v, v) for v in body.outputs]
        carry, scans = outs[1:1 + n_carry], [*scans, outs[1 + n_carry:]]
    results = list(carry)
    for j in range(len(node.outputs) - n_carry):
        results.append(e.op("Concat", *[e.unsqueeze(s[j], [0]) for s in scans], axis=0))
    for old, new in zip(node.outputs, results):
        # an Identity takes the output's name: the value may be an input, a shared constant or
        # another output of the Loop
        name, new = old.name, e.op("Identity", new)
        new.type, new.shape = old.type, old.shape
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        old.name, new.name = None, name
    node.graph.remove(node, safe=True)


def copy_node(e: Emitter, node: ir.Node, mapping: dict[ir.Value, ir.Value]) -> None:
    """Append a copy of a body node with its inputs bound by ``mapping``; subgraphs (an If's
    branches) are cloned, read the mapped values, and get fresh names throughout, since they
    may be inlined into the main graph later."""
    attrs = []
    for a in node.attributes.values():
        if a.type == ir.AttributeType.GRAPH:
            attrs.append(ir.AttrGraph(a.name, copy_graph(e, a.value, mapping)))
        elif a.type == ir.AttributeType.GRAPHS:
            attrs.append(ir.AttrGraphs(a.name, [copy_graph(e, g, mapping) for g in a.value]))
        else:
            attrs.append(ir.Attr(a.name, a.type, a.value))
    copy = ir.Node(node.domain, node.op_type, [mapping.get(v, v) if v is not None else None for v in node.inputs],
                   attrs, num_outputs=len(node.outputs), metadata_props=dict(node.metadata_props),
                   name=e.fresh(node.op_type))
    for old, new in zip(node.outputs, copy.outputs):
        new.name, new.type, new.shape = e.fresh(old.name or "v"), old.type, old.shape
        mapping[old] = new
    if AUTOGRAD_KEY in copy.metadata_props:
        rebind_autograd_copy(copy, {old.name: new.name for old, new in mapping.items() if old.name})
    e.graph.append(copy)


def clone_body(e: Emitter, body: ir.Graph, mapping: dict[ir.Value, ir.Value], slices=None) -> list[ir.Value]:
    """Append one copy of ``body``'s nodes to ``e.graph`` with its inputs bound by ``mapping``
    (an If's branches are copied too, reading the bound values; Gathers of one step's slice
    read off ``slices``, a ``StepSlices``); returns the copy's outputs (outer-scope values stay
    as they are)."""
    for node in body:
        if slices is None or not slices.copy_gather(node, mapping):
            copy_node(e, node, mapping)
    return [mapping.get(v, v) for v in body.outputs]


def copy_graph(e: Emitter, graph: ir.Graph, mapping: dict[ir.Value, ir.Value]) -> ir.Graph:
    """A clone of ``graph`` (nested subgraphs too) with fresh names throughout, reading
    ``mapping``'s values in place of the keys it reads from outside (its Function markers bound to
    the copies: ``fresh_names``)."""
    clone = graph.clone(allow_outer_scope_values=True)
    names = {old.name: new.name for old, new in mapping.items() if old.name}
    stack = [clone]
    while stack:
        sub = stack.pop()
        for v in sub.inputs:
            v.name = names[v.name] = e.fresh(v.name or "v")
        for inner in sub:
            inner.name = e.fresh(inner.op_type)
            for i, v in enumerate(inner.inputs):
                if v in mapping:
                    inner.replace_input_with(i, mapping[v])
            fresh_names(e, inner, names)
            stack.extend(a.value for a in inner.attributes.values() if a.type == ir.AttributeType.GRAPH)
            stack.extend(g for a in inner.attributes.values() if a.type == ir.AttributeType.GRAPHS for g in a.value)
        for i, out in enumerate(sub.outputs):
            if out in mapping:
                sub.outputs[i] = mapping[out]
    return clone


def fresh_names(e: Emitter, node: ir.Node, names: dict[str, str], prefix: str | None = None) -> None:
    """Fresh names for a copied ``node``'s outputs (``prefix`` or their own names as the base), each
    recorded in ``names`` (old -> new); a ``gc.autograd.Function`` marker among the copies is bound to
    the copies of its values, named there."""
    for out in node.outputs:
        fresh = e.fresh(prefix or out.name or "v")
        if out.name:
            names[out.name] = fresh
        out.name = fresh
    if AUTOGRAD_KEY in node.metadata_props:
        rebind_autograd_copy(node, names)


def lower_sequences(model: ir.Model) -> int:
    """Replace ``ConcatFromSequence``, ``SequenceAt`` (constant position) and ``SequenceLength``
    of a sequence built with ``SequenceEmpty``/``SequenceConstruct``/``SequenceInsert`` (at the
    end or a constant position), or by ``SplitToSequence`` into a count the shapes and constants
    decide (``torch.chunk`` from the dynamo exporter), by Concat (with Unsqueeze for
    ``new_axis``), the element (a ``Split`` output), or a constant, so autodiff sees tensors;
    returns how many. Sequence nodes left unused go."""
    graph = model.graph
    opset = onnx_opset(model, 17)
    e = Emitter(graph, opset, "sequence")
    splits: dict[ir.Node, list[ir.Value] | None] = {}  # one Split per SplitToSequence
    count = 0
    for node in list(graph):
        if node.op_type not in ("ConcatFromSequence", "SequenceAt", "SequenceLength") or node.domain not in ("", "ai.onnx"):
            continue
        elements = _elements(node.inputs[0], e, splits)
        if elements is None:
            continue
        if node.op_type == "ConcatFromSequence" and elements:
            axis = node.attributes.get_int("axis")
            parts = [e.unsqueeze(x, [axis]) for x in elements] if node.attributes.get_int("new_axis", 0) else elements
            new = e.op("Concat", *parts, axis=axis)
        elif node.op_type == "SequenceAt" and folded_array(node.inputs[1]) is not None:
            position = int(folded_array(node.inputs[1]))
            if not -len(elements) <= position < len(elements):
                continue
            new = e.op("Identity", elements[position])
        elif node.op_type == "SequenceLength":
            new = e.const(len(elements), np.int64)
        else:
            continue
        old = node.outputs[0]
        name, new.type, new.shape = old.name, old.type, old.shape
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        old.name, new.name = None, name
        graph.remove(node, safe=True)
        count += 1
    for node in reversed(list(graph)):  # sequences no one reads any more, and their builders
        if (node.op_type in _SEQUENCE_BUILDERS or any(isinstance(v.type, ir.SequenceType) for v in node.outputs)) \
                and not any(v.uses() or v.is_graph_output() for v in node.outputs):
            graph.remove(node, safe=True)
    if count:
        graph.sort()
    return count


def _elements(sequence: ir.Value | None, e: Emitter, splits: dict) -> list[ir.Value] | None:
    """The tensors of a sequence built in the main graph from known parts, in order, else None."""
    node = sequence.producer() if sequence is not None else None
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Identity":
        return _elements(node.inputs[0], e, splits)
    if node.op_type == "SplitToSequence":
        if node not in splits:
            splits[node] = _split_parts(node, e)
        return splits[node]
    if node.op_type == "SequenceEmpty":
        return []
    if node.op_type == "SequenceConstruct":
        return list(node.inputs)
    if node.op_type != "SequenceInsert":
        return None
    before = _elements(node.inputs[0], e, splits)
    if before is None:
        return None
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return [*before, node.inputs[1]]
    position = folded_array(node.inputs[2])
    if position is None or not -len(before) <= int(position) <= len(before):
        return None
    position = int(position) + len(before) if int(position) < 0 else int(position)
    return [*before[:position], node.inputs[1], *before[position:]]


def _split_parts(node: ir.Node, e: Emitter) -> list[ir.Value] | None:
    """``SplitToSequence(x, split)`` as the outputs of one ``Split`` (each squeezed along the
    axis for ``keepdims=0`` without ``split``), when the parts' sizes are known: ``split`` a
    constant list, or a constant chunk size (or absent: size 1) with ``x``'s dim static."""
    x = node.inputs[0]
    split = folded_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if len(node.inputs) > 1 and node.inputs[1] is not None and split is None:
        return None
    if x.shape is None:
        return None
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(x.shape) if axis < 0 else axis
    dim = x.shape[axis]
    if split is not None and np.ndim(split) == 1:
        sizes = [int(v) for v in split]
    elif isinstance(dim, int):
        chunk = 1 if split is None else int(split)
        sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
    else:
        return None
    if not sizes:
        return None
    parts = list(e.split(x, sizes, axis, len(sizes)))
    if split is None and not node.attributes.get_int("keepdims", 1):
        parts = [e.squeeze(p, [axis]) for p in parts]
    return parts
