"""Optimizer update graphs: for one param, the nodes that compute its next value and state.

Each function matches ``torch.optim`` (single-tensor, non-capturable path) step for step:

* SGD: ``g = grad + wd*p``; with momentum ``buf = m*buf + (1-dampening)*g`` (a zero initial
  buffer and no dampening at step 1 give PyTorch's ``buf = g`` on the first step), ``g = g +
  m*buf`` if nesterov else ``buf``; ``p = p - lr*g``.
* Adam: ``g = grad + wd*p``; ``m = m + (1-b1)*(g - m)`` (torch's ``lerp_``);
  ``v = b2*v + (1-b2)*g*g``; ``p = p - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`` with
  ``t`` the step number after this step (``step + 1``). The state holds the moments as
  exponentially weighted sums, ``exp_sum = m / (1-b1)`` and, but for float16 and bfloat16
  params, ``exp_sum_sq = v / (1-b2)``: ``exp_sum = b1*exp_sum + g`` takes two full-size passes
  where PyTorch's average takes three, ``exp_sum_sq = b2*exp_sum_sq + g*g`` three where it takes
  four, the factors moving onto the step's scalars (see ``adam``; ``adam_moments`` names the
  slots and says why half params keep the average). Training artifacts of format 3 and before
  hold both averages, of format 4 and 5 the second; their update is still built.
  With amsgrad, the running maximum of the second moment (``max_exp_sum_sq``, torch's
  ``max_exp_avg_sq``) takes its place in the step.
* AdamW: ``p = p*(1 - lr*wd)`` first (decoupled decay), then the Adam step without ``wd``.
* RMSprop: ``g = grad + wd*p``; ``square_avg = alpha*square_avg + (1-alpha)*g*g``; centered:
  ``grad_avg = grad_avg + (1-alpha)*(g - grad_avg)``, ``avg = sqrt(square_avg - grad_avg^2) + eps``,
  else ``sqrt(square_avg) + eps``; ``p = p - lr*g/avg``, or with momentum ``momentum_buffer =
  m*momentum_buffer + g/avg``, ``p = p - lr*momentum_buffer``.
* Adagrad: ``g = grad + wd*p``; ``sum = sum + g*g`` (``sum`` starts at
  ``initial_accumulator_value``: ``initial_state``); ``p = p - clr * g/(sqrt(sum) + eps)``,
  ``clr = lr / (1 + (t-1)*lr_decay)``.
* Adamax: ``g = grad + wd*p``; ``exp_avg = exp_avg + (1-b1)*(g - exp_avg)``; ``exp_inf =
  max(b2*exp_inf, |g| + eps)``; ``p = p - lr/(1-b1^t) * exp_avg/exp_inf``.
* NAdam: ``g = grad + wd*p`` (or ``p = p*(1 - lr*wd)`` first with ``decoupled_weight_decay``);
  ``exp_avg``, ``exp_avg_sq`` as Adam's (``lerp``); ``mu_t = b1*(1 - 0.5*0.96^(t*momentum_decay))``,
  ``P_t = mu_1*...*mu_t``; ``p = p - lr*(1-mu_t)/(1-P_t) * g/d - lr*mu_{t+1}/(1-P_{t+1}) * exp_avg/d``,
  ``d = sqrt(exp_avg_sq/(1-b2^t)) + eps``. PyTorch keeps ``P_t`` as a per-param state, ``mu_product``;
  every param here steps at every step, so all share one ``P_t``, computed from ``t``
  (``nadam_momentum``), or with a scheduled beta1 kept as the float64 state ``mu_product``.
* RAdam: weight decay as NAdam's; moments as Adam's; ``rho_t = rho_inf - 2t*b2^t/(1-b2^t)``,
  ``rho_inf = 2/(1-b2) - 1``; ``p = p - lr/(1-b1^t) * exp_avg * r_t*sqrt(1-b2^t)/(sqrt(exp_avg_sq) + eps)``
  when ``rho_t > 5``, ``r_t = sqrt((rho_t-4)(rho_t-2)rho_inf / ((rho_inf-4)(rho_inf-2)rho_t))``, else
  ``p = p - lr/(1-b1^t) * exp_avg``.
* Adadelta, Rprop and ASGD: ``adadelta_rprop_asgd``; Adafactor, whose step is not elementwise:
  ``adafactor``.
* ``maximize`` (each kind): the gradient negated first, as PyTorch does.

Step-dependent scalars (bias corrections, Adagrad's decayed lr, NAdam's and RAdam's factors) are
computed in float64 from the fed step, as PyTorch computes them in Python floats, then cast to the
param's dtype. float16 and bfloat16 params of the adaptive kinds (all but SGD) step in float32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import HALF_DTYPES, Emitter
from graphc.passes.training import adafactor, adam_moments, nadam_momentum
from graphc.passes.training.adadelta_rprop_asgd import adadelta, asgd, rprop
from graphc.passes.training.scheduled import MU_PRODUCT, buffer_exists, momentum64, momentum_as, momentum_scheduled, \
    unless_zero
from graphc.passes.training.update_step import Step, StepContext, lerp as _lerp, prologue as _prologue, \
    shrink as _shrink

STATE_SLOTS = {"sgd": ("momentum_buffer",), "rmsprop": ("square_avg",), "adagrad": ("sum",),
               "adamax": ("exp_avg", "exp_inf"), "nadam": ("exp_avg", "exp_avg_sq"),
               "radam": ("exp_avg", "exp_avg_sq"), "adadelta": ("square_avg", "acc_delta"),
               "rprop": ("prev", "step_size"), "asgd": ("ax",)}  # Adam's and AdamW's: ``adam_moments.slots``
# kinds whose step reads the param whatever the weight decay (Adafactor its norm, ASGD its average)
READS_PARAM = ("adafactor", "asgd")
# kinds whose step is not elementwise (Adafactor: norms of each param and its update, row and column
# statistics): stepped one param at a time, each held in the model's axis order
PER_PARAM = ("adafactor",)


def state_slots(optimizer: dict, dtype: ir.DataType | None = None, rank: int | None = None) -> tuple[str, ...]:
    """Per-param state slot names (``<param>.<slot>``, named after PyTorch's ``optimizer.state``
    keys) of an optimizer spec as JSON (``{"kind": "sgd", "momentum": 0.9, ...}``) for params of
    ``dtype`` (None: float32; Adam's second moment is a sum but for float16 and bfloat16 params)
    and ``rank`` (Adafactor's: ``row_var`` and ``col_var`` of two or more dims, else ``variance``;
    None: all three); the one definition (``gc.optim`` specs' ``state_slots`` read it)."""
    if optimizer["kind"] == "adafactor":
        return adafactor.slots(rank)
    if optimizer["kind"] in ("adam", "adamw"):
        return adam_moments.slots(*adam_moments.forms(optimizer, dtype), bool(optimizer.get("amsgrad")))
    with_momentum = bool(optimizer.get("momentum")) or momentum_scheduled(optimizer)
    if optimizer["kind"] == "sgd" and not with_momentum:
        return ()
    slots = STATE_SLOTS[optimizer["kind"]]
    if optimizer["kind"] == "rmsprop":  # torch.optim.RMSprop's keys, in its order
        return (*slots, *(("momentum_buffer",) if with_momentum else ()),
                *(("grad_avg",) if optimizer.get("centered") else ()))
    return slots


def initial_state(optimizer: dict, slot: str, like: np.ndarray) -> np.ndarray:
    """A param's state slot before the first step, typed ``like`` the param and shaped as it
    (``state_shape``): zeros but for Adagrad's ``sum``, ``initial_accumulator_value``, and
    Rprop's ``step_size``, the lr (as torch.optim starts them)."""
    fill = {"adagrad": optimizer.get("initial_accumulator_value", 0.0),
            "rprop": optimizer.get("lr", 1e-2) if slot == "step_size" else 0.0}.get(optimizer["kind"], 0.0)
    return np.full(state_shape(optimizer, slot, like.shape), fill, dtype=like.dtype)


def state_shape(optimizer: dict, slot: str, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of state ``slot`` of a param of ``shape``: the param's, but for Adafactor's row
    and column statistics (``adafactor.state_shape``)."""
    return adafactor.state_shape(slot, shape) if optimizer["kind"] == "adafactor" else tuple(shape)


def lr_dtype(param_dtypes: Iterable[ir.DataType]) -> ir.DataType:
    """The dtype of the ``lr`` input for params of ``param_dtypes``: float64 where one is float64
    (torch.optim's lr is a Python float; a float32 lr stepped float64 params by float32(0.01),
    2e-8 relative off 0.01), else float32, which float32, float16 and bfloat16 params have
    always had (their graphs unchanged)."""
    return ir.DataType.DOUBLE if ir.DataType.DOUBLE in set(param_dtypes) else ir.DataType.FLOAT


def needs_param(hyper: dict) -> bool:
    """Does the step read the param itself (L2 weight decay adds ``wd * param`` to the gradient)?
    ``hyper``: the optimizer spec as JSON, its ``kind`` included."""
    return hyper["kind"] in READS_PARAM or (hyper["kind"] in ("sgd", "adam", *ADAPTIVE) and bool(
        hyper.get("weight_decay")) and not hyper.get("decoupled_weight_decay"))


def step(ctx: StepContext, hyper: dict, grad: ir.Value, state: dict[str, ir.Value],
         param: ir.Value | None = None) -> Step:
    """The update of a param (or a flat group of them) from its gradient and state; ``hyper`` is
    the optimizer spec as JSON, its ``kind`` included; ``param`` is needed only when ``needs_param``."""
    kind = hyper["kind"]
    if kind == "sgd":
        return sgd(ctx, param, grad, state,
                   **_only(hyper, "momentum", "nesterov", "weight_decay", "dampening", "maximize"))
    if kind in ("adam", "adamw"):
        options = _only(hyper, "betas", "eps", "weight_decay", "amsgrad", "maximize")
        dtype = (param if param is not None else grad).dtype
        options["first_moment"], options["second_moment"] = adam_moments.forms(hyper, dtype)
        if dtype in HALF_DTYPES:
            return _in_float32(ctx, dtype, param, grad, state, decoupled=kind == "adamw", **options)
        return adam(ctx, param, grad, state, decoupled=kind == "adamw", **options)
    if kind in ADAPTIVE:
        fn, keys = ADAPTIVE[kind]
        options = _only(hyper, *keys, "weight_decay", "maximize")
        dtype = (param if param is not None else grad).dtype
        if kind == "adafactor":  # eps1 None: the param dtype's epsilon, not float32's of a half param's step
            options["eps"] = adafactor.eps_for(options.get("eps", (None, 1e-3)), dtype)
        if dtype in HALF_DTYPES:
            return _in_float32(ctx, dtype, param, grad, state, step_fn=fn, **options)
        return fn(ctx, param, grad, state, **options)
    raise ValueError(f"unknown optimizer kind {kind!r}; expected sgd, adam, adamw, {', '.join(ADAPTIVE)}")


def _in_float32(ctx: StepContext, dtype: ir.DataType, param, grad, state, step_fn=None, **options) -> Step:
    """The Adam step (or ``step_fn``'s, another adaptive kind's) of a float16 or bfloat16 param in
    float32, as torch.optim's fused Adam/AdamW computes it: the state is stored in ``dtype``, ``delta`` and ``shrink`` stay float32 and
    ``apply`` rounds the param once. In float16, eps * sqrt(1 - b2^t) (3e-10 at eps 1e-8) is 0,
    so an element whose gradients were all 0 stepped by 0/0 = NaN (as torch's single-tensor and
    foreach Adam do), where onnxruntime's CPU provider, which runs float16 arithmetic in float32
    and merges a Cast down with its own Cast up, kept the eps and stepped by 0. In bfloat16,
    b2 = 0.999 is 1.0 and AdamW's 1 - lr*wd = 0.998 is 0.996."""
    b = ctx.b
    wide = {name: b.op("Cast", v, to=ir.DataType.FLOAT, dtype=ir.DataType.FLOAT) if v is not None else None
            for name, v in {"param": param, "grad": grad, **state}.items()}
    s = (step_fn or adam)(ctx, wide.pop("param"), wide.pop("grad"), wide, **options)
    return Step(s.delta, s.shrink, {name: b.op("Cast", v, to=dtype, dtype=dtype) for name, v in s.state.items()})


def apply(b: Emitter, param: ir.Value, delta: ir.Value, shrink: ir.Value | None) -> ir.Value:
    """``param * shrink - delta``: the param's next value (``delta`` has the param's shape). (A
    param whose shape ends in 1, a 1x1 conv's weight, meets the scalar ``shrink`` in
    onnxruntime's slow broadcast: ``broadcasts.rank_scalars`` gives ``shrink`` its rank.)
    onnxruntime runs ``param * shrink``, which reads only inputs, early in the step, and its
    result waits for the rest; ``(param - delta / shrink) * shrink`` (the 1 / shrink folded into
    AdamW's scalar step size) runs both nodes at the end: ResNet-50 at batch 32, 64 px, peak RSS
    1,565 -> 1,538 MB, ResNet-18 at batch 2 unchanged, ResNet-18's steps at batch 32 0.997x /
    0.998x (built second / first); left out, for rounding as ``torch.optim.AdamW`` rounds. A
    float16 or bfloat16 param with a float32 step is stepped in float32 and rounded once."""
    if param.dtype in HALF_DTYPES and delta.dtype != param.dtype:  # a float32 step (``_in_float32``)
        wide = b.op("Cast", param, to=delta.dtype, dtype=delta.dtype)
        return b.op("Cast", apply(b, wide, delta, shrink), to=param.dtype, dtype=param.dtype)
    if shrink is None:
        return b.op("Sub", param, delta)
    return b.op("Sub", b.op("Mul", param, shrink), delta)


def update(ctx: StepContext, hyper: dict, param: ir.Value, grad: ir.Value,
           state: dict[str, ir.Value]) -> tuple[ir.Value, dict[str, ir.Value]]:
    """Next value of ``param`` and of each state slot (same keys as ``state``); ``hyper`` is the
    optimizer spec as JSON, its ``kind`` included."""
    s = step(ctx, hyper, grad, state, param)
    return apply(ctx.b, param, s.delta, s.shrink), s.state


def _only(hyper: dict, *keys: str) -> dict:
    return {k: hyper[k] for k in keys if k in hyper}


def sgd(ctx: StepContext, param, grad, state, momentum=0.0, nesterov=False, weight_decay=0.0, dampening=0.0,
        maximize=False) -> Step:
    like = param if param is not None else grad  # typed (a per-param gradient may not be)
    b, c = ctx.b, lambda v: b.scalar(v, like)
    if maximize:
        grad = b.op("Neg", grad)
    if weight_decay:
        grad = b.op("Add", grad, b.op("Mul", param, c(weight_decay)))
    new_state = {}
    if momentum or ctx.momentum is not None:
        pushed = grad
        if dampening:  # 1 - dampening once the buffer exists: PyTorch's first buffer is the gradient itself
            undamped = ctx.cached(("undamped", like.dtype, dampening), lambda: b.op(
                "Where", buffer_exists(ctx), c(1.0 - dampening), c(1.0)))
            pushed = b.op("Mul", grad, undamped)
        buf = b.op("Add", b.op("Mul", state["momentum_buffer"], momentum_as(ctx, momentum, like)), pushed)
        new_state["momentum_buffer"] = unless_zero(ctx, state["momentum_buffer"], buf)
        grad = b.op("Add", grad, b.op("Mul", buf, momentum_as(ctx, momentum, like))) if nesterov else \
            unless_zero(ctx, grad, buf)
    return Step(b.op("Mul", grad, ctx.lr_as(like)), None, new_state)


def adam(ctx: StepContext, param, grad, state, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
         decoupled=False, first_moment="sum", second_moment="sum", amsgrad=False, maximize=False) -> Step:
    # torch's ``p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`` with the bias correction
    # moved onto scalars: ``(m / (sqrt(v) + eps*sqrt(1-b2^t))) * (lr/(1-b1^t) * sqrt(1-b2^t))``,
    # one full-size pass fewer (the Div by sqrt(1-b2^t)); equal up to float rounding. (The moment
    # updates as one Gemm each, ``b1*m + (1-b1)*g`` as [n, 1] x [[1-b1]] with C = m and beta = b1:
    # 3.4x slower than Sub, Mul, Add on 2**20 floats, onnxruntime CPU, 2 threads; as [n/K, K] x
    # (1-b1)*I_K, K = 4, 8, 16, 32: 590, 318, 304, 456 us against the three nodes' 313. And
    # onnxruntime's com.microsoft GatedAdd, ``x + y * gate`` in one pass, as a session rewrite of
    # the ``Add(x, Mul(y, c))`` pairs: ResNet-18's update at batch 2 spent 5.8 ms in GatedAdd where
    # the Adds and Muls it took the place of had taken 6.0. The scale and eps folded into one
    # affine pass over sqrt(v), an inference-mode BatchNormalization of it as one channel, one
    # node in place of the Add and the Mul: ResNet-18's update graph alone 0.971x, about 0.5 % of
    # its step at batch 32, not worth the odd node (with the first moment as its sum, Trainer
    # steps interleaved at batch 32, 64 px, built second / first: 1.004x / 1.013x); and
    # ``b1*m + (1-b1)*g`` (Mul, Mul, Add, reading one array fewer than the Sub): 1.034x /
    # 0.996x.) The first moment kept as its sum, ``b1*exp_sum + g`` (two passes where the
    # average takes three, its 1 - b1 in the scalar step size): Trainer steps interleaved, batch
    # 32, 64 px, built second / first, ResNet-18 0.991x / 0.991x, ResNet-50 0.999x / 0.992x,
    # ResNet-50's update 49.8 -> 46.9 ms of kernel time (15.6 -> 14.9 % of the step). The second
    # moment as its sum too, ``b2*exp_sum_sq + g*g`` (its 1 - b2 and sqrt(1 - b2) in the
    # scalars), for float32 and float64 params: one Mul fewer per group (ResNet-18's train_step
    # 1,874 -> 1,858 nodes, EfficientNet-B0's 4,625 -> 4,615), a pass of about 1.4 ms of
    # ResNet-18's 144 ms step at batch 32; ABBA timings on a 2-core machine at load 6-7 were
    # noise (update graphs alone, medians 0.96-1.12x, fastest runs 0.77-1.45x). Half params keep
    # the average (``adam_moments``). (The first sum's 1 / (1 - b1), 10 at b1 = 0.9, leaves
    # float16 gradients up to 6,550.) The Sqrt is the chain's dearest pass, about two
    # of the others (2**19 floats, 2 threads, warm: Sqrt 71 us, Add 35, Mul 43, Div 46), and no
    # standard op is a cheaper root: Pow(v, 0.5) 785 us (a std::pow per element).
    like = param if param is not None else grad  # typed (a per-param gradient may not be)
    b, c = ctx.b, lambda v: b.scalar(v, like)
    beta1, beta2 = betas
    shrink = None
    if maximize:
        grad = b.op("Neg", grad)
    if weight_decay and decoupled:
        shrink = _shrink(ctx, like, weight_decay)
    elif weight_decay:
        grad = b.op("Add", grad, b.op("Mul", param, c(weight_decay)))
    first, second, *most = adam_moments.slots(first_moment, second_moment, amsgrad)
    m, v = state[first], state[second]
    if first_moment == adam_moments.AVERAGE:  # format 3 artifacts' and a scheduled beta1's state: PyTorch's own
        m = b.op("Add", m, b.op("Mul", b.op("Sub", grad, m), momentum_as(ctx, beta1, like, complement=True)))
    else:  # the sum m / (1-b1)
        m = b.op("Add", b.op("Mul", m, c(beta1)), grad)
    decayed, squared = b.op("Mul", v, c(beta2)), b.op("Mul", grad, grad)
    if second_moment == adam_moments.AVERAGE:  # half params', format 5 artifacts' and before: PyTorch's own
        squared = b.op("Mul", squared, c(1.0 - beta2))
    v = b.op("Add", decayed, squared)  # else the sum v / (1-b2)
    new_state = {first: m, second: v}
    if amsgrad:  # a max commutes with the sum's positive factor
        v = new_state[most[0]] = b.op("Max", state[most[0]], v)
    forms = (first_moment, second_moment)
    scale, eps_scaled = ctx.cached(("adam", like.dtype, beta1, beta2, eps, forms),
                                   lambda: _bias_corrections(ctx, like, beta1, beta2, eps, *forms))
    delta = b.op("Mul", b.op("Div", m, b.op("Add", b.op("Sqrt", v), eps_scaled)), scale)
    return Step(delta, shrink, new_state)


def _bias_corrections(ctx: StepContext, like: ir.Value, beta1: float, beta2: float, eps: float,
                      first_moment: str, second_moment: str):
    """``lr / (1 - b1^t) * sqrt(1 - b2^t)`` and ``eps * sqrt(1 - b2^t)``: the step's scalar
    factor and the denominator's eps, ``m * scale / (sqrt(v) + eps_scaled)``. The first moment as
    its sum multiplies the scale by ``1 - b1``; the second as its sum, whose root is
    ``sqrt(v) / sqrt(1 - b2)``, divides both by ``sqrt(1 - b2)``. Computed in float64 then cast to
    the param's dtype, as PyTorch computes its bias corrections in Python floats."""
    b, t = ctx.b, ctx._cast("t", ctx.t, ir.DataType.DOUBLE)
    one = b.const(1.0, np.float64)
    bc1 = b.op("Sub", one, b.op("Pow", momentum64(ctx, beta1), t))
    bc2_sqrt = b.op("Sqrt", b.op("Sub", one, b.op("Pow", b.const(beta2, np.float64), t)))
    if second_moment == adam_moments.SUM:
        bc2_sqrt = b.op("Div", bc2_sqrt, b.const(float(np.sqrt(1.0 - beta2)), np.float64))
    lr64 = ctx._cast("lr", ctx.lr, ir.DataType.DOUBLE)
    if first_moment == adam_moments.SUM:
        lr64 = b.op("Mul", lr64, b.const(1.0 - beta1, np.float64))
    scale = b.op("Mul", b.op("Div", lr64, bc1), bc2_sqrt)
    eps_scaled = b.op("Mul", b.const(eps, np.float64), bc2_sqrt)
    return b.from_float64(scale, like), b.from_float64(eps_scaled, like)


def rmsprop(ctx: StepContext, param, grad, state, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
            centered=False, maximize=False) -> Step:
    b = ctx.b
    like, c, grad = _prologue(ctx, param, grad, weight_decay, maximize)
    square_avg = b.op("Add", b.op("Mul", state["square_avg"], c(alpha)),
                      b.op("Mul", b.op("Mul", grad, grad), c(1.0 - alpha)))
    new_state = {"square_avg": square_avg}
    if centered:
        grad_avg = new_state["grad_avg"] = _lerp(b, state["grad_avg"], grad, c(1.0 - alpha))
        square_avg = b.op("Sub", square_avg, b.op("Mul", grad_avg, grad_avg))
    scaled = b.op("Div", grad, b.op("Add", b.op("Sqrt", square_avg), c(eps)))
    if momentum or ctx.momentum is not None:
        buf = b.op("Add", b.op("Mul", state["momentum_buffer"], momentum_as(ctx, momentum, like)), scaled)
        new_state["momentum_buffer"] = unless_zero(ctx, state["momentum_buffer"], buf)
        scaled = unless_zero(ctx, scaled, buf)
    return Step(b.op("Mul", scaled, ctx.lr_as(like)), None, new_state)


def adagrad(ctx: StepContext, param, grad, state, lr_decay=0.0, eps=1e-10, weight_decay=0.0,
            maximize=False) -> Step:
    b = ctx.b
    like, c, grad = _prologue(ctx, param, grad, weight_decay, maximize)
    total = b.op("Add", state["sum"], b.op("Mul", grad, grad))
    clr = ctx.lr_as(like)
    if lr_decay:  # lr / (1 + (t-1)*lr_decay), in float64 as torch's Python floats
        clr = ctx.cached(("adagrad", like.dtype, lr_decay), lambda: b.from_float64(b.op(
            "Div", ctx._cast("lr", ctx.lr, ir.DataType.DOUBLE),
            b.op("Add", b.const(1.0, np.float64), b.op("Mul", b.op("Sub", ctx._cast("t", ctx.t, ir.DataType.DOUBLE),
                                                                   b.const(1.0, np.float64)),
                                                      b.const(lr_decay, np.float64)))), like))
    delta = b.op("Mul", b.op("Div", grad, b.op("Add", b.op("Sqrt", total), c(eps))), clr)
    return Step(delta, None, {"sum": total})


def adamax(ctx: StepContext, param, grad, state, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
           maximize=False) -> Step:
    b = ctx.b
    like, c, grad = _prologue(ctx, param, grad, weight_decay, maximize)
    beta1, beta2 = betas
    exp_avg = _lerp(b, state["exp_avg"], grad, momentum_as(ctx, beta1, like, complement=True))
    exp_inf = b.op("Max", b.op("Mul", state["exp_inf"], c(beta2)), b.op("Add", b.op("Abs", grad), c(eps)))

    def clr():  # lr / (1 - b1^t), in float64
        one, t = b.const(1.0, np.float64), ctx._cast("t", ctx.t, ir.DataType.DOUBLE)
        bc1 = b.op("Sub", one, b.op("Pow", momentum64(ctx, beta1), t))
        return b.from_float64(b.op("Div", ctx._cast("lr", ctx.lr, ir.DataType.DOUBLE), bc1), like)

    scale = ctx.cached(("adamax", like.dtype, beta1), clr)
    return Step(b.op("Mul", b.op("Div", exp_avg, exp_inf), scale), None, {"exp_avg": exp_avg, "exp_inf": exp_inf})


def _moments(ctx: StepContext, param, grad, state, betas, weight_decay, decoupled, maximize):
    """The prologue of NAdam and RAdam: (like, constant maker, gradient, shrink, exp_avg, exp_avg_sq),
    the moments as Adamax's and RMSprop's (``lerp``, ``b2*v + (1-b2)*g*g``)."""
    b = ctx.b
    like, c, grad = _prologue(ctx, param, grad, 0.0 if decoupled else weight_decay, maximize)
    shrink = _shrink(ctx, like, weight_decay) if weight_decay and decoupled else None
    beta1, beta2 = betas
    exp_avg = _lerp(b, state["exp_avg"], grad, momentum_as(ctx, beta1, like, complement=True))
    exp_avg_sq = b.op("Add", b.op("Mul", state["exp_avg_sq"], c(beta2)),
                      b.op("Mul", b.op("Mul", grad, grad), c(1.0 - beta2)))
    return like, c, grad, shrink, exp_avg, exp_avg_sq


def nadam(ctx: StepContext, param, grad, state, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
          momentum_decay=4e-3, decoupled_weight_decay=False, maximize=False) -> Step:
    # torch's ``d = sqrt(v/bc2) + eps`` as ``(sqrt(v) + eps*sqrt(bc2)) / sqrt(bc2)``, the
    # sqrt(bc2) moved onto the two scalar factors (as ``adam``): ``(g*c1 + m*c2) / (sqrt(v) + e)``
    b = ctx.b
    like, c, grad, shrink, exp_avg, exp_avg_sq = _moments(ctx, param, grad, state, betas, weight_decay,
                                                          decoupled_weight_decay, maximize)

    def scalars():
        f, t, (beta1, beta2) = lambda v: b.const(v, np.float64), ctx._cast("t", ctx.t, ir.DataType.DOUBLE), betas
        mu, mu_next = (b.op("Mul", momentum64(ctx, beta1), b.op("Sub", f(1.0), b.op("Mul", f(0.5), b.op(
            "Pow", f(0.96), b.op("Mul", step, f(momentum_decay)))))) for step in (t, b.op("Add", t, f(1.0))))
        if MU_PRODUCT not in ctx.running:
            product = nadam_momentum.closed_form_product(b, f, t, beta1, momentum_decay)
        else:  # torch's mu_product *= mu, with this step's beta1
            product = ctx.running_next[MU_PRODUCT] = b.op("Mul", ctx.running[MU_PRODUCT], mu)
        product_next = b.op("Mul", product, mu_next)
        bc2_sqrt = b.op("Sqrt", b.op("Sub", f(1.0), b.op("Pow", f(beta2), t)))
        lr = b.op("Mul", ctx._cast("lr", ctx.lr, ir.DataType.DOUBLE), bc2_sqrt)
        c1 = b.op("Div", b.op("Mul", lr, b.op("Sub", f(1.0), mu)), b.op("Sub", f(1.0), product))
        c2 = b.op("Div", b.op("Mul", lr, mu_next), b.op("Sub", f(1.0), product_next))
        return tuple(b.from_float64(v, like) for v in (c1, c2, b.op("Mul", f(eps), bc2_sqrt)))

    c1, c2, eps_scaled = ctx.cached(("nadam", like.dtype, *betas, eps, momentum_decay), scalars)
    step_dir = b.op("Add", b.op("Mul", grad, c1), b.op("Mul", exp_avg, c2))
    delta = b.op("Div", step_dir, b.op("Add", b.op("Sqrt", exp_avg_sq), eps_scaled))
    return Step(delta, shrink, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq})


def radam(ctx: StepContext, param, grad, state, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
          decoupled_weight_decay=False, maximize=False) -> Step:
    # both branches as ``m * s / (sqrt(v)*w + e)``, the rectification switch and its scalars
    # (``w = 0, e = 1`` until rho_t > 5) chosen before the full-size passes, none of them twice
    b = ctx.b
    like, c, grad, shrink, exp_avg, exp_avg_sq = _moments(ctx, param, grad, state, betas, weight_decay,
                                                          decoupled_weight_decay, maximize)

    def scalars():
        f, t, (beta1, beta2) = lambda v: b.const(v, np.float64), ctx._cast("t", ctx.t, ir.DataType.DOUBLE), betas
        bc1 = b.op("Sub", f(1.0), b.op("Pow", momentum64(ctx, beta1), t))
        b2t = b.op("Pow", f(beta2), t)
        bc2 = b.op("Sub", f(1.0), b2t)
        rho_inf = 2.0 / (1.0 - beta2) - 1.0
        rho = b.op("Sub", f(rho_inf), b.op("Div", b.op("Mul", b.op("Mul", f(2.0), t), b2t), bc2))
        rect = b.op("Sqrt", b.op("Div", b.op("Mul", b.op("Mul", b.op("Sub", rho, f(4.0)), b.op("Sub", rho, f(2.0))),
                                              f(rho_inf)), b.op("Mul", f((rho_inf - 4.0) * (rho_inf - 2.0)), rho)))
        rectified = b.op("Greater", rho, f(5.0))
        scale = b.op("Div", ctx._cast("lr", ctx.lr, ir.DataType.DOUBLE), bc1)
        scale = b.op("Where", rectified, b.op("Mul", b.op("Mul", scale, rect), b.op("Sqrt", bc2)), scale)
        return tuple(b.from_float64(b.op("Where", rectified, f(on), f(off)), like) for on, off in ((1.0, 0.0), (eps, 1.0))) + (
            b.from_float64(scale, like),)

    w, e, scale = ctx.cached(("radam", like.dtype, *betas, eps), scalars)
    denom = b.op("Add", b.op("Mul", b.op("Sqrt", exp_avg_sq), w), e)
    return Step(b.op("Mul", b.op("Div", exp_avg, denom), scale), shrink, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq})


# the kinds beside SGD and Adam/AdamW: their step and the spec fields it takes (beside
# weight_decay and maximize)
ADAPTIVE = {"rmsprop": (rmsprop, ("alpha", "eps", "momentum", "centered")),
            "adagrad": (adagrad, ("lr_decay", "eps")),
            "adamax": (adamax, ("betas", "eps")),
            "nadam": (nadam, ("betas", "eps", "momentum_decay", "decoupled_weight_decay")),
            "radam": (radam, ("betas", "eps", "decoupled_weight_decay")),
            "adadelta": (adadelta, ("rho", "eps")),
            "rprop": (rprop, ("etas", "step_sizes")),
            "asgd": (asgd, ("lambd", "alpha", "t0")),
            "adafactor": (adafactor.step, ("beta2_decay", "eps", "d"))}
