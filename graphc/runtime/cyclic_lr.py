"""torch's cyclical schedules, OneCycleLR and CyclicLR, on a ``gc.Trainer``: the lr, and with
``cycle_momentum=True`` (torch's default) the momentum against it, SGD's and RMSprop's
``momentum`` or the Adam family's beta1, as torch writes ``group["momentum"]`` or
``group["betas"]``. Cycling the momentum needs training graphs that take it as an input
(``gc.training.generate(..., scheduled=["momentum"])``, ``Trainer.momentum``); on others
the scheduler says so."""

from __future__ import annotations

import math
import types
from typing import Any, Callable, Optional

from graphc.passes.training.scheduled import momentum_scheduled
from graphc.runtime import momentum
from graphc.runtime.lr_base import LRScheduler, lr_group

__all__ = ["OneCycleLR", "CyclicLR"]


def _start_momentum(scheduler: str, trainer: Any, group: dict, base: float, peak: float, last_epoch: int) -> None:
    """``cycle_momentum=True``'s set-up, as torch's: refused where the Trainer cannot set the
    momentum; on a fresh start the group gets ``max_momentum`` and ``base_momentum`` and the
    momentum starts at ``max_momentum``."""
    optimizer = trainer.manifest.optimizer
    for value in (base, peak):
        momentum.checked(optimizer, momentum_scheduled(optimizer), value,
                         f"{scheduler}(cycle_momentum=True)")
    if last_epoch == -1:
        trainer.momentum = peak
        group["max_momentum"], group["base_momentum"] = peak, base


class OneCycleLR(LRScheduler):
    """The 1cycle policy: from max_lr / div_factor up to ``max_lr`` over ``pct_start`` of
    ``total_steps``, then down to that / final_div_factor (``three_phase``: down to the start
    first); with ``cycle_momentum`` the momentum goes the other way, ``max_momentum`` down to
    ``base_momentum`` and back."""

    def __init__(self, trainer: Any, max_lr: float, total_steps: Optional[int] = None, epochs: Optional[int] = None,
                 steps_per_epoch: Optional[int] = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum: float = 0.85, max_momentum: float = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"OneCycleLR: total_steps must be a positive integer, got {total_steps!r}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
                if not isinstance(value, int) or value <= 0:
                    raise ValueError(f"OneCycleLR: {name} must be a positive integer, got {value!r}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        n = self.total_steps
        up = float(pct_start * n) - 1
        # each phase: its end step, lr from, to, momentum from, to (group keys), as torch's
        self._schedule_phases = (
            [[up, "initial_lr", "max_lr", "max_momentum", "base_momentum"],
             [float(2 * pct_start * n) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"],
             [n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"]] if three_phase else
            [[up, "initial_lr", "max_lr", "max_momentum", "base_momentum"],
             [n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"]])
        self._anneal_func_type, self.cycle_momentum = anneal_strategy, cycle_momentum
        group = lr_group(trainer)
        if last_epoch == -1:
            group["initial_lr"] = max_lr / div_factor
            group["max_lr"] = max_lr
            group["min_lr"] = group["initial_lr"] / final_div_factor
        if cycle_momentum:
            _start_momentum("OneCycleLR", trainer, group, base_momentum, max_momentum, last_epoch)
        super().__init__(trainer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _end(self) -> Optional[int]:
        return self.total_steps

    def get_lr(self) -> list[float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step} times; total_steps is {self.total_steps}")
        start = 0.0
        for i, (end, low, high, m_from, m_to) in enumerate(self._schedule_phases):
            if step <= end or i == len(self._schedule_phases) - 1:
                pct = (step - start) / (end - start)
                if self.cycle_momentum:  # linear, stepped total_steps times: past max_momentum, 1 too, as torch's
                    self.trainer._set_momentum(self._anneal(self.group[m_from], self.group[m_to], pct),
                                               below_one=False)
                return [self._anneal(self.group[low], self.group[high], pct)]
            start = end
        raise AssertionError("unreachable: the last phase always matches")


class CyclicLR(LRScheduler):
    """The lr cycles between ``base_lr`` and ``max_lr``, ``step_size_up`` steps up and
    ``step_size_down`` (default the same) down, the cycle's height scaled by ``mode``
    (``triangular``: 1, ``triangular2``: halved each cycle, ``exp_range``: ``gamma`` to the
    step) or ``scale_fn`` (of the cycle or, ``scale_mode="iterations"``, the step); with
    ``cycle_momentum`` the momentum goes the other way between ``max_momentum`` and
    ``base_momentum``. ``state_dict()`` keeps a callable object's own attributes (its
    ``__dict__``, under ``_scale_fn_custom``; None for a function or lambda), as torch's does:
    give ``scale_fn`` again on resume, and ``load_state_dict`` restores them into it."""

    _NOT_STATE = (*LRScheduler._NOT_STATE, "_scale_fn_custom")

    def __init__(self, trainer: Any, base_lr: float, max_lr: float, step_size_up: int = 2000,
                 step_size_down: Optional[int] = None, mode: str = "triangular", gamma: float = 1.0,
                 scale_fn: Optional[Callable[[float], float]] = None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum: float = 0.8, max_momentum: float = 0.9,
                 last_epoch: int = -1) -> None:
        for name, value in (("base_lr", base_lr), ("max_lr", max_lr)):
            if isinstance(value, (list, tuple)):
                if len(value) != 1:
                    raise ValueError(f"CyclicLR: expected 1 {name} (a Trainer has one param group), got {len(value)}")
        base_lr, max_lr = (v[0] if isinstance(v, (list, tuple)) else v for v in (base_lr, max_lr))
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError(f"CyclicLR: mode must be 'triangular', 'triangular2' or 'exp_range' when no scale_fn "
                             f"is given, got {mode!r}")
        if scale_fn is not None and not callable(scale_fn):
            raise TypeError(f"CyclicLR: scale_fn should be a function, got {type(scale_fn).__name__}")
        group = lr_group(trainer)
        if last_epoch == -1:
            trainer.lr = base_lr
        self.max_lrs = [max_lr]
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        self.mode, self.gamma, self.scale_mode = mode, gamma, scale_mode
        self._scale_fn_custom = scale_fn
        self._init_scale_mode()
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            _start_momentum("CyclicLR", trainer, group, base_momentum, max_momentum, last_epoch)
            self.base_momentums, self.max_momentums = [base_momentum], [max_momentum]
        super().__init__(trainer, last_epoch)
        self.base_lrs = [base_lr]

    def _init_scale_mode(self) -> None:
        if self._scale_fn_custom is None:
            self.scale_mode = "iterations" if self.mode == "exp_range" else "cycle"

    def scale_fn(self, x: float) -> float:
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma ** x

    def get_lr(self) -> list[float]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        at = cycle if self.scale_mode == "cycle" else self.last_epoch
        lrs = [base + (peak - base) * factor * self.scale_fn(at) for base, peak in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:  # scale_fn called again, as torch's (a callable object may count its calls)
            self.trainer.momentum = self.max_momentums[0] - (self.max_momentums[0] - self.base_momentums[0]) \
                * factor * self.scale_fn(at)
        return lrs

    def state_dict(self) -> dict[str, Any]:
        fn = self._scale_fn_custom
        return {**super().state_dict(),
                "_scale_fn_custom": None if fn is None or isinstance(fn, types.FunctionType) else dict(fn.__dict__)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        attributes = state.get("_scale_fn_custom")
        if attributes is not None and self._scale_fn_custom is None:
            raise ValueError(f"CyclicLR.load_state_dict: the state holds a scale_fn object's attributes "
                             f"({sorted(attributes)}); give the scheduler that scale_fn to restore them into")
        super().load_state_dict(state)
        if attributes is not None:
            self._scale_fn_custom.__dict__.update(attributes)
        self._init_scale_mode()
