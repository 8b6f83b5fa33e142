"""The sizing inputs of a model's value-sized main-graph nodes, computed on the numpy kernels for a
run whose shape inference could not find those nodes' outputs (a ConstantOfShape of a size read
off a NonZero's output, an Expand to a shape a data-dependent Reshape made), so that
``max_tensor_bytes`` bounds them before an onnxruntime run too (``value_sized.ShapePrepass``).

Only the nodes those inputs need run (their cone: usually a few small ones, Shape, Gather, Concat,
arithmetic on int64s), under the same bound; an input whose shape alone matters (``SHAPE_ONLY``:
an Expand's data) is computed only where shape inference did not find its shape. The values then
go through the numpy backend's own check (``backends/numpy/sizes.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from graphc.backends.numpy import sizes
from graphc.backends.numpy.interpreter import Plan, Step
from graphc.backends.numpy.kernels import lookup, normalize_domain
from graphc.backends.value_sized import SHAPE_ONLY, is_value_sized
from graphc.errors import BackendError
from graphc.model import node_label
from graphc.model.file import with_body_output_shapes
from graphc.model.graphs import reads

_RNG = np.random.default_rng(0)  # for a random op in a cone, whose values no size reads


class SizeCones:
    """The value-sized nodes of ``model``'s main graph, checked from their inputs' values."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
        self.opsets.setdefault("", 1)
        self.functions = {(normalize_domain(f.domain), f.name): f for f in model.functions}
        self.producer = {out: node for node in model.graph.node for out in node.output if out}
        self.nodes: dict[int, Step] = {}
        self.unchecked: list[tuple[str, str]] = []
        for index, node in enumerate(model.graph.node):
            if not is_value_sized(node):
                continue
            lacking = sorted({n.op_type for n in self._cone(node.input) if not self._runs(n)})
            if lacking:
                self.unchecked.append((node_label(node.name, index), "its sizing inputs need "
                                       f"{', '.join(lacking)}, which the numpy kernels do not run"))
            else:
                self.nodes[index] = Step(node, index, self.opsets, self.functions)
        self._plans: dict[frozenset[str], Plan] = {}

    def check(self, misses: Sequence[tuple[int, Mapping[str, tuple]]], feeds: Mapping[str, np.ndarray],
              limit: int) -> None:
        """``TensorTooLarge`` if a node of ``misses`` ((index, {input: (shape, dtype)} where shape
        inference found them)) would make a tensor over ``limit`` bytes for ``feeds``."""
        misses = [(index, self.nodes[index], known) for index, known in misses if index in self.nodes]
        stand_ins, wanted = {}, set()
        for _, step, known in misses:
            for k, name in enumerate(step.inputs):
                if name and name in known and k in SHAPE_ONLY.get(step.op, ()):
                    shape, dtype = known[name]
                    stand_ins[name] = np.broadcast_to(np.zeros((), dtype), shape)  # no memory of its own
                elif name:
                    wanted.add(name)
        values = self._values(frozenset(wanted), feeds, limit) if wanted else {}
        for index, step, _ in misses:
            args = [values[n] if n in values else stand_ins.get(n) for n in step.inputs]
            sizes.check(step.size, node_label(step.node.name, index), step.op, args, step.attrs, limit)

    def _values(self, wanted: frozenset[str], feeds: Mapping[str, np.ndarray], limit: int) -> dict:
        plan = self._plans.get(wanted)
        if plan is None:
            plan = self._plans[wanted] = self._plan(wanted)
        try:
            with np.errstate(all="ignore"):
                return plan.run(feeds, sorted(wanted), _RNG, max_tensor_bytes=limit)
        except BackendError as exc:
            raise BackendError(f"the sizes of the model's value-sized nodes could not be computed before the "
                               f"run, to bound them (max_tensor_bytes): {exc}") from None

    def _plan(self, wanted: frozenset[str]) -> Plan:
        """A numpy plan of the nodes ``wanted`` needs, with the initializers they read."""
        cone = self._cone(wanted)
        graph = self.model.graph
        reads = {n for node in cone for n in node.input} | wanted
        sub = onnx.helper.make_graph(
            cone, graph.name, list(graph.input), [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in wanted],
            [t for t in graph.initializer if t.name in reads])
        sub.sparse_initializer.extend(s for s in graph.sparse_initializer if s.values.name in reads)
        model = onnx.ModelProto(ir_version=self.model.ir_version, opset_import=self.model.opset_import, graph=sub)
        return Plan(with_body_output_shapes(model).graph, self.opsets, functions=self.functions)

    def _cone(self, names) -> list[onnx.NodeProto]:
        """The main-graph nodes that ``names`` need, in graph order."""
        needed, stack = {}, [n for n in names if n]
        while stack:
            node = self.producer.get(stack.pop())
            if node is not None and id(node) not in needed:
                needed[id(node)] = node
                stack.extend(reads(node))
        return [node for node in self.model.graph.node if id(node) in needed]

    def _runs(self, node: onnx.NodeProto) -> bool:
        domain = normalize_domain(node.domain)
        return domain in self.opsets and ((domain, node.op_type) in self.functions
                                          or lookup(node.op_type, self.opsets[domain], domain) is not None)

