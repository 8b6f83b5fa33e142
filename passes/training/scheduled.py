"""Hyper-parameters a training graph takes as inputs set between steps, beside the lr: a
scheduled momentum (SGD's and RMSprop's ``momentum``, the Adam family's beta1), for torch's
OneCycleLR and CyclicLR with ``cycle_momentum=True``. Opt-in at generate time (``scheduled`` in
the optimizer spec's JSON): graphs without it hold the spec's constant, as before."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

MOMENTUM = "momentum"  # the train_step input of a scheduled momentum (``scheduled`` in the spec's JSON)
SCHEDULABLE = (MOMENTUM,)
MU_PRODUCT = "mu_product"  # NAdam's running product of mu_t, torch's per-param key
MOMENTUM_STEPS = "momentum_steps"  # SGD's steps with a nonzero momentum: torch's buffer exists from the first
ASGD_ETA, ASGD_MU = "eta", "mu"  # ASGD's step size and averaging factor, torch's per-param keys


def momentum_scheduled(optimizer: dict) -> bool:
    """Whether ``optimizer`` (a spec's JSON) makes its momentum or beta1 a train_step input."""
    return MOMENTUM in optimizer.get("scheduled", ())


def scheduled_inputs(optimizer: dict) -> dict[str, np.ndarray]:
    """The hyper-parameter inputs ``scheduled`` adds beside the lr, with their start: ``momentum``,
    the spec's momentum or beta1 (``momentum_value``) as float64. Else nothing."""
    return {MOMENTUM: np.array(momentum_value(optimizer), np.float64)} if momentum_scheduled(optimizer) else {}


def running_state(optimizer: dict) -> dict[str, np.ndarray]:
    """The scalar state the graphs keep beside the step, with its start: ASGD's ``eta`` and ``mu``
    (float64, torch's starts lr and 1.0; ``adadelta_rprop_asgd.asgd``); with a scheduled momentum
    NAdam's ``mu_product`` (float64 1.0, torch's start; each step multiplies it by that step's
    mu_t, of that step's beta1), and with dampening SGD's ``momentum_steps`` (int64 0: torch
    creates the buffer undamped at the first step whose momentum is not 0). Else nothing."""
    if optimizer["kind"] == "asgd":
        return {ASGD_ETA: np.array(optimizer.get("lr", 1e-2), np.float64), ASGD_MU: np.array(1.0, np.float64)}
    if not momentum_scheduled(optimizer):
        return {}
    if optimizer["kind"] == "nadam":
        return {MU_PRODUCT: np.array(1.0, np.float64)}
    if optimizer["kind"] == "sgd" and optimizer.get("dampening"):
        return {MOMENTUM_STEPS: np.array(0, np.int64)}
    return {}


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
    torch's average (``exp_avg``: its sum assumes one beta1); NAdam's graphs then keep its
    ``mu_product`` as a state (``nadam_momentum``). Nothing scheduled: ``optimizer`` as is."""
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
    out = {**optimizer, "scheduled": sorted(set(scheduled))}
    return {**out, "first_moment": "average"} if kind in ("adam", "adamw") else out


def _is_zero(ctx) -> ir.Value:
    """The scheduled momentum is exactly 0 this step (a bool scalar)."""
    return ctx.cached("momentum == 0", lambda: ctx.b.op("Equal", ctx.momentum, ctx.b.const(0.0, np.float64)))


def unless_zero(ctx, held: ir.Value, pushed: ir.Value) -> ir.Value:
    """``pushed`` (a momentum buffer's next value, or the step it gives), or ``held`` where a
    scheduled momentum is exactly 0: torch's SGD and RMSprop then step with the gradient alone
    and leave the buffer as it is (``if momentum != 0`` / ``> 0`` each step)."""
    return pushed if ctx.momentum is None else ctx.b.op("Where", _is_zero(ctx), held, pushed)


def buffer_exists(ctx) -> ir.Value:
    """Has an earlier step pushed SGD's momentum buffer (a bool scalar; torch damps from its second
    push on, the first buffer the gradient itself)? From step 2 on; with ``MOMENTUM_STEPS``
    (dampening and a scheduled momentum), once a step's momentum was not 0, counted here."""
    b = ctx.b
    if MOMENTUM_STEPS not in ctx.running:
        return b.op("Greater", ctx.t, b.const(1, np.int64))
    steps = ctx.running[MOMENTUM_STEPS]
    pushed = b.op("Cast", b.op("Not", _is_zero(ctx)), to=ir.DataType.INT64, dtype=ir.DataType.INT64)
    ctx.running_next[MOMENTUM_STEPS] = b.op("Add", steps, pushed)
    return b.op("Greater", steps, b.const(0, np.int64))


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
        return b.from_float64(value, like)

    return ctx.cached(("momentum", complement, like.dtype), make)
