"""float16 and bfloat16 nodes computed in float32 between Casts for onnxruntime's CPU provider, in a
session's copy of a model.

onnxruntime 1.31's CPU provider has narrow-float kernels for moving data and for control flow, and
for float16 a few more (``KERNELS``: its ai.onnx ops whose type constraints list the dtype in
``onnxruntime.capi._pybind_state.get_all_opkernel_def()`` of the CPU-only wheel, from the op version
given). A bfloat16 Add, MatMul or Relu does not load ("Could not find an implementation for
Add(14)"). A float16 one loads: its ``InsertCastTransformer`` casts the node's inputs to float32 and
its outputs back, then its ``RemoveDuplicateCastTransformer`` drops each pair of Casts one of which
it inserted (named ``InsertedPrecisionFreeCast_``), the model's own Cast(float32 -> float16) before
the node too: values stay float32 through every such run of nodes, at any optimization level
(under float16 autocast a Linear's output from an input of 1e5 was -1.3e4, not -inf).
A pair of Casts the model holds is kept. So the session's copy writes them: each other node with a
narrow input or output reads its narrow inputs cast to float32 and rounds each narrow output
once, as torch's CPU kernels compute float16 and bfloat16 (and the numpy backend, whose
arithmetic rounds each op's float32 result). A ``dtype``/``to`` attribute that asks for a narrow
dtype (RandomNormal, EyeLike, Bernoulli) asks for float32 instead. Nodes in any graph (Loop and
Scan bodies, If branches too).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from graphc.backends import selects
from graphc.backends.written_out import Writer, replace_nodes
from graphc.model.file import ai_onnx_opset, all_graphs
from graphc.model.inferred import TypesOf, tensor_types

__all__ = ["KERNELS", "lower", "lower_for_cpu"]

_BOTH = dict.fromkeys(
    "BitCast Cast Compress Concat Constant ConstantOfShape DynamicSlice Flatten Gather GatherElements GatherND "
    "Identity If LayerNormalization Loop Optional OptionalGetElement OptionalHasElement RandomNormalLike "
    "RandomUniformLike Reshape ReverseSequence Scan Scatter ScatterElements ScatterND SequenceAt "
    "SequenceConstruct Shape Shrink Sign SimplifiedLayerNormalization Slice Split Squeeze TensorScatter Transpose "
    "Unsqueeze".split(), 1)  # Constant: onnxruntime makes it an initializer
_BF16, _F16, _F32 = TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT
# dtype -> op type -> the first ai.onnx opset whose version of the op has a CPU kernel for it (1: every
# version); float16 Dropout has one before opset 12 only, and runs in float32 (one rounding either way)
KERNELS = {
    _BF16: {**_BOTH, "IsInf": 20, "IsNaN": 20},
    _F16: {**_BOTH, **dict.fromkeys("Attention Expand IsNaN Mod RMSNormalization RotaryEmbedding Round "
                                    "SplitToSequence".split(), 1),
           "Clip": 12, "Max": 12, "Min": 12, "IsInf": 20, "DequantizeLinear": 19, "QuantizeLinear": 19},
}


def _asked(node: onnx.NodeProto) -> int | None:
    """The narrow dtype a ``dtype``/``to`` attribute of ``node`` asks for; None where none does."""
    return next((a.i for a in node.attribute if a.name in ("dtype", "to") and a.type == onnx.AttributeProto.INT
                 and a.i in KERNELS), None)


def lower(model: onnx.ModelProto, types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """``model`` itself when every node that reads or writes float16 or bfloat16 has a kernel for it
    (``KERNELS``), else a copy with each other such node computed in float32 (the module docstring).
    ``types_of``: how it gets ``tensor_types`` (``SharedTypes`` along a session's rewrites)."""
    opset = ai_onnx_opset(model)
    kernels = {dtype: frozenset(op for op, first in ops.items() if opset >= first) for dtype, ops in KERNELS.items()}
    if all(node.op_type in kernels[_F16] and node.op_type in kernels[_BF16]
           for graph in all_graphs(model.graph) for node in graph.node):
        return model
    types = types_of(model, subgraphs=True) or {}

    def narrow(name: str) -> int | None:
        dtype = types.get(name, (None,))[0] if name else None
        return dtype if dtype in KERNELS else None

    def lowered(node: onnx.NodeProto) -> bool:
        dtypes = {*map(narrow, [*node.input, *node.output]), _asked(node)} - {None}
        return node.domain in ("", "ai.onnx") and any(node.op_type not in kernels[d] for d in dtypes)

    def write(node: onnx.NodeProto) -> list[onnx.NodeProto]:
        w = Writer(node, "float32", opset)
        wide = onnx.NodeProto()
        wide.CopyFrom(node)
        wide.input[:] = [w.op("Cast", x, to=_F32) if narrow(x) else x for x in node.input]
        asked = _asked(node)
        wide.output[:] = [f"{w.prefix}{y}" if y and (asked or narrow(y)) else y for y in node.output]
        for a in wide.attribute:
            if asked and a.name in ("dtype", "to") and a.type == onnx.AttributeProto.INT and a.i == asked:
                a.i = _F32
        w.nodes.append(wide)
        for old, new in zip(node.output, wide.output):
            if old != new:
                w.op("Cast", new, to=narrow(old) or asked, output=old)
        return w.nodes

    return replace_nodes(model, lowered, write)


def lower_for_cpu(model: onnx.ModelProto, types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """``lower`` of ``selects.as_ifs(model)``: what onnxruntime's CPU provider is given, in an ort-cpu
    session's copy and in the file of a Triton CPU instance (``graphc.serving.deploy``) alike. Wheres
    as Ifs first (-0.0 kept): ``lower``'s float32 Where between Casts has no declared shapes for
    ``as_ifs`` to read, and onnxruntime's float32 Where returns a -0.0 taken from X as +0.0."""
    return lower(selects.as_ifs(model), types_of)
