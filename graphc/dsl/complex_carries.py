"""Complex values through control flow. An ONNX ``If``, ``Loop`` or ``Scan`` holds real values only, so
``gc.cond``, ``gc.fori_loop``, ``gc.while_loop`` and ``gc.scan`` pass each complex carry, scanned input or
output as its (real, imaginary) parts, two real values, and make it complex again inside the body and after
the node. Its gradients are its parts' (graphc's complex convention: ``complex_ops``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.tensor import ComplexTensor, Tensor


def item(x: Any) -> Tensor | ComplexTensor:
    """``x`` as a carried value: a complex one (a ComplexTensor, a complex number or array) a ComplexTensor,
    anything else ``ops.lift``'s Tensor."""
    from graphc.dsl.complex_ops import is_complex_value, of_parts  # it imports control (through ops_binary)
    if isinstance(x, ComplexTensor):
        return x
    if is_complex_value(x):
        re = ops.lift(np.real(x))
        return of_parts(re, ops.lift(np.imag(x), re))
    return ops.lift(x)


def split(items: Sequence[Tensor | ComplexTensor]) -> tuple[list[Tensor], list[bool]]:
    """The real Tensors that hold ``items`` (a complex one's two parts), and which items are complex."""
    from graphc.dsl.complex_ops import parts  # it imports control (through ops_binary)
    flat: list[Tensor] = []
    kinds = [isinstance(x, ComplexTensor) for x in items]
    for x, is_complex in zip(items, kinds):
        flat.extend(parts(x) if is_complex else [x])
    return flat, kinds


def join(flat: Sequence[Tensor], kinds: Sequence[bool]) -> list[Tensor | ComplexTensor]:
    """The items ``split`` gave ``flat`` and ``kinds`` for: each complex one's two parts one ComplexTensor."""
    values = iter(flat)
    return [ComplexTensor(parts=(next(values), next(values))) if is_complex else next(values) for is_complex in kinds]


__all__ = ["item", "join", "split"]
