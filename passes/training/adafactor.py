"""``torch.optim.Adafactor``'s update (T5's optimizer), step for step as torch 2.13's single-tensor path.

At step ``t`` (1, 2, ...): ``w = t^beta2_decay``, ``rho = min(lr, 1/sqrt(t))``, ``alpha = max(eps2,
rms(param)) * rho`` (of the param before the step); with weight decay ``param *= 1 - lr*wd`` first. A
param of two or more dims keeps its second moment factored over its last two: ``row_var`` (shape
``[..., R, 1]``) is lerped to the rows' mean squared gradient, ``col_var`` (``[..., 1, C]``) to the
columns', and the estimate is ``row_var * col_var / max(mean(row_var), eps1)``; a 1-D or 0-D param
keeps ``variance``, lerped to ``g*g``. ``update = g / sqrt(max(estimate, eps1^2))`` and ``param -=
alpha / max(1, rms(update) / d) * update``. ``eps1`` None is the param dtype's machine epsilon.

Each param's step reads norms of the whole param and of its update, so the step is not elementwise:
the fused update steps each param on its own (``per_param``), and train_step holds every param in
the model's axis order (the row and column statistics are torch's). The scalars (``w``, ``rho``,
``alpha``, the clipping denominator) are computed in float64, as torch's Python floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphc.model.dtypes import finfo
from graphc.passes.training.update_step import Step, StepContext, prologue, shrink

__all__ = ["FACTORED", "VECTOR", "eps_for", "slots", "state_shape", "step"]

FACTORED = ("row_var", "col_var")  # torch's state keys of a param of two or more dims
VECTOR = ("variance",)  # of a 1-D or 0-D param


def slots(rank: int | None) -> tuple[str, ...]:
    """The state slots of a param of ``rank`` dims (None: every slot a param may have)."""
    if rank is None:
        return (*FACTORED, *VECTOR)
    return FACTORED if rank > 1 else VECTOR


def state_shape(slot: str, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of ``slot`` of a param of ``shape``: torch's ``row_var`` keeps the last dim as 1,
    ``col_var`` the one before it, ``variance`` the param's."""
    shape = tuple(shape)
    if slot == "row_var":
        return (*shape[:-1], 1)
    if slot == "col_var":
        return (*shape[:-2], 1, shape[-1])
    return shape


def eps_for(eps: Sequence[float | None], dtype: ir.DataType) -> tuple[float, float]:
    """``(eps1, eps2)`` with an ``eps1`` of None made the machine epsilon of ``dtype`` (the param's:
    torch's ``torch.finfo(param.dtype).eps``: 2**-7 for bfloat16, 2**-10 for float16)."""
    eps1, eps2 = eps
    return (float(finfo(dtype.numpy()).eps) if eps1 is None else float(eps1)), float(eps2)


def _lerp(b, start: ir.Value, end: ir.Value, small: ir.Value, coef: ir.Value) -> ir.Value:
    """torch's ``start.lerp_(end, w)`` for any ``w`` in [0, 1]: ``start + w*(end - start)`` where
    ``small`` (w < 0.5), else ``end - (1 - w)*(end - start)`` (``coef``: w or w - 1)."""
    return b.op("Add", b.op("Where", small, start, end), b.op("Mul", b.op("Sub", end, start), coef))


def _rms64(b, x: ir.Value, numel: int, divisor: float = 1.0) -> ir.Value:
    """torch's ``x.norm(2).item() / (x.numel() ** 0.5 * divisor)``: the norm in ``x``'s dtype, the
    rest in float64."""
    norm = b.op("Cast", b.op("ReduceL2", x, keepdims=0), to=ir.DataType.DOUBLE, dtype=ir.DataType.DOUBLE)
    return b.op("Div", norm, b.const(math.sqrt(numel) * divisor, np.float64))


def step(ctx: StepContext, param, grad, state, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0,
         maximize=False) -> Step:
    b = ctx.b
    like, c, grad = prologue(ctx, param, grad, 0.0, maximize)
    eps1, eps2 = eps_for(eps, like.dtype)
    f = lambda v: b.const(v, np.float64)  # noqa: E731

    def scalars():
        t = ctx.float64("t")
        w = b.op("Pow", t, f(beta2_decay))
        rho = b.op("Min", ctx.float64("lr"), b.op("Div", f(1.0), b.op("Sqrt", t)))
        small = b.op("Less", w, f(0.5))
        coef = b.from_float64(b.op("Where", small, w, b.op("Sub", w, f(1.0))), like)
        return rho, small, coef

    rho, small, coef = ctx.cached(("adafactor", like.dtype, beta2_decay), scalars)
    numel = math.prod(int(n) for n in like.shape)
    alpha = b.op("Mul", b.op("Max", f(eps2), _rms64(b, param, numel)), rho)
    if len(like.shape) > 1:
        rows, cols = int(like.shape[-2]), int(like.shape[-1])
        means = [b.op("Div", b.op("Mul", norm, norm), c(n)) for norm, n in (
            (b.reduce("ReduceL2", grad, [-1]), cols), (b.reduce("ReduceL2", grad, [-2]), rows))]
        row_var, col_var = (_lerp(b, state[s], mean, small, coef) for s, mean in zip(FACTORED, means))
        new_state = {"row_var": row_var, "col_var": col_var}
        estimate = b.op("Div", b.op("Mul", row_var, col_var),
                        b.op("Max", b.reduce("ReduceMean", row_var, [-2]), c(eps1)))
    else:
        estimate = _lerp(b, state["variance"], b.op("Mul", grad, grad), small, coef)
        new_state = {"variance": estimate}
    update = b.op("Mul", b.op("Div", c(1.0), b.op("Sqrt", b.op("Max", estimate, c(eps1 * eps1)))), grad)
    denom = b.op("Max", f(1.0), _rms64(b, update, numel, d))
    delta = b.op("Mul", update, b.from_float64(b.op("Div", alpha, denom), like))
    return Step(delta, shrink(ctx, like, weight_decay) if weight_decay else None, new_state)
