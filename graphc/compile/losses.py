"""Losses: ``gc.losses.mse l1 huber cross_entropy bce_with_logits``.

Each works two ways:

* inside DSL code on Tensors, returning a Tensor: ``loss = gc.losses.mse(pred, target)``;
* as a loss spec for training, when the first argument is an output name:
  ``gc.losses.cross_entropy("logits", label="y")`` binds the model output ``logits`` to a new
  label input ``y`` and returns a ``LossSpec`` for ``gc.training.generate``.

Definitions follow ``torch.nn.functional`` (reduction "mean" by default):

* ``mse``: mean((pred - target)^2)
* ``l1``: mean(|pred - target|)
* ``huber``: d = |pred - target|; 0.5*d^2 if d < delta else delta*(d - 0.5*delta)
* ``cross_entropy``: logits [N, C, d1...], integer class labels [N, d1...]; log_softmax over
  axis 1; ``label_smoothing`` eps mixes (1-eps)*nll with eps/C * (-sum_c log_softmax);
  labels equal to ``ignore_index`` count for nothing, and "mean" divides by the number of
  labels that are not ignored. A class ``weight`` [C] scales each label's term by ``w[y]``
  (the smoothing term's classes by ``w[c]``) and "mean" divides by the sum of the ``w[y]`` of
  the labels not ignored, as torch.
* ``bce_with_logits``: max(x, 0) - x*y + log(1 + exp(-|x|)) (stable at any |x|; max(x, 0) is
  written (x + |x|)/2 so the gradient at x = 0 is PyTorch's sigmoid(0) - y).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Reduction = Literal["mean", "sum", "none"]  # "none": Tensors only
LossKind = Literal["mse", "l1", "huber", "cross_entropy", "bce_with_logits"]
KINDS: tuple[str, ...] = ("mse", "l1", "huber", "cross_entropy", "bce_with_logits")

# Options each kind accepts, with PyTorch's defaults.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "mse": {"reduction": "mean"},
    "l1": {"reduction": "mean"},
    "huber": {"reduction": "mean", "delta": 1.0},
    "cross_entropy": {"reduction": "mean", "label_smoothing": 0.0, "ignore_index": -100},
    "bce_with_logits": {"reduction": "mean"},
}
# Options a kind takes that are left out of its options unless given (a spec without them, and
# the manifest that records it, as before they existed).
OPTIONAL_OPTIONS: dict[str, tuple[str, ...]] = {"cross_entropy": ("weight",)}


class LossSpec(BaseModel):
    """A loss bound to a model output: ``kind`` applied to ``output`` against a new label input
    named ``label``; ``options`` holds the kind's keyword arguments (reduction, delta, ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: LossKind
    output: str
    label: str = "label"
    options: dict[str, Any] = Field(default_factory=dict)

    def resolved_options(self) -> dict[str, Any]:
        """``options`` over the kind's defaults, with unknown keys rejected."""
        defaults = DEFAULT_OPTIONS[self.kind]
        known = {*defaults, *OPTIONAL_OPTIONS.get(self.kind, ())}
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise ValueError(f"loss {self.kind!r} has no option(s) {unknown}; "
                             f"it takes {sorted(known)}")
        opts = {**defaults, **self.options}
        if "weight" in opts:
            opts["weight"] = class_weights(opts["weight"])
        if opts["reduction"] not in ("mean", "sum"):
            raise ValueError(f"loss {self.kind!r}: reduction must be 'mean' or 'sum', "
                             f"got {opts['reduction']!r}")
        return opts


def _spec_or_tensor(kind: str, first, second, label, options: dict[str, Any]):
    if isinstance(first, str):
        if second is not None:
            raise TypeError(f"gc.losses.{kind}({first!r}, ...) is a loss spec: pass the label "
                            f"input's name as label=..., not a second positional argument")
        spec = LossSpec(kind=kind, output=first, label=label or "label", options=options)
        spec.resolved_options()
        return spec
    if second is None:
        raise TypeError(f"gc.losses.{kind}(pred, target) needs two Tensors")
    from graphc.dsl import losses as _dsl_losses

    return getattr(_dsl_losses, kind)(first, second, **{**DEFAULT_OPTIONS[kind], **options})


def mse(pred, target=None, *, label: str | None = None, reduction: Reduction = "mean"):
    """Mean squared error, ``torch.nn.functional.mse_loss``."""
    return _spec_or_tensor("mse", pred, target, label, {"reduction": reduction})


def l1(pred, target=None, *, label: str | None = None, reduction: Reduction = "mean"):
    """Mean absolute error, ``torch.nn.functional.l1_loss``."""
    return _spec_or_tensor("l1", pred, target, label, {"reduction": reduction})


def huber(pred, target=None, *, label: str | None = None, delta: float = 1.0,
          reduction: Reduction = "mean"):
    """Huber loss, ``torch.nn.functional.huber_loss``."""
    return _spec_or_tensor("huber", pred, target, label, {"reduction": reduction, "delta": float(delta)})


def cross_entropy(logits, labels=None, *, label: str | None = None, label_smoothing: float = 0.0,
                  ignore_index: int = -100, reduction: Reduction = "mean", weight=None):
    """Softmax cross-entropy on integer class labels, ``torch.nn.functional.cross_entropy``;
    ``weight``: one finite weight per class, of any sign as torch's (a list, an array; a Tensor in
    DSL code); ``label_smoothing`` at most 1 (below 0: none), ``ignore_index`` an int."""
    from graphc.dsl.losses import check_ignore_index

    options = {"reduction": reduction, "label_smoothing": float(label_smoothing),
               "ignore_index": check_ignore_index("cross_entropy", ignore_index)}
    if weight is not None:
        options["weight"] = weight if not isinstance(logits, str) else class_weights(weight)
    return _spec_or_tensor("cross_entropy", logits, labels, label, options)


def class_weights(weight) -> list[float]:
    """A loss spec's ``weight`` as the JSON list its manifest records: one finite float per class."""
    array = np.asarray(weight)
    if array.ndim != 1 or not array.size or not np.issubdtype(array.dtype, np.number) or \
            not np.isfinite(array).all():
        raise ValueError(f"cross_entropy: weight must be one finite number per class, a 1-D list or array, got "
                         f"{weight!r}")
    return [float(w) for w in array]


def bce_with_logits(logits, target=None, *, label: str | None = None, reduction: Reduction = "mean"):
    """Binary cross-entropy on logits, ``torch.nn.functional.binary_cross_entropy_with_logits``."""
    return _spec_or_tensor("bce_with_logits", logits, target, label, {"reduction": reduction})


__all__ = ["LossSpec", "mse", "l1", "huber", "cross_entropy", "bce_with_logits"]
