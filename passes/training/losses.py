"""Loss graphs: append ``mse l1 huber cross_entropy bce_with_logits`` nodes after a model output.

The formulas are PyTorch's (``torch.nn.functional``), written with ops every gradient rule
table covers (no GatherElements/Softplus): see ``graphc/losses.py`` for the definitions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.training.builder import Builder

LOSS_NAME = "loss"


def label_type(kind: str, output: ir.Value) -> tuple[ir.DataType, ir.Shape | None]:
    """The label input's dtype and shape for a loss on ``output``: int64 class indices
    ``[N, d1...]`` for cross-entropy on ``[N, C, d1...]``, else ``output``'s own type."""
    if kind != "cross_entropy":
        return output.dtype, output.shape
    shape = output.shape
    if shape is not None:
        dims = list(shape)
        shape = ir.Shape([dims[0], *dims[2:]]) if len(dims) >= 2 else None
    return ir.DataType.INT64, shape


def append_loss(b: Builder, kind: str, options: dict, output: ir.Value, label: ir.Value) -> ir.Value:
    """Append the loss nodes; the returned scalar value is named ``loss``."""
    fn = _LOSSES.get(kind)
    if fn is None:
        raise ValueError(f"unknown loss {kind!r}; expected one of {sorted(_LOSSES)}")
    return fn(b, output, label, **options)


def _reduce(b: Builder, x: ir.Value, reduction: str, count: ir.Value | None = None) -> ir.Value:
    if reduction == "sum":
        return b.op("ReduceSum", x, keepdims=0, name=LOSS_NAME)
    if count is not None:
        total = b.op("ReduceSum", x, keepdims=0)
        return b.op("Div", total, count, name=LOSS_NAME)
    return b.op("ReduceMean", x, keepdims=0, name=LOSS_NAME)


def mse(b: Builder, pred: ir.Value, target: ir.Value, reduction: str = "mean") -> ir.Value:
    diff = b.op("Sub", pred, target)
    return _reduce(b, b.op("Mul", diff, diff), reduction)


def l1(b: Builder, pred: ir.Value, target: ir.Value, reduction: str = "mean") -> ir.Value:
    return _reduce(b, b.op("Abs", b.op("Sub", pred, target)), reduction)


def huber(b: Builder, pred: ir.Value, target: ir.Value, reduction: str = "mean",
          delta: float = 1.0) -> ir.Value:
    # 0.5*d^2 where d < delta, delta*(d - 0.5*delta) elsewhere (d = |pred - target|).
    d = b.op("Abs", b.op("Sub", pred, target))
    quad = b.op("Mul", b.op("Mul", d, d), b.scalar_like(0.5, pred))
    lin = b.op("Mul", b.op("Sub", d, b.scalar_like(0.5 * delta, pred)), b.scalar_like(delta, pred))
    small = b.op("Less", d, b.scalar_like(delta, pred), dtype=ir.DataType.BOOL)
    return _reduce(b, b.op("Where", small, quad, lin, dtype=pred.dtype), reduction)


def bce_with_logits(b: Builder, x: ir.Value, y: ir.Value, reduction: str = "mean") -> ir.Value:
    # max(x, 0) - x*y + log(1 + exp(-|x|)), with max(x, 0) written (x + |x|)/2: exp never
    # overflows, and the gradient is sigmoid(x) - y at x = 0 too (the Relu form gives -y there).
    abs_x = b.op("Abs", x)
    tail = b.op("Log", b.op("Add", b.scalar_like(1.0, x), b.op("Exp", b.op("Neg", abs_x))))
    linear = b.op("Add", b.op("Mul", x, b.op("Sub", b.scalar_like(0.5, x), y)),
                  b.op("Mul", abs_x, b.scalar_like(0.5, x)))
    return _reduce(b, b.op("Add", linear, tail), reduction)


def cross_entropy(b: Builder, logits: ir.Value, labels: ir.Value, reduction: str = "mean",
                  label_smoothing: float = 0.0, ignore_index: int = -100) -> ir.Value:
    if logits.shape is None or len(logits.shape) < 2:
        raise ValueError(f"cross_entropy needs logits of rank >= 2 [N, C, ...], got shape "
                         f"{logits.shape} for {logits.name!r}")
    rank = len(logits.shape)
    lsm = b.op("LogSoftmax", logits, axis=1)
    classes = _class_ids(b, logits, rank)
    onehot = b.op("Cast", b.op("Equal", b.axes_op("Unsqueeze", labels, [1]), classes, dtype=ir.DataType.BOOL),
                  to=logits.dtype, dtype=logits.dtype)
    picked = b.axes_op("ReduceSum", b.op("Mul", onehot, lsm), [1], keepdims=0)
    elem = b.op("Neg", picked)  # nll per element
    if label_smoothing:
        smooth = b.op("Neg", b.axes_op("ReduceSum", lsm, [1], keepdims=0))
        n_classes = b.op("Cast", b.op("Shape", logits, start=1, end=2, dtype=ir.DataType.INT64),
                         to=logits.dtype, dtype=logits.dtype)
        smooth = b.op("Div", b.op("Mul", smooth, b.scalar_like(label_smoothing, logits)), n_classes)
        elem = b.op("Add", b.op("Mul", elem, b.scalar_like(1.0 - label_smoothing, logits)), smooth)
    keep = b.op("Cast", b.op("Not", b.op("Equal", labels, b.const(ignore_index, np.int64), dtype=ir.DataType.BOOL)),
                to=logits.dtype, dtype=logits.dtype)
    elem = b.op("Mul", elem, keep)
    if reduction == "sum":
        return _reduce(b, elem, "sum")
    return _reduce(b, elem, "mean", count=b.op("ReduceSum", keep, keepdims=0))


def _class_ids(b: Builder, logits: ir.Value, rank: int) -> ir.Value:
    """0..C-1 shaped [C, 1, ...] to broadcast against labels unsqueezed at axis 1."""
    n_classes = logits.shape[1]
    trailing = [1] * (rank - 2)
    if isinstance(n_classes, int):
        return b.const(np.arange(n_classes, dtype=np.int64).reshape(n_classes, *trailing), hint="classes")
    c = b.axes_op("Squeeze", b.op("Shape", logits, start=1, end=2, dtype=ir.DataType.INT64), [0])
    ids = b.op("Range", b.const(0, np.int64), c, b.const(1, np.int64))
    return b.axes_op("Unsqueeze", ids, list(range(1, rank - 1))) if trailing else ids


_LOSSES = {"mse": mse, "l1": l1, "huber": huber, "cross_entropy": cross_entropy,
           "bce_with_logits": bce_with_logits}
KINDS: Sequence[str] = tuple(_LOSSES)
