"""The margin, ranking and embedding losses of ``torch.nn.functional`` on DSL Tensors
(``cosine_embedding``, ``margin_ranking``, ``hinge_embedding``, ``soft_margin``,
``multilabel_soft_margin``, ``multilabel_margin``, ``multi_margin``, ``triplet_margin`` and
``triplet_margin_with_distance``), written once in standard ONNX ops;
``gc.nn``'s loss modules and functional forms call them. ``tests/test_nn_losses_margin.py``
checks them against torch and float64 central differences."""

from __future__ import annotations

from typing import Callable

from graphc.dsl import ops, ops_array
from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.losses import check_reduction, dim_size, like_dtype, promoted, reduce_loss, same_dtype_weight
from graphc.dsl.ops_layers import logsigmoid
from graphc.dsl.ops_distance import pairwise_distance
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError

_EPS = 1e-12  # what ATen's cosine_embedding_loss adds to each squared magnitude


def _same_rank(loss: str, tensors: list[Tensor], names: str) -> None:
    """Refuse operands of different ranks, as torch does for this loss."""
    ranks = [t.ndim for t in tensors if t.shape is not None]
    if len(set(ranks)) > 1:
        raise op_error(loss, tensors, f"{names} must have the same rank, got ranks {ranks}", user_source())


def positive_margin(loss: str, margin: float) -> None:
    if not margin > 0:
        raise CaptureError(f"{loss}: margin must be > 0, got {margin} (at {user_source()})")


def margin_power(loss: str, p: int) -> None:
    """``p`` of a multi-class margin loss: 1 or 2, as torch's."""
    if p not in (1, 2):
        raise CaptureError(f"{loss}: p must be 1 or 2, got {p} (at {user_source()})")


def _class_ids(x: Tensor) -> Tensor:
    """``[0, C)`` as int64 for ``x [N, C]``."""
    size = x.shape[1]
    return ops_array.arange(size if isinstance(size, int) else dim_size(x, 1, "int64"))


def _int64_labels(loss: str, x: Tensor, target: Tensor) -> Tensor:
    """``target`` checked to hold int64 class indices, for an input ``x`` checked to be ``[N, C]`` or ``[C]``."""
    target = ops.lift(target)
    if x.shape is not None and x.ndim not in (1, 2):
        raise op_error(loss, [x, target], f"input must be [N, C] or [C], got rank {x.ndim}", user_source())
    if target.dtype != "int64":
        raise op_error(loss, [x, target], f"target must hold int64 class indices, got {target.dtype}", user_source())
    return target


def _per_sample(fn, x: Tensor, target: Tensor, target_rank: int, reduction: str, *args) -> Tensor:
    """``fn`` on ``x [N, C]`` and a target of rank ``target_rank``, each sample's loss divided by
    ``C`` and then reduced; an unbatched ``[C]`` is a batch of one (with a target of rank
    ``target_rank - 1``, whose "none" loss is 0-d, as torch's)."""
    one = x.ndim == 1 and target.ndim < target_rank
    if x.ndim == 1:
        x = ops.unsqueeze(x, [0])
    if one:
        target = ops.unsqueeze(target, [0])
    elem = fn(x, target, *args) / dim_size(x, 1)
    return reduce_loss(ops.squeeze(elem, [0]) if one else elem, reduction)


@autocast_op("cosine_embedding_loss")
def cosine_embedding(x1: Tensor, x2: Tensor, target: Tensor, margin: float = 0.0, reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``target`` is 1, ``max(0, cos - margin)`` where it is -1 (0
    elsewhere), the cosine over the last dim of ``[N, D]`` pairs (``[D]`` with a 0-d target)."""
    check_reduction("cosine_embedding", reduction)
    x1 = ops.lift(x1)
    x2, target = ops.lift(x2, x1), ops.lift(target, x1)
    if target.shape is not None and target.ndim > 1:
        raise op_error("cosine_embedding", [x1, x2, target], f"target must be [N] or 0-d, got rank {target.ndim}",
                       user_source())
    want = 1 if target.ndim == 0 else 2
    for t in (x1, x2):
        if t.shape is not None and t.ndim != want:
            raise op_error("cosine_embedding", [x1, x2, target], f"a rank-{target.ndim} target takes inputs of rank "
                           f"{want}, got rank {t.ndim}", user_source())
    dot = ops.sum(x1 * x2, axis=-1)
    cos = dot / ops.sqrt((ops.sum(x1 * x1, axis=-1) + _EPS) * (ops.sum(x2 * x2, axis=-1) + _EPS))
    elem = ops.where(target == 1.0, 1.0 - cos, 0.0) + ops.where(target == -1.0, ops.relu(cos - margin), 0.0)
    return reduce_loss(elem, reduction)


@autocast_op("margin_ranking_loss")
def margin_ranking(x1: Tensor, x2: Tensor, target: Tensor, margin: float = 0.0, reduction: str = "mean") -> Tensor:
    """``max(0, -target (x1 - x2) + margin)``; the three operands of one rank, as torch asks."""
    check_reduction("margin_ranking", reduction)
    x1 = ops.lift(x1)
    x2, target = ops.lift(x2, x1), ops.lift(target, x1)
    _same_rank("margin_ranking", [x1, x2, target], "input1, input2 and target")
    return reduce_loss(ops.relu(margin - target * (x1 - x2)), reduction)


@autocast_op("hinge_embedding_loss")
def hinge_embedding(x: Tensor, target: Tensor, margin: float = 1.0, reduction: str = "mean") -> Tensor:
    """``x`` where ``target`` is 1, ``max(0, margin - x)`` where it is -1 (torch's sum of both
    where it is neither)."""
    check_reduction("hinge_embedding", reduction)
    x = ops.lift(x)
    target = ops.lift(target, x)
    elem = ops.where(target != 1.0, ops.relu(margin - x), 0.0) + ops.where(target != -1.0, x, 0.0)
    return reduce_loss(elem, reduction)


@autocast_op("soft_margin_loss")
def soft_margin(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """``log(1 + exp(-target x))``, as ``-logsigmoid(target x)`` (no overflow at any ``|x|``)."""
    check_reduction("soft_margin", reduction)
    x = ops.lift(x)
    return reduce_loss(-logsigmoid(ops.lift(target, x) * x), reduction)


def multilabel_soft_margin(x: Tensor, target: Tensor, weight: Tensor | None = None,
                           reduction: str = "mean") -> Tensor:
    """``-(t logsigmoid(x) + (1 - t) logsigmoid(-x))`` times ``weight``, averaged over the last
    (class) dim: one loss per sample."""
    check_reduction("multilabel_soft_margin", reduction)
    x = ops.lift(x)
    target = ops.lift(target, x)
    elem = -(target * logsigmoid(x) + (1.0 - target) * logsigmoid(-x))
    if weight is not None:  # a weight of a wider float dtype: the loss in that dtype, as torch promotes
        elem = promoted(elem, weight)
        elem = elem * like_dtype(weight, elem)
    return reduce_loss(ops.sum(elem, axis=-1) / dim_size(elem, -1), reduction)


@autocast_op("multilabel_margin_loss")
def multilabel_margin(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """``sum_j sum_{i not a target} max(0, 1 - (x[y_j] - x[i])) / C`` over the target classes
    ``y_j``: the int64 ``target`` (the input's shape) lists them, ending at its first negative."""
    check_reduction("multilabel_margin", reduction)
    x = ops.lift(x)
    target = _int64_labels("multilabel_margin", x, target)
    if x.shape is not None and target.shape is not None:
        if len(target.shape) != len(x.shape):
            raise op_error("multilabel_margin", [x, target], f"target must have the input's shape, got rank "
                           f"{len(target.shape)} for rank {len(x.shape)}", user_source())
        for a, b in zip(x.shape, target.shape):
            ops.same_dim("multilabel_margin", [x, target], a, b, "input and target dims")
    return _per_sample(_multilabel_margin, x, target, 2, reduction)


def _multilabel_margin(x: Tensor, target: Tensor) -> Tensor:
    listed = ops_array.cumsum(target < 0, 1) == 0  # before the first negative
    picks = ops.where(listed, target, 0)
    is_target = ops.unsqueeze(picks, [2]) == _class_ids(x)  # [N, j, i]
    is_target = ops.max(ops.cast(is_target & ops.unsqueeze(listed, [2]), x.dtype), axis=1)  # [N, i]
    hinge = ops.relu(1.0 - ops.unsqueeze(ops_array.gather(x, 1, picks), [2]) + ops.unsqueeze(x, [1]))
    pairs = ops.unsqueeze(ops.cast(listed, x.dtype), [2]) * ops.unsqueeze(1.0 - is_target, [1])
    return ops.sum(hinge * pairs, axis=[1, 2])


@autocast_op("multi_margin_loss")
def multi_margin(x: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight: Tensor | None = None,
                 reduction: str = "mean") -> Tensor:
    """``sum_{i != y} w[y] max(0, margin - x[y] + x[i])^p / C`` for each sample's int64 class
    ``y`` (``p`` 1 or 2, ``weight`` one value per class)."""
    check_reduction("multi_margin", reduction)
    margin_power("multi_margin", p)
    x = ops.lift(x)
    target = _int64_labels("multi_margin", x, target)
    if x.shape is not None and target.shape is not None:
        if target.ndim > 1 or target.ndim < x.ndim - 1:
            raise op_error("multi_margin", [x, target], "target must be [N] for an input [N, C], or 0-d or [1] for "
                           "[C]", user_source())
        if target.ndim == 1:
            ops.same_dim("multi_margin", [x, target], x.shape[0] if x.ndim == 2 else 1, target.shape[0],
                         "input and target batch sizes")
    if weight is not None:
        weight = same_dtype_weight("multi_margin_loss", weight, x)
        if weight.shape is not None and x.shape is not None:
            if weight.ndim != 1:
                raise op_error("multi_margin", [x, weight], f"weight must be [C], got rank {weight.ndim}",
                               user_source())
            ops.same_dim("multi_margin", [x, weight], x.shape[-1], weight.shape[0], "classes and weights")
    return _per_sample(_multi_margin, x, target, 1, reduction, p, margin, weight)


def _multi_margin(x: Tensor, target: Tensor, p: int, margin: float, weight: Tensor | None) -> Tensor:
    """Each sample's sum over the classes; NaN for a negative class, which Gather would read from
    the end (torch raises "target out of range"; a class of C or more fails in the backend's Gather)."""
    label = ops.unsqueeze(target, [1])
    hinge = ops.relu(margin - ops_array.gather(x, 1, label) + x)
    if p == 2:
        hinge = hinge * hinge
    if weight is not None:
        hinge = hinge * ops.emit("Gather", [weight, label], {"axis": 0})
    summed = ops.sum(ops.where(_class_ids(x) == label, 0.0, hinge), axis=1)
    return ops.where(target < ops.lift(0, target), float("nan"), summed)


def triplet_margin_with_distance(anchor: Tensor, positive: Tensor, negative: Tensor,
                                 distance_function: Callable[[Tensor, Tensor], Tensor] | None = None,
                                 margin: float = 1.0, swap: bool = False, reduction: str = "mean") -> Tensor:
    """``max(0, margin + d(a, p) - d(a, n))``, ``d(a, n)`` no more than ``d(p, n)`` with ``swap``;
    ``d`` is ``distance_function`` (DSL code on two Tensors), by default ``pairwise_distance``."""
    check_reduction("triplet_margin_with_distance", reduction)
    positive_margin("triplet_margin_with_distance", margin)
    anchor = ops.lift(anchor)
    positive, negative = ops.lift(positive, anchor), ops.lift(negative, anchor)
    _same_rank("triplet_margin", [anchor, positive, negative], "anchor, positive and negative")
    dist = distance_function or pairwise_distance
    far = dist(anchor, negative)
    if swap:
        far = ops.minimum(far, dist(positive, negative))
    return reduce_loss(ops.relu(margin + dist(anchor, positive) - far), reduction)


@autocast_op("triplet_margin_loss")
def triplet_margin(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2.0,
                   eps: float = 1e-6, swap: bool = False, reduction: str = "mean") -> Tensor:
    """``triplet_margin_with_distance`` with ``pairwise_distance(p, eps)``."""
    check_reduction("triplet_margin", reduction)
    positive_margin("triplet_margin", margin)
    return triplet_margin_with_distance(anchor, positive, negative, lambda a, b: pairwise_distance(a, b, p, eps),
                                        margin, swap, reduction)
