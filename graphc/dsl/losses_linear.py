"""``torch.nn.functional.linear_cross_entropy``: ``cross_entropy(linear(input, W, b), target, ...)``
with torch's shapes (a ``[C, d_1 .. d_K, in]`` weight gives a K-dimensional loss) and refusals.
torch's ``options`` (a chunked, memory-saving evaluation) is accepted: the values are the same."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl import losses, ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_nn import linear
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES


def linear_cross_entropy(input: Any, linear_weight: Any, target: Any, *, linear_bias: Any = None,  # noqa: A002
                         weight: Any = None, reduction: str = "mean", ignore_index: int | None = None,
                         label_smoothing: float = 0.0, options: Any = None) -> Tensor:
    """``F.linear_cross_entropy``: the logits ``[N, C, d...]`` (or ``[C]``) of ``input [N, in]``
    (or ``[in]``) and ``linear_weight [C, d..., in]`` (plus ``linear_bias [C, d...]``) under
    ``F.cross_entropy`` with ``weight``, ``reduction``, ``ignore_index`` (None: -100) and
    ``label_smoothing``."""
    x, w = ops.lift(input), ops.lift(linear_weight)
    target = ops.lift(target)
    bias = None if linear_bias is None else ops.lift(linear_bias, x)

    def fail(message: str):
        raise op_error("linear_cross_entropy", [x, w], message, user_source())

    if x.ndim not in (1, 2):
        fail(f"expected input with dimensionality 1 or 2, got {x.ndim}")
    if w.ndim < 2:
        fail(f"expected linear_weight with dimensionality at least 2, got {w.ndim}")
    if w.shape[-1] != x.shape[-1]:
        fail(f"expected equal input and linear_weight last dimensions (in_features), got {x.shape[-1]} and "
             f"{w.shape[-1]}")
    classes, out_features = w.shape[0], tuple(w.shape[1:-1])
    if bias is not None and tuple(bias.shape) != (classes, *out_features):
        fail(f"expected linear_bias shape {(classes, *out_features)}, got {tuple(bias.shape)}")
    if out_features and x.ndim == 1:
        fail(f"K-dimensional loss defined by linear_weight shape {tuple(w.shape)} requires batched input, "
             f"(N, {x.shape[-1]}), got unbatched input with shape {tuple(x.shape)}")
    if target.dtype in FLOAT_DTYPES and ignore_index is not None:
        fail("ignore_index cannot be specified when target contains probabilities")
    if out_features:
        rows = math.prod(out_features, start=classes)
        w = ops.reshape(w, [rows, w.shape[-1]])
        bias = None if bias is None else ops.reshape(bias, [rows])
    logits = linear(x, w, bias)
    if out_features:
        logits = ops.reshape(logits, [-1, classes, *out_features])
    return losses.cross_entropy(logits, target, reduction, label_smoothing,
                                -100 if ignore_index is None else ignore_index, weight)


__all__ = ["linear_cross_entropy"]
