"""torch's keywords on graphc's modules and ``F`` functions: ``takes_device`` (a module's ``device=`` factory
keyword, as torch's ``factory_kwargs``) and ``implicit_dim`` (the softmaxes' ``dim=None``, torch's implicit dim).
A function's torch parameter names: ``graphc.dsl.torch_keywords``."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, TypeVar

from graphc.dsl.devices import check_device, with_keywords
from graphc.dsl.ops import lift
from graphc.errors import CaptureError

M = TypeVar("M", bound=type)


def takes_device(cls: M) -> M:
    """``cls`` whose ``__init__`` also takes torch's ``device=None`` (keyword only): a device (``"cpu"``,
    ``"cuda:1"``, ``"meta"``, a ``torch.device``) is accepted and dropped, as the factories' (``check_device``):
    a module's parameters have no device, the session's backend places the graph; anything else is refused."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, device: Any = None, **kwargs: Any) -> None:
        check_device(type(self).__name__, device)
        init(self, *args, **kwargs)

    __init__.__signature__ = with_keywords(inspect.signature(init), {"device": None})  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def implicit_dim(name: str, x: Any, dim: int | None, stacklevel: int = 3) -> int:
    """``dim``; where None, torch's deprecated implicit choice for the softmaxes (``name``: ``softmax``,
    ``softmin``, ``log_softmax``): dim 0 of a 0-, 1- or 3-D ``x``, else dim 1, with torch's UserWarning. An
    unknown rank is refused (the dim would depend on it). ``stacklevel``: the warning's frame, counted from
    here (3: the caller of the function that called this one)."""
    if dim is not None:
        return dim
    shape = lift(x).shape
    if shape is None:
        raise CaptureError(f"{name}(dim=None) takes torch's implicit dim from the input's rank, which is unknown "
                           f"here: give dim")
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as "
                  f"an argument.", UserWarning, stacklevel=stacklevel)
    return 0 if len(shape) in (0, 1, 3) else 1


__all__ = ["implicit_dim", "takes_device"]
