"""torch's strided views and layout-taking factories: ``as_strided`` (and ``_copy``, ``_scatter``) read
or write ``x``'s contiguous (row-major) storage at flat indices computed at capture from the static
``size``, ``stride`` and ``storage_offset``; ``empty_strided`` and ``empty_permuted`` make zeros of
``size`` (a graph has one layout: the strides and the physical layout are checked, then dropped)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import constant, emit, lift, reshape
from graphc.dsl.ops_factories import empty
from graphc.dsl.tensor import Tensor


def _ints(fn: str, x: Any, name: str, values: Any) -> list[int]:
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, (int, np.integer)) for v in values):
        raise op_error(fn, [] if x is None else [x], f"{name} must be a sequence of ints, got {values!r}",
                       user_source())
    return [int(v) for v in values]


def strided_indices(fn: str, x: Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int) -> np.ndarray:
    """The flat positions in ``x``'s row-major storage that ``x.as_strided(size, stride, storage_offset)``
    reads, shaped ``size``; checked in bounds as torch checks its storage."""
    size, stride = _ints(fn, x, "size", size), _ints(fn, x, "stride", stride)
    if len(size) != len(stride):
        raise op_error(fn, [x], f"size and stride must have the same length, got size {size} and stride {stride}",
                       user_source())
    if any(s < 0 for s in size) or any(s < 0 for s in stride) or storage_offset < 0:
        raise op_error(fn, [x], f"size, stride and storage_offset must be >= 0, got size {size}, stride {stride}, "
                       f"storage_offset {storage_offset}", user_source())
    if x.shape is None or not all(isinstance(d, int) for d in x.shape):
        raise op_error(fn, [x], f"needs a Tensor of static shape (its storage size), got {x.type_str()}",
                       user_source())
    storage = int(np.prod(x.shape, dtype=np.int64))
    flat = np.full(size, storage_offset, np.int64)
    for axis, (n, s) in enumerate(zip(size, stride)):
        flat = flat + (np.arange(n, dtype=np.int64) * s).reshape([n if a == axis else 1 for a in range(len(size))])
    need = storage_offset + 1 + sum((n - 1) * s for n, s in zip(size, stride)) if 0 not in size else 0
    if need > storage:
        raise op_error(fn, [x], f"size {size}, stride {stride} and storage_offset {storage_offset} need a storage of "
                       f"{need} elements, out of bounds for the input's {storage}", user_source())
    return flat


def as_strided(input: Any, size: Sequence[int], stride: Sequence[int],
               storage_offset: int | None = None) -> Tensor:
    """``torch.as_strided``: the elements of ``input``'s contiguous storage at
    ``storage_offset + sum(i_k * stride[k])``, shaped ``size`` (a Gather: a copy, not a view)."""
    x = lift(input)
    flat = strided_indices("as_strided", x, size, stride, storage_offset or 0)
    return emit("Gather", [reshape(x, [-1]), constant(flat)], {"axis": 0})


def as_strided_copy(input: Any, size: Sequence[int], stride: Sequence[int],
                    storage_offset: int | None = None) -> Tensor:
    """``torch.as_strided_copy``: ``as_strided``, which already copies."""
    return as_strided(input, size, stride, storage_offset)


def as_strided_scatter(input: Any, src: Any, size: Sequence[int], stride: Sequence[int],
                       storage_offset: int | None = None) -> Tensor:
    """``torch.as_strided_scatter``: ``input`` with ``src`` written where ``as_strided(input, size, stride,
    storage_offset)`` reads (positions read twice take one of the writes, as torch's)."""
    x = lift(input)
    flat = strided_indices("as_strided_scatter", x, size, stride, storage_offset or 0)
    s = lift(src, x)
    if s.dtype != x.dtype or s.shape is None or list(s.shape) != list(flat.shape):
        raise op_error("as_strided_scatter", [x, s], f"src must be {x.dtype}{list(flat.shape)} (the size), got "
                       f"{s.type_str()}", user_source())
    out = emit("ScatterND", [reshape(x, [-1]), constant(flat.reshape(-1, 1)), reshape(s, [-1])])
    return reshape(out, list(x.shape))


def empty_strided(size: Sequence[int], stride: Sequence[int], *, dtype: Any = "float32", **_: Any) -> Tensor:
    """``torch.empty_strided``: zeros of ``size``; ``stride`` is checked (one per dim, >= 0) and dropped."""
    size, stride = _ints("empty_strided", None, "size", size), _ints("empty_strided", None, "stride", stride)
    if len(size) != len(stride) or any(s < 0 for s in stride):
        raise op_error("empty_strided", [], f"stride must hold one int >= 0 per dim of size {size}, got {stride}",
                       user_source())
    return empty(size, dtype=dtype)


def empty_permuted(size: Sequence[int], physical_layout: Sequence[int], *, dtype: Any = "float32",
                   **_: Any) -> Tensor:
    """``torch.empty_permuted``: zeros of ``size``; ``physical_layout`` must be a permutation of its dims."""
    size = _ints("empty_permuted", None, "size", size)
    layout = _ints("empty_permuted", None, "physical_layout", physical_layout)
    if sorted(layout) != list(range(len(size))):
        raise op_error("empty_permuted", [], f"physical_layout must be a permutation of 0..{len(size) - 1}, got "
                       f"{layout}", user_source())
    return empty(size, dtype=dtype)


__all__ = ["as_strided", "as_strided_copy", "as_strided_scatter", "empty_permuted", "empty_strided",
           "strided_indices"]
