"""The losses on DSL Tensors: ``gc.losses``' (definitions in ``graphc/compile/losses.py``) and the
rest of ``torch.nn.functional``'s (``smooth_l1``, ``bce``, ``nll``, ``kl_div``).

``gc.training.generate`` captures these same functions to append a loss spec's graph to a
model, and ``gc.nn``'s loss modules and functional forms call them, so there is one definition of
each formula; ``tests/test_losses.py`` and ``tests/test_nn_losses.py`` check them against closed
forms and ``torch.nn.functional``.
"""

from __future__ import annotations

import numpy as np

from graphc.dsl import ops, ops_array
from graphc.dsl.autocast import autocast_op, widest
from graphc.dsl.batching import batch_of_one
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_layers import logsigmoid
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.passes.values import CLASS_LABELS_KEY, PROBABILITIES_KEY
from graphc.model.dtypes import FLOAT_DTYPES

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(loss: str, reduction: str, allowed: tuple[str, ...] = REDUCTIONS) -> None:
    """Refuse a ``reduction`` that ``loss`` does not take, naming it and the ones it does."""
    if reduction not in allowed:
        raise CaptureError(f"{loss}: reduction must be {', '.join(map(repr, allowed))}, got {reduction!r} "
                           f"(at {user_source()})")


def check_ignore_index(loss: str, ignore_index) -> int:
    """``ignore_index`` as an int; a float or bool is refused, as torch's argument parser refuses it."""
    if isinstance(ignore_index, (bool, np.bool_)) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"{loss}: ignore_index must be an int, got {ignore_index!r} (a {type(ignore_index).__name__})")
    return int(ignore_index)


def reduce_loss(x: Tensor, reduction: str) -> Tensor:
    """``x``'s mean, sum, or ``x`` itself, as ``reduction`` ("mean", "sum", "none") says."""
    if reduction == "mean":
        return ops.mean(x)
    return ops.sum(x) if reduction == "sum" else x


def like_dtype(t, like: Tensor) -> Tensor:
    """``t`` (an array or a Tensor, such as a loss module's weight buffer) in ``like``'s dtype."""
    t = ops.lift(t, like)
    return t if t.dtype == like.dtype else ops.cast(t, like.dtype)


def _float_mismatch(t, like: Tensor) -> bool:
    """Whether ``t`` is a float Tensor (a module's weight buffer, a computed value) of a float dtype other
    than ``like``'s; an array or list is a constant, which takes ``like``'s dtype as any constant does."""
    return isinstance(t, Tensor) and t.dtype in FLOAT_DTYPES and like.dtype in FLOAT_DTYPES and t.dtype != like.dtype


def in_input_dtype(t, like: Tensor) -> Tensor:
    """A loss module's weight buffer ``t`` in ``like``'s (the input's) float dtype, as an array given to
    the functional form takes it: numpy's float64 default on a float32 model is cast, a float64 model's
    float64 weights stay exact (torch, whose tensors default to float32, refuses a class weight of another
    dtype instead); not a float pair, as it is."""
    return like_dtype(t, like) if _float_mismatch(t, like) else t


def same_dtype_weight(loss: str, t, like: Tensor) -> Tensor:
    """``t`` in ``like``'s dtype where torch requires the input's dtype of a class weight
    (``cross_entropy`` on class labels, ``nll_loss``, ``multi_margin_loss``): a float Tensor of another
    dtype is refused, as torch raises "expected scalar type Float but found Double"."""
    if _float_mismatch(t, like):
        raise CaptureError(f"{loss}: weight is {t.dtype} but the input is {like.dtype}; torch requires the "
                           f"input's dtype (it raises 'expected scalar type'): give the weight as {like.dtype} "
                           f"(or the input as {t.dtype}) (at {user_source()})")
    return like_dtype(t, like)


def promoted(x: Tensor, *others) -> Tensor:
    """``x`` in the float dtype torch promotes ``x`` and the float Tensors among ``others`` to (a float64
    weight on a float32 input: float64); arrays and numbers take ``x``'s dtype."""
    dtype = widest({x.dtype, *(t.dtype for t in others if _float_mismatch(t, x))})
    return x if dtype == x.dtype else ops.cast(x, dtype)


def promoted_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a`` and ``b`` in the float dtype torch promotes the two to, the narrower cast (an op's operands)."""
    return promoted(a, b), promoted(b, a)


def _weighted(elem: Tensor, weight: Tensor | None) -> Tensor:
    return elem if weight is None else elem * like_dtype(weight, elem)


def _same_shape(loss: str, x: Tensor, target: Tensor) -> None:
    """Refuse a target whose static shape is not the input's, as torch does for this loss."""
    if x.shape is not None and target.shape is not None:
        if len(x.shape) != len(target.shape):
            raise op_error(loss, [x, target], f"target must have the input's shape, got rank {len(target.shape)} "
                           f"for rank {len(x.shape)}", user_source())
        for a, b in zip(x.shape, target.shape):
            ops.same_dim(loss, [x, target], a, b, "input and target dims")


@autocast_op("mse_loss")
def mse(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    check_reduction("mse", reduction)
    diff = pred - target
    return reduce_loss(diff * diff, reduction)


@autocast_op("l1_loss")
def l1(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    check_reduction("l1", reduction)
    return reduce_loss(ops.abs(pred - target), reduction)


@autocast_op("huber_loss")
def huber(pred: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    check_reduction("huber", reduction)
    if not delta > 0:
        raise CaptureError(f"huber: delta must be > 0, got {delta} (at {user_source()})")
    d = ops.abs(pred - target)
    return reduce_loss(ops.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta), reduction)


@autocast_op("smooth_l1_loss")
def smooth_l1(pred: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """``torch.nn.functional.smooth_l1_loss``: ``huber(delta=beta) / beta``, ``l1`` at ``beta=0``."""
    check_reduction("smooth_l1", reduction)
    if not beta >= 0:  # NaN too, as torch
        raise CaptureError(f"smooth_l1: beta must be >= 0, got {beta} (at {user_source()})")
    if beta == 0:
        return l1(pred, target, reduction)
    return reduce_loss(huber(pred, target, "none", beta) / beta, reduction)


@autocast_op("binary_cross_entropy_with_logits")
def bce_with_logits(x: Tensor, y: Tensor, reduction: str = "mean", weight: Tensor | None = None,
                    pos_weight: Tensor | None = None) -> Tensor:
    """``(1 - y) x - (1 + (pos_weight - 1) y) logsigmoid(x)``, times ``weight``, as torch writes it:
    stable at any ``|x|``, with the gradient ``sigmoid(x) - y`` at 0 (``logsigmoid``)."""
    check_reduction("bce_with_logits", reduction)
    x = ops.lift(x)
    y = ops.lift(y, x)
    _same_shape("bce_with_logits", x, y)
    scaled = logsigmoid(x)  # no Mul by 1 without pos_weight: the DSL would emit it, and its gradient
    if pos_weight is not None:
        scaled = scaled * ((like_dtype(pos_weight, x) - 1.0) * y + 1.0)
    return reduce_loss(_weighted((1.0 - y) * x - scaled, weight), reduction)


def _log_where_positive(t: Tensor) -> tuple[Tensor, Tensor]:
    """``(t > 0, log(t) there)``: the log reads 1 elsewhere, so its gradient there is 0, not 0/0."""
    positive = t > 0.0
    return positive, ops.log(ops.where(positive, t, 1.0))


def _clamped_log(p: Tensor) -> Tensor:
    """``log(p)`` no lower than -100, as torch's binary_cross_entropy clamps it."""
    positive, log = _log_where_positive(p)
    return ops.where(positive, ops.clip(log, -100.0), -100.0)


@autocast_op("binary_cross_entropy")
def bce(p: Tensor, y: Tensor, reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    """``torch.nn.functional.binary_cross_entropy`` on probabilities: ``-(y log p + (1 - y)
    log(1 - p))``, each log clamped at -100 (finite at ``p`` 0 or 1, where the clamped log's
    gradient is 0 and torch divides by 1e-12). An element whose ``p`` or ``y`` is outside [0, 1]
    (or NaN) is NaN, so the loss is, where torch raises ("all elements of input should be between
    0 and 1"): the clamped logs made it a finite number (35.05), or ``y``'s linear term did."""
    check_reduction("bce", reduction)
    p = ops.lift(p)
    y = ops.lift(y, p)
    _same_shape("bce", p, y)
    q, n = 1.0 - p, 1.0 - y
    terms = -(y * _clamped_log(p) + n * _clamped_log(q))
    # p (1 - p) >= 0 exactly where 0 <= p <= 1 (False for NaN): 5 passes over the elements, where
    # 4 comparisons, 3 Ands and the Where took 8 (ort-cpu step of a 1M-element loss: see docs/api.md)
    inside = ops.minimum(p * q, y * n) >= 0.0
    terms = ops.where(inside, terms, float("nan"))
    fed = [t.name for t in (p, y) if t.value.producer() is None]  # inputs, or params (left out at generate)
    if fed:
        terms.value.producer().metadata_props[PROBABILITIES_KEY] = ",".join(fed)
    return reduce_loss(_weighted(terms, weight), reduction)


def _class_terms(logp: Tensor, labels: Tensor, ignore_index: int, weight: Tensor | None):
    """For log-probabilities ``[N, C, d...]`` and labels ``[N, d...]``: each label's ``-w[y] *
    logp[y]``, 1 where the label is not ``ignore_index`` (else 0), and that times ``w[y]`` (what
    ``"mean"`` divides by). Labels outside ``[0, C)`` pick class 0: ``ignore_index`` adds nothing,
    any other makes its term NaN, so the loss is (torch raises).

    Each label's log-probability is picked by GatherElements, so the gradient scatters one value
    per label where a one-hot of the labels (Equal, Cast, Mul, ReduceSum) made four passes over
    [N, C] and held that one-hot for the backward (GPT's [4096, 2048] logits: 32 MB). bench_zoo's
    GPT at batch 32, the loss's kernel time forward and backward (2 threads, profiles of two
    sessions each): 34.3 -> 20.7 ms a step (11.7 with LogSoftmax's sparse gradient, ``rules_reduce``)."""
    if labels.dtype not in ("int64", "int32"):
        raise op_error("GatherElements", [logp, labels], f"class labels must be int64 or int32, got {labels.dtype}",
                       user_source())
    if logp.shape is not None and labels.shape is not None:
        dims = [logp.shape[0], *logp.shape[2:]]  # the input's without C
        if len(labels.shape) != len(dims):
            raise op_error("GatherElements", [logp, labels], f"the target must have the input's dims without C "
                           f"(rank {len(dims)}), got rank {len(labels.shape)}", user_source())
        for a, b in zip(dims, labels.shape):
            ops.same_dim("GatherElements", [logp, labels], a, b, "input and target dims")
    ids, zero = ops.unsqueeze(labels, [1]), ops.lift(np.asarray(0, dtype=labels.dtype))
    hit = (ids >= zero) & (ids < dim_size(logp, 1, labels.dtype))
    source = _labels_source(labels)
    if source is not None:  # a graph input's values: the Trainer checks them (CLASS_LABELS_KEY)
        classes = "" if logp.shape is None or logp.shape[1] is None else logp.shape[1]  # a size or a dim's name
        hit.value.producer().metadata_props[CLASS_LABELS_KEY] = f"{source}:{classes}:{ignore_index}"
    safe = ops.where(hit, ids, zero)
    counts = labels != ops.lift(np.asarray(ignore_index, dtype=labels.dtype))
    # a label neither a class nor ignore_index scales its term by NaN: the loss is NaN, where torch
    # raises ("Target 3 is out of bounds"), however the labels were computed (sliced, shifted)
    scale = ops.where(hit, ops.lift(1.0, logp), ops.where(ops.unsqueeze(counts, [1]), float("nan"), ops.lift(0.0, logp)))
    keep = ops.cast(counts, logp.dtype)
    counted = keep
    if weight is not None:
        picked_weight = ops.emit("Gather", [_class_weight(weight, logp), safe], {"axis": 0})
        scale, counted = scale * picked_weight, keep * ops.squeeze(picked_weight, [1])
    return -ops.squeeze(ops_array.gather(logp, 1, safe) * scale, [1]), keep, counted


# ops whose output holds every value of their input 0, and only those: rearranged, or cast from a
# narrower integer to int64
_SAME_VALUES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Cast"})
_WIDENED = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32"})


def _labels_source(labels: Tensor) -> str | None:
    """The name of the graph input (or initializer) whose values ``labels`` are, reshaped,
    transposed or widened (``labels.view(-1)``, ``.long()``), else None (computed or sliced)."""
    value = labels.value
    while (node := value.producer()) is not None:
        if node.op_type not in _SAME_VALUES:
            return None
        value = node.inputs[0]
        if node.op_type == "Cast" and getattr(value.dtype, "name", None) not in _WIDENED:
            return None
    return value.name


def _batched(fn, logp: Tensor, target: Tensor, reduction: str, *args) -> Tensor:
    """``fn`` on ``[N, C, d...]``, or on an unbatched ``[C]`` input (and a 0-d class label or ``[C]``
    probabilities) as a batch of one, as torch takes it; a 0-d input is refused."""
    if logp.shape is None or len(logp.shape) > 2:
        return fn(logp, target, reduction, *args)
    if not logp.shape:  # batch_of_one's refusal would name (C) and (N, C) only
        raise op_error("GatherElements", [logp], "expects a (C), (N, C) or (N, C, d...) input, got rank 0",
                       user_source())
    return batch_of_one("GatherElements", logp, "C", lambda lp, t: fn(lp, t, reduction, *args), target)


@autocast_op("nll_loss")
def nll(logp: Tensor, labels: Tensor, reduction: str = "mean", weight: Tensor | None = None,
        ignore_index: int = -100) -> Tensor:
    """``torch.nn.functional.nll_loss``: ``-w[y] logp[y]`` per label; ``"mean"`` divides by the sum
    of the picked weights of the labels that are not ``ignore_index``."""
    check_reduction("nll", reduction)
    ignore_index = check_ignore_index("nll", ignore_index)
    logp = ops.lift(logp)
    weight = None if weight is None else same_dtype_weight("nll_loss", weight, logp)
    return _batched(_nll, logp, ops.lift(labels), reduction, weight, ignore_index)


def _nll(logp: Tensor, labels: Tensor, reduction: str, weight: Tensor | None, ignore_index: int) -> Tensor:
    elem, keep, counted = _class_terms(logp, labels, ignore_index, weight)
    return _mean_over(elem * keep, counted, reduction)


def _mean_over(elem: Tensor, counted: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return ops.sum(elem) / ops.sum(counted)  # over the labels not ignored (weighted), as torch
    return reduce_loss(elem, reduction)


@autocast_op()
def cross_entropy(logits: Tensor, labels: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100, weight: Tensor | None = None) -> Tensor:
    """``torch.nn.functional.cross_entropy`` over axis 1 of ``[N, C, d...]`` logits (or an
    unbatched ``[C]``): ``labels`` are integer classes ``[N, d...]`` or float class probabilities
    of the logits' shape. ``label_smoothing`` eps mixes ``(1 - eps) * nll`` with ``eps / C *
    sum_c w[c] * -log_softmax``; ``weight`` ``[C]`` scales each class (any sign, as torch).
    ``label_smoothing`` below 0 (or NaN) smooths nothing and above 1 is refused, as torch 2.13 does."""
    check_reduction("cross_entropy", reduction)
    ignore_index = check_ignore_index("cross_entropy", ignore_index)
    if label_smoothing > 1.0:
        raise CaptureError(f"cross_entropy: label_smoothing must be at most 1 (torch's check; below 0 it smooths "
                           f"nothing), got {label_smoothing} (at {user_source()})")
    label_smoothing = label_smoothing if label_smoothing > 0.0 else 0.0
    logits, labels = ops.lift(logits), ops.lift(labels)
    if labels.dtype in FLOAT_DTYPES:
        if ignore_index != -100:
            raise CaptureError(f"cross_entropy: ignore_index={ignore_index} is for class labels, not the class "
                               f"probabilities given (at {user_source()})")
        return _batched(_soft_cross_entropy, logits, labels, reduction, label_smoothing, weight)
    weight = None if weight is None else same_dtype_weight("cross_entropy", weight, logits)
    return _batched(_cross_entropy, logits, labels, reduction, label_smoothing, ignore_index, weight)


def _class_weight(weight: Tensor, like: Tensor) -> Tensor:
    """``weight`` in ``like``'s dtype, checked to be ``[C]`` for ``like [N, C, d...]``."""
    weight = like_dtype(weight, like)
    if weight.shape is not None and len(weight.shape) != 1:
        raise op_error("Gather", [like, weight], f"weight must be one value per class [C], got {weight.type_str()}",
                       user_source())
    if weight.shape is not None and like.shape is not None:
        ops.same_dim("Gather", [like, weight], like.shape[1], weight.shape[0], "classes and weights")
    return weight


def _per_class(weight: Tensor, like: Tensor) -> Tensor:
    """``weight [C]`` shaped ``[C, 1, ...]`` against ``like [N, C, d...]``."""
    return ops.reshape(_class_weight(weight, like), [-1] + [1] * (like.ndim - 2))


def _cross_entropy(logits: Tensor, labels: Tensor, reduction: str, eps: float, ignore_index: int,
                   weight: Tensor | None) -> Tensor:
    lsm = ops.log_softmax(logits, axis=1)
    elem, keep, counted = _class_terms(lsm, labels, ignore_index, weight)
    if eps:
        spread = lsm if weight is None else lsm * _per_class(weight, lsm)
        elem = elem * (1.0 - eps) - ops.sum(spread, axis=1) * eps / dim_size(logits, 1)
    return _mean_over(elem * keep, counted, reduction)


def _soft_cross_entropy(logits: Tensor, probs: Tensor, reduction: str, eps: float, weight: Tensor | None) -> Tensor:
    """``-sum_c w[c] p[c] log_softmax[c]`` with ``p`` smoothed to ``(1 - eps) p + eps / C``;
    ``"mean"`` over ``N, d...``, as torch."""
    _same_shape("cross_entropy", logits, probs)
    ops.same_dtype("cross_entropy", logits, probs)
    if eps:
        probs = probs * (1.0 - eps) + eps / dim_size(logits, 1)
    terms = ops.log_softmax(logits, axis=1) * probs
    if weight is not None:  # a weight of a wider float dtype: the loss in that dtype, as torch promotes
        terms = promoted(terms, weight)
        terms = terms * _per_class(weight, terms)
    return reduce_loss(-ops.sum(terms, axis=1), reduction)


@autocast_op()
def kl_div(logp: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """``torch.nn.functional.kl_div``: ``target * (log(target) - logp)`` (0 where target is 0, where
    the target's gradient is ``-logp``; torch's is nan; nan where it is negative, as torch's), or
    ``exp(target) * (target - logp)`` with ``log_target``; ``"batchmean"`` divides the sum by N."""
    check_reduction("kl_div", reduction, (*REDUCTIONS, "batchmean"))
    logp, target = ops.lift(logp), ops.lift(target)
    if log_target:
        elem = ops.exp(target) * (target - logp)
    else:
        positive, log = _log_where_positive(target)
        elem = ops.where(target < 0.0, float("nan"), ops.where(positive, target * log, 0.0)) - target * logp
    if reduction != "batchmean":
        return reduce_loss(elem, reduction)
    total = ops.sum(elem)
    return total if not elem.shape else total / dim_size(elem, 0)


@autocast_op("poisson_nll_loss")
def poisson_nll(x: Tensor, target: Tensor, log_input: bool = True, full: bool = False, eps: float = 1e-8,
                reduction: str = "mean") -> Tensor:
    """``torch.nn.functional.poisson_nll_loss``: ``exp(x) - target x`` for a log-rate ``x`` (else
    ``x - target log(x + eps)``); ``full`` adds Stirling's ``t log t - t + log(2 pi t) / 2`` where
    the target is above 1 (its log reads 2 elsewhere: the target's gradient at 0 is 0, torch's nan)."""
    check_reduction("poisson_nll", reduction)
    x = ops.lift(x)
    target = ops.lift(target, x)
    elem = ops.exp(x) - target * x if log_input else x - target * ops.log(x + eps)
    if full:
        above = target > 1.0
        t = ops.where(above, target, 2.0)
        elem = elem + ops.where(above, t * ops.log(t) - t + 0.5 * ops.log(t * (2 * np.pi)), 0.0)
    return reduce_loss(elem, reduction)


def _gaussian_var(x: Tensor, var) -> Tensor:
    """``var`` (a float, or a Tensor of ``x``'s shape, of it without the last dim, or with one dim
    1) shaped to broadcast against ``x``, as torch's gaussian_nll_loss checks it."""
    if isinstance(var, (int, float)):
        if var < 0:
            raise CaptureError(f"gaussian_nll: var must be >= 0, got {var} (at {user_source()})")
        return ops.lift(float(var), x)
    var = var if _float_mismatch(var, x) else like_dtype(var, x)  # a float Tensor keeps its dtype, as torch's
    if x.shape is None or var.shape is None or var.shape == x.shape:
        return var
    if var.shape == x.shape[:-1]:
        return ops.unsqueeze(var, [-1])
    if len(var.shape) == len(x.shape) and sum(b for a, b in zip(x.shape, var.shape) if a != b) == 1:
        return var
    raise op_error("gaussian_nll", [x, var], "var must have the input's shape, that without its last dim, or that "
                   "with one dim 1", user_source())


def gaussian_nll(x: Tensor, target: Tensor, var, full: bool = False, eps: float = 1e-6,
                 reduction: str = "mean") -> Tensor:
    """``torch.nn.functional.gaussian_nll_loss``: ``(log v + (x - target)^2 / v) / 2`` (plus
    ``log(2 pi) / 2`` with ``full``), ``v`` the variance clamped at ``eps`` as torch does it, with
    no effect on the gradient (its gradient is the unclamped variance's). Float Tensors of different
    dtypes are promoted op by op as torch's (a float64 ``var`` on a float32 input: ``x - target`` in
    float32, the rest and the loss in float64)."""
    check_reduction("gaussian_nll", reduction)
    x = ops.lift(x)
    target, var = ops.lift(target, x), _gaussian_var(x, var)
    var = ops.detach(ops.maximum(var, eps)) + (var - ops.detach(var))
    x, target = promoted_pair(x, target)
    diff = x - target
    log_var = ops.log(var)
    square, var = promoted_pair(diff * diff, var)
    log_var, ratio = promoted_pair(log_var, square / var)
    elem = (log_var + ratio) * 0.5
    return reduce_loss(elem + 0.5 * float(np.log(2 * np.pi)) if full else elem, reduction)


def dim_size(x: Tensor, axis: int, dtype=None):
    """Dim ``axis`` of ``x`` (negative counts from the end): a float (a constant of ``dtype``, if given) where
    static, else read from the shape (``ops.dim_read``) and cast to ``x``'s dtype (or ``dtype``)."""
    if isinstance(x.shape[axis], int):
        return float(x.shape[axis]) if dtype is None else ops.lift(np.asarray(x.shape[axis], dtype=dtype))
    return ops.cast(ops.dim_read(x, axis % x.ndim), dtype or x.dtype)
