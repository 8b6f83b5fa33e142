"""In-place arithmetic and writes on complex Tensors, as torch's: ``z.add_(w, alpha=2)``, ``z *= w``,
``z.copy_(x)``, ``z.zero_()``, ``z.fill_(1+2j)``, ``z.masked_fill_(mask, v)``, ``z.index_put_(...)``,
``z.addcmul_(a, b)``. Each rebinds ``z``'s ``view_as_real`` pair (``complex_ops.write``), so a view writes its base."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphc.dsl import inplace, ops, ops_array, ops_scatter
from graphc.dsl.builder import user_source
from graphc.dsl.complex_ops import add, as_complex, div, mul, of_parts, operand, pair, parts, sub, write
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.errors import CaptureError


def _scaled(b: Any, alpha: Any) -> Any:
    return b if alpha == 1 else b * alpha


def addcmul(z: ComplexTensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> ComplexTensor:
    """``z + value * tensor1 * tensor2``."""
    return add(z, _scaled(mul(tensor1, tensor2), value))


def addcdiv(z: ComplexTensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> ComplexTensor:
    """``z + value * tensor1 / tensor2``."""
    return add(z, _scaled(div(tensor1, tensor2), value))


def _div(z: ComplexTensor, other: Any, rounding_mode: str | None = None) -> ComplexTensor:
    if rounding_mode is not None:
        raise CaptureError(f"div_ with rounding_mode={rounding_mode!r} does not take complex Tensors (got "
                           f"{z.type_str()}), as torch's (at {user_source()})")
    return div(z, other)


def _filled(z: ComplexTensor, value: Any) -> ComplexTensor:
    """``value`` (a number or a 0-D Tensor, complex or real) everywhere in ``z``'s shape, as ``fill_``."""
    re, im = parts(as_complex(value, parts(z)[0]))
    ops_array.zero_dim_value("fill_", pair(z), re)
    return of_parts(*(ops_array.full_like(p, 0.0) + ops.cast(part, p.dtype) for p, part in zip(parts(z), (re, im))))


def _copied(z: ComplexTensor, src: Any) -> ComplexTensor:
    """``src`` (a complex or real Tensor, broadcast to ``z``'s shape and cast to its dtype), as ``copy_``."""
    if not isinstance(src, (Tensor, ComplexTensor)):
        raise CaptureError(f"copy_ takes a Tensor src, got {type(src).__name__} (at {user_source()})")
    return of_parts(*(inplace.broadcast_value(ops.cast(part, p.dtype), p, p)
                      for p, part in zip(parts(z), parts(as_complex(src, parts(z)[0])))))


def masked_fill(z: ComplexTensor, mask: Tensor, value: Any) -> ComplexTensor:
    """``value`` (a number or a 0-D Tensor, complex or real) where the bool ``mask`` is true, else ``z``."""
    re, im = operand(value)
    return of_parts(*(ops_array.masked_fill(p, mask, 0.0 if v is None else v) for p, v in zip(parts(z), (re, im))))


def index_put(z: ComplexTensor, indices: Any, values: Any, accumulate: bool = False) -> ComplexTensor:
    """``torch.index_put`` of complex (or real) ``values`` into ``z``, on each part."""
    re, im = operand(values)
    return of_parts(*(ops_scatter.index_put(p, indices, 0.0 if v is None else ops.lift(v, p), accumulate)
                      for p, v in zip(parts(z), (re, im))))


def _in_place(fn: Callable[..., ComplexTensor]) -> Callable[..., ComplexTensor]:
    """``z`` rebound to ``fn(z, ...)`` (``complex_ops.write``), and returned."""
    return lambda z, *args, **kwargs: write(z, fn(z, *args, **kwargs))


_WRITES = {
    "add_": lambda z, b, *, alpha=1: add(z, _scaled(b, alpha)),
    "sub_": lambda z, b, *, alpha=1: sub(z, _scaled(b, alpha)),
    "mul_": mul, "div_": _div, "__iadd__": add, "__isub__": sub, "__imul__": mul, "__itruediv__": div,
    "copy_": _copied, "fill_": _filled, "zero_": lambda z: _filled(z, 0.0), "masked_fill_": masked_fill,
    "index_put_": index_put, "addcmul_": addcmul, "addcdiv_": addcdiv,
}
METHODS = {
    "clone": lambda z, *, memory_format=None: of_parts(*parts(z)), "addcmul": addcmul, "addcdiv": addcdiv,
    "masked_fill": masked_fill, "index_put": index_put, **{name: _in_place(fn) for name, fn in _WRITES.items()},
}
for _name, _method in METHODS.items():
    setattr(ComplexTensor, _name, _method)
