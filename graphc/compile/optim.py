"""Optimizer specs: ``gc.optim.SGD / Adam / AdamW / RMSprop / Adagrad / Adamax / NAdam / RAdam /
Adadelta / Rprop / ASGD / Adafactor``, pydantic models that describe an update.

A spec holds hyper-parameters only; ``gc.training.generate`` turns it into ONNX update nodes
(``graphc.passes.training.optimizers``) whose formulas match ``torch.optim`` step for step.

    >>> import graphc as gc
    >>> gc.optim.SGD(lr=0.1, momentum=0.9).model_dump()
    {'kind': 'sgd', 'lr': 0.1, 'momentum': 0.9, 'nesterov': False, 'weight_decay': 0.0, 'no_decay': ()}
    >>> gc.optim.SGD(lr=0.1, max_grad_norm=1.0).model_dump()  # doctest: +NORMALIZE_WHITESPACE
    {'kind': 'sgd', 'lr': 0.1, 'momentum': 0.0, 'nesterov': False, 'weight_decay': 0.0, 'no_decay': (),
     'max_grad_norm': 1.0}
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_serializer,
                      model_validator)


_CLIPPING = ("max_grad_norm", "grad_norm_type", "clip_grad_value")


# options dumped only when set, as the clipping: specs without them dump as before they existed
_OPTIONS = ("dampening", "amsgrad", "maximize")


# torch.optim's checks (each optimizer's ``__init__``, torch 2.13): these arguments must be >= 0, each
# beta in [0, 1), and SGD's dampening is unchecked; the same wherever an optimizer takes the argument
# (alpha: RMSprop's is checked there, ASGD's is eta's power, which torch takes of any sign)
_AT_LEAST_0 = ("lr", "eps", "weight_decay", "momentum", "lr_decay", "initial_accumulator_value", "momentum_decay")


class _Spec(BaseModel):
    # inf and NaN: refused in _torch_range with the reason (the clipping fields: pydantic's "finite number")
    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, lr: float | None = None, /, **kwargs):
        # ``SGD(0.1)`` like ``torch.optim.SGD(params, 0.1)``: lr may be positional.
        if isinstance(lr, (list, tuple, set, dict, Iterator)):  # torch's params: a list, groups, model.parameters()
            raise TypeError(f"gc.optim.{type(self).__name__} takes no params (got {type(lr).__name__} where lr goes): "
                            "it trains every param that reaches the loss; name those to leave out in "
                            "gc.training.generate(frozen=...) and those without weight decay in no_decay=")
        if lr is not None:
            kwargs["lr"] = lr
        if isinstance(kwargs.get("no_decay"), str):  # one pattern, as generate's frozen takes one name
            kwargs["no_decay"] = (kwargs["no_decay"],)
        super().__init__(**kwargs)

    # gradient clipping before the step, as torch.nn.utils.clip_grad_value_ then clip_grad_norm_
    # (``graphc.passes.training.clipping``): each gradient clamped to [-clip_grad_value, clip_grad_value],
    # then all scaled by min(max_grad_norm / (total norm + 1e-6), 1), the norm of order grad_norm_type
    max_grad_norm: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    grad_norm_type: Union[float, Literal["inf"]] = 2.0
    clip_grad_value: Optional[float] = Field(None, gt=0, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _torch_range(cls, value, info):
        """torch.optim's range of each argument (``_AT_LEAST_0``, betas), and finite numbers only."""
        name, field = cls.__name__, info.field_name
        if field == "betas" and not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"betas must each lie in [0, 1), as torch.optim.{name} checks them, got {value!r}")
        if field in ("eps", "etas", "step_sizes") and isinstance(value, tuple):  # Adafactor's eps, Rprop's pairs
            return _each_finite(cls, field, value)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{field} must be a finite number for {name}, got {value!r}: graphc refuses inf and NaN, "
                             "which torch takes in places (its step then turns params to inf or NaN, or stops them)")
        if field in _AT_LEAST_0 and value < 0:
            raise ValueError(f"{field} must be >= 0, as torch.optim.{name} checks it, got {value!r}")
        return value

    @field_validator("grad_norm_type", mode="before")
    @classmethod
    def _norm_type(cls, value):
        if value in ("inf", math.inf):  # "inf" in JSON, which has no infinity
            return "inf"
        if value not in (1, 2):
            raise ValueError(f"grad_norm_type must be 2.0, 1.0 or 'inf' (float('inf')), got {value!r}")
        return float(value)

    @model_validator(mode="after")
    def _norm_type_needs_max_norm(self):
        if self.grad_norm_type != 2.0 and self.max_grad_norm is None:
            raise ValueError("grad_norm_type is the norm max_grad_norm clips: give max_grad_norm too")
        return self

    @model_serializer(mode="wrap")
    def _clipping_last_and_only_if_set(self, handler):
        # a spec without clipping (or dampening, amsgrad, maximize) dumps as before these fields
        # existed: the manifests of such artifacts still read in earlier graphc (its specs refuse
        # unknown fields)
        data = handler(self)
        later = {k: data.pop(k) for k in (*_OPTIONS, *_CLIPPING) if k in data}
        return {**data, **{k: v for k, v in later.items() if v != type(self).model_fields[k].default}}

    @property
    def state_slots(self) -> tuple[str, ...]:
        """Per-parameter state names of float32 and float64 params: ``<param>.<slot>`` (named after
        PyTorch's ``optimizer.state`` keys; Adam keeps its moments as sums, ``exp_sum`` and
        ``exp_sum_sq``, PyTorch's ``exp_avg`` over ``1 - beta1`` and ``exp_avg_sq`` over
        ``1 - beta2``; float16 and bfloat16 params keep ``exp_avg_sq``), as the update graphs
        define them."""
        from graphc.passes.training.optimizers import state_slots

        return state_slots(self.model_dump())


def _each_finite(cls, field: str, value: tuple) -> tuple:
    """A tuple argument's numbers (None left as it is) finite, and Adafactor's eps each >= 0."""
    name = cls.__name__
    for v in value:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{field} must hold finite numbers for {name}, got {value!r}")
        if field == "eps" and v is not None and v < 0:
            raise ValueError(f"eps must each be >= 0 (eps1 may be None), as torch.optim.{name} checks them, "
                             f"got {value!r}")
    return value


class SGD(_Spec):
    """``torch.optim.SGD``: ``g = -grad if maximize else grad; g = g + wd*p; buf = m*buf +
    (1 - dampening)*g`` (``buf = g`` at the first step); ``g = g + m*buf if nesterov else buf;
    p -= lr*g``."""

    kind: Literal["sgd"] = "sgd"
    lr: float = 1e-3  # torch.optim.SGD's default
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    dampening: float = 0.0
    maximize: bool = False  # ascend the loss: step along +grad
    # fnmatch patterns of param names updated with weight_decay 0 (a PyTorch param group of
    # their own), e.g. ("*.bias", "*norm*")
    no_decay: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self):
        if self.nesterov and (self.momentum <= 0 or self.dampening):
            raise ValueError("SGD(nesterov=True) needs momentum > 0 and dampening 0 (as in torch.optim.SGD), got "
                             f"momentum={self.momentum}, dampening={self.dampening}")
        return self


class Adam(_Spec):
    """``torch.optim.Adam``: L2 weight decay added to the gradient, bias correction from the step
    counter; ``amsgrad`` divides by the root of the running maximum of the second moment (state
    slot ``max_exp_sum_sq``, torch's ``max_exp_avg_sq`` over ``1 - beta2``; ``max_exp_avg_sq``
    for float16 and bfloat16 params); ``maximize`` steps along +grad."""

    kind: Literal["adam"] = "adam"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    no_decay: tuple[str, ...] = ()  # as SGD's
    amsgrad: bool = False
    maximize: bool = False


class AdamW(Adam):
    """``torch.optim.AdamW``: decoupled weight decay ``p *= 1 - lr*wd`` before the Adam step."""

    kind: Literal["adamw"] = "adamw"  # type: ignore[assignment]
    weight_decay: float = 0.01


class RMSprop(_Spec):
    """``torch.optim.RMSprop``: ``g += wd*p``; ``square_avg = alpha*square_avg + (1-alpha)*g*g``;
    ``avg = sqrt(square_avg - grad_avg**2) + eps`` with ``centered`` (``grad_avg`` the running
    mean of g), else ``sqrt(square_avg) + eps``; ``p -= lr*g/avg``, or with momentum
    ``momentum_buffer = momentum*momentum_buffer + g/avg; p -= lr*momentum_buffer``."""

    kind: Literal["rmsprop"] = "rmsprop"
    lr: float = 1e-2  # torch.optim.RMSprop's default
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False
    maximize: bool = False
    no_decay: tuple[str, ...] = ()  # as SGD's

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, value):
        if value < 0:
            raise ValueError(f"alpha must be >= 0, as torch.optim.{cls.__name__} checks it, got {value!r}")
        return value


class Adagrad(_Spec):
    """``torch.optim.Adagrad``: ``g += wd*p``; ``sum += g*g`` (``sum`` starts at
    ``initial_accumulator_value``); ``p -= lr / (1 + (t-1)*lr_decay) * g / (sqrt(sum) + eps)``
    at step ``t`` (1, 2, ...)."""

    kind: Literal["adagrad"] = "adagrad"
    lr: float = 1e-2
    lr_decay: float = 0.0
    weight_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10
    maximize: bool = False
    no_decay: tuple[str, ...] = ()


class Adamax(_Spec):
    """``torch.optim.Adamax``: ``g += wd*p``; ``exp_avg`` as Adam's first moment; ``exp_inf =
    max(b2*exp_inf, |g| + eps)``; ``p -= lr / (1 - b1^t) * exp_avg / exp_inf``."""

    kind: Literal["adamax"] = "adamax"
    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    maximize: bool = False
    no_decay: tuple[str, ...] = ()


class NAdam(_Spec):
    """``torch.optim.NAdam``: Adam's moments with Nesterov momentum whose coefficient ``mu_t =
    b1*(1 - 0.5*0.96^(t*momentum_decay))`` warms up; weight decay L2, or decoupled (AdamW's) with
    ``decoupled_weight_decay``. torch's per-param ``mu_product`` is computed from the step, or
    with a scheduled beta1 kept as one float64 state."""

    kind: Literal["nadam"] = "nadam"
    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum_decay: float = 4e-3
    decoupled_weight_decay: bool = False
    maximize: bool = False
    no_decay: tuple[str, ...] = ()


class RAdam(_Spec):
    """``torch.optim.RAdam``: Adam rectified, ``r_t * sqrt(1 - b2^t) / (sqrt(exp_avg_sq) + eps)``
    once the variance's length ``rho_t`` passes 5, plain momentum SGD (``lr / (1 - b1^t) *
    exp_avg``) before; weight decay L2, or decoupled with ``decoupled_weight_decay``."""

    kind: Literal["radam"] = "radam"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled_weight_decay: bool = False
    maximize: bool = False
    no_decay: tuple[str, ...] = ()


class Adadelta(_Spec):
    """``torch.optim.Adadelta``: ``g += wd*p``; ``square_avg = rho*square_avg + (1-rho)*g*g``;
    ``delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g``; ``acc_delta = rho*acc_delta +
    (1-rho)*delta*delta``; ``p -= lr*delta``."""

    kind: Literal["adadelta"] = "adadelta"
    lr: float = 1.0
    rho: float = 0.9
    eps: float = 1e-6
    weight_decay: float = 0.0
    maximize: bool = False
    no_decay: tuple[str, ...] = ()

    @field_validator("rho")
    @classmethod
    def _rho(cls, value):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"rho must lie in [0, 1], as torch.optim.Adadelta checks it, got {value!r}")
        return value


class Rprop(_Spec):
    """``torch.optim.Rprop``: each element's step size grows by ``etas[1]`` where the gradient kept
    its sign, shrinks by ``etas[0]`` where it flipped (that gradient then counts as 0), clamped to
    ``step_sizes``; ``p -= sign(g) * step_size``. Step sizes start at lr. No weight decay (torch's
    has none)."""

    kind: Literal["rprop"] = "rprop"
    lr: float = 1e-2
    etas: tuple[float, float] = (0.5, 1.2)
    step_sizes: tuple[float, float] = (1e-6, 50.0)
    maximize: bool = False

    @model_validator(mode="after")
    def _ranges(self):
        (minus, plus), (low, high) = self.etas, self.step_sizes
        if not 0.0 < minus < 1.0 < plus:
            raise ValueError(f"etas must be (etaminus, etaplus) with 0 < etaminus < 1 < etaplus, as torch.optim.Rprop "
                             f"checks them, got {self.etas!r}")
        if not 0.0 <= low <= high:
            raise ValueError(f"step_sizes must be (min, max) with 0 <= min <= max, got {self.step_sizes!r} (torch "
                             "takes any pair, and with min > max steps every element by max)")
        return self


class ASGD(_Spec):
    """``torch.optim.ASGD``: ``g += wd*p``; ``p = p*(1 - lambd*eta) - eta*g``; the average ``ax``
    of the params from step ``t0`` on (``ax = p`` before); ``eta = lr / (1 + lambd*lr*t)^alpha``."""

    kind: Literal["asgd"] = "asgd"
    lr: float = 1e-2
    lambd: float = 1e-4
    alpha: float = 0.75
    t0: float = 1e6
    weight_decay: float = 0.0
    maximize: bool = False
    no_decay: tuple[str, ...] = ()


class Adafactor(_Spec):
    """``torch.optim.Adafactor`` (T5's): the second moment of a param of two or more dims factored
    into row and column statistics (state ``row_var``, ``col_var``; ``variance`` for 1-D params),
    ``beta2 = 1 - t^beta2_decay``, the step ``max(eps2, rms(p)) * min(lr, 1/sqrt(t))`` with the
    update's rms clipped to ``d``; ``eps = (eps1, eps2)``, eps1 None the param dtype's epsilon;
    weight decay decoupled, ``p *= 1 - lr*wd``."""

    kind: Literal["adafactor"] = "adafactor"
    lr: float = 1e-2
    beta2_decay: float = -0.8
    eps: tuple[Optional[float], float] = (None, 1e-3)
    d: float = 1.0
    weight_decay: float = 0.0
    maximize: bool = False
    no_decay: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _ranges(self):
        if self.beta2_decay > 0:
            raise ValueError(f"beta2_decay must be <= 0, as torch.optim.Adafactor checks it, got {self.beta2_decay!r}")
        if self.d < 1:
            raise ValueError(f"d must be >= 1 (the update's clipping threshold), as torch.optim.Adafactor checks it, "
                             f"got {self.d!r}")
        return self


# every spec by its kind, in the order the docs and the CLI list them
_SPECS = (SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, NAdam, RAdam, Adadelta, Rprop, ASGD, Adafactor)
BY_KIND = {cls.model_fields["kind"].default: cls for cls in _SPECS}
OptimizerSpec = Annotated[Union[SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, NAdam, RAdam, Adadelta, Rprop, ASGD,
                                Adafactor], Field(discriminator="kind")]
_ADAPTER = TypeAdapter(OptimizerSpec)


def from_dict(data: dict) -> "OptimizerSpec":
    """The spec ``model_dump()`` wrote (``{"kind": "adam", ...}``) back as a spec object."""
    return _ADAPTER.validate_python(data)


__all__ = [*(cls.__name__ for cls in _SPECS), "OptimizerSpec", "from_dict"]


def __getattr__(name: str):
    # ``gc.optim.lr_scheduler``, as ``torch.optim.lr_scheduler``: the schedulers step a Trainer,
    # so they live with it in graphc.runtime (loaded on first use: specs stay light)
    if name in ("lr_scheduler", "swa_utils"):  # swa_utils: the averaging spec, SWALR and update_bn
        import importlib

        return importlib.import_module(f"graphc.runtime.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
