"""Reverse-mode autodiff as a graph transform on onnx_ir graphs.

``backward(graph, loss, wrt)`` appends the gradient nodes to ``graph`` in place:

1. restrict to the nodes on a path from a ``wrt`` value to the loss; paths through integer or
   boolean values carry no gradient (shape arithmetic from Shape/Gather/Concat is skipped);
2. walk those nodes in reverse graph order, calling each op type's VJP rule (``RULES``);
3. sum gradients where a value is used more than once (fan-out), in graph order;
4. a node on the path whose op has no rule raises ``GraphError`` naming op, node and the
   ``graphc.source`` line; a ``wrt`` value with no path to the loss gets zeros of its shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import SOURCE_KEY, GradBuilder, is_float
from graphc.passes.autodiff.recurrent import UNROLLED, not_unrolled
from graphc.passes.autodiff.registry import RULES
from graphc.passes.functions import EXPANDED_FROM
from graphc.passes.values import onnx_opset

DEFAULT_OPSET = 21


def node_inputs(node: ir.Node) -> list[ir.Value]:
    """The node's inputs plus the outer-scope values its subgraphs read (If/Loop/Scan captures)."""
    values = [v for v in node.inputs if v is not None]
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            values.extend(captured_values(attr.value))
        elif attr.type == ir.AttributeType.GRAPHS:
            for g in attr.value:
                values.extend(captured_values(g))
    return values


def captured_values(graph: ir.Graph) -> list[ir.Value]:
    """Values read inside ``graph`` (or its nested subgraphs) but defined outside it, in order."""
    defined = set(graph.inputs) | set(graph.initializers.values())
    seen: dict[ir.Value, None] = {}
    for node in graph:
        for v in node_inputs(node):
            if v not in defined:
                seen.setdefault(v, None)
        defined.update(node.outputs)
    for v in graph.outputs:
        if v not in defined:
            seen.setdefault(v, None)
    return list(seen)


def _outer_values(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs}
    values.update(graph.initializers)
    for node in graph:
        values.update((v.name, v) for v in node.outputs if v.name)
    return values


def own_subgraph_outputs(g: GradBuilder, branch: ir.Graph, outer: ir.Graph) -> None:
    """Route branch outputs that are outer values through an Identity inside the branch
    (same semantics; onnx_ir can clone a subgraph only when it produces its own outputs).
    Such an output may be a stand-in Value that only shares the outer value's name: the
    Identity reads the outer value itself, so the gradient reaches it."""
    outer_values = None
    for i, out in enumerate(list(branch.outputs)):
        producer = out.producer()
        if producer is None or producer.graph is not branch:
            if out not in branch.inputs and out.name not in branch.initializers:
                outer_values = outer_values or _outer_values(outer)
                out = outer_values.get(out.name, out)
            node = ir.node("Identity", [out], name=g.fresh("Identity"))
            node.outputs[0].name = g.fresh("Identity")
            node.outputs[0].type, node.outputs[0].shape = out.type, out.shape
            branch.append(node)
            branch.outputs[i] = node.outputs[0]


def _on_path(nodes: Sequence[ir.Node], sources: Sequence[ir.Value], sinks: Sequence[ir.Value]):
    """Nodes on a float path from ``sources`` to ``sinks``, and the values on such paths."""
    forward = {v for v in sources if is_float(v)}
    for node in nodes:
        if any(v in forward for v in node_inputs(node)):
            forward.update(v for v in node.outputs if is_float(v))
    needed = {v for v in sinks if v in forward}
    path: list[ir.Node] = []
    for node in reversed(nodes):
        if not any(v in needed for v in node.outputs):
            continue
        ins = [v for v in node_inputs(node) if v in forward]
        if ins:
            path.append(node)
            needed.update(ins)
    path.reverse()
    return path, needed


def _origin(node: ir.Node) -> str:
    """`` (inside the body of <op> node <name>)`` for a node an ONNX function was expanded into."""
    origin = node.metadata_props.get(EXPANDED_FROM)
    return f" (inside the ONNX function body of {origin})" if origin else ""


def _missing_rule(node: ir.Node) -> GraphError:
    source = node.metadata_props.get(SOURCE_KEY)
    where = f" (defined at {source})" if source else ""
    where += _origin(node)
    domain = f"{node.domain}::" if node.domain not in ("", "ai.onnx") else ""
    if node.op_type in UNROLLED and node.domain in ("", "ai.onnx"):
        reason = not_unrolled(node) or "it is inside a control-flow body"
        return GraphError(f"cannot differentiate {node.op_type} node {node.name!r}{where}: autodiff unrolls it over "
                          f"its time steps, but {reason}")
    covered = ", ".join(sorted(RULES))
    return GraphError(
        f"no gradient rule for ONNX op '{domain}{node.op_type}' (node {node.name!r}{where}), which lies "
        f"on the path from a trainable parameter to the loss. Freeze the parameters that reach it, "
        f"or add a rule in graphc/passes/autodiff/. Ops with rules: {covered}")


def _type_like(grad: ir.Value, primal: ir.Value) -> None:
    """A gradient has its primal's dtype and shape; record them where the rule did not."""
    if grad.type is None and primal.type is not None:
        grad.type = primal.type
    if grad.shape is None and primal.shape is not None:
        grad.shape = primal.shape


def backprop(g: GradBuilder, nodes: Sequence[ir.Node], seeds: Mapping[ir.Value, ir.Value],
             wrt: Sequence[ir.Value]) -> dict[ir.Value, ir.Value]:
    """Propagate ``seeds`` (value -> its gradient) back through ``nodes`` to ``wrt``.

    Returns the summed gradient of each ``wrt`` value that has a path (others are absent).
    """
    for node in nodes:
        for attr in node.attributes.values():
            for sub in ([attr.value] if attr.type == ir.AttributeType.GRAPH else
                        attr.value if attr.type == ir.AttributeType.GRAPHS else []):
                own_subgraph_outputs(g, sub, node.graph)
    path, needed = _on_path(list(nodes), wrt, list(seeds))
    pending: dict[ir.Value, list[ir.Value]] = {v: [dv] for v, dv in seeds.items()}
    for v, dv in seeds.items():
        _type_like(dv, v)
    wrt_set = set(wrt)
    g.needed = needed

    def take(value: ir.Value) -> ir.Value | None:
        parts = pending.get(value)
        if not parts:
            return None
        if len(parts) > 1:
            parts[:] = [g.sum_values(parts)]
            _type_like(parts[0], value)
        if value not in wrt_set:
            del pending[value]
        return parts[0]

    for node in reversed(path):
        if node.domain not in ("", "ai.onnx"):
            raise _missing_rule(node)
        rule = RULES.get(node.op_type)
        if rule is None:
            raise _missing_rule(node)
        dys = tuple(take(v) for v in node.outputs)
        if not rule.multi_output:
            dropped = [i for i, d in enumerate(dys[1:], 1) if d is not None and i not in rule.no_grad_outputs]
            if dropped:
                raise GraphError(f"gradient of {node.op_type} node {node.name!r} through its output "
                                 f"{node.outputs[dropped[0]].name!r} (output {dropped[0]}) is not supported; "
                                 f"the loss may depend on output 0 only{_origin(node)}")
        if all(d is None for d in dys) or (not rule.multi_output and dys[0] is None):
            continue  # only non-differentiable outputs (Indices, masks, running stats) are used
        g.source = node.metadata_props.get(SOURCE_KEY)
        g.scope = f"{node.name or node.op_type}/grad"
        inputs = list(node.inputs)  # a rule may replace the node (to expose Indices or a mask)
        try:
            result = rule.fn(g, node, dys if rule.multi_output else dys[0])
        except GraphError as exc:
            if not _origin(node):
                raise
            raise GraphError(f"{exc}{_origin(node)}") from exc
        pairs = result.items() if isinstance(result, dict) else zip(inputs, result)
        for value, dx in pairs:
            if dx is not None and value is not None and value in needed:
                _type_like(dx, value)
                pending.setdefault(value, []).append(dx)
    g.source, g.scope = None, "grad"
    out = {}
    for w in wrt:
        dw = take(w)
        if dw is not None:
            out[w] = dw
    return out


def backward(graph: ir.Graph, loss: ir.Value, wrt: Sequence[ir.Value]) -> dict[str, ir.Value]:
    """Append d(loss)/d(w) for each ``w`` in ``wrt`` to ``graph``; return ``{w.name: gradient}``.

    ``loss`` must be a scalar (or one-element) float value of ``graph``. A ``w`` with no path
    to the loss gets zeros of its shape (``ConstantOfShape``), like ``tf.gradients`` with
    ``unconnected_gradients="zero"``. Integer/bool ``w`` raise ``GraphError``.
    """
    for w in wrt:
        if not is_float(w):
            raise GraphError(f"cannot differentiate with respect to {w.name!r}: dtype {w.dtype} is not floating-point")
    if not is_float(loss):
        raise GraphError(f"loss {loss.name!r} has dtype {loss.dtype}; it must be floating-point")
    if loss.shape is not None and any(isinstance(d, int) and d != 1 for d in loss.shape):
        raise GraphError(f"loss {loss.name!r} must be a scalar, got shape {loss.shape}")
    g = GradBuilder(graph, onnx_opset(graph, DEFAULT_OPSET))
    nodes = list(graph)
    seed = g.full(g.shape_of(loss), 1.0, loss)
    grads = backprop(g, nodes, {loss: seed}, list(wrt))
    result = {}
    for w in wrt:
        result[w.name] = grads[w] if w in grads else g.zeros_like(w)
    return result
