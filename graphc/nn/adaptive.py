"""``torch.nn.AdaptiveLogSoftmaxWithLoss``: the adaptive softmax of Grave et al. (2016).

The head scores the ``cutoffs[0]`` most frequent classes and one entry per tail cluster; the
cluster ``[cutoffs[i], cutoffs[i+1])`` is scored by its own two bias-free Linears (a projection to
``in_features // div_value ** (i+1)`` and the cluster's classes). A class's log-probability is its
head entry's, or its cluster's head entry's plus its log-probability within the cluster.

torch's ``forward`` runs each tail on the rows whose targets fall in its cluster (a data-dependent
selection); the graph runs every tail on every row and keeps, with ``Where``, each row's own
cluster term, so the values and the gradients are torch's (rows of other clusters get a zero
gradient through a tail) at the cost of the tails on all rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl import ops, ops_array
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.containers import ModuleList, Sequential
from graphc.nn.layers import Linear
from graphc.nn.module import Module
from graphc.nn.signatures import takes_device

__all__ = ["AdaptiveLogSoftmaxWithLoss", "ASMOutput"]

_OP = "AdaptiveLogSoftmaxWithLoss"


class ASMOutput(NamedTuple):
    """What ``forward`` returns, as torch's ``_ASMoutput``: each row's target log-probability and
    the loss, their negated mean."""

    output: Tensor
    loss: Tensor


@takes_device
class AdaptiveLogSoftmaxWithLoss(Module):
    """``torch.nn.AdaptiveLogSoftmaxWithLoss(in_features, n_classes, cutoffs, div_value=4.0,
    head_bias=False)``: ``forward(input, target) -> ASMOutput(output, loss)`` for ``(N,
    in_features)`` input and ``(N,)`` int targets (or ``(in_features)`` and a 0-d target);
    ``log_prob(input)`` ``(N, n_classes)``; ``predict(input)`` the most likely class. A target
    outside ``[0, n_classes)`` gives a NaN output (torch raises at run time)."""

    def __init__(self, in_features: int, n_classes: int, cutoffs: Sequence[int], div_value: float = 4.0,
                 head_bias: bool = False, dtype: Any = "float32"):
        super().__init__()
        cutoffs = list(cutoffs)
        if not cutoffs:
            raise CaptureError(f"{_OP}: cutoffs should be a sequence of length larger than 0 (at {user_source()})")
        if cutoffs != sorted(cutoffs) or min(cutoffs) <= 0 or max(cutoffs) > n_classes - 1 or \
                len(set(cutoffs)) != len(cutoffs) or any(int(c) != c for c in cutoffs):
            raise CaptureError(f"{_OP}: cutoffs should be a sequence of unique, positive integers sorted in an "
                               f"increasing order, where each value is between 1 and n_classes-1 = {n_classes - 1}; "
                               f"got {cutoffs} (at {user_source()})")
        self.in_features, self.n_classes, self.cutoffs = in_features, n_classes, [int(c) for c in cutoffs] + [n_classes]
        self.div_value, self.head_bias = div_value, head_bias
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters
        self.head = Linear(in_features, self.head_size, bias=head_bias, dtype=dtype)
        self.tail = ModuleList(
            Sequential(Linear(in_features, int(in_features // (div_value ** (i + 1))), bias=False, dtype=dtype),
                       Linear(int(in_features // (div_value ** (i + 1))), hi - lo, bias=False, dtype=dtype))
            for i, (lo, hi) in enumerate(zip(self.cutoffs, self.cutoffs[1:])))

    def forward(self, input: Tensor, target: Any) -> ASMOutput:  # noqa: A002 - torch's names
        x, target = ops.lift(input), ops.lift(target)
        if target.dtype not in ("int64", "int32") or target.ndim > 1:
            raise op_error(_OP, [x, target], f"target must be a 0-D or 1-D int64 or int32 Tensor, got "
                           f"{target.dtype} of rank {target.ndim}", user_source())
        if x.ndim != target.ndim + 1:
            raise op_error(_OP, [x, target], f"{target.ndim}D target tensor expects {target.ndim + 1}D input "
                           f"tensors, got rank {x.ndim}", user_source())
        if target.ndim == 0:
            out = self.forward(ops.unsqueeze(x, [0]), ops.unsqueeze(target, [0]))
            return ASMOutput(ops.squeeze(out.output, [0]), out.loss)
        ops.same_dim(_OP, [x, target], x.shape[0], target.shape[0], "input and target batch sizes")
        target = ops.cast(target, "int64")
        head = ops.log_softmax(self.head(x), 1)
        cluster = sum(ops.cast(target >= ops.scalar(c, target), "int64") for c in self.cutoffs[:-1])
        in_head = ops.where(target < ops.scalar(self.shortlist_size, target), target,
                            cluster + ops.scalar(self.shortlist_size - 1, target))
        output = _picked(head, in_head)
        for i, (lo, hi) in enumerate(zip(self.cutoffs, self.cutoffs[1:])):
            inside = (target >= ops.scalar(lo, target)) & (target < ops.scalar(hi, target))
            within = ops.clip(target - ops.scalar(lo, target), 0, hi - lo - 1)
            term = _picked(ops.log_softmax(self.tail[i](x), 1), within)
            output = output + ops.where(inside, term, ops.scalar(0.0, term))
        valid = (target >= ops.scalar(0, target)) & (target < ops.scalar(self.n_classes, target))
        output = ops.where(valid, output, ops.scalar(np.nan, output))
        return ASMOutput(output, ops.mean(-output))

    def log_prob(self, input: Tensor) -> Tensor:  # noqa: A002
        """Log-probabilities of all ``n_classes`` classes, ``(N, n_classes)``, for ``(N, in_features)`` input."""
        x = ops.lift(input)
        if x.ndim != 2:
            raise op_error(_OP, [x], f"log_prob expects a (N, in_features) input, got rank {x.ndim}", user_source())
        head = ops.log_softmax(self.head(x), 1)
        parts = [head[:, :self.shortlist_size]]
        for i in range(self.n_clusters):
            column = self.shortlist_size + i
            parts.append(ops.log_softmax(self.tail[i](x), 1) + head[:, column:column + 1])
        return ops.concat(parts, 1)

    def predict(self, input: Tensor) -> Tensor:  # noqa: A002
        """The most likely class of each row, int64 ``(N,)``: ``log_prob(input).argmax(1)``, which
        torch's shortcut through the head equals."""
        return ops_array.argmax(self.log_prob(input), 1)


def _picked(log_probs: Tensor, index: Tensor) -> Tensor:
    """``log_probs[n, index[n]]`` for each row n."""
    return ops.squeeze(ops_array.gather(log_probs, 1, ops.unsqueeze(index, [1])), [1])
