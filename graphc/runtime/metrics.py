"""Evaluation metrics: what ``Trainer.evaluate`` reports beside the loss.

A metric is a function ``fn(pred, target) -> float``: the loss's model output and the label
for one batch, as numpy arrays, to the batch's mean (``evaluate_loader`` weights each batch by
its count of examples, ``graphc.runtime.averaging.examples``). For a cross-entropy loss
``pred`` is ``[M, C]`` logits and ``target`` ``[M]`` class ids, the extra dims of ``[N, C,
d1...]`` outputs folded into ``M`` and labels equal to the loss's ``ignore_index`` left out.

By default a classifier (cross_entropy) reports ``accuracy`` and, with more than 5 classes,
``top5_accuracy``; a binary one (bce_with_logits) ``accuracy``; a regression (mse, l1,
huber) ``mse`` and ``mae``. These built-ins are means over examples (``splits``): a batch's
value is its parts' values weighted by their examples, so data-parallel workers send their
shard's sums, not its prediction. Add your own by name or as a callable:

    gc.metrics.register("max_err", lambda pred, target: float(np.abs(pred - target).max()))
    trainer = gc.Trainer(arts, metrics=["mse", "max_err", my_metric])
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Optional, Union

import numpy as np

from graphc.errors import did_you_mean

__all__ = ["Metric", "accuracy", "check_fits", "compute", "default_names", "defaults", "get", "mae", "mse", "names",
           "prepare", "register", "resolve", "splits", "sums", "top_k_accuracy"]

Metric = Callable[[np.ndarray, np.ndarray], float]
_REGISTRY: dict[str, Metric] = {}
_MEANS: "weakref.WeakSet[Metric]" = weakref.WeakSet()  # the built-ins: means over examples (``splits``)


def register(name: str, fn: Optional[Metric] = None):
    """Register ``fn`` as the metric ``name`` (also usable as ``@register(name)``)."""
    if fn is None:
        return lambda f: register(name, f)
    if not callable(fn):
        raise TypeError(f"metric {name!r} must be a function (pred, target) -> float, got {type(fn).__name__}")
    _REGISTRY[name] = fn
    return fn


def names() -> list[str]:
    """The registered metric names."""
    return list(_REGISTRY)


def get(name: str) -> Metric:
    """The metric registered as ``name``; ``ValueError`` naming the registered ones otherwise."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown metric {name!r}{did_you_mean(name, _REGISTRY)}; registered: {', '.join(_REGISTRY)} "
                         "(add one with gc.metrics.register(name, fn))")
    return _REGISTRY[name]


def resolve(metrics: Union[None, Iterable[Union[str, Metric]], Mapping[str, Metric]]) -> Optional[dict[str, Metric]]:
    """Names, callables (named by ``__name__``) or a name -> callable mapping as one mapping;
    None stays None (the loss kind's defaults); one name or one callable alone is that metric."""
    if metrics is None:
        return None
    if isinstance(metrics, str) or callable(metrics):
        metrics = [metrics]
    if isinstance(metrics, Mapping):
        return {name: _checked(repr(name), fn) for name, fn in metrics.items()}
    out = {}
    for m in metrics:
        if isinstance(m, str):
            out[m] = get(m)
        else:
            out[getattr(m, "__name__", type(m).__name__)] = _checked(repr(m), m)
    return out


def _checked(name: str, fn) -> Metric:
    if not callable(fn):
        raise TypeError(f"metric {name} must be a function (pred, target) -> float, got {type(fn).__name__}")
    return fn


@register("accuracy")
def accuracy(pred: np.ndarray, target: np.ndarray) -> float:
    """Share of correct predictions: the argmax over classes for ``[M, C]`` logits, the sign of
    the logit for binary targets shaped as ``pred`` (``target > 0.5`` is the positive class)."""
    if pred.shape == target.shape:
        hits = (pred > 0) == (target > 0.5)
    else:
        hits = np.argmax(pred, axis=1) == target
    return float(hits.mean()) if hits.size else float("nan")


def top_k_accuracy(k: int) -> Metric:
    """The metric "the label is among the ``k`` highest logits" for ``[M, C]`` logits."""
    def metric(pred: np.ndarray, target: np.ndarray) -> float:
        if not len(target):
            return float("nan")
        top = np.argpartition(-pred, min(k, pred.shape[1]) - 1, axis=1)[:, :k]
        return float((top == target[:, None]).any(axis=1).mean())

    metric.__name__ = f"top{k}_accuracy"
    _MEANS.add(metric)
    return metric


register("top5_accuracy", top_k_accuracy(5))
_MEANS.add(accuracy)


def _error(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``|pred - target|`` in float64 (complex128 for complex values: the modulus)."""
    return np.abs(pred.astype(np.result_type(pred.dtype, np.float64)) - target)


@register("mse")
def mse(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean squared error (of the moduli, for complex values)."""
    return float(np.mean(np.square(_error(pred, target))))


@register("mae")
def mae(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean absolute error (the mean modulus, for complex values: torch's l1_loss)."""
    return float(np.mean(_error(pred, target)))


_MEANS.update((mse, mae))


def splits(fn: Metric) -> bool:
    """Whether ``fn`` is a mean over examples graphc knows (``accuracy``, ``top_k_accuracy(k)``'s,
    ``mse``, ``mae``): its value on a batch is then its shards' values weighted by their
    examples. A user's metric may be anything (a max, a median), so it is computed on the whole."""
    return fn in _MEANS


# The loss kinds each built-in metric means something for: a classifier's accuracy on an mse
# output (the sign of a regression) or an mse of logits against class ids computes a number that
# means nothing, once reported silently.
_CLASSIFIERS, _REGRESSIONS = ("cross_entropy", "bce_with_logits"), ("mse", "l1", "huber")
_FITS: dict[Metric, tuple[str, ...]] = {accuracy: _CLASSIFIERS, _REGISTRY["top5_accuracy"]: ("cross_entropy",),
                                        mse: _REGRESSIONS, mae: _REGRESSIONS}


def check_fits(metrics: Optional[Mapping[str, Metric]], kind: str) -> None:
    """``ValueError`` when a built-in metric of ``metrics`` does not fit a loss of ``kind`` (a
    model output as the loss, kind ``output``, fits any: its meaning is the user's)."""
    for name, fn in (metrics or {}).items():
        fits = _FITS.get(fn)
        if fits is not None and kind in (*_CLASSIFIERS, *_REGRESSIONS) and kind not in fits:
            raise ValueError(f"metric {name!r} does not fit a {kind} loss: it is for {' and '.join(fits)} losses "
                             f"(the defaults for {kind}: {', '.join(default_names(kind, 10) or [])})")


def default_names(kind: str, classes: Optional[int]) -> Optional[list[str]]:
    """The metric names a loss of ``kind`` implies; ``classes``: the logits' class count (None:
    unknown, and then None for a classifier, whose top-5 accuracy needs more than 5 classes).
    ``gc.training.generate`` records them in the manifest."""
    if kind == "cross_entropy":
        return None if classes is None else ["accuracy"] + (["top5_accuracy"] if classes > 5 else [])
    if kind == "bce_with_logits":
        return ["accuracy"]
    return ["mse", "mae"]


def defaults(kind: str, pred: np.ndarray) -> dict[str, Metric]:
    """The metrics a loss of ``kind`` implies for outputs like ``pred`` (as prepared)."""
    names = default_names(kind, pred.shape[1] if pred.ndim == 2 else 0)
    return {name: get(name) for name in names}


def prepare(loss: Mapping, pred: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pred`` and ``target`` as metrics take them (see the module docstring)."""
    pred, target = np.asarray(pred), np.asarray(target)
    if loss.get("kind") != "cross_entropy":
        return pred, target
    classes = pred.shape[1]
    flat_pred = np.moveaxis(pred, 1, -1).reshape(-1, classes)
    flat_target = target.reshape(-1)
    keep = flat_target != loss.get("options", {}).get("ignore_index", -100)
    return flat_pred[keep], flat_target[keep]


def compute(loss: Mapping, outputs: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray],
            chosen: Optional[Mapping[str, Metric]] = None) -> dict[str, float]:
    """The metrics of one batch for the loss spec ``loss`` (a manifest's ``loss``): ``chosen``,
    or the loss kind's defaults when None. Empty when the loss's output or label is not there."""
    output, label = loss.get("output"), loss.get("label")
    if output not in outputs or label not in batch:
        return {}
    pred, target = prepare(loss, outputs[output], batch[label])
    metrics = defaults(loss.get("kind", ""), pred) if chosen is None else chosen
    out = {}
    for name, fn in metrics.items():
        try:
            out[name] = float(fn(pred, target))
        except Exception as exc:  # noqa: BLE001 - a user's metric: say which one failed on what
            raise ValueError(f"metric {name!r} failed on the {output!r} output {pred.dtype}{list(pred.shape)} and the "
                             f"{label!r} label {target.dtype}{list(target.shape)}: {type(exc).__name__}: {exc}") from exc
    return out


def sums(loss: Mapping, outputs: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray],
         chosen: Optional[Mapping[str, Metric]], count: int) -> dict[str, float]:
    """``compute``'s metrics each times ``count``, the examples they are a mean over
    (``averaging.examples``), to add up over batches or shards; 0 when there is none (a mean
    over nothing is NaN)."""
    return {name: value * count if count else 0.0 for name, value in compute(loss, outputs, batch, chosen).items()}
