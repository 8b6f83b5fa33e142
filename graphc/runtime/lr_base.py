"""The base of ``gc.optim.lr_scheduler``'s schedulers (``LRScheduler``) and the Trainer's one
param group they read and write (``lr_group``, torch's ``optimizer.param_groups[0]``)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from graphc.runtime import momentum

__all__ = ["LRScheduler", "lr_group", "check_covers"]


def lr_group(trainer: Any) -> dict[str, Any]:
    """``trainer``'s one param group as torch's schedulers see it: ``lr`` is the Python float
    last given to ``trainer.lr`` (else the optimizer spec's, else the graph's value); ``momentum``
    (SGD, RMSprop) or ``betas`` (the Adam family) as ``trainer.momentum`` last set them (else
    the spec's)."""
    group = trainer.lr_group
    if "lr" not in group:
        now = trainer.lr
        spec = trainer.manifest.optimizer.get("lr")
        exact = spec is not None and now in (float(spec), float(np.float32(spec)))
        group["lr"] = float(spec) if exact else now  # SGD(0.1)'s 0.1, not float32's 0.10000000149
    momentum.fill(group, trainer)
    return group


class LRScheduler:
    """torch's ``LRScheduler`` base: ``step()``, ``get_last_lr()``, ``state_dict()``."""

    _is_initial = False
    _NOT_STATE = ("trainer", "group", "lr_lambdas", "_schedulers", "recipe")  # recipe: graphc.cli.schedules

    def __init__(self, trainer: Any, last_epoch: int = -1) -> None:
        if not hasattr(trainer, "lr_group"):
            raise TypeError(f"{type(self).__name__} takes a gc.Trainer (as torch's takes the optimizer), "
                            f"got {type(trainer).__name__}")
        self.trainer = trainer
        self.group = lr_group(trainer)
        if last_epoch == -1:
            self.group.setdefault("initial_lr", self.group["lr"])
        elif "initial_lr" not in self.group:
            raise KeyError(f"{type(self).__name__}(last_epoch={last_epoch}): the trainer's lr group has no "
                           "'initial_lr'; resume a scheduler with load_state_dict, not last_epoch")
        self.base_lrs = [self.group["initial_lr"]]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def _set_lr(self, lr: float) -> None:
        # OneCycleLR's linear anneal, stepped total_steps times (as fit does after the last step),
        # ends just below 0 (-4e-4 at max_lr 0.4), in torch too: the group keeps it, the graph gets 0
        self.trainer.lr = max(lr, 0.0)
        self.group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        """Everything but the Trainer and functions, JSON-serializable."""
        return {k: v for k, v in self.__dict__.items() if k not in self._NOT_STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k not in self._NOT_STATE})

    def get_last_lr(self) -> list[float]:
        return self._last_lr

    def _end(self) -> Optional[int]:
        """The ``last_epoch`` past which ``step()`` raises (OneCycleLR's ``total_steps``); None: no end."""
        return None

    def steps_left(self) -> Optional[int]:
        """How many more ``step()`` calls the schedule takes before one raises (OneCycleLR's past
        its ``total_steps``, as torch's); None where it has no end. ``Trainer.fit`` checks it
        covers the run before the first step."""
        end = self._end()
        return None if end is None else end - self.last_epoch

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def step(self) -> None:
        self._step_count += 1
        self._update_lr()

    def _update_lr(self, epoch: Optional[int] = None) -> None:
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:  # SequentialLR's restart of a scheduler at its milestone: torch's closed form
            self.last_epoch = epoch
            values = self._closed_form() if hasattr(self, "_closed_form") else self.get_lr()
        self._set_lr(values[0])
        self._last_lr = [self.group["lr"]]

    def __repr__(self) -> str:
        return f"<gc.optim.lr_scheduler.{type(self).__name__} last_epoch={self.last_epoch} lr={self.group['lr']!r}>"


def check_covers(scheduler: LRScheduler, interval: str, epochs: int, epoch: int, batch: int, batches: int) -> None:
    """``ValueError`` unless ``scheduler`` takes the steps a fit to epoch ``epochs`` gives it from
    epoch ``epoch`` (0-based), batch ``batch`` on, ``batches`` a loader epoch: one per epoch or,
    with ``interval`` "step", one per batch (every batch counted); a schedule with an end
    (``steps_left``) would otherwise raise mid-run, as torch's does at the failing step."""
    from graphc.runtime.progress import plural

    left = scheduler.steps_left()
    per_step = interval == "step"
    need = (epochs - epoch) * (batches if per_step else 1) - (batch if per_step else 0)
    if left is None or need <= left:
        return
    how = f"after each train step: {batches} batches an epoch, from epoch {epoch + 1} batch {batch + 1}" \
        if per_step else f"after each epoch, from epoch {epoch + 1}"
    reach = epoch + ((left + batch) // batches if per_step else left)
    fewer = f"fit to epoch {reach} at most" if reach > epoch else f"it cannot finish epoch {epoch + 1}"
    raise ValueError(f"fit(epochs={epochs}) would step the scheduler {type(scheduler).__name__} {need} more times "
                     f"({how}), but its schedule ends after {left} more (OneCycleLR raises past its total_steps); "
                     f"{fewer}, or start over with a schedule {plural(need - left, 'step')} longer (OneCycleLR's "
                     f"total_steps: the run's {'epochs x batches per epoch' if per_step else 'epochs'})")
