"""`gc.optim.swa_utils`: torch.optim.swa_utils' weight averaging (EMA, SWA) for a ``gc.Trainer``.

    ema = gc.optim.swa_utils.AveragedModel(model, multi_avg_fn=gc.optim.swa_utils.get_ema_multi_avg_fn(0.999))
    arts = gc.training.generate(gc.capture(model, x=...), loss, gc.optim.SGD(0.1), averaged=ema)
    trainer = gc.Trainer(arts)
    trainer.fit(loader, epochs=10)                  # each step also updates the averaged copy
    trainer.evaluate(batch, averaged=True)          # evaluate/predict/export the averaged weights
    trainer.export_inference("ema.onnx", averaged=True)

torch calls ``update_parameters(model)`` after ``optimizer.step()``; graphc does it inside train_step
(``passes/training/weight_averaging.py``), the copy held as train_step state (``averaged.<name>``,
``averaged.n_averaged``: in ``state_dict()`` and checkpoints). The averaging functions are the four
torch names; the update runs after train_step calls ``t > start`` with ``(t - start) % every == 0``
(a step loss scaling skipped counts, as in torch's loop), torch's ``if step > swa_start:
swa_model.update_parameters(model)``. ``SWALR`` is a
``gc.optim.lr_scheduler`` scheduler; ``update_bn(loader, trainer)`` recomputes the averaged copy's
BatchNorm statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Optional

from graphc.runtime.lr_base import LRScheduler, lr_group

__all__ = ["AveragedModel", "AveragingFn", "SWALR", "get_ema_avg_fn", "get_ema_multi_avg_fn", "get_swa_avg_fn",
           "get_swa_multi_avg_fn", "update_bn"]


@dataclass(frozen=True)
class AveragingFn:
    """One of torch's averaging functions, by name (``weight_averaging.FNS``), as train_step computes it."""

    fn: str
    decay: Optional[float] = None

    @property
    def multi(self) -> bool:
        return self.fn.endswith("_multi")


def _decay(decay: float) -> float:
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"Invalid decay value {decay} provided. Please provide a value in [0,1] range.")
    return float(decay)


def get_ema_multi_avg_fn(decay: float = 0.999) -> AveragingFn:
    """EMA over all params at once: ``lerp(avg, p, 1 - decay)`` (torch's ``_foreach_lerp_``)."""
    return AveragingFn("ema_multi", _decay(decay))


def get_ema_avg_fn(decay: float = 0.999) -> AveragingFn:
    """EMA param by param: ``decay*avg + (1 - decay)*p``."""
    return AveragingFn("ema", _decay(decay))


def get_swa_multi_avg_fn() -> AveragingFn:
    """The running mean over all params at once: ``lerp(avg, p, 1/(n + 1))``."""
    return AveragingFn("swa_multi")


def get_swa_avg_fn() -> AveragingFn:
    """The running mean param by param: ``avg + (p - avg)/(n + 1)`` (torch's default on the CPU)."""
    return AveragingFn("swa")


class AveragedModel:
    """torch's ``AveragedModel(model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False)``
    as the spec ``gc.training.generate(..., averaged=)`` takes. ``model`` and ``device`` are taken for
    torch's signature: the averaged copy is of the model generate trains, held where the Trainer's
    state is. ``start``, ``every``: the first update after step ``start + every``, then every
    ``every`` steps (torch users' ``if step > swa_start``). Neither fn: SWA (``get_swa_avg_fn``)."""

    def __init__(self, model: Any = None, device: Any = None, avg_fn: Optional[AveragingFn] = None,
                 multi_avg_fn: Optional[AveragingFn] = None, use_buffers: bool = False, *, start: int = 0,
                 every: int = 1) -> None:
        if avg_fn is not None and multi_avg_fn is not None:
            raise ValueError("Only one of avg_fn and multi_avg_fn should be provided")
        for name, given, multi in (("avg_fn", avg_fn, False), ("multi_avg_fn", multi_avg_fn, True)):
            if given is not None and not (isinstance(given, AveragingFn) and given.multi == multi):
                kinds = "get_ema_multi_avg_fn(decay), get_swa_multi_avg_fn()" if multi else \
                    "get_ema_avg_fn(decay), get_swa_avg_fn()"
                raise TypeError(f"AveragedModel({name}=...): train_step computes the average itself, so it takes "
                                f"gc.optim.swa_utils.{kinds}, got {given!r}")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ValueError(f"AveragedModel(start=...) must be an int >= 0 (steps before the first update), got {start!r}")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"AveragedModel(every=...) must be an int >= 1 (steps between updates), got {every!r}")
        self.fn = avg_fn or multi_avg_fn or get_swa_avg_fn()
        self.use_buffers, self.start, self.every = bool(use_buffers), start, every

    def spec(self) -> dict:
        """The spec as JSON (``Manifest.averaging`` less its names)."""
        return {"fn": self.fn.fn, "decay": self.fn.decay, "use_buffers": self.use_buffers, "start": self.start,
                "every": self.every}

    def __repr__(self) -> str:
        return (f"AveragedModel(fn={self.fn.fn!r}, decay={self.fn.decay}, use_buffers={self.use_buffers}, "
                f"start={self.start}, every={self.every})")


class SWALR(LRScheduler):
    """torch's ``SWALR(optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos", last_epoch=-1)``,
    the Trainer in the optimizer's place: anneals the lr to ``swa_lr`` over ``anneal_epochs`` steps."""

    def __init__(self, trainer: Any, swa_lr: float, anneal_epochs: int = 10,
                 anneal_strategy: Literal["cos", "linear"] = "cos", last_epoch: int = -1) -> None:
        lrs = list(swa_lr) if isinstance(swa_lr, (list, tuple)) else [swa_lr]
        if len(lrs) != 1:
            raise ValueError(f"expected 1 values for swa_lr (a Trainer has one param group), got {len(lrs)}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs, self._anneal_strategy = anneal_epochs, anneal_strategy
        if hasattr(trainer, "lr_group"):  # else the base refuses it
            lr_group(trainer)["swa_lr"] = float(lrs[0])
        super().__init__(trainer, last_epoch)

    def _anneal(self, t: float) -> float:
        return t if self._anneal_strategy == "linear" else (1 - math.cos(math.pi * t)) / 2

    def get_lr(self) -> list[float]:
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        swa_lr, lr = self.group["swa_lr"], self.group["lr"]
        prev_alpha = self._anneal(max(0, min(1, (step - 1) / max(1, self.anneal_epochs))))
        prev_lr = swa_lr if prev_alpha == 1 else (lr - prev_alpha * swa_lr) / (1 - prev_alpha)
        alpha = self._anneal(max(0, min(1, step / max(1, self.anneal_epochs))))
        return [swa_lr * alpha + prev_lr * (1 - alpha)]


def update_bn(loader: Iterable[Any], model: Any, device: Any = None) -> None:
    """torch's ``update_bn(loader, model)``: the averaged copy's BatchNorm running statistics of
    ``model`` (a Trainer whose artifacts average, ``AveragedModel``) recomputed over one pass of
    ``loader`` with the averaged weights: each the cumulative average (``momentum=None``) of the
    batches' means and unbiased variances. A batch is a dict of the data inputs (or a list/tuple
    whose first item is one, as torch's). Dropout runs in inference mode (torch's in training mode,
    its randomness not reproducible). ``device`` is taken for torch's signature."""
    from graphc.runtime.weight_averaging import recount_batchnorms

    recount_batchnorms(model, (batch[0] if isinstance(batch, (list, tuple)) else batch for batch in loader))
