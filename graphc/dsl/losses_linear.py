"""``torch.nn.functional.linear_cross_entropy``: ``cross_entropy(linear(input, W, b), target, ...)``
with torch's shapes (a ``[C, d_1 .. d_K, in]`` weight gives a K-dimensional loss) and refusals.
torch's ``options`` (a chunked, memory-saving evaluation) is accepted, checked and has no numeric effect: the graph
computes the logits whole, as torch's reference path."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from graphc.dsl import losses, ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_nn import linear
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES


_ACC_POLICIES = ("auto", "accurate", "balanced", "compact")
_ACC_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class LinearCrossEntropyOptions:
    """``torch.nn.LinearCrossEntropyOptions``: torch's chunking options for ``linear_cross_entropy``,
    checked as torch checks them. A captured graph computes the logits whole, so they change nothing."""

    allow_retain_graph: bool = False
    batch_chunk_size: int | None = None
    chunking_method: str | None = "auto"
    acc_policy: str = "auto"
    acc_dtype: Any = None

    def __post_init__(self):
        method = "auto" if self.chunking_method is None else self.chunking_method
        name, sep, factor = method.partition(":") if isinstance(method, str) else (method, "", "")
        if self.acc_policy not in _ACC_POLICIES:
            raise ValueError(f"LinearCrossEntropyOptions: acc_policy must be one of {_ACC_POLICIES}, got "
                             f"{self.acc_policy!r}")
        if name != "auto" and not (name == "aspect_ratio" and (not sep or (factor.isdigit() and int(factor) > 0))):
            raise ValueError("LinearCrossEntropyOptions: chunking_method must be None, 'auto', 'aspect_ratio' or "
                             f"'aspect_ratio:N' with N >= 1, got {self.chunking_method!r}")
        if self.batch_chunk_size is not None and (isinstance(self.batch_chunk_size, bool) or not isinstance(
                self.batch_chunk_size, int) or self.batch_chunk_size <= 0):
            raise ValueError(f"LinearCrossEntropyOptions: batch_chunk_size must be a positive int or None, got "
                             f"{self.batch_chunk_size!r}")
        if self.acc_dtype is not None and str(self.acc_dtype).removeprefix("torch.") not in _ACC_DTYPES:
            raise ValueError(f"LinearCrossEntropyOptions: acc_dtype must be None or one of {_ACC_DTYPES}, got "
                             f"{self.acc_dtype!r}")


def check_options(options: Any) -> None:
    """Refuse ``options`` other than None or a ``LinearCrossEntropyOptions`` (graphc's or torch's)."""
    kind = type(options)
    if options is None or isinstance(options, LinearCrossEntropyOptions) or (
            kind.__name__ == "LinearCrossEntropyOptions" and kind.__module__.startswith("torch.")):
        return
    raise CaptureError(f"linear_cross_entropy: options must be None or a LinearCrossEntropyOptions (gc.nn's or "
                       f"torch.nn's), got {options!r} (a {kind.__name__}) (at {user_source()})")


def linear_cross_entropy(input: Any, linear_weight: Any, target: Any, *, linear_bias: Any = None,  # noqa: A002
                         weight: Any = None, reduction: str = "mean", ignore_index: int | None = None,
                         label_smoothing: float = 0.0, options: Any = None) -> Tensor:
    """``F.linear_cross_entropy``: the logits ``[N, C, d...]`` (or ``[C]``) of ``input [N, in]``
    (or ``[in]``) and ``linear_weight [C, d..., in]`` (plus ``linear_bias [C, d...]``) under
    ``F.cross_entropy`` with ``weight``, ``reduction``, ``ignore_index`` (None: -100) and
    ``label_smoothing``."""
    check_options(options)
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


__all__ = ["LinearCrossEntropyOptions", "check_options", "linear_cross_entropy"]
