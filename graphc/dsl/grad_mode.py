"""torch's grad-mode switches over ``gc.no_grad``'s machinery: ``set_grad_enabled`` (a call, or a
``with`` block that restores the mode on exit), ``enable_grad``, ``is_grad_enabled`` and
``inference_mode`` (``no_grad`` for a graph: there is no version counter to skip) with
``is_inference_mode_enabled``; ``no_grad`` too, as ``torch.autograd.grad_mode`` holds it."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from graphc.dsl.builder import grad_mode, no_grad, restore_grad_mode, set_grad_mode
from graphc.errors import CaptureError

_INFERENCE: contextvars.ContextVar[bool] = contextvars.ContextVar("graphc_inference_mode", default=False)


def _mode(fn: str, name: str, mode: object) -> bool:
    if not isinstance(mode, bool):
        raise CaptureError(f"{fn}: {name} must be a bool, got {type(mode).__name__} {mode!r}")
    return mode


class set_grad_enabled:
    """``torch.set_grad_enabled(mode)``: switches the grad mode when called; used in ``with``, restores the
    mode from before the call on exit. In a capture, what is computed while off has no gradient."""

    def __init__(self, mode: bool) -> None:
        self._state = set_grad_mode(_mode("set_grad_enabled", "mode", mode))

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        restore_grad_mode(self._state)


@contextlib.contextmanager
def enable_grad() -> Iterator[None]:
    """``torch.enable_grad()``: gradients on in the block, inside a ``gc.no_grad`` block too."""
    state = set_grad_mode(True)
    try:
        yield
    finally:
        restore_grad_mode(state)


def is_grad_enabled() -> bool:
    """``torch.is_grad_enabled()``: False in ``gc.no_grad`` / ``set_grad_enabled(False)`` /
    ``inference_mode``."""
    return grad_mode()


@contextlib.contextmanager
def inference_mode(mode: bool = True) -> Iterator[None]:
    """``torch.inference_mode(mode=True)``: ``gc.no_grad`` when ``mode``; ``mode=False`` turns gradients on for
    its block, inside an inference-mode or no_grad block too, as torch's."""
    state = set_grad_mode(not _mode("inference_mode", "mode", mode))
    token = _INFERENCE.set(mode)
    try:
        yield
    finally:
        _INFERENCE.reset(token)
        restore_grad_mode(state)


def is_inference_mode_enabled() -> bool:
    """``torch.is_inference_mode_enabled()``: whether the innermost ``inference_mode`` block is on."""
    return _INFERENCE.get()


__all__ = ["enable_grad", "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "no_grad", "set_grad_enabled"]
