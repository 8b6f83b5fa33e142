"""torch's process-wide switches that training scripts set at the top: ``get_default_dtype``/``set_default_dtype``
(float32, the one graphc has), ``compile`` (the model as it is: graphc is the compiler), ``use_deterministic_algorithms``
and ``are_deterministic_algorithms_enabled`` (the flag kept, no kernel changed). Those graphc refuses:
``graphc.dsl.refusals``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphc.model.dtypes import DType, as_dtype, float32

_DETERMINISTIC = {"mode": False, "warn_only": False}


def get_default_dtype() -> DType:
    """``torch.get_default_dtype()``: ``gc.float32``, the dtype of Python floats and of the float factories."""
    return float32


def set_default_dtype(d: Any) -> None:
    """``torch.set_default_dtype(d)``: float32 is accepted (it is the default); another dtype is refused: graphc's
    factories and Python floats are float32 by their own rules, which no setting changes."""
    dtype = as_dtype(d)
    if dtype != float32:
        raise TypeError(f"gc.set_default_dtype({dtype}): graphc's default dtype is float32 and cannot be changed "
                        f"(the factories and Python floats are float32 by their own rules); give the dtype where the "
                        f"values are made instead: dtype=gc.{dtype} to the factories, {dtype} arrays or "
                        f"gc.spec('{dtype}', ...) as the captured inputs, module.to(gc.{dtype}) for the parameters")


def compile(model: Callable | None = None, **options: Any) -> Any:  # noqa: A001 - torch's name
    """``torch.compile(model, **options)``: ``model`` returned unchanged, any options ignored (graphc compiles at
    ``gc.capture`` and ``gc.Session``); with no model, a decorator that returns what it decorates."""
    if model is None:
        return lambda fn: fn
    if not callable(model):
        raise TypeError(f"gc.compile: model must be a Module or function, got {type(model).__name__}")
    return model


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms(mode, warn_only=False)``: kept for
    ``are_deterministic_algorithms_enabled``; it switches no kernel and makes no op raise."""
    for name, value in (("mode", mode), ("warn_only", warn_only)):
        if not isinstance(value, bool):
            raise TypeError(f"gc.use_deterministic_algorithms: {name} must be a bool, got {type(value).__name__} "
                            f"{value!r}")
    _DETERMINISTIC.update(mode=mode, warn_only=warn_only)


def are_deterministic_algorithms_enabled() -> bool:
    """``torch.are_deterministic_algorithms_enabled()``: the last ``use_deterministic_algorithms`` mode, False
    before any."""
    return _DETERMINISTIC["mode"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """``torch.is_deterministic_algorithms_warn_only_enabled()``: the last ``use_deterministic_algorithms``
    ``warn_only``, False before any."""
    return _DETERMINISTIC["warn_only"]


__all__ = ["are_deterministic_algorithms_enabled", "compile", "get_default_dtype",
           "is_deterministic_algorithms_warn_only_enabled", "set_default_dtype", "use_deterministic_algorithms"]
