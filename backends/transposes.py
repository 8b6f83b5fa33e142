"""Transposes onnxruntime's CPU provider runs badly on its threads, run as Einsums instead.

onnxruntime's CPU Transpose splits a transpose over its threads by the input's rows. Where the
transpose is, its size-1 axes dropped and adjacent axes merged, a 2-D one of an [R, C] input of
few rows, or a batch of them ([B, R, C] -> [B, C, R]), each output row (R values) fits in a cache
line, and the threads write their parts of the same lines: its time is erratic, up to 20x that
of one thread. An Einsum that only permutes axes (``"ab->ba"``) makes the same copy on one
thread, bit for bit. The CPU training graphs have such transposes: a dense conv's weight
gradient taken from its taps-outer layout back to [Co, Ci, K] (``training.dense_conv._taps_outer``'s
2-D Transpose, differentiated: [9, Co*Ci] -> [Co*Ci, 9]), ``pixel_major``'s rows of a few pixels
back to channels ([N, P, C] -> [N, C, P]), a batch of 2 moved innermost for a gathered dW.

Measured (2 threads, kernel time in ms, Transpose / Einsum, the input written by a Relu just
before; two runs where the Transpose's time moved between them): [R, C] -> [C, R] with R = 3:
C = 65,536 0.61 / 0.06, 262,144 1.68 / 0.22; R = 9: C = 16,384 0.40 / 0.03, 65,536 1.39 / 0.12,
131,072 0.87 / 0.18, 262,144 1.33 / 0.73 and 1.17 / 0.86; R = 12: 65,536 1.31 / 0.31, 262,144
0.45 / 1.46 and 4.78 / 1.50; R = 16: 16,384 0.88 / 0.10, 65,536 2.80 / 0.45, 262,144 1.10 /
2.13. Batched: [32, 9, 4608] 2.54 / 0.34 and 2.94 / 0.28; [32, 16, 208] 0.14 / 0.02; [32, 4,
512] 0.10 / 0.01; [2, 9, 65536] 2.02 / 0.20. Past a line a row the Transpose is the faster one
more often than not (R = 32: 65,536 0.73 / 1.16, 262,144 3.13 / 6.58), and so are the zoo's
other Transposes (ResNet-18 at batch 32, 64 px: its Transposes 7.0 -> 16.8 ms when all were
Einsums; a Transpose of blocks, [32, 4, 512, 9] -> [32, 512, 4, 9], 0.18 / 0.40).
Trainer steps interleaved, with / without this rewrite: batch 32, 64 px, ResNet-18 0.976x,
ResNet-50 0.981x, MobileNetV3-small 0.950x, EfficientNet-B0 0.995x, RegNetY-400MF 0.999x; 128 px
ResNet-18 0.991x, RegNetY-400MF 0.984x; batch 2, 64 px, MobileNetV3-small 0.981x (with 2-D
transposes alone: ResNet-18 0.992x, ResNet-50 0.994x, EfficientNet-B0 0.993x, RegNetY 0.987x).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from graphc.model.file import with_nodes

__all__ = ["LINE_BYTES", "MIN_VALUES", "batched_rows_and_columns", "rewrite"]

LINE_BYTES = 64  # an output row of at most this is written by both threads
MIN_VALUES = 1 << 14  # smaller transposes take microseconds either way
_ITEM_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8}  # onnxruntime's CPU Einsum types


def rewrite(model: onnx.ModelProto, types: dict[str, tuple[int, list[int | None]]]) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose main graph's Transposes of few rows (the module docstring says
    which) are Einsums, each keeping its name, and how many; ``model`` itself when none is.
    ``types``: value name -> (element type, dims), ``nchwc.tensor_types``."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 12:  # Einsum
        return model, 0
    nodes, count = [], 0
    for node in model.graph.node:
        equation = _einsum(node, types)
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
    if merged is None or merged[1] * _ITEM_BYTES[elem] > LINE_BYTES or math.prod(merged) < MIN_VALUES:
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
    size = lambda run: int(np.prod([dims[a] for a in run]))
    if len(runs) == 3 and runs[0][0] < runs[2][0] < runs[1][0]:
        return size(runs[0]), size(runs[2]), size(runs[1])
    if len(runs) == 2 and runs[1][0] < runs[0][0]:
        return 1, size(runs[1]), size(runs[0])
    return None
