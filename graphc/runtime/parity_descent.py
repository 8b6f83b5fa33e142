"""Bisect for ``gc.parity.compare``: the first divergent node of a graph, entered when it is an If,
a Loop, a Scan or a call of a model-local function, and the node found run alone.

A body is entered as a model of its own whose inputs (the body's own and the outer-scope values it
reads) are the reference backend's values, so every backend starts from the same numbers: an If's
taken branch, a Loop/Scan body once per iteration until its outputs differ (only the current
carries are held), a function call as a one-node model with that function inlined."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnx_ir as ir
from onnx import helper, numpy_helper

from graphc.model import Model, load, node_source
from graphc.model.file import all_graphs
from graphc.runtime.parity import Divergence, Scope, diff, expose_intermediates, tensors

ORIGIN_KEY = "graphc.parity.origin"  # a function node's [name, index, outputs] before inlining renames them
Values = Callable[[str], "np.ndarray | None"]  # the reference backend's value of a name; None: not a tensor


def locate(model: Model, feeds: Mapping[str, Any], backends: list[str], rtol: float | None, atol: float | None,
           options: dict[str, Any]) -> tuple[int, Divergence | None]:
    """(values compared, the first divergence in ``model`` run on ``feeds``, entered where it can be)."""
    from graphc.runtime.session import Session

    proto = model.proto
    instrumented, steps = expose_intermediates(model)
    results = {b: tensors(Session(instrumented, backend=b, **options).run(feeds)) for b in backends}
    ref = results[backends[0]]
    compared = 0
    for node, names in steps:
        for key in (k for n in names for k in ref if k == n or k.startswith(f"{n}[")):
            compared += 1
            for b in backends[1:]:
                d = diff(key, b, ref[key], results[b].get(key, np.array([])), rtol, atol)
                if d.ok:
                    continue
                got = {backends[0]: ref[key], b: results[b].get(key)}
                del results  # the reference's values feed what follows; the others are not needed
                name, index, output = _origin(node, list(proto.graph.node).index(node), key)
                found = Divergence(node=name, index=None if name else index, op_type=node.op_type,
                                   source=node_source(node), output=output, backend=b, max_abs_err=d.max_abs_err,
                                   max_rel_err=d.max_rel_err, mismatched=d.mismatched)
                descent = _Descent(proto, _reference(proto, feeds, ref), [backends[0], b], rtol, atol, options)
                inner_compared, found = descent.enter(node, found, key, got)
                return compared + inner_compared, found
    return compared, None


def _origin(node: onnx.NodeProto, index: int, key: str) -> tuple[str, int, str]:
    """``node``'s name, index and the name of output ``key`` as the user wrote them (before inlining)."""
    tag = next((p.value for p in node.metadata_props if p.key == ORIGIN_KEY), None)
    if tag is None:
        return node.name, index, key
    name, index, outputs = json.loads(tag)
    for position, output in enumerate(node.output):
        if key == output or key.startswith(f"{output}["):
            key = outputs[position] + key[len(output):]
    return name, index, key


def _reference(proto: onnx.ModelProto, feeds: Mapping[str, Any], ref: dict[str, np.ndarray]) -> Values:
    initializers = {t.name: t for t in proto.graph.initializer}

    def value(name: str) -> np.ndarray | None:
        if name in ref:
            return ref[name]
        if name in feeds:
            return np.asarray(feeds[name])
        return numpy_helper.to_array(initializers[name]) if name in initializers else None
    return value


def outer_reads(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph``'s nodes (their subgraphs included) read from enclosing graphs, in first-use order."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
        {o for node in graph.node for o in node.output}
    reads: list[str] = []
    for node in graph.node:
        subgraphs = [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]
        for name in [*node.input, *(r for g in subgraphs for r in outer_reads(g))]:
            if name and name not in defined and name not in reads:
                reads.append(name)
    return reads


def standalone(proto: onnx.ModelProto, graph: onnx.GraphProto, inputs: Mapping[str, np.ndarray]) -> Model:
    """``graph`` as a model of ``proto``'s opsets and functions whose inputs are ``inputs``' names, typed
    by dtype only (a Loop's carries may change shape between iterations)."""
    copy = onnx.GraphProto()
    copy.CopyFrom(graph)
    del copy.input[:]
    copy.input.extend(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
                      for n, v in inputs.items())
    model = helper.make_model(copy, opset_imports=proto.opset_import, functions=proto.functions)
    model.ir_version = proto.ir_version
    return load(ir.serde.deserialize_model(model))  # the checker wants shapes this copy does not have


class _Descent:
    """Entering one divergent node: its reference values, the reference and the differing backend."""

    def __init__(self, proto: onnx.ModelProto, values: Values, backends: list[str], rtol: float | None,
                 atol: float | None, options: dict[str, Any]):
        self.proto, self.values, self.backends = proto, values, backends
        self.rtol, self.atol, self.options = rtol, atol, options

    def enter(self, node: onnx.NodeProto, found: Divergence, key: str,
              got: dict[str, np.ndarray | None]) -> tuple[int, Divergence]:
        """``found`` (at ``node``) made precise: the divergence inside its subgraph or function, or
        ``found`` itself with ``differs_alone`` or a note saying why bisect stops there."""
        functions = {(f.domain, f.name): f for f in self.proto.functions}
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type == "If":
            return self._if(node, found, key, got)
        if standard and node.op_type in ("Loop", "Scan"):
            return self._iterations(node, found)
        if (node.domain, node.op_type) in functions:
            return self._call(node, found, functions[(node.domain, node.op_type)])
        if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            found.differs_alone = self._differs_alone(node, key)
        else:
            found.inside, found.note = "subgraph", "bisect does not enter this op's subgraphs"
        return 0, found

    def _feeds(self, names: list[str]) -> tuple[dict[str, np.ndarray], str | None]:
        """The reference's values of ``names``, and the first name whose value is not a tensor."""
        feeds = {name: self.values(name) for name in names}
        return feeds, next((name for name, value in feeds.items() if value is None), None)

    @staticmethod
    def _cannot_enter(found: Divergence, inside: str, name: str) -> tuple[int, Divergence]:
        found.inside, found.note = inside, f"bisect cannot enter its {inside}: it reads {name!r}, which is not a tensor"
        return 0, found

    def _within(self, node: onnx.NodeProto, entered: str, inner: Divergence) -> Divergence:
        index = next(i for g in all_graphs(self.proto.graph) for i, n in enumerate(g.node) if n == node)
        name, index, _ = _origin(node, index, "")
        index = None if name else index
        inner.within.insert(0, Scope(node=name, index=index, op_type=node.op_type, source=node_source(node),
                                     entered=entered))
        return inner

    def _differs_alone(self, node: onnx.NodeProto, key: str) -> bool | None:
        from graphc.runtime.session import Session

        feeds, not_tensor = self._feeds([name for name in node.input if name])
        if not_tensor:
            return None
        graph = helper.make_graph([node], "alone", [], [onnx.ValueInfoProto(name=o) for o in node.output if o])
        model = standalone(self.proto, graph, feeds)
        ref, b = (tensors(Session(model, backend=x, **self.options).run(feeds)) for x in self.backends)
        return not diff(key, self.backends[1], ref[key], b.get(key, np.array([])), self.rtol, self.atol).ok

    def _if(self, node: onnx.NodeProto, found: Divergence, key: str,
            got: dict[str, np.ndarray | None]) -> tuple[int, Divergence]:
        from graphc.runtime.session import Session

        cond = self.values(node.input[0])
        branches = {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}
        taken, other = ("then_branch", "else_branch") if bool(cond) else ("else_branch", "then_branch")
        feeds, not_tensor = self._feeds(outer_reads(branches[taken]))
        if not_tensor:
            return self._cannot_enter(found, f"subgraph {taken}", not_tensor)
        model = standalone(self.proto, branches[taken], feeds)
        compared, inner = locate(model, feeds, self.backends, self.rtol, self.atol, self.options)
        if inner is not None:
            return compared, self._within(node, f"{taken} (cond {bool(cond)})", inner)
        found.note = (f"its {taken} (cond {bool(cond)}) agrees run alone on the reference's values, so the If "
                      "itself differs")
        position = next((i for i, o in enumerate(node.output) if o == key), None)
        other_feeds, not_tensor = self._feeds(outer_reads(branches[other]))
        if position is None or not_tensor:
            return compared, found
        runs = {}
        for branch, branch_feeds in ((taken, feeds), (other, other_feeds)):
            out = branches[branch].output[position].name
            runs[branch] = Session(standalone(self.proto, branches[branch], branch_feeds), backend=self.backends[0],
                                   **self.options).run(branch_feeds)[out]
        for backend, value in got.items():
            if value is not None and not self._agree(runs[taken], value) and self._agree(runs[other], value):
                found.note = f"{backend} took {other} although cond is {bool(cond)}: its output is what {other} gives"
        return compared, found

    def _agree(self, ref: np.ndarray, got: np.ndarray) -> bool:
        return diff("", "", ref, got, self.rtol, self.atol).ok

    def _iterations(self, node: onnx.NodeProto, found: Divergence) -> tuple[int, Divergence]:
        """The first iteration whose body outputs differ when every backend starts from the reference's
        carries, bisected."""
        from graphc.runtime.session import Session

        body = next(a.g for a in node.attribute if a.name == "body")
        outer, not_tensor = self._feeds(outer_reads(body))
        not_tensor = not_tensor or self._feeds([n for n in node.input if n])[1]
        if not_tensor:
            return self._cannot_enter(found, "subgraph body", not_tensor)
        steps = _loop_steps(node, self.values) if node.op_type == "Loop" else _scan_steps(node, self.values, self.proto)
        if isinstance(steps, str):
            found.inside, found.note = "subgraph body", steps
            return 0, found
        formal = [i.name for i in body.input]
        model, sessions, iteration = None, {}, -1
        carries = next(steps)
        while carries is not None:
            iteration += 1
            feeds = {**outer, **dict(zip(formal, carries))}
            if model is None:
                model = standalone(self.proto, body, feeds)
                sessions = {b: Session(model, backend=b, **self.options) for b in self.backends}
            ref, got = (tensors(sessions[b].run(feeds)) for b in self.backends)
            if not all(self._agree(ref[k], got.get(k, np.array([]))) for k in ref):
                compared, inner = locate(model, feeds, self.backends, self.rtol, self.atol, self.options)
                if inner is not None:
                    return compared, self._within(node, f"body, iteration {iteration}", inner)
                found.note = (f"the outputs of its body's iteration {iteration} differ, yet no value in it does "
                              "when they are exposed (a fusion or a kernel that is not deterministic)")
                return compared, found
            outputs = [ref.get(o.name) for o in body.output]
            carries = steps.send(outputs)
        found.note = (f"each of its {iteration + 1} iterations agrees run alone on the reference's carries, so "
                      f"the {node.op_type} itself differs (how it carries values or stacks scan outputs)")
        return 0, found

    def _call(self, node: onnx.NodeProto, found: Divergence, function: onnx.FunctionProto) -> tuple[int, Divergence]:
        called = f"function {function.domain}.{function.name}"
        feeds, not_tensor = self._feeds([n for n in node.input if n])
        if not_tensor:
            return self._cannot_enter(found, called, not_tensor)
        graph = helper.make_graph([node], "call", [], [onnx.ValueInfoProto(name=o) for o in node.output if o])
        graph.input.extend(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
                           for n, v in feeds.items())
        proto = helper.make_model(graph, opset_imports=self.proto.opset_import, functions=self.proto.functions)
        proto.ir_version = self.proto.ir_version
        for f in proto.functions:
            if (f.domain, f.name) == (function.domain, function.name):
                _tag(f)
        inlined = onnx.inliner.inline_selected_functions(proto, [(function.domain, function.name)], exclude=False)
        model = standalone(inlined, inlined.graph, feeds)
        compared, inner = locate(model, feeds, self.backends, self.rtol, self.atol, self.options)
        if inner is not None:
            return compared, self._within(node, called, inner)
        found.note = f"its {called}, inlined, agrees run alone on the reference's inputs"
        return compared, found


def _tag(function: onnx.FunctionProto) -> None:
    """Record on each of ``function``'s nodes its name, index and outputs, which inlining renames."""
    graph = helper.make_graph(function.node, function.name, [], [])
    for sub in all_graphs(graph):
        for index, node in enumerate(sub.node):
            kept = [p for p in node.metadata_props if p.key != ORIGIN_KEY]
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
            node.metadata_props.add(key=ORIGIN_KEY, value=json.dumps([node.name, index, list(node.output)]))
    del function.node[:]
    function.node.extend(graph.node)


def _loop_steps(node: onnx.NodeProto, values: Values):
    """A generator of a Loop body's inputs ([iteration, cond, *carries]) per iteration, sent the body's
    outputs of the one before (the reference's); None when the loop ends."""
    trip = int(values(node.input[0])) if node.input[0] else None
    cond = bool(values(node.input[1])) if len(node.input) > 1 and node.input[1] else True
    carries = [values(n) for n in node.input[2:]]

    def steps():
        nonlocal cond, carries
        iteration = 0
        while (trip is None or iteration < trip) and cond:
            outputs = yield [np.array(iteration, np.int64), np.array(cond), *carries]
            cond, carries = bool(outputs[0]), outputs[1:1 + len(carries)]
            iteration += 1
        yield None
    return steps()


def _scan_steps(node: onnx.NodeProto, values: Values, proto: onnx.ModelProto):
    """As ``_loop_steps`` for a Scan (opset 9 on): [*states, *scan input slices] per iteration."""
    if next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 21) < 9:
        return "bisect does not enter a Scan of opset 8 (its batch axis)"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    count = attrs["num_scan_inputs"]
    states = [values(n) for n in node.input[:len(node.input) - count]]
    xs = [values(n) for n in node.input[len(node.input) - count:]]
    axes = [a % x.ndim for a, x in zip(attrs.get("scan_input_axes", [0] * count), xs)]
    reverse = attrs.get("scan_input_directions", [0] * count)
    length = xs[0].shape[axes[0]]

    def steps():
        nonlocal states
        for t in range(length):
            slices = [np.take(x, length - 1 - t if r else t, axis=a) for x, a, r in zip(xs, axes, reverse)]
            outputs = yield [*states, *slices]
            states = outputs[:len(states)]
        yield None
    return steps()
