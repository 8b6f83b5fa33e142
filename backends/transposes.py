"""Transposes onnxruntime's CPU provider runs badly on its threads, run as Einsums instead.

onnxruntime's CPU Transpose splits a transpose over its threads by the input's rows, and a batch
of transposes into one small transpose per batch entry. Where a Transpose is, its size-1 axes
dropped and adjacent axes merged, [R, C] -> [C, R] or a batch of them, [B, R, C] -> [B, C, R],
and each output row (R values) fits in a cache line, the threads write their parts of the same
lines: its time is erratic, up to 20x that of one thread; and a batch of transposes to few rows
(C of them) spends its time dispatching. An Einsum that only permutes axes (``"abc->acb"``) makes
the same copy in one loop on one thread, bit for bit. So: R values of at most ``LINE_BYTES``, or,
in a batch, at most ``BATCHED_ROWS`` rows (C); not where a MatMul or Gemm reads the
Transpose (onnxruntime folds it into the product: no copy is made). The CPU training graphs have
such transposes: a dense conv's weight gradient taken from its taps-outer layout back to [Co, Ci,
K] (``training.dense_conv._taps_outer``'s 2-D Transpose, differentiated: [9, Co*Ci] -> [Co*Ci, 9]),
``pixel_major``'s rows of a few pixels to channels and back ([N, P, C] <-> [N, C, P]), a batch of
2 moved innermost for a gathered dW.

Measured (2 threads, kernel time in ms, Transpose / Einsum, the input written by a Relu just
before; two runs where the Transpose's time moved between them): [R, C] -> [C, R] with R = 3:
C = 65,536 0.61 / 0.06, 262,144 1.68 / 0.22; R = 9: C = 16,384 0.40 / 0.03, 65,536 1.39 / 0.12,
131,072 0.87 / 0.18, 262,144 1.33 / 0.73 and 1.17 / 0.86; R = 12: 65,536 1.31 / 0.31, 262,144
0.45 / 1.46 and 4.78 / 1.50; R = 16: 16,384 0.88 / 0.10, 65,536 2.80 / 0.45, 262,144 1.10 /
2.13; R = 32: 65,536 0.73 / 1.16, 262,144 3.13 / 6.58 (past a line a row the Transpose is the
faster one more often than not). Batched, B = 32: [9, 4608] 2.54 / 0.34 and 2.94 / 0.28; R = 16,
C = 64, 256, 1,024: 0.017 / 0.008, 0.066 / 0.025, 0.269 / 0.095; C = 4 .. 64, R = 128: 0.021 /
0.005, 0.030 / 0.012, 0.056 / 0.058; R = 512: 0.098 / 0.012, 0.149 / 0.054, 0.498 / 0.251; but
C = 256: R = 32 0.043 / 0.060, R = 512 1.32 / 2.17; B = 128 and B = 4 alike (B = 128, R = 512,
C = 64: 1.64 / 1.91, the one loss on that side of the bound). Rewriting every Transpose of the
zoo's train steps lost (ResNet-18 at batch 32, 64 px: its Transposes 7.0 -> 16.8 ms; a Transpose
of blocks, [32, 4, 512, 9] -> [32, 512, 4, 9], 0.18 / 0.40), and so did rewriting those a MatMul
reads (RegNetY-400MF at batch 32, 64 px, 1.26x the step time).
Trainer steps interleaved, with / without this rewrite, the Trainer with it built second / first
(in these pairs the Trainer built second ran up to 2 % faster, whichever it was): batch 32, 64 px,
ResNet-18 0.976x / 0.991x, ResNet-50 0.970x / 0.990x, MobileNetV3-small 0.947x / 0.993x,
EfficientNet-B0 0.939x / 0.999x, RegNetY-400MF 1.002x, 0.943x, 1.020x / 0.950x, ViT-Ti/8 0.990x /
-; 128 px ResNet-18 0.993x / 0.997x, RegNetY-400MF 0.872x, 0.988x / 0.993x, ResNet-50 1.004x / -,
EfficientNet-B0 0.977x / -, MobileNetV3-small 0.964x / -; batch 2, 64 px, built second: ResNet-18
0.986x, ResNet-50 0.993x, EfficientNet-B0 0.992x, the GPT 0.997x, MobileNetV3-small 1.004x /
1.011x and RegNetY-400MF 1.007x / 1.013x (two small stem transposes rewritten, their kernel time
0.06 -> 0.05 ms, the step's 31.1 ms both ways: this pair of Trainers' noise).
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from graphc.model.file import ai_onnx_opset, with_nodes

__all__ = ["BATCHED_ROWS", "LINE_BYTES", "MIN_VALUES", "batched_rows_and_columns", "rewrite"]

LINE_BYTES = 64  # an output row of at most this is written by both threads
BATCHED_ROWS = 64  # a batch of transposes to at most this many rows each is dispatch-bound
MIN_VALUES = 1 << 14  # smaller transposes take microseconds either way
# onnxruntime folds a Transpose of the last two axes into the product that reads it (its
# MatmulTransposeFusion, GemmTransposeFusion): an Einsum there would be a copy that was not made.
_FUSES_TRANSPOSES = frozenset({"MatMul", "Gemm"})
_ITEM_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8}  # onnxruntime's CPU Einsum types


def rewrite(model: onnx.ModelProto, types: dict[str, tuple[int, list[int | None]]]) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose main graph's Transposes of few rows (the module docstring says
    which) are Einsums, each keeping its name, and how many; ``model`` itself when none is.
    ``types``: value name -> (element type, dims), ``graphc.model.file.tensor_types``."""
    opset = ai_onnx_opset(model)
    if opset < 12:  # Einsum
        return model, 0
    fused = {name for node in model.graph.node if node.op_type in _FUSES_TRANSPOSES and node.domain in ("", "ai.onnx")
             for name in node.input}
    nodes, count = [], 0
    for node in model.graph.node:
        equation = None if node.output[0] in fused else _einsum(node, types)
        if equation is None:
            nodes.append(node)
            continue
        nodes.append(helper.make_node("Einsum", list(node.input), list(node.output), node.name, equation=equation))
        nodes[-1].metadata_props.extend(node.metadata_props)
        count += 1
    if not count:
        return model, 0
    return with_nodes(model, nodes), count


def _einsum(node: onnx.NodeProto, types) -> str | None:
    """The Einsum equation that does what the Transpose ``node`` does, where it is one of few rows;
    else None."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or node.input[0] not in types:
        return None
    elem, dims = types[node.input[0]]
    if elem not in _ITEM_BYTES or None in dims or not 0 < len(dims) <= 26:
        return None
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(len(dims)))[::-1])
    merged = batched_rows_and_columns(dims, perm)
    if merged is None or math.prod(merged) < MIN_VALUES:
        return None
    batch, rows, columns = merged
    if rows * _ITEM_BYTES[elem] > LINE_BYTES and (batch == 1 or columns > BATCHED_ROWS):
        return None
    letters = "abcdefghijklmnopqrstuvwxyz"[:len(dims)]
    return f"{letters}->{''.join(letters[p] for p in perm)}"


def batched_rows_and_columns(dims: list[int], perm: list[int]) -> tuple[int, int, int] | None:
    """(B, R, C) where transposing ``dims`` by ``perm`` is, its size-1 axes dropped and the
    input's adjacent axes that stay adjacent merged, B transposes of [R, C] matrices, the leading
    axes (B of them, 1 for none) left in place; else None."""
    kept = [p for p in perm if dims[p] != 1]  # the output's axes, by input axis
    runs: list[list[int]] = []
    for axis in kept:
        if runs and runs[-1][-1] + 1 == axis:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    size = lambda run: math.prod(dims[a] for a in run)
    if len(runs) == 3 and runs[0][0] < runs[2][0] < runs[1][0]:
        return size(runs[0]), size(runs[2]), size(runs[1])
    if len(runs) == 2 and runs[1][0] < runs[0][0]:
        return 1, size(runs[1]), size(runs[0])
    return None
