"""Autocast in an existing graph: ``generate(..., autocast=)``'s rewrite of an imported float32
model's training forward, with ``torch.autocast``'s dtype flow.

The nodes are walked in order, each value float32 or the low dtype (float16 / bfloat16), each node
as its op type's ``autocast_policy.onnx_kinds`` entry says:

* ``lower`` (MatMul, Gemm, Conv, ...): float inputs cast to the low dtype (params too: they stay
  float32 master weights, the gradient flows back through the Cast), outputs in the low dtype;
* ``fp32`` (the losses, ReduceProd; on CUDA also Softmax, Exp, Log, ReduceSum, ...): low inputs cast
  to float32, outputs float32;
* ``mixed`` (LayerNormalization, GroupNormalization, BatchNormalization): a low input with float32
  params is normalized in float32 and the result rounded to the low dtype, as torch's mixed kernels;
  the statistics stay float32;
* any other op (Relu, Add, Reshape, Transpose, Softmax on the CPU, MaxPool, Concat, ...) runs on what
  it is given: in the low dtype when its float inputs are (a 0-d float32 input, a scalar, does not
  widen it, as torch's type promotion), else in float32 with its low inputs cast up (the widest).

An op runs natively in the low dtype where its schema at the model's opset takes it for those inputs
and outputs; elsewhere (a scalar float32 operand, Conv on bfloat16 before opset 22, LayerNormalization's
float32 params) it computes in float32 on its inputs cast up and its result is rounded: torch's CPU
kernels for bfloat16 compute in float32 and round the result, so both give torch's values. Only the
outputs whose schema type is a low input's follow it (Shape's, Cast's, the norms' statistics do not).
torch's fused kernels round once where the graph has several nodes (``autocast_kernels``: linear's
MatMul + bias Add, written-out attention). A graph output in the low dtype is cast back to float32
under its name, so the loss and the update run in float32. One Cast per value and dtype.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from graphc.dsl.autocast_policy import FP32, LOWER, MIXED
from graphc.passes.precision.autocast_kernels import (ACCUMULATE, EPILOGUE, SCALE, SCORES, fused_roles, scalar,
                                                      take_place)
from graphc.passes.precision.casts import Casts
from graphc.passes.precision.slots import FLOAT, TARGETS, allows, by_domain, is_float, schema, standard
from graphc.passes.values import ancestors


def autocast_in_place(graph: ir.Graph, opsets: dict[str, int], dtype: str, kinds: dict[str, str],
                      loss: str | None = None) -> list[str]:
    """Rewrite the nodes of ``graph`` (its own; subgraphs read float32) with autocast's dtype flow,
    ``kinds`` the op types' classes (``autocast_policy.onnx_kinds``); returns the names of the nodes
    of ``lower`` kind so run. ``loss``: the graph output the nodes after the model compute (the
    loss); those nodes take float32, as torch's loss on ``out.float()``. Values must be typed."""
    opsets = by_domain(opsets)
    flow = _Flow(graph, TARGETS[dtype])
    lowered = frozenset(op for op, how in kinds.items() if how == LOWER)
    roles, flow.exact = fused_roles(graph, opsets.get("", 1), lowered)
    model = ancestors([v for v in graph.outputs if v.name != loss])
    done = []
    for node in list(graph):
        how = roles.get(node) or kinds.get(node.op_type)
        op_schema = schema(node, opsets) if node in model and standard(node) else None
        if op_schema is None:
            how = FP32
        if flow.run(node, op_schema, how):
            done.append(node.name)
    flow.outputs_to_float()
    return done


class _Flow:
    """The walk's state: the Casts made and the ids of the float32 values that hold a fused
    kernel's unrounded result (``exact``: kept float32 by the kernel's next node). Each method that
    rewrites a node takes its schema (``op_schema``), looked up once per node by ``autocast_in_place``."""

    def __init__(self, graph: ir.Graph, target: ir.DataType):
        self.graph, self.target = graph, target
        self.casts = Casts()
        self.exact: set[int] = set()

    def low(self, value: ir.Value | None) -> bool:
        return value is not None and isinstance(value.type, ir.TensorType) and value.dtype == self.target

    def run(self, node: ir.Node, op_schema: onnx.defs.OpSchema | None, how: str | None) -> bool:
        """Rewrite ``node`` as ``how`` says (a kind or a fused role); whether it is a lowered op."""
        floats = [i for i, v in enumerate(node.inputs) if is_float(v) or self.low(v)]
        lows = [i for i in floats if self.low(node.inputs[i])]
        if how == LOWER and floats:
            self._lower(node, op_schema, floats)
            return True
        if how in (ACCUMULATE, SCORES, EPILOGUE) and floats:
            for i in floats:  # a lowered op's float32 inputs and a bias read rounded, a kernel's own kept
                if how == ACCUMULATE or not (self.low(node.inputs[i]) or id(node.inputs[i]) in self.exact):
                    self._round_trip(node, i)
            self._up(node, floats)
            self._outputs(node, op_schema, floats, exact=how != EPILOGUE)
            return how == ACCUMULATE
        if not lows:
            return False
        if how == SCALE:
            self._up(node, lows)
            self._outputs(node, op_schema, floats, exact=True)
        elif how == FP32:
            self._up(node, lows)
        elif how == MIXED:
            if 0 in lows:
                self._up(node, lows)
                self._outputs(node, op_schema, [0], exact=False)
        elif any(is_float(node.inputs[i]) and not scalar(node.inputs[i]) for i in floats):
            self._up(node, lows)  # the widest: float32
        elif self._native(node, op_schema, floats, lows):
            for index in self._following(node, op_schema, lows):
                self._retype(node.outputs[index])
        else:
            self._up(node, lows)
            self._outputs(node, op_schema, lows, exact=False)
        return False

    def _lower(self, node: ir.Node, op_schema: onnx.defs.OpSchema | None, floats: list[int]) -> None:
        for i in floats:
            node.replace_input_with(i, self.casts.cast(node.inputs[i], self.target, self.graph, before=node))
        if self._takes(node, op_schema, floats):
            for index in self._following(node, op_schema, floats):
                self._retype(node.outputs[index])
        else:  # computes in float32 on the rounded inputs, its result rounded
            self._up(node, floats)
            self._outputs(node, op_schema, floats, exact=False)

    def _native(self, node: ir.Node, op_schema: onnx.defs.OpSchema | None, floats: list[int],
                lows: list[int]) -> bool:
        """Whether ``node`` runs as given in the low dtype: the float inputs of its low inputs'
        schema types are all low (no float32 scalar among them) and the schema takes them."""
        types = {_type_str(op_schema.inputs, i) for i in lows}
        same = [i for i in floats if _type_str(op_schema.inputs, i) in types]
        return all(self.low(node.inputs[i]) for i in same) and self._takes(node, op_schema, lows)

    def _takes(self, node: ir.Node, op_schema: onnx.defs.OpSchema | None, inputs: list[int]) -> bool:
        """Whether the schema lets these inputs and the outputs that follow them be the low dtype."""
        return op_schema is not None and all(allows(op_schema, False, i, self.target) for i in inputs) and \
            all(allows(op_schema, True, o, self.target) for o in self._following(node, op_schema, inputs))

    def _following(self, node: ir.Node, op_schema: onnx.defs.OpSchema | None, inputs: list[int]) -> list[int]:
        """The float outputs whose schema type is one of these inputs' (all float ones if unknown)."""
        floats = [o for o, v in enumerate(node.outputs) if is_float(v) or self.low(v)]
        if op_schema is None:
            return floats
        types = {_type_str(op_schema.inputs, i) for i in inputs}
        return [o for o in floats if _type_str(op_schema.outputs, o) in types]

    def _round_trip(self, node: ir.Node, index: int) -> None:
        value = node.inputs[index]
        low = value if self.low(value) else self.casts.cast(value, self.target, self.graph, before=node)
        node.replace_input_with(index, low)

    def _up(self, node: ir.Node, inputs: list[int]) -> None:
        for i in inputs:
            if self.low(node.inputs[i]):
                node.replace_input_with(i, self.casts.cast(node.inputs[i], FLOAT, self.graph, before=node))

    def _outputs(self, node: ir.Node, op_schema: onnx.defs.OpSchema | None, inputs: list[int], exact: bool) -> None:
        """The float32 outputs of ``node`` that follow ``inputs``: kept unrounded for a kernel's
        next node (``exact``) or rounded to the low dtype for every reader."""
        for index in self._following(node, op_schema, inputs):
            value = node.outputs[index]
            if exact:
                self.exact.add(id(value))
            else:
                cast = self.casts.cast(value, self.target, self.graph, after=node)
                take_place(self.graph, value, cast, "unrounded", readers="graph")

    def _retype(self, value: ir.Value) -> None:
        """``value`` made the low dtype; a subgraph reading it reads it cast to float32."""
        value.type = ir.TensorType(self.target)
        for use in list(value.uses()):
            if use.node.graph is not self.graph:
                use.node.replace_input_with(use.idx, self.casts.cast(value, FLOAT, self.graph, after=value.producer()))

    def outputs_to_float(self) -> None:
        """Each low graph output cast to float32, the float32 value under its name."""
        for value in list(self.graph.outputs):
            if self.low(value):
                back = self.casts.cast(value, FLOAT, self.graph, after=value.producer())
                take_place(self.graph, value, back, self.target.name.lower(), readers="none")


def _type_str(params, index: int) -> str | None:
    if not params:
        return None
    return params[min(index, len(params) - 1)].type_str
