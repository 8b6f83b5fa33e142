"""``gc.nn.utils.clip_grad_norm_`` and the rest of torch's clip_grad: refused, naming why and what
to use. A graphc Parameter has no ``.grad``: gradients exist only inside the graphs ``gc.grad`` and
``gc.training.generate`` build; the training graphs clip them as the optimizer spec asks
(``max_grad_norm``, ``grad_norm_type``, ``clip_grad_value``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from graphc.dsl.builder import user_source
from graphc.errors import CaptureError

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm"]


def _refused(fn: str) -> Callable[..., NoReturn]:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise CaptureError(f"gc.nn.utils.{fn}: a graphc Parameter has no .grad to clip in place; gradients exist "
                           f"only inside the graphs gc.grad and gc.training.generate build: give the optimizer spec "
                           f"max_grad_norm= (and grad_norm_type=) or clip_grad_value=, e.g. "
                           f"gc.optim.AdamW(lr, max_grad_norm=1.0) (graphc grad --max-grad-norm 1.0), and the "
                           f"train step clips before each update as torch's {fn} does (or clip the "
                           f"'<param>_grad' outputs of gc.grad yourself) (at {user_source()})")

    refuse.__name__ = refuse.__qualname__ = fn
    refuse.__doc__ = f"``torch.nn.utils.{fn}``: refused, as this module's docstring says."
    return refuse


clip_grad_norm_ = _refused("clip_grad_norm_")
clip_grad_norm = _refused("clip_grad_norm")
clip_grad_value_ = _refused("clip_grad_value_")
clip_grads_with_norm_ = _refused("clip_grads_with_norm_")
get_total_norm = _refused("get_total_norm")
