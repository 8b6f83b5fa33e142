"""torch's Tensor methods that read a value into Python (``item``, ``tolist``, ``torch.is_nonzero``), the legacy
constructor ``new``, and the autograd state torch keeps on a tensor (``grad``, ``retain_grad``, ``retains_grad``,
``register_post_accumulate_grad_hook``). A value made outside any capture is read; a traced one is refused naming
the line, since the graph would hold the example's value fixed; the autograd attributes are refused naming what
graphc has instead (``gc.autograd.grad``, ``register_hook``, ``gc.grad``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import made_outside, user_source
from graphc.dsl.ops_factories import new_empty, new_tensor
from graphc.dsl.tensor import Size, Tensor
from graphc.errors import CaptureError

__all__ = ["METHODS", "is_nonzero"]

_INSTEAD = ("take an intermediate's gradient with gc.autograd.grad(loss, [x]) inside the capture, see it with "
            "x.register_hook(fn), and a model's parameter gradients with gc.grad(model, loss)")


def _known(t: Tensor, what: str, instead: str) -> np.ndarray:
    """``t``'s value where it was made outside any capture; a CaptureError naming ``what`` otherwise."""
    if made_outside(t.value) and t._value is not None:
        return t._value
    raise CaptureError(f"{what} at {user_source()} reads traced value {t.name}: {t.type_str()} into Python, where "
                       f"the captured graph would keep the example's value for every input: {instead}")


def item(t: Tensor) -> Any:
    """``t.item()``: the Python number of a one-element Tensor made outside any capture."""
    value = _known(t, f"{t.name}.item()", "keep it a Tensor (a 0-d Tensor works in arithmetic and as gc.where's "
                   "condition), or print(t) / t.numpy() in an eager capture to see it")
    if value.size != 1:
        raise CaptureError(f"{t.name}.item() at {user_source()}: a Tensor with {value.size} elements cannot be "
                           "converted to a Python scalar")
    return value.item()


def tolist(t: Tensor) -> Any:
    """``t.tolist()``: nested Python lists of a Tensor made outside any capture."""
    return _known(t, f"{t.name}.tolist()", "keep it a Tensor, or t.numpy() in an eager capture to see it").tolist()


def is_nonzero(input: Any) -> bool:  # noqa: A002 - torch's name
    """``torch.is_nonzero``: whether a one-element Tensor made outside any capture is not zero."""
    if not isinstance(input, Tensor):
        raise CaptureError(f"is_nonzero takes a Tensor, got {type(input).__name__} (at {user_source()})")
    value = _known(input, "torch.is_nonzero", "branch in the graph with gc.where(cond, a, b) or gc.cond")
    if value.size != 1:
        raise CaptureError(f"is_nonzero of {input.name} at {user_source()}: a Tensor with {value.size} elements "
                           "cannot be converted to a Python bool")
    return bool(value.reshape(()))


def new(t: Tensor, *args: Any) -> Tensor:
    """torch's legacy ``t.new(...)``: sizes (ints, or one ``Size``: ``x.new(x.shape)``) give ``new_empty`` (zeros),
    data (a list, tuple or array) ``new_tensor``, both of ``t``'s dtype; no argument gives an empty ``[0]`` Tensor."""
    if not args:
        return new_empty(t, 0)
    if all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in args) or (
            len(args) == 1 and isinstance(args[0], Size)):
        return new_empty(t, *args)
    if len(args) == 1 and not isinstance(args[0], Tensor):
        return new_tensor(t, args[0])
    raise CaptureError(f"{t.name}.new{tuple(type(a).__name__ for a in args)} at {user_source()}: torch's legacy "
                       "constructor takes sizes or data; use new_empty(size), new_tensor(data) or clone()")


def retain_grad(t: Tensor) -> None:
    """Refused: a captured graph fills no ``.grad``."""
    raise CaptureError(f"{t.name}.retain_grad() at {user_source()}: a captured graph fills no .grad; {_INSTEAD}")


def _grad(t: Tensor) -> None:
    raise CaptureError(f"{t.name}.grad at {user_source()}: a captured value has no .grad; {_INSTEAD}")


def _post_accumulate_grad_hook(t: Tensor, hook: Any) -> None:
    raise CaptureError(f"{t.name}.register_post_accumulate_grad_hook at {user_source()}: torch registers these on "
                       "leaf tensors only: register it on the gc.nn.Parameter (param.register_post_accumulate_grad_"
                       "hook), or x.register_hook(fn) on a captured value")


METHODS = {
    "item": item, "tolist": tolist, "new": new, "retain_grad": retain_grad,
    "retains_grad": property(lambda t: False),  # torch's answer for a tensor whose .grad is not kept
    "grad": property(_grad), "register_post_accumulate_grad_hook": _post_accumulate_grad_hook,
}
