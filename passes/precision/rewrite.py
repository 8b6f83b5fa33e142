"""The float32 -> float16/bfloat16 rewrite of a typed onnx-ir model, in place.

Every float32 tensor value takes the dtype its producer's schema gives it in half precision
(``slots``); initializers and Constants become half when any consumer takes half; then a Cast is
put wherever a consumer takes another dtype than its value has (a blocked node's float32 inputs
and outputs, Resize's scales) and before every graph output whose dtype is fixed (keep_io_types).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.precision.casts import Casts
from graphc.passes.precision.slots import (CONTROL_FLOW, DEFAULT_BLOCKED, FLOAT, TARGETS, allows, by_domain, is_float,
                                          schema, standard)
from graphc.passes.precision.tensors import narrow
from graphc.passes.values import subgraphs

# Ops whose output dtype is their own choice, not their inputs': kept float32 where only
# float32 consumers read them (a Cast to float feeding Range keeps integers above 2048 exact).
_SOURCES = frozenset({"Constant", "Cast"})
_DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")  # Cast, Random*/EyeLike/Bernoulli, DequantizeLinear


class RangeWarning(UserWarning):
    """Initializers or Constants held finite float32 values beyond the half type's range (clamped)."""


@dataclass
class FloatReport:
    """What ``convert_float`` did: ``blocked``: nodes kept in float32 by a block list (op type or
    name) or for lack of a schema; ``casts``: Cast nodes added; ``clamped``/``subnormal``/
    ``flushed``: per tensor, values clamped to the type's largest finite value / that became the
    type's subnormals (float16: magnitude below 6.1e-5, down to 6e-8) / non-zero values that
    became 0."""

    dtype: str
    converted: int = 0
    blocked: list[str] = field(default_factory=list)
    casts: int = 0
    clamped: dict[str, int] = field(default_factory=dict)
    subnormal: dict[str, int] = field(default_factory=dict)
    flushed: dict[str, int] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0


class _Rewrite:
    def __init__(self, model: ir.Model, target: ir.DataType, keep_io_types: bool,
                 op_block_list: frozenset[str], node_block_list: frozenset[str], report: FloatReport):
        self.model, self.target, self.keep_io = model, target, keep_io_types
        self.report = report
        self.opsets = by_domain(model.opset_imports)
        self.nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
        self.schemas = {node: schema(node, self.opsets) for node in self.nodes}
        self.blocked = {n for n in self.nodes if self._is_blocked(n, op_block_list, node_block_list)}
        self.casts = Casts()

    def _is_blocked(self, node: ir.Node, ops: frozenset[str], names: frozenset[str]) -> bool:
        named = (standard(node) and node.op_type in ops) or node.name in names
        if named and standard(node) and node.op_type in CONTROL_FLOW:
            raise PassError(f"{node.op_type} node {node.name!r} cannot be kept in float32 as a whole: "
                            "block the nodes inside its body instead")
        values = [v for v in (*node.inputs, *node.outputs) if v is not None]
        sequence = any(not isinstance(v.type, ir.TensorType) and v.dtype == FLOAT for v in values)
        return named or sequence or self.schemas[node] is None

    def want(self, node: ir.Node, outputs: bool, index: int) -> ir.DataType:
        """The dtype input (output) ``index`` of ``node`` takes for a float32 value."""
        if node in self.blocked:
            return FLOAT
        if node.op_type in CONTROL_FLOW and standard(node):
            return self.target
        return self.target if allows(self.schemas[node], outputs, index, self.target) else FLOAT

    def run(self) -> None:
        self.report.blocked = sorted(f"{n.op_type} {n.name!r}" for n in self.blocked if _floats(n))
        self.report.converted = sum(1 for n in self.nodes if n not in self.blocked and _floats(n))
        new = self._new_dtypes()
        for node in self.nodes:
            if node not in self.blocked and any(new.get(out) == self.target for out in node.outputs[:1]):
                self._convert_attributes(node)
        for value, dtype in new.items():
            if dtype == self.target:
                self._retype(value)
        for node in self.nodes:
            for index, value in enumerate(node.inputs):
                if value is not None and value in new:
                    wanted = self.want(node, False, index)
                    if wanted != new[value]:
                        node.replace_input_with(index, self._cast(value, wanted, node.graph, node))
        for graph in [self.model.graph, *(g for n in self.nodes for g in subgraphs(n))]:
            self._fix_outputs(graph, new)
        self._warn_range()

    def _new_dtypes(self) -> dict[ir.Value, ir.DataType]:
        """Each float32 tensor value's dtype in the converted model."""
        main = self.model.graph
        io = FLOAT if self.keep_io else self.target
        new: dict[ir.Value, ir.DataType] = {}
        for graph in [main, *(g for n in self.nodes for g in subgraphs(n))]:
            for value in [*graph.inputs, *graph.initializers.values()]:
                if is_float(value):
                    new[value] = io if graph is main and value in main.inputs else (
                        self.target if value in graph.inputs else self._shared(value, graph is main))
        for node in self.nodes:
            for index, value in enumerate(node.outputs):
                if is_float(value):
                    new[value] = self._shared(value, node.graph is main) if node.op_type in _SOURCES \
                        else self.want(node, True, index)
        return new

    def _shared(self, value: ir.Value, in_main: bool) -> ir.DataType:
        """A constant's dtype: the target if any consumer (or a graph output) takes it, else float32."""
        if value.is_graph_output():
            return (FLOAT if self.keep_io else self.target) if in_main else self.target
        wants = {self.want(use.node, False, use.idx) for use in value.uses()}
        return self.target if self.target in wants or not wants else FLOAT

    def _retype(self, value: ir.Value) -> None:
        value.type = ir.TensorType(self.target)
        if value.const_value is not None:
            value.const_value = self._narrow(value.const_value, value.name)

    def _narrow(self, tensor: ir.TensorProtocol, name: str) -> ir.Tensor:
        done = narrow(tensor, self.target, name)
        for counts, count in ((self.report.clamped, done.clamped), (self.report.subnormal, done.subnormal),
                              (self.report.flushed, done.flushed)):
            if count:
                counts[name] = count
        return done.tensor

    def _convert_attributes(self, node: ir.Node) -> None:
        """A node that makes float32 makes the target instead: its dtype attributes (given or
        defaulted to float) and its float32 tensor attributes (Constant, ConstantOfShape)."""
        op_schema = self.schemas[node]
        for name in _DTYPE_ATTRIBUTES:
            if name in op_schema.attributes:
                given = node.attributes.get(name)
                default = op_schema.attributes[name].default_value
                current = given.as_int() if given is not None else (default.i if default.HasField("i") else None)
                if current == FLOAT:
                    node.attributes[name] = ir.AttrInt64(name, self.target)
        if node.op_type in _SOURCES:
            for name in ("value_float", "value_floats"):
                if name in node.attributes:
                    value = node.attributes.pop(name).value
                    node.attributes["value"] = ir.AttrTensor("value", ir.tensor(value, dtype=FLOAT))
        tensor_attr = node.attributes.get("value")
        label = node.name or node.outputs[0].name
        if tensor_attr is not None and tensor_attr.as_tensor().dtype == FLOAT:
            node.attributes["value"] = ir.AttrTensor("value", self._narrow(tensor_attr.as_tensor(), label))
        elif tensor_attr is None and node.op_type == "ConstantOfShape":  # the default is a float32 0
            node.attributes["value"] = ir.AttrTensor("value", ir.tensor([0], dtype=self.target))

    def _cast(self, value: ir.Value, to: ir.DataType, graph: ir.Graph, before: ir.Node | None) -> ir.Value:
        """``value`` cast to ``to`` in ``graph`` (one Cast per value, dtype and graph)."""
        out = self.casts.cast(value, to, graph, before)
        self.report.casts = self.casts.count
        return out

    def _fix_outputs(self, graph: ir.Graph, new: dict[ir.Value, ir.DataType]) -> None:
        """Graph outputs in the dtype the interface fixes: the main graph's float32 with
        keep_io_types, else the target; a subgraph's the target (its node's outputs are)."""
        main = graph is self.model.graph
        wanted = FLOAT if (main and self.keep_io) else self.target
        for index, value in enumerate(graph.outputs):
            if value not in new or new[value] == wanted:
                continue
            name = value.name
            if main:  # the output keeps its name; the value feeding the Cast takes another
                if value.name in graph.initializers:
                    graph.initializers.pop(value.name)
                    value.name = f"{name}_{new[value].name.lower()}"
                    graph.register_initializer(value)
                else:
                    value.name = f"{name}_{new[value].name.lower()}"
            out = self._cast(value, wanted, graph, None)
            if main:
                out.name = name
            graph.outputs[index] = out

    def _warn_range(self) -> None:
        if self.report.clamped:
            items = ", ".join(f"{name!r} ({count})" for name, count in sorted(self.report.clamped.items()))
            flushed = sum(self.report.flushed.values())
            warnings.warn(RangeWarning(
                f"{sum(self.report.clamped.values())} finite float32 values beyond {self.report.dtype}'s range "
                f"were clamped to its largest finite value, in {items}"
                + (f"; {flushed} non-zero values became 0" if flushed else "")), stacklevel=5)


def _floats(node: ir.Node) -> bool:
    return any(is_float(v) for v in (*node.inputs, *node.outputs))


def convert_in_place(model: ir.Model, dtype: str, keep_io_types: bool = False,
                     op_block_list=None, node_block_list=(), report: FloatReport | None = None) -> FloatReport:
    """Convert ``model`` (float32 values typed: run shape inference first) to ``dtype``
    ("float16" or "bfloat16") in place. ``op_block_list`` None: ``DEFAULT_BLOCKED``."""
    report = report or FloatReport(dtype)
    ops = DEFAULT_BLOCKED if op_block_list is None else frozenset(op_block_list)
    _Rewrite(model, TARGETS[dtype], keep_io_types, ops, frozenset(node_block_list), report).run()
    return report
