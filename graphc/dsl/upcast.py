"""float16 and bfloat16 math in float32, as torch computes it: torch's kernels accumulate a narrow
float's sums, products and scans in float32, and compute its softmax, norms, statistics, losses and
composite activations in float32, rounding once at the end. The same ONNX ops on float16 round at
every step (the numpy backend's do, and onnxruntime's GPU kernels may), and bfloat16 keeps 8 bits,
so the graph says float32 itself: ``in_float32`` casts a function's narrow float Tensor arguments
to float32 and its float32 results back. float32 and float64 graphs are left as they are."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from graphc.dsl.builder import current
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES, to_onnx

__all__ = ["NARROW", "in_float32", "narrowed"]

NARROW = frozenset({"float16", "bfloat16"})
F = TypeVar("F", bound=Callable[..., Any])


def _cast(t: Tensor, dtype: str) -> Tensor:
    builder = current()
    (value,) = builder.emit("Cast", [t.value], {"to": to_onnx(dtype)}, 1, operands=[t])
    return Tensor(value, builder.eager_value(value))


def narrowed(out: Any, dtype: str) -> Any:
    """``out`` (a Tensor, or a tuple or named tuple of them) with its float32 Tensors cast to ``dtype``."""
    if isinstance(out, Tensor):
        return _cast(out, dtype) if out.dtype == "float32" else out
    if isinstance(out, tuple):
        items = [narrowed(o, dtype) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    return out


def in_float32(fn: F) -> F:
    """``fn`` computed in float32 where its float Tensor arguments are all one narrow dtype
    (float16 or bfloat16), its float32 results cast back to that dtype; as written otherwise
    (float32, float64, or mixed float dtypes, which ``fn`` itself checks)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        floats = {a.dtype for a in (*args, *kwargs.values()) if isinstance(a, Tensor) and a.dtype in FLOAT_DTYPES}
        if len(floats) != 1 or not floats <= NARROW:
            return fn(*args, **kwargs)
        (dtype,) = floats

        def wide(a: Any) -> Any:
            return _cast(a, "float32") if isinstance(a, Tensor) and a.dtype == dtype else a

        return narrowed(fn(*map(wide, args), **{k: wide(v) for k, v in kwargs.items()}), dtype)

    return wrapper  # type: ignore[return-value]
