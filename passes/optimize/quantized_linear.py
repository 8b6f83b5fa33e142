"""Level 3's QDQ placement for onnxruntime's int8 Linear layers and pooling: a Gemm between
DequantizeLinears gets its float bias as int32 (onnxruntime then runs it as QGemm, also with a float
output, where it otherwise stays a float Gemm), and per-tensor QuantizeLinear/DequantizeLinear pairs
trade places with the views (Flatten, Reshape, Squeeze, Unsqueeze) that separate them from what they
quantize (``GlobalAveragePool -> Flatten -> QuantizeLinear`` runs as QLinearGlobalAveragePool, a
rank-3 Linear's ``DequantizeLinear -> Reshape -> Gemm`` as QGemm). A view moves integers as it moves
floats, so the swaps change no value."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.optimize.pipeline import Declared, all_nodes
from graphc.passes.optimize.rules import initializer
from graphc.passes.values import FAKE_QUANTIZE_KEY, fixed_array

__all__ = ["GemmBiasToInt32", "QDQThroughViews"]

_VIEWS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze"})
_INT8 = (ir.DataType.INT8, ir.DataType.UINT8)
_INT32_MAX = 2**31 - 1


def _onnx(node: ir.Node | None, *op_types: str) -> bool:
    return node is not None and node.domain in ("", "ai.onnx") and node.op_type in op_types


def _qparams(node: ir.Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A QuantizeLinear/DequantizeLinear's constant ``(scale, zero_point)`` (None when it has none), else None."""
    scale = fixed_array(node.inputs[1])
    has_zero = len(node.inputs) > 2 and node.inputs[2] is not None
    zero = fixed_array(node.inputs[2]) if has_zero else None
    return None if scale is None or (has_zero and zero is None) else (scale, zero)


def _per_tensor(node: ir.Node) -> bool:
    qparams = _qparams(node)
    return qparams is not None and qparams[0].size == 1 and (qparams[1] is None or qparams[1].size == 1)


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


class QDQThroughViews(Declared, ir.passes.InPlacePass):
    """``View(DequantizeLinear(q))`` -> ``DequantizeLinear(View(q))`` and ``QuantizeLinear(View(x))`` ->
    ``View(QuantizeLinear(x))``, per tensor, when the moved-past value has no other reader: the
    pair's int8 node then sits next to the op it quantizes, which onnxruntime's QDQ selectors need."""

    name = "QDQThroughViews"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            if node.graph is None:  # removed by an earlier swap in this pass
                continue
            if _onnx(node, *_VIEWS):
                dq = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
                if _onnx(dq, "DequantizeLinear") and _per_tensor(dq) and _single_use(dq.outputs[0]) \
                        and dq.graph is node.graph:
                    _swap(dq, node)
                    modified = True
            elif _onnx(node, "QuantizeLinear") and FAKE_QUANTIZE_KEY not in node.metadata_props \
                    and _per_tensor(node) and node.inputs[0] is not None:
                view = node.inputs[0].producer()
                if _onnx(view, *_VIEWS) and _single_use(node.inputs[0]) and view.graph is node.graph:
                    _swap(view, node)
                    modified = True
        return ir.passes.PassResult(model, modified)


def _swap(before: ir.Node, after: ir.Node) -> None:
    """``after(before(v, ...), ...)`` -> ``before(after(v, ...), ...)``, each node keeping its other
    inputs and attributes; ``after``'s output (name, type) is the new ``before``'s."""
    def copy(node: ir.Node, data: ir.Value) -> ir.Node:
        attrs = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        return ir.Node(node.domain, node.op_type, [data, *node.inputs[1:]], attrs, version=node.version,
                       metadata_props=dict(node.metadata_props))
    head = copy(after, before.inputs[0])
    tail = copy(before, head.outputs[0])
    ir.convenience.replace_nodes_and_values(after.graph, after, [before, after], [head, tail], after.outputs,
                                            tail.outputs)


class GemmBiasToInt32(Declared, ir.passes.InPlacePass):
    """``Gemm(DequantizeLinear(a), DequantizeLinear(B), C)`` with a constant float32 bias ``C`` of the
    output's N columns: ``C`` becomes ``DequantizeLinear(round(C / (sa * sb)), sa * sb)`` in int32, the
    bias QGemm adds to its int32 accumulator (onnxruntime's quantizer's rule: at most half of ``sa * sb``
    off, a small fraction of an output quantization step). ``a``: int8/uint8 per tensor; ``B``:
    int8/uint8 constant per tensor or per output feature (axis 0 under ``transB``, else 1; then so is the
    bias's scale); ``alpha = beta = 1``. A bias past int32 at that scale stays float."""

    name = "GemmBiasToInt32"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in all_nodes(model.graph):
            scale = _bias_scale(node) if _onnx(node, "Gemm") else None
            if scale is None:
                continue
            bias = fixed_array(node.inputs[2])
            q = np.round(bias.astype(np.float64) / scale.astype(np.float64))
            if np.abs(q).max(initial=0) > _INT32_MAX:
                continue
            graph, name = node.graph, node.inputs[2].name or "bias"
            attrs = [ir.AttrInt64("axis", 0)] if scale.size > 1 else []
            dq = ir.Node("", "DequantizeLinear", [initializer(graph, f"{name}_int32", q.astype(np.int32)),
                                                  initializer(graph, f"{name}_scale", scale),
                                                  initializer(graph, f"{name}_zero", np.zeros_like(scale, np.int32))],
                         attrs, metadata_props={})
            graph.insert_before(node, dq)
            node.replace_input_with(2, dq.outputs[0])
            modified = True
        return ir.passes.PassResult(model, modified)


def _bias_scale(gemm: ir.Node) -> np.ndarray | None:
    """The float32 int32 scale of ``gemm``'s bias (scalar, or [N] for a per-feature weight), or None
    where the class docstring's pattern does not hold."""
    if len(gemm.inputs) != 3 or gemm.inputs[2] is None or gemm.attributes.get_float("alpha", 1.0) != 1.0 \
            or gemm.attributes.get_float("beta", 1.0) != 1.0:
        return None
    a, b = (v.producer() if v is not None else None for v in gemm.inputs[:2])
    bias, weight = fixed_array(gemm.inputs[2]), fixed_array(b.inputs[0]) if _onnx(b, "DequantizeLinear") else None
    if not _onnx(a, "DequantizeLinear") or not _per_tensor(a) or a.inputs[0].dtype not in _INT8 \
            or weight is None or weight.ndim != 2 or b.inputs[0].dtype not in _INT8 or _qparams(b) is None \
            or bias is None or bias.dtype != np.float32:
        return None
    transposed = gemm.attributes.get_int("transB", 0)
    n = weight.shape[0 if transposed else 1]
    if bias.shape != (n,):
        return None
    sb = _qparams(b)[0]
    if sb.size > 1 and (sb.shape != (n,) or b.attributes.get_int("axis", 1) % 2 != (0 if transposed else 1)):
        return None
    scale = (_qparams(a)[0].reshape(()) * sb.reshape(-1)).astype(np.float32)
    scale = scale.reshape(()) if scale.size == 1 else scale
    return scale if np.all(np.isfinite(scale)) and np.all(scale >= np.finfo(np.float32).tiny) else None
