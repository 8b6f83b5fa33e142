"""Compile-time evaluation: the one engine passes use to compute values before a model runs
(a value's constant, a Loop's trip count, a separable op's gradient matrices, the ranks shape
inference could not find).

The engine is a kernel table behind one function, ``run_node(op_type, inputs, attrs, opset,
domain, *, num_outputs, scope)`` (the numpy backend's, checked against onnx's node cases and
onnxruntime). Passes never import a backend: graphc injects it at import (``use_kernels``);
without one, onnx's reference evaluator runs each node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.values import const_array, draws_random, node_attrs, onnx_opset, static_shape

__all__ = ["folded_array", "run_graph", "run_node", "use_kernels"]

Kernels = Callable[..., list[np.ndarray]]
_loader: Callable[[], Kernels] | None = None
_kernels: Kernels | None = None


def use_kernels(loader: Callable[[], Kernels] | None) -> None:
    """Make ``loader()`` (called on first use, so a backend loads only when needed) the engine."""
    global _loader, _kernels
    _loader, _kernels = loader, None


def run_node(op_type: str, inputs: Sequence[np.ndarray | None], attrs: Mapping, opset: int, domain: str = "",
             *, num_outputs: int | None = None, scope: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Evaluate one node on constants: ``attrs`` are plain values (``node_attrs``), a graph
    attribute's outer names are read from ``scope``. Raises ``GraphcError`` when the engine
    cannot evaluate it."""
    global _kernels
    if _kernels is None and _loader is not None:
        _kernels = _loader()
    if _kernels is not None:
        return _kernels(op_type, inputs, attrs, opset, domain, num_outputs=num_outputs, scope=scope)
    return _reference(op_type, inputs, attrs, opset, domain, num_outputs)


def _reference(op_type, inputs, attrs, opset, domain, num_outputs) -> list[np.ndarray]:
    from onnx import TypeProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    outs = [f"out{i}" for i in range(num_outputs or 1)]
    graph = helper.make_graph([helper.make_node(op_type, names, outs, domain=domain or None, **attrs)], "evaluate",
                              [], [helper.make_value_info(o, TypeProto()) for o in outs],
                              [numpy_helper.from_array(np.asarray(a), n) for a, n in zip(inputs, names) if n])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    try:
        return [np.asarray(r) for r in ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(None, {})]
    except Exception as exc:  # noqa: BLE001 - the reference evaluator raises anything
        raise GraphError(f"cannot evaluate {op_type}: {type(exc).__name__}: {exc}") from exc


_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def _opset(node: ir.Node) -> int:
    return onnx_opset(node.graph.opset_imports, 17) if node.graph is not None else 17


def folded_array(value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
    """The value as numpy when it is known before the model runs: a constant, the ``Shape`` of
    a value with a static shape, or a deterministic node of such values (``run_node``), e.g.
    Resize scales an exporter builds with Concat/Cast; None otherwise, and for a graph input
    (its default is not known before run time: a caller may feed another)."""
    if value is None or value.is_graph_input():
        return None
    array = const_array(value)
    if array is not None or depth > 16:
        return array
    node = value.producer()
    if (node is None or node.domain not in ("", "ai.onnx") or node.op_type in _CONTROL_FLOW
            or draws_random(node)):
        return None
    if node.op_type == "Shape":
        shape = static_shape(node.inputs[0])
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", len(shape))
        return np.array(shape[slice(start, end)], dtype=np.int64)
    inputs = [folded_array(v, depth + 1) for v in node.inputs]
    if any(a is None and v is not None for a, v in zip(inputs, node.inputs)):
        return None
    try:
        results = run_node(node.op_type, inputs, node_attrs(node), _opset(node), num_outputs=len(node.outputs))
    except Exception:  # noqa: BLE001 - not computable here: the caller treats it as unknown
        return None
    return np.asarray(results[list(node.outputs).index(value)])


def run_graph(graph: ir.Graph, feeds: Mapping[ir.Value, np.ndarray], opset: int) -> dict[ir.Value, np.ndarray]:
    """Every value of ``graph`` (main graph nodes in order; initializers and ``feeds`` for its
    inputs), evaluated with ``run_node``. Raises ``GraphcError`` when a node cannot be."""
    env: dict[ir.Value, np.ndarray] = dict(feeds)
    for value in graph.initializers.values():
        env[value] = value.const_value.numpy()
    for node in graph:
        inputs = [None if v is None else env[v] for v in node.inputs]
        bodies = any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())
        scope = {v.name: a for v, a in env.items() if v.name} if bodies else None  # what a body reads
        outs = run_node(node.op_type, inputs, node_attrs(node), opset, node.domain,
                        num_outputs=len(node.outputs), scope=scope)
        env.update(zip(node.outputs, outs))
    return env
