"""The losses of ``gc.losses`` on DSL Tensors (definitions in ``graphc/losses.py``).

The same formulas, in ONNX nodes appended to an existing graph, are in
``graphc/passes/training/losses.py`` (used when ``generate`` binds a loss spec to a model
output); ``tests/test_losses.py`` checks both against ``torch.nn.functional``.
"""

from __future__ import annotations

import numpy as np

from graphc import ops
from graphc.errors import GraphError
from graphc.tensor import Tensor


def _reduce(x: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return ops.mean(x)
    if reduction == "sum":
        return ops.sum(x)
    if reduction == "none":
        return x
    raise GraphError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def mse(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    diff = pred - target
    return _reduce(diff * diff, reduction)


def l1(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce(ops.abs(pred - target), reduction)


def huber(pred: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    d = ops.abs(pred - target)
    return _reduce(ops.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta), reduction)


def bce_with_logits(x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    # max(x, 0) written (x + |x|)/2 so the gradient at x = 0 is sigmoid(0) - y (see passes/training/losses.py)
    abs_x = ops.abs(x)
    return _reduce(x * (0.5 - y) + abs_x * 0.5 + ops.log(ops.exp(-abs_x) + 1.0), reduction)


def cross_entropy(logits: Tensor, labels: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100) -> Tensor:
    shape = logits.shape
    if shape is None or len(shape) < 2 or not isinstance(shape[1], int):
        raise GraphError(f"cross_entropy needs logits [N, C, ...] with a static class count C, got "
                         f"{logits.type_str()}")
    n_classes = shape[1]
    lsm = ops.log_softmax(logits, axis=1)
    classes = np.arange(n_classes, dtype=np.int64).reshape(n_classes, *[1] * (len(shape) - 2))
    onehot = ops.cast(ops.unsqueeze(labels, [1]) == ops.lift(classes), logits.dtype)
    elem = -ops.sum(onehot * lsm, axis=1)
    if label_smoothing:
        smooth = -ops.sum(lsm, axis=1) * (label_smoothing / n_classes)
        elem = elem * (1.0 - label_smoothing) + smooth
    keep = ops.cast(labels != ops.lift(np.asarray(ignore_index, dtype=np.int64)), logits.dtype)
    elem = elem * keep
    if reduction == "mean":
        return ops.sum(elem) / ops.sum(keep)
    return _reduce(elem, reduction)
