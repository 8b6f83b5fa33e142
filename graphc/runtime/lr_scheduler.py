"""`gc.optim.lr_scheduler`: torch.optim.lr_scheduler's schedulers, stepping a ``gc.Trainer``'s lr.

    trainer = gc.Trainer(arts)
    sched = gc.optim.lr_scheduler.StepLR(trainer, step_size=30, gamma=0.1)  # as torch takes the optimizer
    trainer.fit(loader, epochs=90, scheduler=sched)                           # sched.step() after each epoch

Each class takes torch 2.13's arguments and defaults with the Trainer in the optimizer's place and
computes the same Python floats in the same order (the chainable forms ``step()`` uses), so a
schedule's lrs equal torch's bit for bit. A Trainer has one param group: the scheduler's
``group`` (the Trainer's ``lr_group``, torch's ``optimizer.param_groups[0]``: ``lr`` as a Python
float, ``initial_lr``, OneCycleLR's ``max_lr`` and ``min_lr``, ``momentum`` or ``betas``) is what it
reads and writes; each write sets ``trainer.lr`` (the graph's lr, float32 or float64, rounded once
from it), and OneCycleLR's and CyclicLR's momentum ``trainer.momentum`` (``cyclic_lr``).
``state_dict()`` is JSON (a checkpoint saves it, ``Trainer.save_checkpoint``); LambdaLR's and
MultiplicativeLR's functions are not in it, as in torch (give them again on resume).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from typing import Any, Callable, Iterable, Optional, Sequence

from graphc.runtime.cyclic_lr import CyclicLR, OneCycleLR
from graphc.runtime.lr_base import LRScheduler, lr_group

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "SequentialLR", "PolynomialLR", "CosineAnnealingLR", "ChainedScheduler",
           "ReduceLROnPlateau", "CosineAnnealingWarmRestarts", "OneCycleLR", "CyclicLR", "lr_group"]


def _one_function(lr_lambda: Any, what: str) -> list[Callable[[int], float]]:
    functions = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda]
    if len(functions) != 1:
        raise ValueError(f"Expected 1 lr_lambdas (a Trainer has one param group), but got {len(functions)}")
    if not callable(functions[0]):
        raise TypeError(f"{what}: lr_lambda should be a function, but got {type(functions[0]).__name__}")
    return functions


class LambdaLR(LRScheduler):
    """lr = initial lr * lr_lambda(epoch). The function is not saved: on resume give it again."""

    def __init__(self, trainer: Any, lr_lambda: Callable[[int], float], last_epoch: int = -1) -> None:
        self.lr_lambdas = _one_function(lr_lambda, "LambdaLR")
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]


class MultiplicativeLR(LRScheduler):
    """lr *= lr_lambda(epoch) each step. The function is not saved: on resume give it again."""

    def __init__(self, trainer: Any, lr_lambda: Callable[[int], float], last_epoch: int = -1) -> None:
        self.lr_lambdas = _one_function(lr_lambda, "MultiplicativeLR")
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial:
            return [self.group["lr"]]
        return [self.group["lr"] * self.lr_lambdas[0](self.last_epoch)]


class StepLR(LRScheduler):
    """lr *= gamma every ``step_size`` steps."""

    def __init__(self, trainer: Any, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size, self.gamma = step_size, gamma
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [self.group["lr"]]
        return [self.group["lr"] * self.gamma]

    def _closed_form(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr *= gamma at each milestone (a milestone listed twice: gamma squared)."""

    def __init__(self, trainer: Any, milestones: Iterable[int], gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return [self.group["lr"]]
        return [self.group["lr"] * self.gamma ** self.milestones[self.last_epoch]]

    def _closed_form(self) -> list[float]:
        return [base * self.gamma ** bisect_right(sorted(self.milestones.elements()), self.last_epoch)
                for base in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:  # JSON keys are strings: the milestones as a list
        return {**super().state_dict(), "milestones": sorted(self.milestones.elements())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.milestones = Counter(state["milestones"])


class ConstantLR(LRScheduler):
    """lr = initial lr * factor for the first ``total_iters`` steps, then the initial lr."""

    def __init__(self, trainer: Any, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1) -> None:
        if factor > 1.0 or factor < 0:
            raise ValueError(f"ConstantLR: factor must be in [0, 1], got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [self.group["lr"] * self.factor]
        if self.last_epoch != self.total_iters:
            return [self.group["lr"]]
        return [self.group["lr"] * (1.0 / self.factor)]

    def _closed_form(self) -> list[float]:
        return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """lr goes linearly from initial lr * start_factor to * end_factor over ``total_iters`` steps."""

    def __init__(self, trainer: Any, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        lr = self.group["lr"]
        if self.last_epoch == 0:
            return [lr * self.start_factor]
        if self._is_initial or self.last_epoch > self.total_iters:
            return [lr]
        delta = self.end_factor - self.start_factor
        return [lr * (1.0 + delta / (self.total_iters * self.start_factor + (self.last_epoch - 1) * delta))]

    def _closed_form(self) -> list[float]:
        return [base * (self.start_factor + (self.end_factor - self.start_factor)
                        * min(self.total_iters, self.last_epoch) / self.total_iters) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr *= gamma each step."""

    def __init__(self, trainer: Any, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        return [self.group["lr"]] if self._is_initial else [self.group["lr"] * self.gamma]

    def _closed_form(self) -> list[float]:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """lr = initial lr * (1 - step / total_iters) ** power, then constant."""

    def __init__(self, trainer: Any, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        self.total_iters, self.power = total_iters, power
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial or self.last_epoch > self.total_iters:
            return [self.group["lr"]]
        decay = ((1.0 - self.last_epoch / self.total_iters)
                 / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [self.group["lr"] * decay]

    def _closed_form(self) -> list[float]:
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine from the initial lr down to ``eta_min`` over ``T_max`` steps (and back up after)."""

    def __init__(self, trainer: Any, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        lr, base, t, T, low = self.group["lr"], self.base_lrs[0], self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return [lr]
        if self._step_count == 1 and t > 0:
            return [low + (base - low) * (1 + math.cos(t * math.pi / T)) / 2]
        if (t - 1 - T) % (2 * T) == 0:
            return [lr + (base - low) * (1 - math.cos(math.pi / T)) / 2]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (lr - low) + low]

    def _closed_form(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine from the initial lr to ``eta_min`` over ``T_0`` steps, restarting; each period
    ``T_mult`` times the last."""

    def __init__(self, trainer: Any, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"CosineAnnealingWarmRestarts: T_0 must be a positive integer, got {T_0!r}")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"CosineAnnealingWarmRestarts: T_mult must be an integer >= 1, got {T_mult!r}")
        self.T_0, self.T_i, self.T_mult, self.eta_min, self.T_cur = T_0, T_0, T_mult, eta_min, last_epoch
        super().__init__(trainer, last_epoch)

    def get_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self) -> None:
        self._step_count += 1
        if self.last_epoch < 0:
            epoch = 0
            self.T_i, self.T_cur = self.T_0, 0
        else:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur, self.T_i = self.T_cur % self.T_i, self.T_i * self.T_mult
        self.last_epoch = epoch
        self._set_lr(self.get_lr()[0])
        self._last_lr = [self.group["lr"]]


def _check_members(what: str, trainer: Any, schedulers: Sequence[LRScheduler]) -> None:
    if len(schedulers) < 1:
        raise ValueError(f"{what} expects at least one scheduler, got none")
    for i, s in enumerate(schedulers):
        if not isinstance(s, LRScheduler):
            raise TypeError(f"{what}: schedulers[{i}] is a {type(s).__name__}, not a gc.optim.lr_scheduler scheduler")
        if isinstance(s, ReduceLROnPlateau):
            raise ValueError(f"{what} does not take ReduceLROnPlateau (its step needs the metric), "
                             f"got one at index {i}")
        if s.trainer is not trainer:
            raise ValueError(f"{what}: schedulers[{i}] ({type(s).__name__}) steps another Trainer")


class _Composite(LRScheduler):
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "_schedulers": [s.state_dict() for s in self._schedulers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for s, inner in zip(self._schedulers, state["_schedulers"]):
            s.load_state_dict(inner)


class SequentialLR(_Composite):
    """``schedulers[i]`` runs from ``milestones[i-1]`` on (each restarted at its milestone)."""

    def __init__(self, trainer: Any, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1) -> None:
        _check_members("SequentialLR", trainer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR expects one milestone fewer than schedulers, got {len(schedulers)} "
                             f"schedulers and {len(milestones)} milestones")
        self.trainer, self.group = trainer, lr_group(trainer)
        self._schedulers, self._milestones = list(schedulers), list(milestones)
        self.last_epoch = last_epoch + 1
        self._set_lr(self.group["initial_lr"])
        self._undo(self)
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = self._schedulers[idx].get_last_lr()

    def _undo(self, scheduler: LRScheduler) -> None:
        if isinstance(scheduler, _Composite):
            for s in scheduler._schedulers:
                self._undo(s)
        else:
            scheduler.last_epoch -= 1

    def steps_left(self) -> Optional[int]:
        """The steps until a member with an end (OneCycleLR) would pass it within its span: the
        one running now from where it is, a later one from its restart at its milestone."""
        now, starts, bounds = self.last_epoch, [0, *self._milestones], []
        for i, s in enumerate(self._schedulers):
            stop = self._milestones[i] if i < len(self._milestones) else math.inf
            if now >= stop:
                continue
            end = s._end()
            left = s.steps_left() if starts[i] <= now else None if end is None else starts[i] + end - now
            if left is not None and now + left + 1 < stop:
                bounds.append(left)
        return min(bounds, default=None)

    def step(self) -> None:
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_Composite):
    """Steps every scheduler in turn each step (their factors compound)."""

    def __init__(self, schedulers: Sequence[LRScheduler], trainer: Any = None) -> None:
        trainer = trainer if trainer is not None else (schedulers[0].trainer if schedulers else None)
        _check_members("ChainedScheduler", trainer, schedulers)
        self.trainer, self.group = trainer, lr_group(trainer)
        self._schedulers = list(schedulers)
        self._last_lr = [self.group["lr"]]

    def steps_left(self) -> Optional[int]:
        return min((n for n in (s.steps_left() for s in self._schedulers) if n is not None), default=None)

    def step(self) -> None:
        for s in self._schedulers:
            s.step()
        self._last_lr = [self.group["lr"]]


class ReduceLROnPlateau(LRScheduler):
    """lr *= factor once ``metric`` (``step(metric)``) has not improved for ``patience`` steps."""

    def __init__(self, trainer: Any, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr: float = 0,
                 eps: float = 1e-8) -> None:
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1.0, got {factor}")
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.trainer, self.group = trainer, lr_group(trainer)
        min_lrs = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr]
        if len(min_lrs) != 1:
            raise ValueError(f"ReduceLROnPlateau: expected 1 min_lr (a Trainer has one param group), got {len(min_lrs)}")
        self.factor, self.min_lrs, self.patience, self.cooldown, self.eps = factor, min_lrs, patience, cooldown, eps
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode
        self.last_epoch = 0
        self._last_lr = [self.group["lr"]]
        self.best, self.cooldown_counter, self.num_bad_epochs = (math.inf if mode == "min" else -math.inf), 0, 0

    def _is_better(self, a: float, best: float) -> bool:
        if self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold) if self.mode == "min" else a > best * (self.threshold + 1.0)
        return a < best - self.threshold if self.mode == "min" else a > best + self.threshold

    def step(self, metrics: Any = None) -> None:  # type: ignore[override]
        if metrics is None:
            raise TypeError("ReduceLROnPlateau.step(metrics) needs the metric to watch (e.g. the eval loss)")
        current = float(metrics)
        self.last_epoch += 1
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            old = float(self.group["lr"])
            new = max(old * self.factor, self.min_lrs[0])
            if old - new > self.eps:
                self._set_lr(new)
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [self.group["lr"]]
