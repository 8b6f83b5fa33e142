"""Convs whose weight is fed at run time, moved onto onnxruntime's NCHWc kernels (CPU provider).

onnxruntime runs a Conv on its fast blocked-layout (NCHWc) kernels only when the weight is a
constant: its layout transformer (``graph_optimization_level="all"``) reorders the weight once,
as the session is built. A training graph's weights are inputs, fed every step, so its Convs,
forward and input gradients alike, run on the generic kernel (an im2col and a GEMM per image, a
tiny product per image and channel for a depthwise conv). ``rewrite`` gives such a Conv those
kernels anyway, the weight reordered inside the graph, so every run reads the weight it is fed:

    ReorderInput(x) -> com.microsoft.nchwc Conv(x, W reordered by Transpose + Gather) -> ReorderOutput

The ops of domain com.microsoft.nchwc are onnxruntime's own (the ones its transformer writes);
``rewrite`` runs on the session's copy of the model, so what graphc saves stays standard ONNX.
A Conv is rewritten where those kernels measured faster than the generic one, reorders
included (``scripts/bench_lowerings.py --only nchwc``, 2 threads, ms, generic vs NCHWc): a
depthwise Conv of more than one tap, at any size (N=32: 96ch 3x3 stride 2 on 64x64 9.0 vs 7.6;
144ch 3x3 on 32x32 7.4 vs 4.8; 240ch 5x5 on 16x16 12.8 vs 2.8; 672ch 5x5 on 8x8 10.4 vs 1.7;
N=2, 144ch 3x3 on 16x16 0.15 vs 0.10), the depthwise dW's Conv over the images' channels too,
dy its kernel (``rules_nn._depthwise_weight_grad_per_image``; N=32: 144ch 3x3 on 32x32 55 vs
13; 96ch 3x3 stride 2 on 64x64 44 vs 14; 240ch 5x5 on 16x16 42 vs 7.0); a stem of fewer input
channels than a block, its input left as it is (N=32, 3->64 7x7 stride 2 on 128x128: 14.3 vs
10.5); a dense one whose batch times output pixels reach ``DENSE_MIN_PIXELS``, what pays for
the weight's reorder every run (N=32, 64ch 3x3 on 32x32 7.5 vs 5.2, 256ch on 8x8 12.2 vs 5.8,
128ch on 8x8 5.4 vs 1.5; N=16, 256ch on 8x8 6.1 vs 3.5; N=8, 64ch on 32x32 1.9 vs 1.4; but N=2,
128ch on 16x16 0.45 vs 0.58). It was 4,096 while the reorder was one 6-D Transpose (N=8, 256ch
on 8x8 then 4.1 vs 5.2). The CPU training graphs count on it (``rules_nn.blocked_dense``, whose
``NCHWC_MIN_PIXELS`` must equal it): a dense 3x3 conv so run, on 8x8 maps for one, stays a Conv
and its dx a Conv by the flipped weight, no longer gathered columns times the weight; Trainer
steps interleaved, 64 px: ResNet-18 at batch 8 0.975x the step time, at 32 0.985x, ResNet-50
at 32 0.995x; 128 px: ResNet-18 at batch 2 0.983x, at 32 1.004x, ResNet-50 0.989x and 0.987x.
1x1 Convs keep the generic kernel, one GEMM already (N=32, 64->256 on 32x32: 5.9 vs 7.6), and
so do a dense conv's weight gradient Convs over swapped axes, dy their kernel, past 49 taps
(ResNet-18's 7x7 stem dW, a 64x64 kernel: 33 ms of its step on the generic kernel, 84 on the
NCHWc one); but a 3x3 conv's dW Conv over swapped axes at a batch under a block (its input
channels, so its input stays NCHW) with dy of up to ``SWAPPED_MAX_TAPS`` pixels, its output 3x3,
runs faster there (1 thread, ms, generic vs NCHWc, N=2: 64ch 16x16 0.69 / 0.77 vs 0.46 / 0.49;
32ch 16x16 0.25 vs 0.18; 128ch 8x8 0.64 vs 0.49; 64->128 stride 2 on 16x16 0.44 vs 0.36; N=4,
64ch 16x16 1.90 / 1.47 vs 0.87 / 0.91): ``rules_nn`` takes it where it beats the gathered columns.
Train steps at batch 32, 128 px, Trainers with and without the rewrite interleaved (the same
artifacts; two runs where two are given, this VM's noise being a few percent): ResNet-18 0.90x /
0.94x the step time, ResNet-50 0.95x, RegNetY-400MF 0.93x / 0.99x, EfficientNet-B0 0.89x,
MobileNetV3-small 0.95x (0.89x and 0.99x with the depthwise dWs' Convs left on the generic kernel).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphc.model.file import ai_onnx_opset, constant_tensors, tensor_types, with_nodes

__all__ = ["DENSE_MIN_PIXELS", "SWAPPED_MAX_TAPS", "block_size", "rewrite"]

NCHWC = "com.microsoft.nchwc"
DENSE_MIN_PIXELS = 1024  # batch (a symbolic one counts 16) times output pixels, for a dense Conv
_SYMBOLIC_BATCH = 16
_MAX_TAPS = 49
SWAPPED_MAX_TAPS = 256  # dy's pixels, for a dW Conv over swapped axes of at most 9 output pixels


@functools.cache
def block_size() -> int:
    """onnxruntime's NCHWc channel block on this CPU (16 with AVX-512, 8 with AVX2), read off the
    weight its layout transformer pads to a block for a one-output-channel Conv; 0 where it has
    no NCHWc kernels (the Conv stays a Conv)."""
    import onnxruntime as ort

    weight = numpy_helper.from_array(np.ones((1, 64, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "probe",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 8, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with tempfile.TemporaryDirectory(prefix="graphc-nchwc-") as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.log_severity_level = 4
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    weights = {t.name: list(t.dims) for t in optimized.graph.initializer}
    convs = [n for n in optimized.graph.node if n.domain == NCHWC and n.op_type == "Conv"]
    return weights.get(convs[0].input[1], [0])[0] if convs else 0


def rewrite(model: onnx.ModelProto, block: int, only_faster: bool = True,
            types: dict[str, tuple[int, list[int | None]]] | None = None) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose main graph's qualifying Convs (the module docstring says which)
    run on the NCHWc kernels of channel block ``block``, and how many were rewritten; ``model``
    itself when none qualifies (or shape inference fails). ``only_faster=False``: every Conv
    those kernels can run (for benchmarks). ``types``: ``graphc.model.file.tensor_types(model)``
    where the caller has them."""
    opset = ai_onnx_opset(model)
    if block <= 1 or opset < 11 or not any(n.op_type == "Conv" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model, 0  # (before opset 11 Pad takes its pads as an attribute)
    types = tensor_types(model) if types is None else types
    if types is None:
        return model, 0
    constants = set(constant_tensors([model.graph]))  # an initializer also an input is fed: not one of them
    nodes, count = [], 0
    for node in model.graph.node:
        kind = _kind(node, types, constants, block)
        if kind is None or (only_faster and not _faster(node, kind, types)):
            nodes.append(node)
            continue
        count += 1
        nodes.extend(_blocked(node, kind, types, block, f"{node.output[0]}/nchwc"))  # (value names are unique)
    if not count:
        return model, 0
    out = with_nodes(model, nodes)
    if not any(o.domain == NCHWC for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(NCHWC, 1))
    return out, count


def _kind(node: onnx.NodeProto, types, constants: set[str], block: int) -> str | None:
    """"dense", "nchw" (fewer input channels than a block) or "depthwise" where the NCHWc
    kernels can run ``node`` (its weight fed, not a constant); else None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    x, w, y = (types.get(name) for name in (node.input[0], node.input[1], node.output[0]))
    if (x is None or w is None or y is None or node.input[1] in constants
            or any(t[0] != onnx.TensorProto.FLOAT for t in (x, w)) or len(x[1]) != 4 or len(w[1]) != 4
            or None in w[1] or x[1][1] is None or len(y[1]) != 4 or None in y[1][2:]):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("auto_pad", b"NOTSET") != b"NOTSET":
        return None
    group, (co, per_group, _, _), ci = attrs.get("group", 1), w[1], x[1][1]
    if group == ci == co and per_group == 1 and ci % block == 0:
        return "depthwise"
    if group != 1:
        return None
    return "nchw" if ci < block else "dense" if ci % block == 0 else None


def _faster(node: onnx.NodeProto, kind: str, types) -> bool:
    """Do the NCHWc kernels, reorders included, beat the generic one on ``node`` (measured, see
    the module docstring)?"""
    _, _, kh, kw = types[node.input[1]][1]
    if kind == "depthwise" or kh * kw == 1:
        return kh * kw > 1
    out = types[node.output[0]][1]
    if kind == "nchw" and out[2] * out[3] <= 9:  # a 3x3 conv's dW over swapped axes, a batch under a block
        return kh * kw <= SWAPPED_MAX_TAPS
    return kh * kw <= _MAX_TAPS and (kind == "nchw" or (out[0] or _SYMBOLIC_BATCH) * out[2] * out[3] >= DENSE_MIN_PIXELS)


def _blocked(node: onnx.NodeProto, kind: str, types, block: int, stem: str) -> list[onnx.NodeProto]:
    """The nodes computing ``node``'s output on the NCHWc kernels: the output channels padded to
    a whole block (zero weights and bias) and cropped by ReorderOutput."""
    co, per_group, kh, kw = types[node.input[1]][1]
    padded = -(-co // block) * block
    nodes = []

    def const(name: str, values) -> str:
        nodes.append(helper.make_node("Constant", [], [f"{stem}/{name}"], name=f"{stem}/{name}",
                                      value=numpy_helper.from_array(np.asarray(values, np.int64), f"{stem}/{name}")))
        return f"{stem}/{name}"

    def op(op_type: str, inputs: list[str], name: str, domain: str = "", **attrs) -> str:
        nodes.append(helper.make_node(op_type, inputs, [f"{stem}/{name}"], name=f"{stem}/{name}", domain=domain, **attrs))
        return f"{stem}/{name}"

    weight = node.input[1]
    if padded != co:
        weight = op("Pad", [weight, const("weight_pads", [0, 0, 0, 0, padded - co, 0, 0, 0])], "weight_padded")
    # OIHWBo [O/B, I, kh, kw, Bo] (each block's output channels innermost), for a dense Conv
    # OIHWBiBo [O/B, I/B, kh, kw, Bi, Bo]: the weight as [I*kh*kw, O] by one 2-D Transpose, whose
    # rows of Bo values one Gather puts in that order (``_block_rows``). onnxruntime ran the
    # Transposes this took before, [O/B, Bo, I*K] -> [O/B, I*K, Bo] and the taps past Bi, as one
    # small 2-D transpose per block: EfficientNet-B0 at batch 32, 64 px (its depthwise dWs' Convs
    # have dy as their weight) spent 7.5 ms of kernel time a step in them, 2.8 in these (4
    # profiles each); Trainer steps interleaved 0.946x / 0.948x, MobileNetV3-small 0.982x,
    # RegNetY-400MF 0.992x, ResNet-50 0.987x, ResNet-18 0.998x; at 128 px EfficientNet-B0 0.928x,
    # MobileNetV3-small 0.956x, ResNet-18 0.990x, RegNetY-400MF 0.996x. (Those two Transposes
    # had replaced one 6-D Transpose that took 5x longer again.)
    weight = op("Reshape", [weight, const("weight_rows_dims", [padded, per_group * kh * kw])], "weight_rows")
    weight = op("Transpose", [weight], "weight_columns", perm=[1, 0])
    weight = op("Reshape", [weight, const("weight_block_dims", [-1, block])], "weight_blocks")
    weight = op("Gather", [weight, const("weight_block_order", _block_rows(kind, padded // block, per_group,
                                                                          kh * kw, block))], "weight_blocked")
    weight = op("Reshape", [weight, const("weight_shape", [padded, per_group, kh, kw])], "weight")
    x = node.input[0] if kind == "nchw" else op("ReorderInput", [node.input[0]], "input", domain=NCHWC)
    inputs = [x, weight]
    if len(node.input) > 2 and node.input[2]:
        bias = node.input[2]
        inputs.append(op("Pad", [bias, const("bias_pads", [0, padded - co])], "bias") if padded != co else bias)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in ("dilations", "group", "pads", "strides")}
    conv = helper.make_node("Conv", inputs, [f"{stem}/output"], name=node.name or f"{stem}/conv", domain=NCHWC,
                            kernel_shape=[kh, kw], **attrs)
    conv.metadata_props.extend(node.metadata_props)
    conv.doc_string = node.doc_string
    nodes.append(conv)
    nodes.append(helper.make_node("ReorderOutput", [f"{stem}/output"], list(node.output[:1]), name=f"{stem}/output_nchw",
                                  domain=NCHWC, channels=co))
    return nodes


def _block_rows(kind: str, blocks: int, per_group: int, taps: int, block: int) -> np.ndarray:
    """Where each row of Bo output channels of the NCHWc weight comes from in the weight's 2-D
    transpose, [I*K*O/B, Bo] (row ``(i*K + k)*O/B + o``): indexed [O/B, I, K] for OIHWBo, [O/B,
    I/B, K, Bi] for OIHWBiBo (``kind`` "dense")."""
    o, i, k = np.ogrid[:blocks, :per_group, :taps]
    rows = (i * taps + k) * blocks + o  # [O/B, I, K]
    if kind == "dense":
        rows = rows.reshape(blocks, per_group // block, block, taps).transpose(0, 1, 3, 2)
    return rows
