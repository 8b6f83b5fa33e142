"""The updates of ``torch.optim.Adadelta``, ``Rprop`` and ``ASGD``, step for step as torch 2.13's
single-tensor path (each elementwise: the fused update steps their flat buffers as any other's).

* Adadelta: ``g = grad + wd*p``; ``square_avg = rho*square_avg + (1-rho)*g*g``; ``delta =
  sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g``; ``acc_delta = rho*acc_delta +
  (1-rho)*delta*delta``; ``p -= lr*delta``.
* Rprop: ``s = sign(g * prev)``; ``step_size = clamp(step_size * (etaplus if s > 0, etaminus if s < 0,
  else 1), *step_sizes)``; where ``s < 0`` the gradient counts as 0 (this step and as the next
  ``prev``); ``p -= sign(g) * step_size``. ``step_size`` starts at the lr fed at the first step (a
  scheduler's, as torch's first ``step_size``; ``initial_state`` holds the spec's until then), ``prev``
  at 0. No weight decay, as torch's.
* ASGD: ``g = grad + wd*p``; ``p = p*(1 - lambd*eta) - eta*g``; ``ax = p`` while ``mu`` is 1, else
  ``ax += mu*(p - ax)``; then ``eta = lr / (1 + lambd*lr*t)^alpha`` and ``mu = 1 / max(1, t - t0)``
  for the next step. torch keeps ``eta`` and ``mu`` per param; every param here steps at every
  step, so they are one float64 state each (``scheduled.running_state``; a param stepped only on
  some steps keeps its own), ``eta`` the lr fed at the first step, as torch's first ``eta``.
"""

from __future__ import annotations

import numpy as np

from graphc.passes.training.scheduled import ASGD_ETA, ASGD_MU
from graphc.passes.training.update_step import Step, StepContext, prologue

__all__ = ["adadelta", "asgd", "rprop"]


def adadelta(ctx: StepContext, param, grad, state, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False) -> Step:
    b = ctx.b
    like, c, grad = prologue(ctx, param, grad, weight_decay, maximize)

    def averaged(avg, x):  # torch's ``avg.mul_(rho).addcmul_(x, x, value=1 - rho)``
        return b.op("Add", b.op("Mul", avg, c(rho)), b.op("Mul", b.op("Mul", x, x), c(1.0 - rho)))

    square_avg = averaged(state["square_avg"], grad)
    std = b.op("Sqrt", b.op("Add", square_avg, c(eps)))
    delta = b.op("Mul", b.op("Div", b.op("Sqrt", b.op("Add", state["acc_delta"], c(eps))), std), grad)
    return Step(b.op("Mul", delta, ctx.lr_as(like)), None,
                {"square_avg": square_avg, "acc_delta": averaged(state["acc_delta"], delta)})


def rprop(ctx: StepContext, param, grad, state, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0), maximize=False,
          weight_decay=0.0) -> Step:
    # ``weight_decay``: the no-decay params' 0 that generate passes every kind (Rprop has none)
    b = ctx.b
    like, c, grad = prologue(ctx, param, grad, 0.0, maximize)
    agreement = b.op("Sign", b.op("Mul", grad, state["prev"]))
    flipped = b.op("Less", agreement, c(0.0))
    factor = b.op("Where", b.op("Greater", agreement, c(0.0)), c(etas[1]), b.op("Where", flipped, c(etas[0]), c(1.0)))
    start = b.op("Where", ctx.first_step(), ctx.lr_as(like), state["step_size"])
    step_size = b.op("Clip", b.op("Mul", start, factor), c(step_sizes[0]), c(step_sizes[1]))
    grad = b.op("Where", flipped, c(0.0), grad)
    return Step(b.op("Mul", b.op("Sign", grad), step_size), None, {"prev": grad, "step_size": step_size})


def _eta_mu(ctx: StepContext, lambd: float, alpha: float, t0: float):
    """This step's ``eta`` and ``mu`` (float64 scalars), their next values set in ``ctx.running_next``."""
    b, f = ctx.b, lambda v: ctx.b.const(v, np.float64)
    t, lr = ctx.float64("t"), ctx.float64("lr")
    eta = b.op("Where", ctx.first_step(), lr, ctx.running[ASGD_ETA])
    ctx.running_next[ASGD_ETA] = b.op("Div", lr, b.op("Pow", b.op("Add", f(1.0), b.op("Mul", b.op("Mul", f(lambd), lr), t)),
                                                      f(alpha)))
    ctx.running_next[ASGD_MU] = b.op("Div", f(1.0), b.op("Max", f(1.0), b.op("Sub", t, f(t0))))
    return eta, ctx.running[ASGD_MU]


def asgd(ctx: StepContext, param, grad, state, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0,
         maximize=False) -> Step:
    b = ctx.b
    like, c, grad = prologue(ctx, param, grad, weight_decay, maximize)
    eta, mu = ctx.cached(("asgd", lambd, alpha, t0), lambda: _eta_mu(ctx, lambd, alpha, t0))

    def scalars():  # torch's ``param.mul_(1 - lambd*eta)``, ``param.add_(grad, alpha=-eta)``, ``mu.item() != 1``
        decay = b.op("Sub", b.const(1.0, np.float64), b.op("Mul", b.const(lambd, np.float64), eta))
        return (b.from_float64(decay, like), b.from_float64(eta, like), b.from_float64(mu, like),
                b.op("Equal", mu, b.const(1.0, np.float64)))

    decay, eta_as, mu_as, copied = ctx.cached(("asgd", like.dtype, lambd), scalars)
    delta = b.op("Mul", grad, eta_as)
    stepped = b.op("Sub", b.op("Mul", param, decay), delta)  # ``optimizers.apply``'s next param, which ax reads
    ax = b.op("Where", copied, stepped, b.op("Add", state["ax"], b.op("Mul", b.op("Sub", stepped, state["ax"]), mu_as)))
    return Step(delta, decay, {"ax": ax})
