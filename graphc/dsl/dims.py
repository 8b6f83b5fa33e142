"""A dim argument as torch reads it: in range for the Tensor's rank, where a 0-d Tensor takes 0 and -1 as
a dim of its one element (``dim_index``), and functions of a dim run on a 0-d Tensor as on that one
element along a dim of size 1, their results 0-d again (``one_element``: cumsum, sort, softmax, gather, ...)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.tensor import Tensor

__all__ = ["dim_index", "one_element"]


def dim_index(x: Tensor, dim: int, op: str) -> int:
    """``dim`` of ``x`` (rank known) as a non-negative axis, a 0-d ``x`` counting as rank 1 (torch's
    wrapping of scalars); a CaptureError for ``op`` when it is out of range."""
    rank = max(len(x.shape), 1)
    if not -rank <= dim < rank:
        raise op_error(op, [x], f"dim {dim} out of range for rank {len(x.shape)}", user_source())
    return dim % rank


def _is_0d(value: Any) -> bool:
    return isinstance(value, Tensor) and value.shape is not None and len(value.shape) == 0


def one_element(param: str = "dim") -> Callable:
    """Decorator for a function whose first argument is a Tensor and ``param`` its dim (an int or a list of
    them): given a 0-d Tensor and a dim, each dim must be 0 or -1, and the function runs on every 0-d Tensor
    argument viewed as ``[1]`` with the dims 0; its result (a Tensor, or a tuple, NamedTuple or
    ``ValuesIndices`` of them) is viewed as 0-d.
    Anything else runs as it is."""
    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        first = next(iter(signature.parameters))

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            x, dims = bound.arguments.get(first), bound.arguments.get(param)
            if not _is_0d(x) or dims is None or isinstance(dims, bool) or dims == [] or dims == ():
                return fn(*args, **kwargs)
            for d in [dims] if isinstance(dims, int) else dims:
                dim_index(x, d, fn.__name__)
            for name, value in bound.arguments.items():
                if _is_0d(value):
                    bound.arguments[name] = value.reshape([1])
            bound.arguments[param] = 0 if isinstance(dims, int) else [0] * len(dims)
            out = fn(*bound.args, **bound.kwargs)
            if type(out) is Tensor:
                return out.reshape([])
            parts = [o.reshape([]) for o in out]  # a (values, indices) result: a tuple, or a Tensor of two parts
            return type(out)(parts) if type(out) is tuple else type(out)(*parts)
        return run
    return wrap
