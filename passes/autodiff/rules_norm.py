"""VJP rules of BatchNormalization (training and inference mode), Layer-, Instance- and GroupNormalization."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, static_shape
from graphc.passes.autodiff.channel_scale import scaled_by_channel
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.rules_reduce import count_ratio
from graphc.passes.values import exact_float


# -- normalization ----------------------------------------------------------------------------
def _per_channel(g: GradBuilder, v: ir.Value, rank: int) -> ir.Value:
    """A [C] tensor shaped [C, 1, ..., 1] to broadcast against [N, C, *spatial]."""
    return g.unsqueeze(v, list(range(1, rank - 1)))


@grad_rule("BatchNormalization", no_grad_outputs=(1, 2))
def grad_batch_norm(g, node, dy):
    # Since opset 15 scale and bias, mean and var may have float types other than x's (a float64
    # network with a float32 BatchNorm): computed in x's type, each gradient cast back to its input's.
    x = node.inputs[0]
    params = [v if v.dtype == x.dtype else g.cast_like(v, x) for v in node.inputs[1:5]]
    grads = _batch_norm_grads(g, node, dy, x, *params)
    return tuple(d if d is None or v.dtype == x.dtype else g.cast_like(d, v) for d, v in zip(grads, node.inputs[:5]))


def _batch_norm_grads(g, node, dy, x, scale, bias, mean, var):
    """The gradients of ``node``'s five inputs, its ``scale``, ``bias``, ``mean`` and ``var`` given
    in ``x``'s type. training_mode=1 (opset >= 14): batch statistics, the full gradient through
    mean and var; running-mean/var outputs carry no gradient (as in PyTorch). Inference:
    y = (x - mean) * scale / sqrt(var + eps) + b with mean/var as inputs."""
    rank = g.rank(x)
    axes = [0] + list(range(2, rank))
    if g.opset >= 14 and attr(node, "training_mode", 0):
        return _batch_norm_training_grads(g, node, dy, axes, scale, bias) + (None, None)
    wants_x, wants_scale, wants_bias, wants_mean, wants_var = (g.wants(v) for v in node.inputs[:5])
    eps = g.scalar(exact_float(node, "epsilon", 1e-5), dy)
    scale_c = _per_channel(g, scale, rank)
    xc = g.sub(x, _per_channel(g, mean, rank))
    invstd = g.op("Reciprocal", g.op("Sqrt", g.add(_per_channel(g, var, rank), eps)))
    xhat = g.mul(xc, invstd)
    dx = dscale = dbias = dmean = dvar = None
    sum_dy = g.reduce("ReduceSum", dy, axes, keepdims=False) if wants_bias or wants_mean else None
    if wants_x:
        dx = g.mul(dy, g.mul(scale_c, invstd))
    if wants_scale:
        dscale = g.reduce("ReduceSum", g.mul(dy, xhat), axes, keepdims=False)
    if wants_bias:
        dbias = sum_dy
    if wants_mean or wants_var:
        inv = g.reshape_like(invstd, scale)
        if wants_mean:
            dmean = g.neg(g.mul(sum_dy, g.mul(scale, inv)))
        if wants_var:
            sum_dy_xc = g.reduce("ReduceSum", g.mul(dy, xc), axes, keepdims=False)
            half_inv3 = g.mul(g.scalar(-0.5, dy), g.mul(inv, g.mul(inv, inv)))
            dvar = g.mul(sum_dy_xc, g.mul(scale, half_inv3))
    return dx, dscale, dbias, dmean, dvar


def channel_reduce(e, op_type: str, x: ir.Value, axes: list[int], device: str) -> ir.Value:
    """``op_type`` (ReduceMean or ReduceSum) of ``x`` [N, C, *S] over ``axes``, all but the
    channels, kept; in CPU graphs over S first, then over N (CUDA graphs take such reductions apart
    their own way, ``reductions.split_reductions``). onnxruntime's CPU reduction over (0, 2, 3) at
    once ran up to 2.4x slower than the two (1 thread, ms: [32,64,32,32] 0.59 vs 0.24, [32,64,16,16]
    0.137 vs 0.071, [32,128,8,8] 0.076 vs 0.044). Train steps at 64 px with the forward's mean and
    variance and the backward's two sums so, CPU time of one thread, Trainers interleaved, median of
    6-8 rounds, at batch 32: RegNetY-400MF 0.980x, EfficientNet-B0 0.984x and 0.975x, ResNet-50
    0.986x, MobileNetV3-small 1.004x, ResNet-18 0.999x (2 threads, spinning off: 1.001x); at batch
    2: EfficientNet-B0 1.001x, ResNet-50 1.002x, ResNet-18 1.004x. (Rows [R, C] summed over R as a
    MatMul by a row of ones, 4.6x faster alone on 2 threads at [512, 256] but even on one:
    EfficientNet-B0 at batch 32 1.015x, not kept.)"""
    if device == "cpu" and len(axes) > 1 and axes == [0, *range(2, len(axes) + 1)]:
        return e.reduce(op_type, e.reduce(op_type, x, axes[1:]), [0])
    return e.reduce(op_type, x, axes)


def batch_statistics(e, x: ir.Value, axes: list[int], device: str
                     ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """(mean, x - mean, biased variance, zeros) of ``x`` per channel, mean and variance kept
    [1, C, 1, ...], and zeros [C]: the forward lowering (``training.modes``) and the gradient
    rule write them alike, so onnxruntime's common-subexpression elimination computes them once.
    Both normalise the centred input (an inference-mode BatchNormalization with mean ``zeros``),
    so it is the one full-size value of the BatchNorm the backward reads: x is freed after the
    forward."""
    mean = channel_reduce(e, "ReduceMean", x, axes, device)
    centred = e.op("Sub", x, mean)
    var = channel_reduce(e, "ReduceMean", e.op("Mul", centred, centred), axes, device)
    channels = static_shape(x)[1]
    if isinstance(channels, int):
        zeros = e.const(np.zeros(channels, (x.dtype or ir.DataType.FLOAT).numpy()))
    else:
        zeros = e.op("Sub", e.squeeze(mean, axes), e.squeeze(mean, axes))
    return mean, centred, var, zeros


# On the CPU, a per-channel affine of the centred input over a map of FUSED_AFFINE_CONV_PIXELS
# pixels or more (the forward's normalisation when a Relu or a residual Add, a Relu after it or
# not, follows it; the backward's xhat term, which an Add follows) is a 1x1 Conv of one channel
# a group weighted scale / sqrt(var + eps), not an inference-mode BatchNormalization:
# onnxruntime fuses the Relu, or the Add of the other tensor, into that Conv's pass (FusedConv),
# where after a BatchNormalization each is a full-size pass of its own; from AFFINE_CONV_PIXELS
# pixels the Conv alone is faster too. 2 threads, ms, BatchNormalization vs Conv
# (``bench_lowerings.py --only bn_affine``), alone / + Relu / + Add / + Add, Relu / + dy * k:
# [32,96,32,32] 2.16 vs 1.28, 3.11 vs 1.43, 3.47 vs 2.81, 4.75 vs 3.07, 5.02 vs 4.44;
# [32,32,64,64] 2.43 vs 1.81, 3.73 vs 1.93, 5.19 vs 4.00, 6.72 vs 4.35, 7.16 vs 6.20;
# [32,128,16,16] 0.34 vs 0.46, 0.70 vs 0.49, 0.87 vs 0.79, 1.29 vs 0.83, 1.15 vs 1.06;
# [32,256,8,8] 0.16 vs 0.43, 0.26 vs 0.43, 0.41 vs 0.65, 0.60 vs 0.66, 0.64 vs 0.86 (on small maps
# the Conv's per-image, per-channel setup loses); [2,96,32,32] 0.06 vs 0.10, 0.13 vs 0.11, 0.17
# vs 0.16, 0.24 vs 0.18, 0.27 vs 0.25. Kernel time of a train step at batch 32, 128 px, of the
# BatchNorms' forward and backward and the Relus and residual Adds fused into them (two profiles
# each, ms, before -> after): ResNet-50 ~215 -> ~146, EfficientNet-B0 ~130 -> ~80, RegNetY-400MF
# ~78 -> ~60, MobileNetV3-small ~25 -> ~16; Trainer steps interleaved, both orders: ResNet-18 at
# 128 px 0.969 / 0.970 the step time; at batch 2 (64 px) the kernel time is unchanged. CUDA
# graphs keep the BatchNormalization.
AFFINE_CONV_PIXELS = 1024
FUSED_AFFINE_CONV_PIXELS = 256


def affine_as_conv(x: ir.Value, params: tuple[ir.Value, ...], fused: bool, device: str) -> bool:
    """Whether ``normalize`` writes ``x``'s per-channel affine as a Conv: on the CPU, for float32
    ``x`` and ``params`` (the BatchNorm's scale and bias, which may have a type of their own),
    static channels and a map of at least FUSED_AFFINE_CONV_PIXELS pixels when onnxruntime fuses
    what follows into the Conv (``fused``), else AFFINE_CONV_PIXELS."""
    shape = static_shape(x)
    if (device != "cpu" or any(v.dtype != ir.DataType.FLOAT for v in (x, *params)) or shape is None
            or len(shape) < 3 or not all(isinstance(d, int) for d in shape[1:])):
        return False
    return math.prod(shape[2:]) >= (FUSED_AFFINE_CONV_PIXELS if fused else AFFINE_CONV_PIXELS)


def normalize(e, centred: ir.Value, scale: ir.Value, shift: ir.Value, zeros: ir.Value, var: ir.Value,
              eps: float, conv: bool) -> ir.Value:
    """``scale * centred / sqrt(var + eps) + shift`` per channel (``scale``, ``shift``, ``zeros``
    and ``var`` [C]): an inference-mode BatchNormalization, or with ``conv`` (``affine_as_conv``)
    a 1x1 Conv of one channel a group. A float64 ``eps`` the float32 ``epsilon`` attribute cannot
    hold is added to ``var`` instead (``epsilon=0``)."""
    if not conv:
        if var.dtype == ir.DataType.DOUBLE and float(np.float32(eps)) != eps:
            var, eps = e.op("Add", var, e.scalar(eps, var)), 0.0
        return e.op("BatchNormalization", centred, scale, shift, zeros, var, epsilon=eps)
    shape = static_shape(centred)
    weight = e.op("Div", scale, e.op("Sqrt", e.op("Add", var, e.scalar(eps, centred))))
    weight = e.op("Reshape", weight, e.ints([shape[1]] + [1] * (len(shape) - 1)))
    return e.op("Conv", centred, weight, shift, group=shape[1])


def _batch_norm_training_grads(g, node, dy, axes, scale, bias):
    """(dx, dscale, dbias) of training-mode BatchNormalization (``scale`` and ``bias`` in x's
    type): with the per-channel sums
    s1 = sum(dy), s2 = sum(dy * xhat) over the N values of a channel, k = scale * invstd,
    dx = k * (dy - s1/N - xhat * s2/N), dscale = s2, dbias = s1.

    dx is written as ``k * (dy + BatchNormalization(x - mean, -s2/N, -s1/N, 0, var))``: the
    inference-mode BatchNormalization (which recomputes xhat from the centred input) applies
    the per-channel affine part in one pass, and s2 = invstd * sum(dy * (x - mean)) reads the
    same centred input, which the forward made, so xhat is never written. The product by k is
    marked (``scaled_by_channel``): where a Conv made x, its gradient rule reads the sum and
    folds k into its weight (dx) and its weight and bias gradients, so that full-size multiply
    is never made (elsewhere it stays, the passes as many as with ``dy * k`` added). Kernel time
    of the BatchNorms' backward and forward in a train step, 1 thread, 64 px, each node the
    fastest of 4 profiles of 4 steps taken in turn (ms, dy * k added vs folded): ResNet-18 at
    batch 32 11.50 vs 10.79, at batch 2 3.34 vs 2.98; ResNet-50 52.07 vs 48.73, 9.49 vs 8.78;
    EfficientNet-B0 34.19 vs 32.70 (another two rounds 35.68 vs 32.64), 7.64 vs 7.03 (33 of its
    49 BatchNorms follow a Conv that ``dense_conv`` made a Gemm or products; with k left out of
    every dx, wrong values timed only, 35.87 vs 30.80 at batch 32); the Conv gradients' products
    by the factor take 0.27 ms of EfficientNet-B0's step at batch 32. The depthwise products on
    2x2 maps take k too (``rules_linalg._batch_fold``: 1.02 -> 0.15 ms); after the Gemms the
    multiply stays (``grad_gemm``: no faster).
    Fwd+bwd of one training BN on
    onnxruntime (CPU, 2 threads, interleaved, forward lowered as ``training.modes`` does), in ms,
    this form vs the textbook one (xhat materialised, dx from four full-size Sub/Mul):
    [32,96,32,32] 13.1 vs 14.7; [32,144,16,16] 4.9 vs 5.1; [32,672,4,4] 3.2 vs 4.9;
    [32,64,16,16] 2.9 vs 3.5; [2,256,8,8] 0.31 vs 0.36. (The variance as ReduceSumSquare of the
    centred input: 13.6, 5.2, 3.3, 3.0, 0.33, no better: ORT's ReduceSumSquare over axes
    (0, 2, 3) runs at a third of ReduceSum's speed. Over the rows of the centred input reshaped
    [N, C, H*W], then a mean over N, it ran as fast as the Mul and ReduceMean alone or faster, ms:
    [32,64,16,16] 0.12 vs 0.17, [32,256,4,4] 0.04 vs 0.09, [32,96,32,32] 0.70 vs 0.72; but
    ResNet-18's Trainer step at batch 32, 64 px, built second / first, 1.010x / 1.000x.) s2's
    sum of a product as a MatMul batched over (N, C), [1, H*W] rows by [H*W, 1] columns, or as
    an Einsum, lost to the Mul and
    ReduceSum (``bench_lowerings.py --only bn_sums``, 2 threads, ms: [32,96,64,64] 18.3 / 52.8
    vs 10.1; [32,144,32,32] 6.5 / 17.8 vs 3.7; [2,96,32,32] 0.58 / 0.67 vs 0.21), and the
    variance as GlobalLpPool(p=2), squared, ran 16-25x slower than the Mul and ReduceSum.
    Not kept either (``bench_lowerings.py --only bn_passes``, 1 thread, ms, this form vs the
    other): s1 and s2 as one reduction over Concat([dy, dy * (x - mean)]), which writes both
    again, [32,64,16,16] 0.14 vs 0.21, [32,256,16,16] 5.6 vs 8.5, [32,96,32,32] 12.6 vs 17.2 (as
    a MatMul against [1, xhat] that stack is written too, and the batched dot above lost); the
    forward's mean and variance in one pass over x, E[x] and E[x^2] (then x normalised by its
    mean, no centred input): [32,64,16,16] 0.22 vs 0.16, but the float32 variance of a
    channel of mean 1000 and std 1 16-55 % off in onnxruntime (two passes: 2.4e-7), and a
    BatchNorm's gradients 1e-2 to 1e-1 off torch's (``test_batchnorm_reductions``)."""
    x = node.inputs[0]
    _, centred, var, zeros = batch_statistics(g, x, axes, g.device)
    eps = exact_float(node, "epsilon", 1e-5)
    invstd = g.op("Reciprocal", g.op("Sqrt", g.add(var, g.scalar(eps, dy))))
    s1 = channel_reduce(g, "ReduceSum", dy, axes, g.device)
    s2 = g.mul(channel_reduce(g, "ReduceSum", g.mul(dy, centred), axes, g.device), invstd)
    dx = None
    if g.wants(x):
        # N: values per channel, a constant when shapes are static; else read off dy, which is live
        # here anyway (a Size of x kept x alive from the forward)
        count = count_ratio(g, dy, scale, dy)
        slope = g.squeeze(g.neg(g.div(s2, count)), axes)
        shift = g.squeeze(g.neg(g.div(s1, count)), axes)
        rest = normalize(g, centred, slope, shift, zeros, g.squeeze(var, axes), eps,
                         affine_as_conv(centred, (scale, bias), fused=True, device=g.device))
        dx = scaled_by_channel(g, g.add(dy, rest), g.mul(_per_channel(g, scale, len(axes) + 1), invstd))
    dscale = g.reshape_like(s2, scale) if g.wants(node.inputs[1]) else None
    dbias = g.reshape_like(s1, bias) if g.wants(node.inputs[2]) else None
    return dx, dscale, dbias


@grad_rule("LayerNormalization", multi_output=True)
def grad_layer_norm(g, node, dys):
    # Normalized over axes [axis, rank): dx = invstd * (d - mean(d) - xhat * mean(d * xhat)),
    # d = dy * scale; dscale/dbias in x's shape (the driver sums the broadcast axes). The Mean and
    # InvStdDev outputs add dmean / n and dinvstd * -invstd^3 * (x - mean) / n (n: the group size).
    # Fewer full-size passes did not pay: dx as (dy * invstd) * scale + (xc * k1 + k0), per-row
    # k1, k0 from the row means of dy * xhat (dscale's product) and dy taken as GEMVs against the
    # scale, the affine part by Mul + Add or by an inference BatchNormalization over [1, rows, D]
    # (6-7 passes, not 9), forward + backward on onnxruntime CPU (``bench_lowerings.py --only
    # layer_norm``, ms, this / Mul + Add / BatchNormalization): [32, 128, 256] 5.85 / 5.79 / 5.71
    # (2 threads), 8.60 / 8.58 / 7.99 (1 thread); [32, 65, 192] 2.54 / 2.69 / 2.70, 3.43 / 3.52 /
    # 3.52; [2, 128, 256] 0.65 / 0.69 / 0.63, 0.54 / 0.57 / 0.49. (As one variadic Sum the three
    # terms were slower still: onnxruntime's Sum of two 4 MB tensors takes 1.7x its Add.)
    dy, dmean, dinv = (list(dys) + [None, None])[:3]
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    rank = g.rank(x)
    axes = list(range(attr(node, "axis", -1) % rank, rank))
    stats = _forward_stats(g, node)
    if stats is not None:
        mu, invstd = stats
        xc = g.sub(x, mu)
    else:
        mu = g.reduce("ReduceMean", x, axes, keepdims=True)
        xc = g.sub(x, mu)
        var = g.reduce("ReduceMean", g.mul(xc, xc), axes, keepdims=True)
        invstd = g.op("Reciprocal", g.op("Sqrt", g.add(var, g.scalar(attr(node, "epsilon", 1e-5), x))))
    xhat = g.mul(xc, invstd)
    dx = dscale = dbias = None
    y_shape = static_shape(node.outputs[0]) or static_shape(x)
    if g.wants(x):
        parts = []
        if dy is not None:
            d = g.mul(dy, scale)
            mean_d = g.reduce("ReduceMean", d, axes, keepdims=True)
            mean_dx = g.reduce("ReduceMean", g.mul(d, xhat), axes, keepdims=True)
            parts.append(g.mul(invstd, g.sub(g.sub(d, mean_d), g.mul(xhat, mean_dx))))
        if dmean is not None or dinv is not None:
            # 1/n, n the group size (a count of ones over the normalized axes, in x's dtype)
            inv_n = g.op("Reciprocal", g.reduce("ReduceSum", g.full(g.shape_of(x), 1.0, x), axes, keepdims=True))
            if dmean is not None:
                parts.append(g.mul(g.cast_like(dmean, x), inv_n))
            if dinv is not None:
                cubed = g.mul(g.mul(invstd, invstd), invstd)
                parts.append(g.neg(g.mul(g.mul(g.cast_like(dinv, x), cubed), g.mul(xc, inv_n))))
        dx = g.sum_values(parts) if parts else None
        if dy is None and dinv is None and dx is not None:  # dmean / n alone: one value per group
            dx = g.op("Expand", dx, g.shape_of(x))
    if g.wants(scale) and dy is not None:
        dscale = g.broadcast_from(g.mul(dy, xhat), y_shape)
    if g.wants(bias) and dy is not None:
        dbias = g.broadcast_from(dy, y_shape)
    return dx, dscale, dbias


def _forward_stats(g: GradBuilder, node: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """The forward LayerNormalization's own Mean and InvStdDev outputs (``with_outputs`` adds
    them when it lacks them), for a float32 input, whose statistics onnxruntime and the numpy
    backend keep in float32 (stash_type 1) anyway; None otherwise (the rule recomputes them in
    x's dtype). Reading them takes two reductions and four full-size passes out of the backward:
    ViT-Ti at batch 32 (64 px, 2 threads, two profiles each) LayerNorm's backward 57.7 / 69.6 ->
    47.5 / 52.5 ms a step, the step 0.99x (interleaved A/B)."""
    x = node.inputs[0]
    if x.dtype != ir.DataType.FLOAT or attr(node, "stash_type", 1) != 1 or node.domain not in ("", "ai.onnx"):
        return None
    node = g.with_outputs(node, 3)
    axis = attr(node, "axis", -1) % g.rank(x)
    for value in node.outputs[1:]:
        if value.dtype is None:  # added here: float32, x's shape with the normalized axes 1
            value.dtype = ir.DataType.FLOAT
            if x.shape is not None:
                value.shape = ir.Shape([*x.shape[:axis], *([1] * (len(x.shape) - axis))])
    return node.outputs[1], node.outputs[2]


def _group_norm(g: GradBuilder, node: ir.Node, dy: ir.Value, groups: int):
    # x viewed as [N, G, M] (M = C/G * spatial), normalized over M; scale/bias per channel.
    # dx as in LayerNormalization on that view.
    x, scale, bias = node.inputs[:3]
    rank = g.rank(x)
    eps = g.scalar(attr(node, "epsilon", 1e-5), dy)
    view = g.ints([0, groups, -1])
    xg = g.op("Reshape", x, view)
    mu = g.reduce("ReduceMean", xg, [2], keepdims=True)
    xc = g.sub(xg, mu)
    invstd = g.op("Reciprocal", g.op("Sqrt", g.add(g.reduce("ReduceMean", g.mul(xc, xc), [2], keepdims=True), eps)))
    xhat_g = g.mul(xc, invstd)
    scale_b = g.unsqueeze(scale, list(range(1, rank - 1)))  # [C, 1, ...] against [N, C, *S]
    sum_axes = [0] + list(range(2, rank))
    d_g = g.op("Reshape", g.mul(dy, scale_b), view)
    dscale = dbias = dx = None
    if g.wants(scale):
        dscale = g.reduce("ReduceSum", g.mul(dy, g.reshape_like(xhat_g, x)), sum_axes, keepdims=False)
    if g.wants(bias):
        dbias = g.reduce("ReduceSum", dy, sum_axes, keepdims=False)
    if g.wants(x):
        mean_d = g.reduce("ReduceMean", d_g, [2], keepdims=True)
        mean_dx = g.reduce("ReduceMean", g.mul(d_g, xhat_g), [2], keepdims=True)
        dx = g.reshape_like(g.mul(invstd, g.sub(g.sub(d_g, mean_d), g.mul(xhat_g, mean_dx))), x)
    return dx, dscale, dbias


@grad_rule("InstanceNormalization")
def grad_instance_norm(g, node, dy):
    channels = static_shape(node.inputs[0])[1]
    if not isinstance(channels, int):
        raise GraphError(f"gradient of InstanceNormalization {node.name!r} needs a static channel count")
    return _group_norm(g, node, dy, channels)


@grad_rule("GroupNormalization")
def grad_group_norm(g, node, dy):
    # opset 21 semantics (scale and bias per channel); the opset-18 form is deprecated by ONNX
    g.require_opset(21, "GroupNormalization with per-channel scale")
    return _group_norm(g, node, dy, attr(node, "num_groups"))


def _channel_window_sum(g: GradBuilder, x: ir.Value, channels: int, before: int, after: int, rank: int) -> ir.Value:
    """out[:, c] = sum of x[:, c - before .. c + after] (zeros past the ends): Pad on the channel
    axis, then the sum of ``before + after + 1`` shifted Slices."""
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, after
    padded = g.op("Pad", x, g.ints(pads)) if before or after else x
    parts = [g.op("Slice", padded, g.ints([k]), g.ints([k + channels]), g.ints([1]))
             for k in range(before + after + 1)]
    return g.sum_values(parts)


@grad_rule("LRN")
def grad_lrn(g, node, dy):
    # y = x * d^-beta, d = bias + alpha/size * S, S the sum of x^2 over a window of channels
    # [c - floor((size-1)/2), c + ceil((size-1)/2)]: dx = dy * d^-beta + 2x * W^T(u) with
    # u = -beta * alpha/size * dy * x * d^(-beta-1), W^T the window sum with its ends swapped.
    x = node.inputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) < 3 or not isinstance(shape[1], int):
        raise GraphError(f"gradient of LRN {node.name!r} needs a known rank and channel count, got {shape}")
    rank, channels = len(shape), shape[1]
    size, alpha = attr(node, "size"), attr(node, "alpha", 1e-4)
    beta, bias = attr(node, "beta", 0.75), attr(node, "bias", 1.0)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    s = _channel_window_sum(g, g.mul(x, x), channels, before, after, rank)
    d = g.add(g.scalar(bias, x), g.mul(g.scalar(alpha / size, x), s))
    d_beta = g.op("Pow", d, g.scalar(-beta, x))
    u = g.mul(g.mul(dy, x), g.div(d_beta, d))  # dy * x * d^(-beta-1)
    spread = _channel_window_sum(g, u, channels, after, before, rank)
    return (g.add(g.mul(dy, d_beta), g.mul(g.mul(g.scalar(-2.0 * beta * alpha / size, x), x), spread)),)


@grad_rule("LpNormalization")
def grad_lp_normalization(g, node, dy):
    # y = x / s along axis, s = ||x||_p (p = 1 or 2): dx = (dy - t * sum(dy * y)) / s, with t =
    # sign(x) for p = 1 and t = y for p = 2 (the derivative of s divided by s)
    x, y = node.inputs[0], node.outputs[0]
    p, axis = attr(node, "p", 2), attr(node, "axis", -1)
    if p not in (1, 2):
        raise GraphError(f"gradient of LpNormalization {node.name!r} with p={p} (ONNX allows 1 or 2)")
    norm = g.reduce("ReduceL1" if p == 1 else "ReduceL2", x, [axis], keepdims=True)
    along = g.reduce("ReduceSum", g.mul(dy, y), [axis], keepdims=True)
    t = g.op("Sign", x) if p == 1 else y
    return (g.div(g.sub(dy, g.mul(t, along)), norm),)
