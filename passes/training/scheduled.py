"""Hyper-parameters a training graph takes as inputs set between steps, beside the lr: a
scheduled momentum (SGD's and RMSprop's ``momentum``, the Adam family's beta1), for torch's
OneCycleLR and CyclicLR with ``cycle_momentum=True``. Opt-in at generate time (``scheduled`` in
the optimizer spec's JSON): graphs without it hold the spec's constant, as before."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

MOMENTUM = "momentum"  # the train_step input of a scheduled momentum (``scheduled`` in the spec's JSON)
SCHEDULABLE = (MOMENTUM,)


def momentum_key(optimizer: dict) -> str | None:
    """Where torch's ``param_groups[0]`` keeps what OneCycleLR and CyclicLR cycle: ``"betas"``
    (its first entry, beta1) for the kinds with betas, ``"momentum"`` for SGD and RMSprop, None
    for Adagrad (torch's rule: ``betas`` if the optimizer has them, else ``momentum``)."""
    if "betas" in optimizer or optimizer["kind"] in ("adam", "adamw", "adamax", "nadam", "radam"):
        return "betas"
    return "momentum" if optimizer["kind"] in ("sgd", "rmsprop") else None


def momentum_value(optimizer: dict) -> float:
    """The spec's momentum or beta1 (``momentum_key``)."""
    key = momentum_key(optimizer)
    return float(optimizer.get("betas", (0.9, 0.999))[0] if key == "betas" else optimizer.get("momentum", 0.0))


def with_scheduled(optimizer: dict, scheduled) -> dict:
    """``optimizer`` (a spec's JSON) with ``scheduled`` (names of ``SCHEDULABLE``) made train_step
    inputs set between steps: ``"scheduled": [...]``, and for Adam and AdamW the first moment as
    torch's average (``exp_avg``: its sum assumes one beta1). Nothing scheduled: ``optimizer`` as is."""
    scheduled = [scheduled] if isinstance(scheduled, str) else list(scheduled)
    unknown = [s for s in scheduled if s not in SCHEDULABLE]
    if unknown:
        raise ValueError(f"scheduled: {unknown} cannot be set between steps; expected a subset of {list(SCHEDULABLE)}")
    if not scheduled:
        return optimizer
    kind = optimizer["kind"]
    if momentum_key(optimizer) is None:
        raise ValueError(f"scheduled=['momentum']: {kind} has no momentum or beta1 (torch's OneCycleLR and CyclicLR "
                         "cycle SGD's and RMSprop's momentum, the Adam family's beta1)")
    if kind == "nadam":
        raise ValueError("scheduled=['momentum']: NAdam's beta1 enters a running product over the steps "
                         "(torch's mu_product), which graphc computes from the step count for a constant beta1; "
                         "schedule it with cycle_momentum=False")
    out = {**optimizer, "scheduled": sorted(set(scheduled))}
    return {**out, "first_moment": "average"} if kind in ("adam", "adamw") else out


def momentum64(ctx, constant: float) -> ir.Value:
    """Momentum or beta1 as a float64 scalar of an update (``optimizers.StepContext``): the
    scheduled input, else ``constant``."""
    return ctx.momentum if ctx.momentum is not None else ctx.b.const(constant, np.float64)


def momentum_as(ctx, constant: float, like: ir.Value, complement: bool = False) -> ir.Value:
    """Momentum or beta1 (``1 -`` it with ``complement``) in ``like``'s dtype: the constant's own
    rounding, or the scheduled input's, computed in float64 and cast once as torch rounds its
    Python float."""
    b = ctx.b
    if ctx.momentum is None:
        return b.scalar(1.0 - constant if complement else constant, like)

    def make():
        value = b.op("Sub", b.const(1.0, np.float64), ctx.momentum) if complement else ctx.momentum
        return value if like.dtype == ir.DataType.DOUBLE else b.op("Cast", value, to=like.dtype, dtype=like.dtype)

    return ctx.cached(("momentum", complement, like.dtype), make)
