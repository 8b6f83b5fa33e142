"""What every optimizer's update graph is built from: the values a step shares
(``StepContext``), one param's update (``Step``), and the pieces several kinds take (the gradient
as stepped, decoupled weight decay's factor, torch's ``lerp_``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter

__all__ = ["Step", "StepContext", "lerp", "prologue", "shrink"]


@dataclass
class StepContext:
    """Values shared by every param's update: lr (a float32 or float64 scalar, ``lr_dtype``), the
    step number ``t`` after this step (int64 scalar), a scheduled momentum and its running state
    (``scheduled``), and per-dtype casts and other scalars of them, computed once (``cached``)."""

    b: Emitter
    lr: ir.Value
    t: ir.Value
    momentum: ir.Value | None = None  # float64 scalar input where the spec schedules it, else None
    running: dict[str, ir.Value] = field(default_factory=dict)  # ``scheduled.running_state``'s inputs
    running_next: dict[str, ir.Value] = field(default_factory=dict)  # their next values, set by the steps
    _cache: dict = field(default_factory=dict)

    def lr_as(self, like: ir.Value) -> ir.Value:
        return self._cast("lr", self.lr, like.dtype)

    def float64(self, name: str) -> ir.Value:
        """``lr`` or ``t`` (``name``) as a float64 scalar, cast once: the step's scalars are computed
        as torch's Python floats."""
        return self._cast(name, getattr(self, name), ir.DataType.DOUBLE)

    def _cast(self, key: str, value: ir.Value, dtype: ir.DataType) -> ir.Value:
        if value.dtype == dtype:
            return value
        if (key, dtype) not in self._cache:
            self._cache[key, dtype] = self.b.op("Cast", value, to=dtype, dtype=dtype)
        return self._cache[key, dtype]

    def first_step(self) -> ir.Value:
        """``t == 1`` (a bool scalar): where torch.optim starts a state from the lr the step reads (Rprop's
        ``step_size``, ASGD's ``eta``), which a scheduler or ``trainer.lr`` may have set before it."""
        return self.cached("first_step", lambda: self.b.op("Equal", self.t, self.b.const(1, np.int64)))

    def cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


@dataclass
class Step:
    """One update of a param: ``new = param * shrink - delta`` (``param - delta`` when ``shrink``
    is None: no decoupled decay), and the optimizer state's next values. ``delta`` has the
    gradient's shape, so a flat group's step can be split and applied to each param as it is."""

    delta: ir.Value
    shrink: ir.Value | None
    state: dict[str, ir.Value]


def shrink(ctx: StepContext, like: ir.Value, weight_decay: float) -> ir.Value:
    """Decoupled weight decay's ``1 - lr*wd`` (``param * shrink`` in ``apply``)."""
    b = ctx.b
    return ctx.cached(("shrink", like.dtype, weight_decay), lambda: b.op(
        "Sub", b.scalar(1.0, like), b.op("Mul", ctx.lr_as(like), b.scalar(weight_decay, like))))


def prologue(ctx: StepContext, param, grad, weight_decay: float, maximize: bool):
    """``like`` (the typed value: a per-param gradient may not be), the constant maker and the
    gradient as the adaptive kinds step it: negated with ``maximize``, ``+ wd*param`` (L2)."""
    like = param if param is not None else grad
    b, c = ctx.b, lambda v: ctx.b.scalar(v, like)
    if maximize:
        grad = b.op("Neg", grad)
    if weight_decay:
        grad = b.op("Add", grad, b.op("Mul", param, c(weight_decay)))
    return like, c, grad


def lerp(b: Emitter, avg: ir.Value, grad: ir.Value, weight: ir.Value) -> ir.Value:
    """``avg + weight*(grad - avg)``: torch's ``avg.lerp_(grad, weight)`` (for weight < 0.5)."""
    return b.op("Add", avg, b.op("Mul", b.op("Sub", grad, avg), weight))
