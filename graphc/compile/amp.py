"""Mixed-precision training options of ``gc.training.generate``: ``autocast`` (the low dtype an
imported model's matrix products and convolutions run in) and loss scaling, ``gc.amp.GradScaler``,
``torch.amp.GradScaler``'s arguments, defaults and update rule.

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
import warnings
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["AUTOCAST_DTYPES", "GradScaler", "autocast_dtype", "loss_scale_json"]

AUTOCAST_DTYPES = ("bfloat16", "float16")


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


def autocast_dtype(value, loss_scale: Optional[dict]) -> Optional[str]:
    """``generate``'s ``autocast`` as a dtype name: None, "bfloat16" or "float16" (torch's dtypes
    too); anything else is a ValueError naming ``autocast``. float16 without loss scaling is taken,
    as torch takes it, with a warning: float16 gradients below 6e-8 become 0 (bfloat16 has float32's
    range and needs none)."""
    from graphc.model.dtypes import torch_dtype_name

    if value is None:
        return None
    name = torch_dtype_name(value)
    if name not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast must be one of {', '.join(map(repr, AUTOCAST_DTYPES))} or None, got {value!r}")
    if name == "float16" and loss_scale is None:
        warnings.warn("autocast='float16' without loss_scale: float16 gradients smaller than 6e-8 become 0; "
                      "torch's recipe pairs float16 autocast with a GradScaler "
                      "(loss_scale=gc.amp.GradScaler())", UserWarning, stacklevel=3)
    return name
