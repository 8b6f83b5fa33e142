"""The losses of ``gc.losses`` on DSL Tensors (definitions in ``graphc/compile/losses.py``).

``gc.training.generate`` captures these same functions to append a loss spec's graph to a
model, so there is one definition of each formula; ``tests/test_losses.py`` checks them
against closed forms and ``torch.nn.functional``.
"""

from __future__ import annotations

import numpy as np

from graphc.dsl import ops, ops_array
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError


def _reduce(x: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return ops.mean(x)
    if reduction == "sum":
        return ops.sum(x)
    if reduction == "none":
        return x
    raise CaptureError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def mse(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    diff = pred - target
    return _reduce(diff * diff, reduction)


def l1(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce(ops.abs(pred - target), reduction)


def huber(pred: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    d = ops.abs(pred - target)
    return _reduce(ops.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta), reduction)


def bce_with_logits(x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    # max(x, 0) - x*y + log(1 + exp(-|x|)): exp never overflows, whatever |x|. max(x, 0) is
    # written (x + |x|)/2 so the gradient at x = 0 is sigmoid(0) - y (a Relu would give -y there).
    abs_x = ops.abs(x)
    return _reduce(x * (0.5 - y) + abs_x * 0.5 + ops.log(ops.exp(-abs_x) + 1.0), reduction)


def cross_entropy(logits: Tensor, labels: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100) -> Tensor:
    shape = logits.shape
    if shape is None or len(shape) < 2:
        raise CaptureError(f"cross_entropy needs logits [N, C, ...], got {logits.type_str()}")
    lsm = ops.log_softmax(logits, axis=1)
    # each label's log-probability picked by GatherElements, so the gradient scatters one value
    # per label where a one-hot of the labels (Equal, Cast, Mul, ReduceSum) made four passes
    # over [N, C] and held that one-hot for the backward (GPT's [4096, 2048] logits: 32 MB).
    # bench_zoo's GPT at batch 32, the loss's kernel time forward and backward (2 threads,
    # profiles of two sessions each): 34.3 -> 20.7 ms a step (11.7 with LogSoftmax's sparse
    # gradient, ``rules_reduce``).
    # Labels outside [0, C), ignore_index among them, pick class 0 and count for nothing.
    ids, zero = ops.unsqueeze(labels, [1]), ops.lift(np.asarray(0, dtype=labels.dtype))
    hit = (ids >= zero) & (ids < _class_count(logits, labels.dtype))
    picked = ops_array.gather(lsm, 1, ops.where(hit, ids, zero))
    elem = -ops.squeeze(picked * ops.cast(hit, logits.dtype), [1])
    if label_smoothing:
        smooth = -ops.sum(lsm, axis=1) * label_smoothing / _class_count(logits)
        elem = elem * (1.0 - label_smoothing) + smooth
    keep = ops.cast(labels != ops.lift(np.asarray(ignore_index, dtype=labels.dtype)), logits.dtype)
    elem = elem * keep
    if reduction == "mean":
        return ops.sum(elem) / ops.sum(keep)  # mean over the labels not ignored, as PyTorch
    return _reduce(elem, reduction)


def _class_count(logits: Tensor, dtype=None):
    """C, logits' axis 1: a float (a constant of ``dtype``, if given) where static, else read
    from the shape and cast to the logits' dtype (or ``dtype``)."""
    if isinstance(logits.shape[1], int):
        return float(logits.shape[1]) if dtype is None else ops.lift(np.asarray(logits.shape[1], dtype=dtype))
    return ops.cast(ops.emit("Shape", [logits], {"start": 1, "end": 2}), dtype or logits.dtype)
