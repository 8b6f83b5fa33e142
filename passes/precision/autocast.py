"""Autocast in an existing graph: ``generate(..., autocast=)``'s rewrite of an imported float32
model's training forward, as ``torch.autocast`` runs it.

Each node whose op type the caller lists (``autocast_policy.onnx_lower``: MatMul, Gemm, Conv, ...)
reads its float32 inputs cast to the low dtype (float16 / bfloat16), params included (they stay
float32 master weights: the gradient flows back through the Cast to them), and its outputs are cast
back to float32 at once, so everything else (softmax, norms, reductions, the loss, the update) runs
in float32. Where the op's schema at the model's opset takes no low dtype (Conv and ConvTranspose on
bfloat16 before opset 22) it computes in float32 between round trips (inputs cast to the low dtype
and back, its output too): the same values as a low-precision kernel that accumulates in float32,
as torch's CPU kernels and graphc's DSL capture compute them. One Cast per value and dtype.

Attention written out (torch.onnx's form of scaled_dot_product_attention: MatMul(q, k^T), scaled,
masked, Softmax, MatMul with v) computes as torch's fused kernel: the scores' MatMul reads q and k
rounded to the low dtype but its float32 result is not rounded (scores rounded to bfloat16 moved
a transformer block's gradients 4e-3 from torch autocast's, as far as float32's are), the Softmax
runs in float32 and the MatMul with v reads the probabilities in the low dtype.
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.passes.precision.casts import Casts
from graphc.passes.precision.slots import FLOAT, TARGETS, allows, schema


def autocast_in_place(graph: ir.Graph, opsets: dict[str, int], dtype: str, ops: frozenset[str]) -> list[str]:
    """Run the standard-domain nodes of ``graph`` (its own, not subgraphs') whose op type is in
    ``ops`` in ``dtype``; returns the names of the nodes so rewritten. Values must be typed."""
    target = TARGETS[dtype]
    casts = Casts()
    done = []
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
            continue
        inputs = [i for i, v in enumerate(node.inputs) if _is_float(v)]
        outputs = [v for v in node.outputs if _is_float(v)]
        if not inputs:
            continue
        scores = _attention_scores(node)
        native = not scores and _takes(node, opsets, target, inputs, len(node.outputs))
        for index in inputs:
            low = casts.cast(node.inputs[index], target, graph, before=node)
            node.replace_input_with(index, low if native else casts.cast(low, FLOAT, graph, before=node))
        for value in [] if scores else outputs:
            _back_to_float(graph, node, value, target, native, casts)
        done.append(node.name)
    return done


# what may lie between attention's scores MatMul and its Softmax: the scale, an additive or boolean mask
_SCORE_STEPS = frozenset({"Mul", "Div", "Add", "Sub", "Where"})


def _attention_scores(node: ir.Node) -> bool:
    """Whether ``node`` is a MatMul whose result reaches a Softmax (and nothing else) through
    scaling and masking alone."""
    value = node.outputs[0] if node.op_type == "MatMul" else None
    while value is not None and len(value.uses()) == 1 and not value.is_graph_output():
        user = next(iter(value.uses())).node
        if user.op_type == "Softmax":
            return True
        value = user.outputs[0] if user.op_type in _SCORE_STEPS else None
    return False


def _takes(node: ir.Node, opsets: dict[str, int], target: ir.DataType, inputs: list[int], outputs: int) -> bool:
    """Whether the op's schema at this opset lets these inputs and its outputs be ``target``."""
    op_schema = schema(node, {("" if d == "ai.onnx" else d): v for d, v in opsets.items()})
    return op_schema is not None and all(allows(op_schema, False, i, target) for i in inputs) and \
        all(allows(op_schema, True, i, target) for i in range(outputs))


def _back_to_float(graph: ir.Graph, node: ir.Node, value: ir.Value, target: ir.DataType, native: bool,
                   casts: Casts) -> None:
    """``value`` (a float32 output of ``node``) made ``target`` (or rounded to it), then float32 again
    for its consumers; the float32 value keeps its name (graph outputs and passes find it by name)."""
    name, uses = value.name, list(value.uses())
    value.name = f"{name}_{target.name.lower()}" if native else f"{name}_unrounded"
    if native:
        value.type = ir.TensorType(target)
    low = value if native else casts.cast(value, target, graph, after=node)
    back = casts.cast(low, FLOAT, graph, after=low.producer())
    for use in uses:
        use.node.replace_input_with(use.idx, back)
    for index, output in enumerate(graph.outputs):
        if output is value:
            graph.outputs[index] = back
    back.name = name


def _is_float(value: ir.Value | None) -> bool:
    return value is not None and isinstance(value.type, ir.TensorType) and value.dtype == FLOAT
