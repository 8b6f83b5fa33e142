"""The losses of ``gc.losses`` on DSL Tensors (definitions in ``graphc/compile/losses.py``).

``gc.training.generate`` captures these same functions to append a loss spec's graph to a
model, so there is one definition of each formula; ``tests/test_losses.py`` checks them
against closed forms and ``torch.nn.functional``.
"""

from __future__ import annotations

import numpy as np

from graphc.dsl import ops
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
    # one-hot of the labels along axis 1 (no GatherElements: plain ops every backend and the
    # gradient table cover); labels equal to ignore_index (or out of range) match no class
    onehot = ops.cast(ops.unsqueeze(labels, [1]) == _class_ids(logits), logits.dtype)
    elem = -ops.sum(onehot * lsm, axis=1)
    if label_smoothing:
        smooth = -ops.sum(lsm, axis=1) * label_smoothing / _class_count(logits)
        elem = elem * (1.0 - label_smoothing) + smooth
    keep = ops.cast(labels != ops.lift(np.asarray(ignore_index, dtype=np.int64)), logits.dtype)
    elem = elem * keep
    if reduction == "mean":
        return ops.sum(elem) / ops.sum(keep)  # mean over the labels not ignored, as PyTorch
    return _reduce(elem, reduction)


def _class_ids(logits: Tensor) -> Tensor:
    """0..C-1 shaped [C, 1, ...] (to broadcast against labels unsqueezed at axis 1)."""
    shape = logits.shape
    trailing = [1] * (len(shape) - 2)
    if isinstance(shape[1], int):
        return ops.lift(np.arange(shape[1], dtype=np.int64).reshape(shape[1], *trailing))
    count = ops.squeeze(ops.emit("Shape", [logits], {"start": 1, "end": 2}), [0])
    ids = ops.emit("Range", [ops.lift(np.int64(0)), count, ops.lift(np.int64(1))])
    return ops.unsqueeze(ids, list(range(1, len(shape) - 1))) if trailing else ids


def _class_count(logits: Tensor):
    if isinstance(logits.shape[1], int):
        return float(logits.shape[1])
    return ops.cast(ops.emit("Shape", [logits], {"start": 1, "end": 2}), logits.dtype)
