"""Reductions in the forms onnxruntime's CUDA provider runs on its own kernels (CUDA graphs).

onnxruntime's CUDA ReduceSum runs its own row or column kernel only when the reduced axes are
one run at the front or at the back of the shape; any other axes, and every ReduceMean (its
fast path takes sums only), go to cuDNN's generic reduction. Training graphs reduce over
(N, H, W) of NCHW tensors all the time: BatchNorm's batch statistics and the sums of its
backward, conv biases' gradients, depthwise dWs taken by taps. On the H100 those cuDNN
reductions were the largest kernels of the graphed steps (CUPTI, batch 32, 128 px: ResNet-50 956
of them, 21.8 of 62.2 ms of kernel time; EfficientNet-B0 1,891, 35.9 of 63.7 ms; those profiles
also counted the graph captures' runs).

Here, in graphs generated for ``device="cuda"``, a reduction over a leading and a trailing run
of axes becomes a ReduceSum over the trailing run (the column kernel), then one over the leading
run (the row kernel), both with the node's ``keepdims`` (the leading run's axis numbers do not
move); a ReduceMean becomes those sums times 1/count (a run over a symbolic batch stays a mean,
of the small tensor left). The sums are the same, added in another order.

Measured on the H100 (onnxruntime-gpu 1.31.1, CUPTI kernel time, float32, batch 32; one
reduction over (N, H, W) vs the two sums): [32, 64, 64, 64] 221 vs 26 us; [32, 256, 32, 32] 204
vs 19; [32, 96, 64, 64] 301 vs 41; [32, 2048, 4, 4] 51 vs 24; [32, 1152, 4, 4] 38 vs 24; twelve
BatchNorm shapes of ResNet-50 and EfficientNet-B0 1,473 vs 238 us (ReduceMean 1,490 vs 254 with
the Mul). Graphed train steps at 128 px, AdamW, same machine and run: ResNet-50 41.2 -> 28.8 ms
(PyTorch eager 25.6 / 25.9); against an earlier lease's run that day (another H100): EfficientNet-B0
45.0 -> 27.9, ResNet-18 17.7 -> 15.0, MobileNetV3-small 21.5 -> 14.2.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from graphc.passes.autodiff.builder import attr
from graphc.passes.emit import Emitter
from graphc.passes.values import const_array, const_axes, replace_value

__all__ = ["split_reductions"]


def split_reductions(graph: ir.Graph, opset: int) -> int:
    """Rewrite ``graph``'s ReduceSum and ReduceMean nodes in place (see the module's docstring);
    returns how many."""
    e = Emitter(graph, opset, "reduce")
    count = 0
    for node in list(graph):
        plan = _plan(node)
        if plan is None:
            continue
        runs, keepdims, total = plan
        e.source = node.metadata_props.get("graphc.source")
        y = node.inputs[0]
        for op, axes in runs:
            y = e.reduce(op, y, axes, keepdims=keepdims)
        if total != 1:
            y = e.op("Mul", y, e.scalar(1.0 / total, y))
        y.shape, y.dtype = node.outputs[0].shape, node.outputs[0].dtype
        replace_value(node.outputs[0], y)
        graph.remove(node, safe=True)
        count += 1
    e.source = None
    if count:
        graph.sort()
    return count


def _plan(node: ir.Node) -> tuple[list[tuple[str, list[int]]], bool, int] | None:
    """(the reductions to take, trailing run first; keepdims; the count the sums are divided by,
    1 for none) for a reduction to rewrite; None for one onnxruntime already runs on its own
    kernels, or that is not understood here (dynamic axes, unknown rank). A ReduceMean's run over
    a symbolic dim stays a ReduceMean (of the smaller tensor the other run leaves)."""
    if node.op_type not in ("ReduceSum", "ReduceMean") or node.domain not in ("", "ai.onnx"):
        return None
    shape, axes = node.inputs[0].shape, const_axes(node, const_array)  # the Emitter's axes: Constants
    if shape is None or not axes:  # an empty list reduces all axes or none: left as it is
        return None
    rank = len(shape)
    axes = sorted({a % rank for a in axes})
    runs = [[axes[0]]]
    for a in axes[1:]:
        if a == runs[-1][-1] + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    front, back = runs[0][0] == 0, runs[-1][-1] == rank - 1
    if len(axes) == rank or len(runs) > 2 or not (front or back) or (len(runs) == 2 and not (front and back)):
        return None  # everything, or cuDNN's whatever is done
    mean = node.op_type == "ReduceMean"
    if mean and not (node.inputs[0].dtype is not None and node.inputs[0].dtype.is_floating_point()):
        return None  # an integer mean is not a sum times 1/count
    static = [all(isinstance(shape[a], int) for a in run) for run in runs]
    if len(runs) == 1 and (not mean or not static[0]):
        return None  # already the row or column kernel, or a mean that would stay one
    plan = [("ReduceMean" if mean and not known else "ReduceSum", run) for run, known in zip(runs, static)]
    total = math.prod(shape[a] for run, known in zip(runs, static) if mean and known for a in run)
    return plan[::-1], bool(attr(node, "keepdims", 1)), total
