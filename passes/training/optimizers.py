"""Optimizer update graphs: for one param, the nodes that compute its next value and state.

Each function matches ``torch.optim`` (single-tensor, non-capturable path) step for step:

* SGD (dampening 0): ``g = grad + wd*p``; with momentum ``buf = m*buf + g`` (a zero initial
  buffer gives PyTorch's ``buf = g`` on the first step), ``g = g + m*buf`` if nesterov else
  ``buf``; ``p = p - lr*g``.
* Adam: ``g = grad + wd*p``; ``m = m + (1-b1)*(g - m)`` (torch's ``lerp_``);
  ``v = b2*v + (1-b2)*g*g``; ``p = p - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`` with
  ``t`` the step number after this step (``step + 1``).
* AdamW: ``p = p*(1 - lr*wd)`` first (decoupled decay), then the Adam step without ``wd``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter

STATE_SLOTS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"),
               "adamw": ("exp_avg", "exp_avg_sq")}


def state_slots(optimizer: dict) -> tuple[str, ...]:
    """Per-param state slot names (``<param>.<slot>``, PyTorch's ``optimizer.state`` keys) of an
    optimizer spec as JSON (``{"kind": "sgd", "momentum": 0.9, ...}``); the one definition
    (``gc.optim`` specs' ``state_slots`` read it)."""
    if optimizer["kind"] == "sgd" and not optimizer.get("momentum"):
        return ()
    return STATE_SLOTS[optimizer["kind"]]


@dataclass
class StepContext:
    """Values shared by every param's update: lr (float32 scalar), the step number ``t`` after
    this step (int64 scalar), and per-dtype casts of both, computed once."""

    b: Emitter
    lr: ir.Value
    t: ir.Value
    _cache: dict = field(default_factory=dict)

    def lr_as(self, like: ir.Value) -> ir.Value:
        return self._cast("lr", self.lr, like.dtype)

    def _cast(self, key: str, value: ir.Value, dtype: ir.DataType) -> ir.Value:
        if value.dtype == dtype:
            return value
        if (key, dtype) not in self._cache:
            self._cache[key, dtype] = self.b.op("Cast", value, to=dtype, dtype=dtype)
        return self._cache[key, dtype]

    def cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def update(ctx: StepContext, hyper: dict, param: ir.Value, grad: ir.Value,
           state: dict[str, ir.Value]) -> tuple[ir.Value, dict[str, ir.Value]]:
    """Next value of ``param`` and of each state slot (same keys as ``state``); ``hyper`` is the
    optimizer spec as JSON, its ``kind`` included."""
    kind = hyper["kind"]
    if kind == "sgd":
        return sgd(ctx, param, grad, state, **_only(hyper, "momentum", "nesterov", "weight_decay"))
    if kind in ("adam", "adamw"):
        return adam(ctx, param, grad, state, decoupled=kind == "adamw",
                    **_only(hyper, "betas", "eps", "weight_decay"))
    raise ValueError(f"unknown optimizer kind {kind!r}; expected sgd, adam or adamw")


def _only(hyper: dict, *keys: str) -> dict:
    return {k: hyper[k] for k in keys if k in hyper}


def sgd(ctx: StepContext, param, grad, state, momentum=0.0, nesterov=False, weight_decay=0.0):
    b, c = ctx.b, lambda v: b.scalar(v, param)
    if weight_decay:
        grad = b.op("Add", grad, b.op("Mul", param, c(weight_decay)))
    new_state = {}
    if momentum:
        buf = b.op("Add", b.op("Mul", state["momentum_buffer"], c(momentum)), grad)
        new_state["momentum_buffer"] = buf
        grad = b.op("Add", grad, b.op("Mul", buf, c(momentum))) if nesterov else buf
    new_param = b.op("Sub", param, b.op("Mul", grad, ctx.lr_as(param)))
    return new_param, new_state


def adam(ctx: StepContext, param, grad, state, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
         decoupled=False):
    b, c = ctx.b, lambda v: b.scalar(v, param)
    beta1, beta2 = betas
    lr = ctx.lr_as(param)
    if weight_decay and decoupled:
        param = b.op("Mul", param, b.op("Sub", c(1.0), b.op("Mul", lr, c(weight_decay))))
    elif weight_decay:
        grad = b.op("Add", grad, b.op("Mul", param, c(weight_decay)))
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m = b.op("Add", m, b.op("Mul", b.op("Sub", grad, m), c(1.0 - beta1)))
    v = b.op("Add", b.op("Mul", v, c(beta2)), b.op("Mul", b.op("Mul", grad, grad), c(1.0 - beta2)))
    step_size, bc2_sqrt = ctx.cached(("adam", param.dtype, beta1, beta2),
                                     lambda: _bias_corrections(ctx, param, lr, beta1, beta2))
    denom = b.op("Add", b.op("Div", b.op("Sqrt", v), bc2_sqrt), c(eps))
    new_param = b.op("Sub", param, b.op("Mul", b.op("Div", m, denom), step_size))
    return new_param, {"exp_avg": m, "exp_avg_sq": v}


def _bias_corrections(ctx: StepContext, like: ir.Value, lr: ir.Value, beta1: float, beta2: float):
    """``lr / (1 - b1^t)`` and ``sqrt(1 - b2^t)``; computed in float64 then cast to the param's
    dtype, as PyTorch computes them in Python floats."""
    b, t = ctx.b, ctx._cast("t", ctx.t, ir.DataType.DOUBLE)
    one = b.const(1.0, np.float64)
    bc1 = b.op("Sub", one, b.op("Pow", b.const(beta1, np.float64), t))
    bc2 = b.op("Sub", one, b.op("Pow", b.const(beta2, np.float64), t))
    lr64 = ctx._cast("lr", ctx.lr, ir.DataType.DOUBLE)
    step_size = b.op("Div", lr64, bc1)
    bc2_sqrt = b.op("Sqrt", bc2)
    cast = (lambda v: b.op("Cast", v, to=like.dtype, dtype=like.dtype)) if like.dtype != ir.DataType.DOUBLE else (lambda v: v)
    return cast(step_size), cast(bc2_sqrt)
