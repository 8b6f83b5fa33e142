"""Reverse-mode autodiff as a graph transform on onnx_ir graphs.

``backward(graph, loss, wrt)`` appends the gradient nodes to ``graph`` in place:

1. restrict to the nodes on a path from a ``wrt`` value to the loss; paths through integer or
   boolean values carry no gradient (shape arithmetic from Shape/Gather/Concat is skipped), nor
   do paths through a ``gc.detach`` Identity (``stops_gradient``);
2. walk those nodes in reverse graph order, calling each op type's VJP rule (``RULES``), or at
   the last node of a fused kernel a pass wrote out the kernel's backward (``FUSED_RULES``);
3. undo broadcasting once, here: a gradient a rule returns in a broadcast shape (see
   ``registry``) is summed down to its input's shape (``GradBuilder.sum_to``: ReduceSum over
   the broadcast axes and a Reshape, static when the shapes are known, ``Shape``-based else);
4. check what the rule returned, as JAX's ``ct_check`` does: one entry per input, each
   gradient of its input's dtype and static shape; ``AutodiffError`` naming op, node and
   input otherwise (never a silent truncation);
5. sum gradients where a value is used more than once (fan-out), in graph order;
6. a node on the path whose op has no rule raises ``MissingGradientRule`` naming op, node and
   the ``graphc.source`` line (a node marked ``NO_DERIVATIVE_KEY``: the torch function it makes); a
   ``wrt`` value with no path to the loss gets zeros of its shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx_ir as ir

from graphc.errors import AutodiffError, GraphError, MissingGradientRule
from graphc.passes.autodiff.autograd_functions import Region, regions
from graphc.passes.autodiff.builder import SOURCE_KEY, GradBuilder, is_float, static_shape
from graphc.passes.autodiff.recurrent import UNROLLED, not_unrolled
from graphc.passes.autodiff.registry import FUSED_RULES, RULES, GradRule
from graphc.passes.functions import EXPANDED_FROM
from graphc.passes.values import FUSED_GRADIENT_KEY, NO_DERIVATIVE_KEY, onnx_opset, stops_gradient

DEFAULT_OPSET = 21
RULES_DIR = Path(__file__).resolve().parent  # where the rule files are, as installed


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


def gradient_inputs(node: ir.Node, marked: Mapping[ir.Node, Region]) -> list[ir.Value]:
    """The values ``node``'s gradient goes to: a Function marker's region's inputs, none through
    any other stop-gradient node, else its inputs (``node_inputs``)."""
    if node in marked:
        return marked[node].inputs
    return [] if stops_gradient(node) else node_inputs(node)


def _on_path(nodes: Sequence[ir.Node], sources: Sequence[ir.Value], sinks: Sequence[ir.Value],
             marked: Mapping[ir.Node, Region]):
    """Nodes on a float path from ``sources`` to ``sinks`` that no stop-gradient node cuts (a
    Function's markers join their region's inputs to its outputs), and the values on such paths."""
    forward = {v for v in sources if is_float(v)}
    for node in nodes:
        if any(v in forward for v in gradient_inputs(node, marked)):
            forward.update(v for v in node.outputs if is_float(v))
    needed = {v for v in sinks if v in forward}
    path: list[ir.Node] = []
    for node in reversed(nodes):
        if not any(v in needed for v in node.outputs):
            continue
        ins = [v for v in gradient_inputs(node, marked) if v in forward]
        if ins:
            path.append(node)
            needed.update(ins)
    path.reverse()
    return path, needed


def _origin(node: ir.Node) -> str:
    """`` (inside the body of <op> node <name>)`` for a node an ONNX function was expanded into."""
    origin = node.metadata_props.get(EXPANDED_FROM)
    return f" (inside the ONNX function body of {origin})" if origin else ""


def _defined_at(node: ir.Node) -> str:
    """`` (defined at file.py:LINE)`` for a node that records the user's source line, and its ``_origin``."""
    source = node.metadata_props.get(SOURCE_KEY)
    return (f" (defined at {source})" if source else "") + _origin(node)


def _missing_rule(node: ir.Node) -> AutodiffError:
    """``MissingGradientRule`` naming the op, the node, its source line, where rules live on disk
    and the ops that have one (an RNN that cannot be unrolled: why not)."""
    where = _defined_at(node)
    domain = f"{node.domain}::" if node.domain not in ("", "ai.onnx") else ""
    if node.op_type in UNROLLED and node.domain in ("", "ai.onnx"):
        reason = not_unrolled(node) or "it is inside a control-flow body"
        return AutodiffError(f"cannot differentiate {node.op_type} node {node.name!r}{where}: autodiff unrolls it over "
                             f"its time steps, but {reason}")
    covered = ", ".join(sorted(RULES))
    return MissingGradientRule(
        f"no gradient rule for ONNX op '{domain}{node.op_type}' (node {node.name!r}{where}), which lies "
        f"on the path from a trainable parameter to the loss. Freeze the parameters that reach it, "
        f"or add a rule to the table in {RULES_DIR}/rules_*.py (docs/adding-an-op.md). Ops with rules: {covered}")


def _rule(node: ir.Node) -> GradRule:
    """The rule ``node`` is differentiated by: its fused kernel's (``FUSED_GRADIENT_KEY``) or its op's; a node
    that makes a function torch does not differentiate (``NO_DERIVATIVE_KEY``) has none."""
    refused = node.metadata_props.get(NO_DERIVATIVE_KEY)
    if refused is not None:
        raise MissingGradientRule(
            f"{refused} has no derivative (torch 2.13 defines none: its result does not require grad), but its "
            f"node {node.name!r}{_defined_at(node)} lies on the path from a trainable parameter to the loss; "
            f"gc.detach its input to treat the result as a constant, as torch does")
    kernel = node.metadata_props.get(FUSED_GRADIENT_KEY)
    if kernel is not None:
        if kernel not in FUSED_RULES:
            raise AutodiffError(f"node {node.name!r} ends a fused kernel {kernel!r} that has no gradient rule; "
                                f"fused kernels with rules: {', '.join(sorted(FUSED_RULES))}")
        return FUSED_RULES[kernel]
    rule = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if rule is None:
        raise _missing_rule(node)
    return rule


_FUNCTION_RULE = GradRule("gc.autograd.Function", lambda g, node, dy: ())  # what ``_checked`` names


def _type_like(grad: ir.Value, primal: ir.Value) -> None:
    """A gradient has its primal's dtype and shape; record them where the rule did not."""
    if grad.type is None and primal.type is not None:
        grad.type = primal.type
    if grad.shape is None and primal.shape is not None:
        grad.shape = primal.shape


def _checked(g: GradBuilder, rule: GradRule, node: ir.Node, inputs: list[ir.Value | None], result):
    """(value, gradient) pairs of what ``rule`` returned for ``node`` (whose inputs were
    ``inputs``): broadcast gradients summed down to their input's shape, each checked against
    its input (count, dtype, static shape) and typed like it. Values the walk does not want
    are skipped before anything is emitted for them."""
    where = f"the gradient rule of {node.op_type} (node {node.name!r}{_origin(node)})"
    if isinstance(result, dict):  # values the node reads without listing them (If captures)
        pairs = list(result.items())
    else:
        result = tuple(result)
        # a rule written for an op's whole signature may return None for the trailing optional
        # inputs a node leaves out (ReduceSum's axes before opset 13); anything else must match
        if len(result) < len(inputs) or any(dx is not None for dx in result[len(inputs):]):
            raise AutodiffError(f"{where} returned {len(result)} gradient(s) for the node's {len(inputs)} input(s); a "
                                "rule returns one entry per input, None where an input has no gradient")
        pairs = list(zip(inputs, result))
    out = []
    for index, (value, dx) in enumerate(pairs):
        if dx is None or value is None or value not in g.needed:
            continue
        if dx in g.broadcast_shapes:
            dx = g.sum_to(dx, g.broadcast_shapes[dx], value)
        elif not isinstance(result, dict) and rule.broadcasts(index):
            dx = g.sum_to(dx, static_shape(node.outputs[0]), value)
        _check_like(where, index, value, dx)
        _type_like(dx, value)
        out.append((value, dx))
    g.broadcast_shapes.clear()
    return out


def _check_like(where: str, index: int, primal: ir.Value, grad: ir.Value) -> None:
    """A gradient has its primal's dtype and, where both are known, its static shape."""
    what = f"{where} returned for input {index} ({primal.name!r})"
    if grad.dtype is not None and primal.dtype is not None and grad.dtype != primal.dtype:
        raise AutodiffError(f"{what} a gradient of dtype {grad.dtype}; expected {primal.dtype}, the input's")
    got, want = static_shape(grad), static_shape(primal)
    if got is None or want is None:
        return
    if len(got) != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(got, want)):
        raise AutodiffError(f"{what} a gradient of shape {list(got)}; expected {list(want)}, the input's")


def backprop(g: GradBuilder, nodes: Sequence[ir.Node], seeds: Mapping[ir.Value, ir.Value],
             wrt: Sequence[ir.Value], functions: Mapping[ir.OperatorIdentifier, ir.Function] | None = None
             ) -> dict[ir.Value, ir.Value]:
    """Propagate ``seeds`` (value -> its gradient) back through ``nodes`` to ``wrt``; ``functions``:
    the model's, where the backwards of ``gc.autograd.Function`` regions are (``autograd_functions``).

    Returns the summed gradient of each ``wrt`` value that has a path (others are absent).
    """
    if functions is None:  # a body a rule differentiates: the functions of the walk it is part of
        functions = g.functions
    g.functions = functions
    for node in nodes:
        for attr in node.attributes.values():
            for sub in ([attr.value] if attr.type == ir.AttributeType.GRAPH else
                        attr.value if attr.type == ir.AttributeType.GRAPHS else []):
                own_subgraph_outputs(g, sub, node.graph)
    marked = regions(nodes, functions)
    path, needed = _on_path(list(nodes), wrt, list(seeds), marked)
    for node in path:
        if node in marked:
            marked[node].waiting += 1
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
        if node in marked:
            g.source, g.scope = node.metadata_props.get(SOURCE_KEY), f"{node.name}/grad"
            grads = marked[node].backward(g, node, take(node.outputs[0]))
            for value, dx in _checked(g, _FUNCTION_RULE, node, [], grads or {}):
                pending.setdefault(value, []).append(dx)
            continue
        rule = _rule(node)
        dys = tuple(take(v) for v in node.outputs)
        if not rule.multi_output:
            dropped = [i for i, d in enumerate(dys[1:], 1) if d is not None and i not in rule.no_grad_outputs]
            if dropped:
                raise AutodiffError(f"gradient of {node.op_type} node {node.name!r} through its output "
                                    f"{node.outputs[dropped[0]].name!r} (output {dropped[0]}) is not supported; "
                                    f"the loss may depend on output 0 only{_origin(node)}")
        if all(d is None for d in dys) or (not rule.multi_output and dys[0] is None):
            continue  # only non-differentiable outputs (Indices, masks, running stats) are used
        g.source = node.metadata_props.get(SOURCE_KEY)
        g.scope = f"{node.name or node.op_type}/grad"
        inputs = list(node.inputs)  # a rule may replace the node (to expose Indices or a mask)
        try:
            result = rule.fn(g, node, dys if rule.multi_output else dys[0])
        except GraphError as exc:  # a rule's own error is an AutodiffError, said where it came from
            if isinstance(exc, AutodiffError) and not _origin(node):
                raise
            if isinstance(exc, AutodiffError):
                raise type(exc)(f"{exc}{_origin(node)}") from exc
            raise AutodiffError(f"the gradient rule of {node.op_type} (node {node.name!r}{_defined_at(node)}) "
                                f"failed: {exc}") from exc
        for value, dx in _checked(g, rule, node, inputs, result):
            if value in needed:
                pending.setdefault(value, []).append(dx)
    g.source, g.scope = None, "grad"
    out = {}
    for w in wrt:
        dw = take(w)
        if dw is not None:
            out[w] = dw
    g.drop_unread_expands(set(out.values()))
    return out


def backward(graph: ir.Graph, loss: ir.Value, wrt: Sequence[ir.Value], device: str = "cpu",
             nchwc: int = 0, seed_scale: ir.Value | None = None,
             functions: Mapping[ir.OperatorIdentifier, ir.Function] | None = None) -> dict[str, ir.Value]:
    """Append d(loss)/d(w) for each ``w`` in ``wrt`` to ``graph``; return ``{w.name: gradient}``.
    ``device`` and ``nchwc``: whose kernels the gradient rules choose their lowerings for
    (``GradBuilder``). ``seed_scale`` (a scalar of the loss's dtype): the gradients of ``loss *
    seed_scale`` instead (loss scaling). ``functions``: the model's (``backprop``).

    ``loss`` must be a scalar (or one-element) float value of ``graph``. A ``w`` with no path
    to the loss gets zeros of its shape (``ConstantOfShape``), like ``tf.gradients`` with
    ``unconnected_gradients="zero"``. Integer/bool ``w`` raise ``GraphError``.
    """
    for w in wrt:
        if not is_float(w):
            raise AutodiffError(f"cannot differentiate with respect to {w.name!r}: dtype {w.dtype} is not "
                                "floating-point")
    if not is_float(loss):
        raise AutodiffError(f"loss {loss.name!r} has dtype {loss.dtype}; it must be floating-point")
    if loss.shape is not None and any(isinstance(d, int) and d != 1 for d in loss.shape):
        raise AutodiffError(f"loss {loss.name!r} must be a scalar, got shape {loss.shape}")
    g = GradBuilder(graph, onnx_opset(graph, DEFAULT_OPSET), device=device, nchwc=nchwc)
    nodes = list(graph)
    seed = g.full(g.shape_of(loss), 1.0, loss)
    if seed_scale is not None:
        seed = g.op("Mul", seed, seed_scale)
    grads = backprop(g, nodes, {loss: seed}, list(wrt), functions)
    result = {}
    for w in wrt:
        result[w.name] = grads[w] if w in grads else g.zeros_like(w)
    return result
