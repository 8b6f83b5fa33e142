"""torch's keywords on graphc's signatures: ``takes_device`` (a module's ``device=`` factory keyword, as
torch's ``factory_kwargs``), ``torch_names`` (a function taking torch's parameter names, ``input=``,
beside graphc's own, ``x=``) and ``implicit_dim`` (the softmaxes' ``dim=None``, torch's implicit dim)."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, TypeVar

from graphc.dsl.devices import check_device
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

    sig = inspect.signature(init)
    params = list(sig.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    device = inspect.Parameter("device", inspect.Parameter.KEYWORD_ONLY, default=None)
    __init__.__signature__ = sig.replace(parameters=[*params[:at], device, *params[at:]])  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def torch_names(fn: Callable[..., Any], names: dict[str, str] | None = None) -> Callable[..., Any]:
    """``fn`` taking torch's names for its parameters (``names``: graphc's name -> torch's; by default
    ``{"x": "input"}`` when ``fn``'s first parameter is ``x``, torch's ``input``) as keywords, graphc's still
    bound; its signature shows torch's. ``fn`` itself when nothing is renamed (or it has no signature).
    Both names for one parameter is a TypeError."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    if names is None:
        names = {"x": "input"} if next(iter(sig.parameters), None) == "x" else {}
    if not names:
        return fn
    own = {torch: mine for mine, torch in names.items()}

    @functools.wraps(fn)
    def named(*args: Any, **kwargs: Any) -> Any:
        for torch, mine in own.items():
            if torch in kwargs:
                if mine in kwargs:
                    raise TypeError(f"{fn.__name__}() got {torch!r} and {mine!r}, two names for one argument")
                kwargs[mine] = kwargs.pop(torch)
        return fn(*args, **kwargs)

    named.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(name=names.get(p.name, p.name)) for p in sig.parameters.values()])
    return named


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


__all__ = ["implicit_dim", "takes_device", "torch_names"]
