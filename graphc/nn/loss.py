"""Loss functions and modules with ``torch.nn.functional``'s and ``torch.nn``'s names, signatures
and defaults (MSELoss ... TripletMarginWithDistanceLoss); the formulas are ``graphc/dsl/losses.py``'s
and ``graphc/dsl/losses_margin.py``'s.

The deprecated ``size_average`` and ``reduce`` arguments override ``reduction`` as in torch.
Class weights (``weight``, ``pos_weight``) are buffers, as torch registers them: in the given array's
dtype, in ``state_dict()`` under torch's keys and never trained (``gc.training.generate`` keeps buffers constant)."""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np

from graphc.dsl import losses, losses_margin, ops
from graphc.dsl.ctc import ctc_loss
from graphc.dsl.losses_linear import check_options, linear_cross_entropy
from graphc.dsl.losses_margin import margin_power, positive_margin
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.distance import PairwiseDistance
from graphc.nn.layers import Linear
from graphc.nn.module import Module, Parameter


def _reduction(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    """``reduction``, or what the deprecated ``size_average``/``reduce`` say when either is given
    (torch's ``_Reduction.legacy_get_string``: each defaults to True); torch's deprecated
    ``"elementwise_mean"`` is ``"mean"``, with its warning."""
    if size_average is None and reduce is None:
        if reduction == "elementwise_mean":
            warnings.warn("reduction='elementwise_mean' is deprecated. Please use reduction='mean' instead.",
                          stacklevel=3)
            return "mean"
        return reduction
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


# -- the functional forms (torch.nn.functional) --------------------------------------------------------------------


def _weighted(name: str, loss: Callable[..., Tensor], input: Tensor, target: Tensor,  # noqa: A002
              reduction: str, weight: Any, *args: Any, by_weights: bool = True) -> Tensor:
    """``loss(input, target, reduction, *args)``; with torch 2.13's ``weight`` (one per element, ``input``'s
    shape) each unreduced loss times its weight, ``"mean"`` their sum over the weights' sum (``by_weights``,
    torch's mse and l1) or their mean (torch's huber)."""
    if weight is None:
        return loss(input, target, reduction, *args)
    losses.check_reduction(name, reduction)
    input, weight = ops.lift(input), losses.like_dtype(weight, ops.lift(input))
    if weight.shape != input.shape:
        raise CaptureError(f"{name}: weight's shape {weight.shape} must be input's {input.shape} (one weight per "
                           f"element, as torch's)")
    out = loss(input, target, "none", *args) * weight
    if reduction == "mean" and by_weights:
        return ops.sum(out) / ops.sum(weight)
    return losses.reduce_loss(out, reduction)


def mse_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,  # noqa: A002
             reduction: str = "mean", weight: Any = None) -> Tensor:
    return _weighted("mse_loss", losses.mse, input, target, _reduction(size_average, reduce, reduction), weight)


def l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,  # noqa: A002
            reduction: str = "mean", weight: Any = None) -> Tensor:
    return _weighted("l1_loss", losses.l1, input, target, _reduction(size_average, reduce, reduction), weight)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None,  # noqa: A002
                   reduce: bool | None = None, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    return losses.smooth_l1(input, target, _reduction(size_average, reduce, reduction), beta)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,  # noqa: A002
               weight: Any = None) -> Tensor:
    return _weighted("huber_loss", losses.huber, input, target, reduction, weight, delta, by_weights=False)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Any = None,  # noqa: A002
                         size_average: bool | None = None, reduce: bool | None = None,
                         reduction: str = "mean") -> Tensor:
    return losses.bce(input, target, _reduction(size_average, reduce, reduction), weight)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Any = None,  # noqa: A002
                                     size_average: bool | None = None, reduce: bool | None = None,
                                     reduction: str = "mean", pos_weight: Any = None) -> Tensor:
    return losses.bce_with_logits(input, target, _reduction(size_average, reduce, reduction), weight, pos_weight)


def cross_entropy(input: Tensor, target: Tensor, weight: Any = None, size_average: bool | None = None,  # noqa: A002
                  ignore_index: int = -100, reduce: bool | None = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    return losses.cross_entropy(input, target, _reduction(size_average, reduce, reduction), label_smoothing,
                                ignore_index, weight)


def nll_loss(input: Tensor, target: Tensor, weight: Any = None, size_average: bool | None = None,  # noqa: A002
             ignore_index: int = -100, reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    return losses.nll(input, target, _reduction(size_average, reduce, reduction), weight, ignore_index)


def kl_div(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,  # noqa: A002
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    return losses.kl_div(input, target, _reduction(size_average, reduce, reduction), log_target)


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False,  # noqa: A002
                     size_average: bool | None = None, eps: float = 1e-8, reduce: bool | None = None,
                     reduction: str = "mean") -> Tensor:
    return losses.poisson_nll(input, target, log_input, full, eps, _reduction(size_average, reduce, reduction))


def gaussian_nll_loss(input: Tensor, target: Tensor, var: Any, full: bool = False, eps: float = 1e-6,  # noqa: A002
                      reduction: str = "mean") -> Tensor:
    return losses.gaussian_nll(input, target, var, full, eps, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0,
                          size_average: bool | None = None, reduce: bool | None = None,
                          reduction: str = "mean") -> Tensor:
    return losses_margin.cosine_embedding(input1, input2, target, margin, _reduction(size_average, reduce, reduction))


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0,
                        size_average: bool | None = None, reduce: bool | None = None,
                        reduction: str = "mean") -> Tensor:
    return losses_margin.margin_ranking(input1, input2, target, margin, _reduction(size_average, reduce, reduction))


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0,  # noqa: A002
                         size_average: bool | None = None, reduce: bool | None = None,
                         reduction: str = "mean") -> Tensor:
    return losses_margin.hinge_embedding(input, target, margin, _reduction(size_average, reduce, reduction))


def soft_margin_loss(input: Tensor, target: Tensor, size_average: bool | None = None,  # noqa: A002
                     reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    return losses_margin.soft_margin(input, target, _reduction(size_average, reduce, reduction))


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Any = None,  # noqa: A002
                                size_average: bool | None = None, reduce: bool | None = None,
                                reduction: str = "mean") -> Tensor:
    return losses_margin.multilabel_soft_margin(input, target, weight, _reduction(size_average, reduce, reduction))


def multilabel_margin_loss(input: Tensor, target: Tensor, size_average: bool | None = None,  # noqa: A002
                           reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    return losses_margin.multilabel_margin(input, target, _reduction(size_average, reduce, reduction))


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight: Any = None,  # noqa: A002
                      size_average: bool | None = None, reduce: bool | None = None,
                      reduction: str = "mean") -> Tensor:
    return losses_margin.multi_margin(input, target, p, margin, weight, _reduction(size_average, reduce, reduction))


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average: bool | None = None,
                        reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    return losses_margin.triplet_margin(anchor, positive, negative, margin, p, eps, swap,
                                        _reduction(size_average, reduce, reduction))


def triplet_margin_with_distance_loss(anchor: Tensor, positive: Tensor, negative: Tensor, *,
                                      distance_function: Callable[[Tensor, Tensor], Tensor] | None = None,
                                      margin: float = 1.0, swap: bool = False, reduction: str = "mean") -> Tensor:
    return losses_margin.triplet_margin_with_distance(anchor, positive, negative, distance_function, margin, swap,
                                                      reduction)


# -- the modules (torch.nn) ---------------------------------------------------------------------------------------


class _Loss(Module):
    _reductions = losses.REDUCTIONS

    def __init__(self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean"):
        super().__init__()
        self.reduction = _reduction(size_average, reduce, reduction)
        losses.check_reduction(type(self).__name__, self.reduction, self._reductions)


def _buffer(value: Any) -> Parameter | None:
    """A class-weight buffer in the given array's dtype, as torch keeps a tensor's (a float64 array stays
    float64); a list or tuple of floats is float32, torch's default dtype; None stays None."""
    if value is None:
        return None
    data = np.asarray(value)
    if isinstance(value, (list, tuple)) and data.dtype == np.float64:
        data = data.astype(np.float32)
    return Parameter(data, dtype=data.dtype, buffer=True)


def _as_input(weight: Parameter | None, input: Tensor) -> Tensor | None:  # noqa: A002
    """A weight buffer in the input's float dtype (``losses.in_input_dtype``); None stays None."""
    return None if weight is None else losses.in_input_dtype(weight, input)


class _WeightedLoss(_Loss):
    def __init__(self, weight: Any = None, size_average: bool | None = None, reduce: bool | None = None,
                 reduction: str = "mean"):
        super().__init__(size_average, reduce, reduction)
        self.weight = _buffer(weight)


class MSELoss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.mse(input, target, self.reduction)


class L1Loss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.l1(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
                 beta: float = 1.0):
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.smooth_l1(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.huber(input, target, self.reduction, self.delta)


class BCELoss(_WeightedLoss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.bce(input, target, self.reduction, _as_input(self.weight, input))


class BCEWithLogitsLoss(_WeightedLoss):
    def __init__(self, weight: Any = None, size_average: bool | None = None, reduce: bool | None = None,
                 reduction: str = "mean", pos_weight: Any = None):
        super().__init__(weight, size_average, reduce, reduction)
        self.pos_weight = _buffer(pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.bce_with_logits(input, target, self.reduction, _as_input(self.weight, input),
                                      _as_input(self.pos_weight, input))


class _ClassLoss(_WeightedLoss):
    def __init__(self, weight: Any = None, size_average: bool | None = None, ignore_index: int = -100,
                 reduce: bool | None = None, reduction: str = "mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index


class NLLLoss(_ClassLoss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.nll(input, target, self.reduction, _as_input(self.weight, input), self.ignore_index)


class CrossEntropyLoss(_ClassLoss):
    def __init__(self, weight: Any = None, size_average: bool | None = None, ignore_index: int = -100,
                 reduce: bool | None = None, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__(weight, size_average, ignore_index, reduce, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.cross_entropy(input, target, self.reduction, self.label_smoothing, self.ignore_index,
                                    _as_input(self.weight, input))


class LinearCrossEntropyLoss(_WeightedLoss):
    """``torch.nn.LinearCrossEntropyLoss``: a bias-free (or biased) ``Linear`` to ``num_classes *
    prod(out_features)`` logits, stored flat as torch's (``linear.weight``, ``linear.bias``) and viewed
    as ``[C, *out_features, in_features]`` in ``forward``, under ``F.linear_cross_entropy``."""

    def __init__(self, in_features: int, num_classes: int, *, out_features: tuple[int, ...] = (), bias: bool = False,
                 device: Any = None, dtype: Any = None, reduction: str = "mean", weight: Any = None,
                 ignore_index: int | None = None, label_smoothing: float = 0.0, options: Any = None):
        super().__init__(weight, reduction=reduction)
        name = type(self).__name__
        if self.weight is not None and tuple(self.weight.shape) != (num_classes,):
            raise CaptureError(f"{name}: expected weight shape to be {(num_classes,)}, got {tuple(self.weight.shape)}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise CaptureError(f"{name}: expected label_smoothing to be in range [0, 1], got {label_smoothing}")
        if ignore_index is not None:
            losses.check_ignore_index(name, ignore_index)
        check_options(options)
        self.num_classes, self.out_features = num_classes, tuple(out_features)
        self.ignore_index, self.label_smoothing, self.options = ignore_index, label_smoothing, options
        self.linear = Linear(in_features, math.prod(self.out_features, start=num_classes), bias=bias,
                             dtype="float32" if dtype is None else dtype)  # ``device``: where the session runs

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        linear = self.linear
        weight = ops.reshape(linear.weight, [self.num_classes, *self.out_features, linear.in_features])
        bias = None if linear.bias is None else ops.reshape(linear.bias, [self.num_classes, *self.out_features])
        return linear_cross_entropy(input, weight, target, linear_bias=bias, weight=_as_input(self.weight, input),
                                    reduction=self.reduction, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, options=self.options)

    def extra_repr(self) -> str:
        return (f"in_features={self.linear.in_features}, num_classes={self.num_classes}, "
                f"out_features={self.out_features}, bias={self.linear.bias is not None}, reduction={self.reduction}, "
                f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}, options={self.options}")


class KLDivLoss(_Loss):
    _reductions = (*losses.REDUCTIONS, "batchmean")

    def __init__(self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
                 log_target: bool = False):
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses.kl_div(input, target, self.reduction, self.log_target)


class PoissonNLLLoss(_Loss):
    def __init__(self, log_input: bool = True, full: bool = False, size_average: bool | None = None,
                 eps: float = 1e-8, reduce: bool | None = None, reduction: str = "mean"):
        super().__init__(size_average, reduce, reduction)
        self.log_input, self.full, self.eps = log_input, full, eps

    def forward(self, log_input: Tensor, target: Tensor) -> Tensor:
        return losses.poisson_nll(log_input, target, self.log_input, self.full, self.eps, self.reduction)


class GaussianNLLLoss(_Loss):
    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
        super().__init__(reduction=reduction)
        self.full, self.eps = full, eps

    def forward(self, input: Tensor, target: Tensor, var: Any) -> Tensor:  # noqa: A002
        return losses.gaussian_nll(input, target, var, self.full, self.eps, self.reduction)


class _MarginLoss(_Loss):
    _margin = 0.0  # torch's default margin for the loss

    def __init__(self, margin: float | None = None, size_average: bool | None = None, reduce: bool | None = None,
                 reduction: str = "mean"):
        super().__init__(size_average, reduce, reduction)
        self.margin = self._margin if margin is None else margin


class CosineEmbeddingLoss(_MarginLoss):
    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return losses_margin.cosine_embedding(input1, input2, target, self.margin, self.reduction)


class MarginRankingLoss(_MarginLoss):
    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return losses_margin.margin_ranking(input1, input2, target, self.margin, self.reduction)


class HingeEmbeddingLoss(_MarginLoss):
    _margin = 1.0

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses_margin.hinge_embedding(input, target, self.margin, self.reduction)


class SoftMarginLoss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses_margin.soft_margin(input, target, self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses_margin.multilabel_soft_margin(input, target, _as_input(self.weight, input), self.reduction)


class MultiLabelMarginLoss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses_margin.multilabel_margin(input, target, self.reduction)


class MultiMarginLoss(_WeightedLoss):
    def __init__(self, p: int = 1, margin: float = 1.0, weight: Any = None, size_average: bool | None = None,
                 reduce: bool | None = None, reduction: str = "mean"):
        super().__init__(weight, size_average, reduce, reduction)
        margin_power(type(self).__name__, p)
        if self.weight is not None and len(self.weight.shape) != 1:
            raise CaptureError(f"MultiMarginLoss: weight must be one value per class [C], got shape "
                               f"{list(self.weight.shape)}")
        self.p, self.margin = p, margin

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return losses_margin.multi_margin(input, target, self.p, self.margin, _as_input(self.weight, input),
                                          self.reduction)


class TripletMarginLoss(_MarginLoss):
    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6, swap: bool = False,
                 size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean"):
        super().__init__(margin, size_average, reduce, reduction)
        positive_margin(type(self).__name__, margin)
        self.p, self.eps, self.swap = p, eps, swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return losses_margin.triplet_margin(anchor, positive, negative, self.margin, self.p, self.eps, self.swap,
                                            self.reduction)


class TripletMarginWithDistanceLoss(_MarginLoss):
    """``distance_function`` by default a ``PairwiseDistance()`` sub-module, as torch's (shown in its repr)."""

    def __init__(self, *, distance_function: Callable[[Tensor, Tensor], Tensor] | None = None, margin: float = 1.0,
                 swap: bool = False, reduction: str = "mean"):
        super().__init__(margin, reduction=reduction)
        positive_margin(type(self).__name__, margin)
        self.distance_function = PairwiseDistance() if distance_function is None else distance_function
        self.swap = swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return losses_margin.triplet_margin_with_distance(anchor, positive, negative, self.distance_function,
                                                          self.margin, self.swap, self.reduction)


class CTCLoss(_Loss):
    """``torch.nn.CTCLoss``; the formula is ``graphc/dsl/ctc.py``'s ``ctc_loss``."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__(reduction=reduction)
        self.blank, self.zero_infinity = blank, zero_infinity

    def forward(self, log_probs: Tensor, targets: Any, input_lengths: Any, target_lengths: Any) -> Tensor:
        return ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank, self.reduction,
                        self.zero_infinity)


__all__ = [
    "BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss", "NLLLoss",
    "SmoothL1Loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "huber_loss",
    "kl_div", "l1_loss", "mse_loss", "nll_loss", "smooth_l1_loss",
    "CosineEmbeddingLoss", "GaussianNLLLoss", "HingeEmbeddingLoss", "MarginRankingLoss", "MultiLabelMarginLoss",
    "MultiLabelSoftMarginLoss", "MultiMarginLoss", "PoissonNLLLoss", "SoftMarginLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss", "cosine_embedding_loss", "gaussian_nll_loss", "hinge_embedding_loss",
    "margin_ranking_loss", "multi_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss",
    "poisson_nll_loss", "soft_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
    "CTCLoss", "LinearCrossEntropyLoss",
]
