"""Level 3's fake quantization export: each ``gc.fake_quantize_*`` QuantizeLinear + DequantizeLinear lowering
as the plain QDQ pair that onnxruntime's QDQ optimizer turns into int8 kernels (QLinearConv, QLinearMatMul)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.optimize.pipeline import Declared, all_nodes
from graphc.passes.values import FAKE_QUANTIZE_KEY, fixed_array

__all__ = ["FakeQuantizeToQDQ"]


class FakeQuantizeToQDQ(Declared, ir.passes.InPlacePass):
    """The nodes marked ``FAKE_QUANTIZE_KEY``: the straight-through Add (``"output"``) gives way to its
    value, the per-channel overflow Where (``"overflow"``) to the DequantizeLinear's value (torch's x86 int64
    overflow sends NaN and ``x / scale >= 2**63`` to ``quant_min``, int8 kernels saturate them), and the
    QuantizeLinear of ``x * inv`` with scale 1 (``"quantize"``) quantizes ``x`` by the constant scale of the
    DequantizeLinear reading it, when ``inv`` is the constant ``1 / scale``: the pattern QDQ fusions need,
    with nothing between a Conv/MatMul and the QuantizeLinear of its output. ``x / scale`` and torch's
    ``x * (1 / scale)`` round apart in the last bit for a few values, which then land one integer (one
    quantization step) apart. Run after constant folding has made the scales constant; a weight's pair
    was folded to an int8 weight (torch's rounding) and its DequantizeLinear, which is never folded."""

    name = "FakeQuantizeToQDQ"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            mark = node.metadata_props.get(FAKE_QUANTIZE_KEY)
            if mark in ("output", "overflow"):
                _forward(node, node.inputs[0 if mark == "output" else 2])
                modified = True
            elif mark == "quantize" and _quantize_by_scale(node):
                del node.metadata_props[FAKE_QUANTIZE_KEY]
                modified = True
        return ir.passes.PassResult(model, modified)


def _forward(node: ir.Node, value: ir.Value) -> None:
    """``node`` replaced by an Identity of ``value`` (identity elimination then removes it)."""
    identity = ir.Node("", "Identity", [value], metadata_props={})
    ir.convenience.replace_nodes_and_values(node.graph, node, [node], [identity], node.outputs, identity.outputs)


def _quantize_by_scale(q: ir.Node) -> bool:
    product, one, zero = q.inputs[:3]
    mul = product.producer() if product is not None else None
    readers = [use.node for use in q.outputs[0].uses()]
    if mul is None or mul.op_type != "Mul" or fixed_array(one) is None or np.any(fixed_array(one) != 1) \
            or not readers or q.outputs[0].is_graph_output():
        return False
    scale = readers[0].inputs[1]
    sc = fixed_array(scale)
    if sc is None or any(r.op_type != "DequantizeLinear" or r.inputs[1] is not scale or r.inputs[2] is not zero
                         for r in readers):
        return False
    for pos in (0, 1):
        inv = fixed_array(mul.inputs[pos])
        if inv is not None and inv.size == sc.size and inv.dtype == sc.dtype \
                and np.array_equal(inv.reshape(-1), np.reciprocal(sc.reshape(-1))):
            q.replace_input_with(0, mul.inputs[1 - pos])
            q.replace_input_with(1, scale)
            return True
    return False
