"""Scans of no steps, in an onnxruntime session's copy of a model.

onnxruntime 1.31 fails a Scan whose scanned inputs have length 0 ("Invalid dim0_offset of 0"),
where ONNX makes the final states the initial ones and the scan outputs of length 0 (a
``gc.scan`` over an empty batch of sequences, and the tape of its gradient). The session's copy
runs each Scan, in the main graph and in subgraphs (a Loop's body, an If's branches), as the
else branch of an If on that length; the then branch gives the states as they came and each
scan output empty, of the body's static dims (unknown dims 0) with 0 at its axis: the shape
onnxruntime gives a Loop's scan output of no iterations. A body output declared without a shape
gets onnx's inferred one, a rank nobody knows gives [0] (the numpy backend's); a Scan whose body
leaves a scan output's element type unknown is left as it is. Unguarded, a Scan of no steps on a
scanned axis other than 0 killed the process (SIGFPE).
A Scan whose length onnx's shape inference finds nonzero is not guarded: onnxruntime would fold
the If, and folding guards nested in an If's branch lost a value ("Missing Input: scan21").
A local function's Scans are guarded too (unguarded, one of no steps failed or killed the process
alike).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphc.backends.written_out import Writer
from graphc.model.file import ai_onnx_opset, with_body_output_shapes, with_nodes

__all__ = ["guard_empty"]


def guard_empty(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when it has no Scan to guard, else a copy in which each runs under an If
    on its length (the module docstring), in the main graph and in every subgraph (Loop and If
    bodies, Scan bodies), and in the local functions' nodes (their inputs untyped: each Scan guarded)."""
    opset = ai_onnx_opset(model)
    if opset < 9:  # Scan-8: not rewritten
        return model
    source = with_body_output_shapes(model)
    if _guard_nodes(source.graph.node, _declared(source.graph, {}), opset) is None and not _functions(source, opset):
        return model
    try:  # lengths that onnx's shape inference knows (onnxruntime knows them too) need no guard
        source = onnx.shape_inference.infer_shapes(source)
    except (onnx.shape_inference.InferenceError, ValueError):
        pass
    nodes, functions = _guard_nodes(source.graph.node, _declared(source.graph, {}), opset), _functions(source, opset)
    if nodes is None and not functions:
        return model
    out = with_nodes(source, list(source.graph.node) if nodes is None else nodes)
    for i, guarded in functions.items():
        del out.functions[i].node[:]
        out.functions[i].node.extend(guarded)
    return out


def _functions(model: onnx.ModelProto, opset: int) -> dict[int, list[onnx.NodeProto]]:
    """Index -> guarded nodes of each local function with a Scan to guard (of the function's own
    ai.onnx opset, else the model's; Scan-8 not rewritten)."""
    guarded = {}
    for i, function in enumerate(model.functions):
        own = ai_onnx_opset(function) or opset
        nodes = None if own < 9 else _guard_nodes(function.node, {}, own)
        if nodes is not None:
            guarded[i] = nodes
    return guarded


def _declared(graph: onnx.GraphProto, outer: dict) -> dict:
    """Name -> declared tensor type of the values ``graph`` sees: its own inputs and value_info
    over the enclosing graphs' (a subgraph reads outer values by name)."""
    return {**outer, **{v.name: v.type.tensor_type for v in [*graph.input, *graph.value_info]}}


def _guard_nodes(nodes, declared: dict, opset: int) -> list[onnx.NodeProto] | None:
    """``nodes`` with each Scan whose length may be 0 guarded, subgraphs included; None when
    none is."""
    out, changed = [], False
    for node in nodes:
        inner = _with_guarded_subgraphs(node, declared, opset)
        guarded = _guarded(inner, opset) if _is_scan(inner) and not _steps(inner, declared) else None
        out += guarded or [inner]
        changed = changed or guarded is not None or inner is not node
    return out if changed else None


def _with_guarded_subgraphs(node: onnx.NodeProto, declared: dict, opset: int) -> onnx.NodeProto:
    """``node`` itself when no graph attribute of it holds a Scan to guard, else a copy whose
    graph attributes have theirs guarded."""
    rewritten = {}
    for i, attribute in enumerate(node.attribute):
        if attribute.type == onnx.AttributeProto.GRAPH:
            nodes = _guard_nodes(attribute.g.node, _declared(attribute.g, declared), opset)
            if nodes is not None:
                rewritten[i] = nodes
    if not rewritten:
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for i, nodes in rewritten.items():
        del copy.attribute[i].g.node[:]
        copy.attribute[i].g.node.extend(nodes)
    return copy


def _is_scan(node: onnx.NodeProto) -> bool:
    return node.op_type == "Scan" and node.domain in ("", "ai.onnx")


def _steps(node: onnx.NodeProto, declared: dict) -> bool:
    """Whether the Scan's scanned length is declared, and not 0 (then it needs no guard: an If
    costs onnxruntime about 9 us a run)."""
    m = next(a.i for a in node.attribute if a.name == "num_scan_inputs")
    axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), None) or [0]
    t = declared.get(node.input[len(node.input) - m])
    if t is None or not t.HasField("shape") or not -len(t.shape.dim) <= axes[0] < len(t.shape.dim):
        return False
    return t.shape.dim[axes[0]].dim_value > 0


def _guarded(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body, m = attrs["body"], attrs["num_scan_inputs"]
    n_state = len(node.input) - m
    outs = list(body.output[n_state:])
    types = [o.type.tensor_type for o in outs]
    if any(not t.elem_type for t in types):
        return None
    w = Writer(node, "scan_guard", opset)
    p = w.prefix
    axis = list(attrs.get("scan_input_axes") or [0])[0]
    index, zero = w.const(axis, np.int64), w.const(0, np.int64)
    length = w.op("Gather", w.op("Shape", node.input[n_state]), index)
    empty_branch: list[onnx.NodeProto] = []
    results = [w.op("Identity", state, into=empty_branch) for state in node.input[:n_state]]
    out_axes = list(attrs.get("scan_output_axes") or [0] * len(outs))
    for t, out_axis in zip(types, out_axes):
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]  # no shape: []
        dims.insert(out_axis % (len(dims) + 1), 0)
        empty = helper.make_tensor(f"{p}empty", t.elem_type, dims, [])
        results.append(w.op("Constant", into=empty_branch, value=empty))
    scan = onnx.NodeProto()
    scan.CopyFrom(node)
    scan.output[:] = [f"{p}scan{k}" for k in range(len(node.output))]
    types_out = [o.type.tensor_type.elem_type for o in body.output]
    branches = {name: helper.make_graph(nodes, f"{p}{name}", [], [helper.make_tensor_value_info(v, e, None)
                                                                   for v, e in zip(values, types_out)])
                for name, nodes, values in (("then_branch", empty_branch, results),
                                            ("else_branch", [scan], list(scan.output)))}
    outputs = [name or f"{p}unused{k}" for k, name in enumerate(node.output)]
    w.op("If", w.op("Equal", length, zero), output=outputs, **branches)
    return w.nodes
