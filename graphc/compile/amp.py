"""Loss scaling for mixed-precision training: ``gc.amp.GradScaler``, ``torch.amp.GradScaler``'s
arguments, defaults and update rule, as an option of ``gc.training.generate``.

    arts = gc.training.generate(model, loss, gc.optim.AdamW(1e-3), loss_scale=gc.amp.GradScaler())
    trainer = gc.Trainer(arts)
    trainer.step(batch); trainer.loss_scale      # torch's scaler.get_scale()

train_step then does what ``scaler.scale(loss).backward(); scaler.unscale_(opt); [clip];
scaler.step(opt); scaler.update()`` does (``graphc.passes.training.loss_scaling``). A float
``loss_scale`` is a static scale: the same scaling and skipped non-finite steps, a scale that
never changes.
"""

from __future__ import annotations

import math
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["GradScaler", "loss_scale_json"]


class GradScaler(BaseModel):
    """Dynamic loss scaling as ``torch.amp.GradScaler``: the loss is multiplied by ``scale``
    before the backward and the gradients by ``1/scale`` after; a step whose gradients hold an
    inf or NaN is skipped (no param or optimizer state changes, Adam's step count included) and
    ``scale *= backoff_factor``; after ``growth_interval`` steps in a row that were not,
    ``scale *= growth_factor``. ``enabled=False``: no loss scaling (the graphs as without)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: Literal["dynamic"] = "dynamic"
    init_scale: float = Field(2.0 ** 16, gt=0)
    growth_factor: float = Field(2.0, gt=1.0)  # torch asserts growth_factor > 1 and backoff_factor < 1
    backoff_factor: float = Field(0.5, gt=0.0, lt=1.0)
    growth_interval: int = Field(2000, gt=0)
    enabled: bool = True

    @model_validator(mode="after")
    def _fits_float32(self):
        # the scale is a float32 tensor, as torch's
        if not math.isfinite(float(_float32(self.init_scale))) or _float32(self.init_scale) == 0:
            raise ValueError(f"init_scale {self.init_scale} is not a finite, non-zero float32")
        return self


def _float32(value: float):
    import numpy as np

    with np.errstate(over="ignore", under="ignore"):
        return np.float32(value)


def loss_scale_json(value: Union[GradScaler, float, dict, None]) -> Optional[dict]:
    """``generate``'s ``loss_scale`` as the manifest keeps it: None (no scaling, also a disabled
    scaler), ``{"kind": "dynamic", ...}`` (a GradScaler's fields) or ``{"kind": "static",
    "init_scale": s}``; a bad value is a ValueError or TypeError naming ``loss_scale``."""
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("kind") == "static":
            return loss_scale_json(value.get("init_scale"))
        value = GradScaler(**value)
    if isinstance(value, GradScaler):
        return value.model_dump(mode="json", exclude={"enabled"}) if value.enabled else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"loss_scale must be a gc.amp.GradScaler or a float (a static scale), "
                        f"got {type(value).__name__}")
    scale = _float32(value)
    if not math.isfinite(float(value)) or not math.isfinite(float(scale)) or scale <= 0:
        raise ValueError(f"loss_scale: a static scale must be a positive finite float32, got {value!r}")
    return {"kind": "static", "init_scale": float(value)}
