"""A graph cut at its data-parallel exchanges (``EXCHANGE_KEY`` Identities), for a staged run:
every worker runs stage k on its shard, the values the exchanges after stage k read are
exchanged across the workers, then stage k + 1 runs.

A node's stage is the highest of its inputs' (0 for graph inputs and initializers), where an
exchange's output counts one past its input's. Stage k is a model of its own: inputs the
graph inputs it reads and the values earlier stages or exchanges made (named as in the whole
graph), outputs what later stages, exchanges or the graph's outputs read of its values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from graphc.passes.values import exchange_kind, subgraphs


@dataclass
class Exchange:
    """An exchange after a stage: ``source`` (each worker's value) in, ``target`` out; ``kind``
    ``"gather"`` or ``"gather_grad"`` (``EXCHANGE_KEY``)."""

    source: str
    target: str
    kind: str


@dataclass
class Stage:
    """One stage: its ``model`` (None when it runs no node), the ``exchanges`` after it."""

    model: ir.Model | None
    exchanges: list[Exchange] = field(default_factory=list)


def split(model: ir.Model) -> list[Stage]:
    """``model`` cut at its exchanges (module docstring); ``model`` is not changed. A
    graph without any is one stage."""
    model = model.clone()
    graph = model.graph
    graph.sort()
    level: dict[ir.Value, int] = {}
    placed: list[tuple[ir.Node, int]] = []
    for node in graph:
        at = max((level.get(v, 0) for v in _reads(node)), default=0)
        kind = exchange_kind(node)
        for out in node.outputs:
            level[out] = at + (kind is not None)
        placed.append((node, at))
    count = 1 + max((at for _, at in placed), default=0)
    stages = [Stage(None) for _ in range(count)]
    for node, at in placed:
        kind = exchange_kind(node)
        if kind is not None:
            stages[at].exchanges.append(Exchange(node.inputs[0].name, node.outputs[0].name, kind))
    for k in range(count):
        mine = {i for i, (node, at) in enumerate(placed) if at == k and exchange_kind(node) is None}
        if mine:
            stages[k].model = _stage_model(model, mine)
    return stages


def _reads(node: ir.Node) -> Iterator[ir.Value]:
    """The values ``node`` reads: its inputs and the outer values its subgraphs read."""
    yield from (v for v in node.inputs if v is not None)
    for sub in subgraphs(node):
        for inner in ir.traversal.RecursiveGraphIterator(sub):
            yield from (v for v in inner.inputs if v is not None and _owner(v) is node.graph)


def _owner(value: ir.Value) -> ir.Graph | None:
    producer = value.producer()
    return producer.graph if producer is not None else value.graph


def _stage_model(model: ir.Model, mine: set[int]) -> ir.Model:
    """The model of the nodes at positions ``mine`` of ``model`` (sorted), cut out of a copy."""
    stage = model.clone()
    graph = stage.graph
    nodes = list(graph)
    own = [nodes[i] for i in sorted(mine)]
    made = {v for n in own for v in n.outputs}
    inputs, seen = [], set()
    for node in own:
        for value in _reads(node):
            if value in made or value in seen or (value.is_initializer() and not value.is_graph_input()):
                continue
            seen.add(value)
            if value.is_graph_input():
                inputs.append(value)
                continue
            fed = ir.Value(name=value.name, type=value.type, shape=value.shape)
            value.replace_all_uses_with(fed)
            seen.add(fed)
            inputs.append(fed)
    rest = [n for i, n in enumerate(nodes) if i not in mine]
    later = {v.name for n in rest for v in _reads(n)} | {v.name for v in graph.outputs}
    outputs = [v for v in made if v.name in later]
    graph.remove(rest, safe=False)
    graph.inputs.clear()
    graph.inputs.extend(inputs)
    graph.outputs.clear()
    graph.outputs.extend(sorted(outputs, key=lambda v: v.name))
    RemoveUnusedNodesPass()(stage)
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_input():
            graph.initializers.pop(name)
    return stage
