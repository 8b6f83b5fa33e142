"""bfloat16 nodes computed in float32 between Casts for onnxruntime's CPU provider, in a session's copy
of a model.

onnxruntime 1.31's CPU provider has bfloat16 kernels for moving data and for control flow only
(``KERNELS``, its ai.onnx ops whose type constraints list bfloat16 in
``onnxruntime.capi._pybind_state.get_all_opkernel_def()``), so it cannot load a model with a bfloat16
Add, MatMul or Relu ("Could not find an implementation for Add(14)"). For float16 it casts such a
node's inputs to float32 and its outputs back itself (its ``InsertCastTransformer``); the session's
copy does the same for bfloat16: each other node with a bfloat16 input or output reads its bfloat16
inputs cast to float32 and rounds each bfloat16 output once, as torch's CPU kernels compute
bfloat16 (and the numpy backend, whose ml_dtypes arithmetic rounds each op's float32 result). A
``dtype``/``to`` attribute that asks for bfloat16 (RandomNormal, EyeLike, Bernoulli) asks for float32
instead. Nodes in any graph (Loop and Scan bodies, If branches too).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from graphc.backends.written_out import Writer, replace_nodes
from graphc.model.file import ai_onnx_opset, all_graphs, tensor_types

__all__ = ["KERNELS", "lower"]

KERNELS = frozenset(
    "BitCast Cast Compress Concat Constant ConstantOfShape DynamicSlice Flatten Gather GatherElements GatherND "
    "Identity If IsInf IsNaN LayerNormalization Loop Optional OptionalGetElement OptionalHasElement "
    "RandomNormalLike RandomUniformLike Reshape ReverseSequence Scan Scatter ScatterElements ScatterND SequenceAt "
    "SequenceConstruct Shape Shrink Sign SimplifiedLayerNormalization Slice Split Squeeze TensorScatter Transpose "
    "Unsqueeze".split())  # Constant: onnxruntime makes it an initializer
_BF16, _F32 = TensorProto.BFLOAT16, TensorProto.FLOAT


def _asks_bfloat16(node: onnx.NodeProto) -> bool:
    return any(a.name in ("dtype", "to") and a.type == onnx.AttributeProto.INT and a.i == _BF16
               for a in node.attribute)


def lower(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when no node outside ``KERNELS`` reads or writes bfloat16, else a copy with
    each such node computed in float32 (the module docstring)."""
    graphs = list(all_graphs(model.graph))
    if not any(node.op_type not in KERNELS for graph in graphs for node in graph.node):
        return model
    types = tensor_types(model, subgraphs=True) or {}

    def narrow(name: str) -> bool:
        return bool(name) and types.get(name, (None,))[0] == _BF16

    def lowered(node: onnx.NodeProto) -> bool:
        return node.domain in ("", "ai.onnx") and node.op_type not in KERNELS and (
            any(map(narrow, [*node.input, *node.output])) or _asks_bfloat16(node))

    opset = ai_onnx_opset(model)

    def write(node: onnx.NodeProto) -> list[onnx.NodeProto]:
        w = Writer(node, "float32", opset)
        wide = onnx.NodeProto()
        wide.CopyFrom(node)
        wide.input[:] = [w.op("Cast", x, to=_F32) if narrow(x) else x for x in node.input]
        asks = _asks_bfloat16(node)
        wide.output[:] = [f"{w.prefix}{y}" if y and (asks or narrow(y)) else y for y in node.output]
        for a in wide.attribute:
            if asks and a.name in ("dtype", "to") and a.type == onnx.AttributeProto.INT and a.i == _BF16:
                a.i = _F32
        w.nodes.append(wide)
        for old, new in zip(node.output, wide.output):
            if old != new:
                w.op("Cast", new, to=_BF16, output=old)
        return w.nodes

    return replace_nodes(model, lowered, write)

