"""VJP rules of the fused losses torch.onnx.export emits for F.cross_entropy / F.nll_loss."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, attr
from graphc.passes.autodiff.registry import grad_rule


def _loss_weights(g: GradBuilder, node: ir.Node, dy: ir.Value, like: ir.Value):
    """Per-element factor d loss_total / d loss_i (ignored labels 0, class weights applied) and
    the labels with ignored entries replaced by 0 (so OneHot/Gather stay in range).
    Class weights get no gradient (as in PyTorch, where nll_loss's weight is not differentiable)."""
    labels = node.inputs[1]
    weights = node.inputs[2] if len(node.inputs) > 2 else None
    ignore = attr(node, "ignore_index")
    factor = None
    if ignore is not None:
        keep = g.op("Not", g.op("Equal", labels, g.const(ignore, labels.dtype or np.int64)))
        labels = g.op("Where", keep, labels, g.const(0, labels.dtype or np.int64))
        factor = g.cast_like(keep, like)
    if weights is not None:
        w = g.op("Gather", weights, labels, axis=0)
        factor = w if factor is None else g.mul(factor, w)
    if factor is None:
        factor = g.full(g.op("Shape", labels), 1.0, like)
    reduction = attr(node, "reduction", "mean")
    if reduction == "mean":
        per = g.mul(factor, g.div(dy, g.reduce("ReduceSum", factor, None, keepdims=False)))
    else:  # "sum" (dy is a scalar) or "none" (dy has the labels' shape)
        per = g.mul(factor, dy)
    return per, labels


def _one_hot(g: GradBuilder, labels: ir.Value, scores: ir.Value, like: ir.Value) -> ir.Value:
    depth = g.op("Gather", g.op("Shape", scores), g.const(1, np.int64))  # a 0-d depth
    values = g.op("Cast", g.const([0, 1], np.int64), to=int(like.dtype or ir.DataType.FLOAT))
    return g.op("OneHot", labels, depth, values, axis=1)


@grad_rule("SoftmaxCrossEntropyLoss", multi_output=True)
def grad_softmax_cross_entropy(g, node, dys):
    # d scores = per_sample * (softmax(scores, axis=1) - onehot(label)) (+ the log_prob output's
    # gradient through LogSoftmax when that output is used as well).
    scores = node.inputs[0]
    dy, dlogp = dys[0], dys[1] if len(dys) > 1 else None
    prob = g.op("Softmax", scores, axis=1)
    dx = None
    if dy is not None:
        per, labels = _loss_weights(g, node, dy, scores)
        dx = g.mul(g.unsqueeze(per, [1]), g.sub(prob, _one_hot(g, labels, scores, scores)))
    if dlogp is not None:
        s = g.reduce("ReduceSum", dlogp, [1], keepdims=True)
        extra = g.sub(dlogp, g.mul(prob, s))
        dx = extra if dx is None else g.add(dx, extra)
    return (dx,) + (None,) * (len(node.inputs) - 1)


@grad_rule("NegativeLogLikelihoodLoss")
def grad_nll_loss(g, node, dy):
    # d input = -per_sample * onehot(label)
    x = node.inputs[0]
    per, labels = _loss_weights(g, node, dy, x)
    dx = g.neg(g.mul(g.unsqueeze(per, [1]), _one_hot(g, labels, x, x)))
    return (dx,) + (None,) * (len(node.inputs) - 1)
