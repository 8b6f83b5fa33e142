"""Loss kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (what torch.onnx.export
emits for ``cross_entropy``/``nll_loss``; graphc's autodiff has rules for both).

``mean`` divides by the summed weights of the targets that count (``ignore_index`` targets
weigh 0), as PyTorch does.
"""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel


def _nll(log_prob, target, weight, reduction, ignore_index):
    target = target.astype(np.int64)
    ignored = target == ignore_index if ignore_index is not None else np.zeros(target.shape, bool)
    safe = np.where(ignored, 0, target)
    picked = np.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    w = weight[safe] if weight is not None else np.ones(safe.shape, log_prob.dtype)
    w = np.where(ignored, 0, w).astype(log_prob.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss.astype(log_prob.dtype)
    if reduction == "sum":
        return np.asarray(loss.sum(), dtype=log_prob.dtype)
    return np.asarray(loss.sum() / w.sum(), dtype=log_prob.dtype)


@kernel("NegativeLogLikelihoodLoss", since=12)
def nll_loss(x, target, weight=None, *, ignore_index=None, reduction="mean"):
    return (_nll(x, target, weight, reduction, ignore_index),)


@kernel("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None, reduction="mean",
                               _outputs=1):
    shifted = scores - scores.max(axis=1, keepdims=True)
    log_prob = (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(scores.dtype)
    return (_nll(log_prob, labels, weights, reduction, ignore_index), log_prob)[:_outputs]
