"""torch's parameter names on graphc's functions (``gc.maximum(input=a, other=b)``, ``F.relu6(input=x)``):
``torch_names`` wraps a function to take them beside graphc's own; ``RENAMES`` lists graphc's names that are
not torch's where the rule (a first parameter ``x`` is torch's ``input``) does not say it. ``gc.*`` functions
get them when ``graphc`` loads them, ``F.*`` in ``graphc.nn.functional``."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

_BINARY = {"a": "input", "b": "other"}
_MADE: dict[tuple, Callable[..., Any]] = {}  # (fn, its renames) -> the wrapper: gc.conv1d is F.conv1d

# gc name -> {graphc's parameter name: torch 2.13's}
RENAMES: dict[str, dict[str, str]] = {
    **{name: _BINARY for name in ("dist", "floor_divide", "fmod", "logaddexp", "logical_and", "logical_or",
                                  "logical_xor", "matmul", "maximum", "minimum", "remainder", "true_divide")},
    **{name: {"a": "input", "b": "vec2"} for name in ("ger", "outer")},
    **{name: {"A": "input"} for name in ("cholesky", "matrix_power", "orgqr")},
    "asarray": {"data": "obj"},
    "broadcast_to": {"x": "input", "size": "shape"},
    "softmax": {"x": "input", "axis": "dim"},
    "log_softmax": {"x": "input", "axis": "dim"},
    "split": {"x": "tensor"},
    **{name: {"x": "input", "axis": "dim", "keepdims": "keepdim"} for name in ("sum", "mean")},
    "vander": {"input": "x"},
}


def torch_names(fn: Callable[..., Any], names: dict[str, str] | None = None) -> Callable[..., Any]:
    """``fn`` taking torch's names for its parameters (``names``: graphc's name -> torch's, those ``fn`` has;
    by default ``{"x": "input"}`` when ``fn``'s first parameter is ``x``, torch's ``input``) as keywords,
    graphc's still bound; its signature shows torch's. ``fn`` itself when nothing is renamed (or it has no
    signature). Both names for one parameter is a TypeError. One wrapper per function and names, so an alias
    (``gc.conv1d`` and ``F.conv1d``) stays the same object."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    if names is None:
        names = {"x": "input"} if next(iter(sig.parameters), None) == "x" else {}
    names = {mine: torch for mine, torch in names.items() if mine in sig.parameters}
    if not names:
        return fn
    key = (fn, tuple(sorted(names.items())))
    if key in _MADE:
        return _MADE[key]
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
    _MADE[key] = named
    return named


__all__ = ["RENAMES", "torch_names"]
