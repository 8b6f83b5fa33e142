"""``Trainer.momentum``: SGD's and RMSprop's momentum, the Adam family's beta1, as torch's
OneCycleLR and CyclicLR cycle it (``cycle_momentum=True``), and where the Trainer's lr group
(torch's ``optimizer.param_groups[0]``) keeps it: ``"momentum"``, or ``"betas"``' first entry.
Set between steps only where the training graphs take it as an input (generated with
``scheduled=("momentum",)``); elsewhere it is a constant of the graphs."""

from __future__ import annotations

import math
import numbers
from typing import Any

from graphc.passes.training.scheduled import momentum_key, momentum_value

_WORDS = {"sgd": "SGD's momentum", "rmsprop": "RMSprop's momentum", "adam": "Adam's beta1", "adamw": "AdamW's beta1",
          "adamax": "Adamax's beta1", "nadam": "NAdam's beta1", "radam": "RAdam's beta1"}


def what(optimizer: dict) -> str:
    """The optimizer's momentum in words: "SGD's momentum", "AdamW's beta1"."""
    kind = optimizer["kind"]
    return _WORDS.get(kind, f"{kind}'s beta1")


def checked(optimizer: dict, scheduled: bool, value: Any, who: str = "momentum", below_one: bool = True) -> float:
    """``value`` as the momentum to set, or a ValueError saying why not: the graphs hold it
    constant (and what to generate them with), or not a finite number >= 0 (beta1: < 1, unless
    ``below_one`` is False: a linear OneCycleLR stepped past its last step, as torch's, which
    carries on)."""
    if momentum_key(optimizer) is None:
        raise ValueError(f"{who}: {optimizer['kind']} has no momentum or beta1 (torch's OneCycleLR and CyclicLR "
                         "refuse cycle_momentum=True for it too)")
    if not scheduled:
        raise ValueError(f"{who}: this Trainer's train_step holds {what(optimizer)} as the constant "
                         f"{momentum_value(optimizer)!r}. Generate the artifacts with "
                         "gc.training.generate(..., scheduled=['momentum']) to set it between steps, or give the "
                         "scheduler cycle_momentum=False")
    betas = momentum_key(optimizer) == "betas" and below_one
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < math.inf \
            or (betas and float(value) >= 1.0):
        raise ValueError(f"{who}: {what(optimizer)} must be a finite number >= 0{' and < 1' if betas else ''}, "
                         f"got {value!r}")
    return float(value)


def record(group: dict, optimizer: dict, value: float) -> None:
    """Write ``value`` into ``group`` where torch's param group has it."""
    if momentum_key(optimizer) == "betas":
        group["betas"] = (value, *tuple(group.get("betas") or optimizer.get("betas", (0.9, 0.999)))[1:])
    else:
        group["momentum"] = value


def current(group: dict, optimizer: dict) -> float:
    """The momentum ``group`` holds (``record``'s)."""
    return group["betas"][0] if momentum_key(optimizer) == "betas" else group["momentum"]


def fill(group: dict, trainer: Any) -> None:
    """``group`` (``trainer``'s lr group) gets the momentum key torch's param group has, from
    ``trainer.momentum``, unless it has it; ``betas`` from a checkpoint's JSON (a list) as the
    tuple torch keeps."""
    optimizer = trainer.manifest.optimizer
    key = momentum_key(optimizer)
    if key is not None and key not in group:
        record(group, optimizer, trainer.momentum)
    elif key == "betas":
        group["betas"] = tuple(group["betas"])
