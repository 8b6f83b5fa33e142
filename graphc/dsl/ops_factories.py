"""torch's creation, combinatorics and dtype-utility functions: constants (``gc.eye``, ``gc.linspace``,
``gc.logspace``, ``gc.range``, ``gc.tensor``, ``gc.tril_indices``, ...) computed at capture time with torch's
formulas, grids and products of Tensors (``gc.meshgrid``, ``gc.cartesian_prod``, ``gc.combinations``,
``gc.block_diag``, ``gc.vander``, ``gc.tensordot``, ``gc.unravel_index``) lowered to standard ONNX ops with
their gradients, numpy's stacking names, and torch's dtype promotion rules as pure Python."""

from __future__ import annotations

import builtins
import itertools
import math
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.devices import factory
from graphc.dsl.ops import cast, concat, constant, emit, lift, promote, reshape, same_dtype, stack
from graphc.dsl.ops_array import cat, dim_length, einsum, full, full_like, static_dim
from graphc.dsl.ops_divide import remainder
from graphc.dsl.ops_reshape import atleast_1d, atleast_2d, atleast_3d
from graphc.dsl.promotion import can_cast, promote_types, result_type
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, DType, as_dtype
from graphc.passes.infer import InferenceError, broadcast

# -- constants --------------------------------------------------------------------------------


def _count(value: Any, arg: str, fn: str) -> int:
    """``value`` as a non-negative int; a CaptureError naming ``fn``'s ``arg`` otherwise, as torch refuses it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise CaptureError(f"{fn}: {arg} must be a non-negative int, got {value!r} (at {user_source()})")
    return int(value)


def _dtype(dtype: Any, default: str = "float32") -> DType:
    return as_dtype(default if dtype is None else dtype)


@factory
def eye(n: int, m: int | None = None, dtype: Any = None) -> Tensor:
    """``torch.eye``: ones on the diagonal of an ``n x m`` constant (float32 unless ``dtype``)."""
    n = _count(n, "n", "eye")
    m = n if m is None else _count(m, "m", "eye")
    return constant(np.eye(n, m, dtype=_dtype(dtype).numpy))


def _spaced(start: Any, end: Any, steps: Any, dtype: DType, work: Any, fused: bool, fn: str) -> np.ndarray:
    """torch's evenly spaced values in ``work`` precision: the ends first converted to ``dtype`` (an integer
    dtype truncates them), then ``start + i * step`` for the first half and ``end - (steps - 1 - i) * step`` for
    the rest (symmetric about both ends); ``fused``: each rounded once, as torch's vectorised float kernels
    compute ``a * b + c``."""
    steps = _count(steps, "steps", fn)
    for arg, value in (("start", start), ("end", end)):
        if isinstance(value, Tensor) or not isinstance(value, (bool, int, float, np.number)):
            raise CaptureError(f"{fn}: {arg} must be a Python number (the values are a constant), got "
                               f"{type(value).__name__} (at {user_source()})")
    work = np.dtype(work)
    start, end = (np.asarray(v).astype(dtype.numpy).astype(work) for v in (start, end))
    if steps == 1:
        return start.reshape(1)
    step = (end - start) / work.type(steps - 1)
    i = np.arange(steps)
    wide = np.longdouble if fused and work == np.float64 else np.float64 if fused else work
    low = start.astype(wide) + step.astype(wide) * i.astype(wide)
    high = end.astype(wide) - step.astype(wide) * (steps - 1 - i).astype(wide)
    return np.where(i < steps // 2, low, high).astype(work)


@factory
def linspace(start: Any, end: Any, steps: int, dtype: Any = None) -> Tensor:
    """``torch.linspace``: ``steps`` evenly spaced values from ``start`` to ``end``, a constant with torch's
    values (float32 and float64 exactly, float16 and bfloat16 computed in float32)."""
    dt = _dtype(dtype)
    floats = dt in FLOAT_DTYPES
    work = dt.numpy if dt in ("float32", "float64") else np.float32 if floats else np.float64
    return constant(_spaced(start, end, steps, dt, work, floats, "linspace").astype(dt.numpy))


@factory
def logspace(start: Any, end: Any, steps: int, base: float = 10.0, dtype: Any = None) -> Tensor:
    """``torch.logspace``: ``base ** linspace(start, end, steps)``, exponents and powers in float64 as torch's,
    a constant."""
    dt = _dtype(dtype)
    exponents = _spaced(start, end, steps, dt, np.float64, False, "logspace")
    return constant(np.power(np.float64(base), exponents).astype(dt.numpy))


@factory
def range(start: Any, end: Any, step: Any = 1, dtype: Any = None) -> Tensor:  # noqa: A001 - torch's name
    """``torch.range`` (deprecated in torch): ``start, start + step, ...`` up to and including ``end``;
    float32 unless ``dtype``, a constant."""
    if step == 0:
        raise CaptureError(f"range: step must be nonzero (at {user_source()})")
    if (end - start) * step < 0:
        raise CaptureError(f"range: end {end} is not reached from start {start} by step {step}, as torch refuses "
                           f"(at {user_source()})")
    count = math.floor((end - start) / step) + 1
    return constant((start + np.arange(count, dtype=np.float64) * step).astype(_dtype(dtype).numpy))


@factory
def empty(*size: Any, dtype: Any = "float32") -> Tensor:
    """``torch.empty``: zeros (a graph holds no uninitialised memory)."""
    return full(size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size, 0, dtype)


@factory
def empty_like(x: Tensor, dtype: Any = None) -> Tensor:
    """``torch.empty_like``: zeros of ``x``'s shape (symbolic dims too)."""
    return full_like(x, 0, dtype)


@factory
def scalar_tensor(s: Any, dtype: Any = None) -> Tensor:
    """``torch.scalar_tensor``: a 0-D constant, float32 unless ``dtype`` (a bool or int too, as torch)."""
    if isinstance(s, Tensor) or not isinstance(s, (bool, int, float, np.number)):
        raise CaptureError(f"scalar_tensor: s must be a Python number, got {type(s).__name__} (at {user_source()})")
    return constant(np.asarray(s, _dtype(dtype).numpy))


def _data_array(data: Any, dtype: Any, fn: str) -> np.ndarray:
    """Python or numpy ``data`` as torch's ``tensor`` reads it: a numpy array keeps its dtype, Python floats
    are float32, ints int64, bools bool; ``dtype`` overrides."""
    if isinstance(data, Tensor) or (isinstance(data, (list, tuple)) and any(isinstance(d, Tensor) for d in data)):
        raise CaptureError(f"{fn} takes Python or numpy data, got a Tensor; use gc.stack or x.clone() "
                           f"(at {user_source()})")
    try:
        array = np.asarray(data)
    except ValueError:  # numpy refuses a ragged nest, as torch does
        raise CaptureError(f"{fn}: data must nest sequences of equal lengths, got {data!r} "
                           f"(at {user_source()})") from None
    if array.dtype.kind not in "biuf":
        raise CaptureError(f"{fn}: cannot make a Tensor of {type(data).__name__} {data!r} (at {user_source()})")
    if dtype is not None:
        return array.astype(as_dtype(dtype).numpy)
    if not isinstance(data, (np.ndarray, np.generic)):
        array = array.astype(np.float32 if array.dtype.kind == "f" else np.int64 if array.dtype.kind in "iu" else bool)
    return array.astype(as_dtype(array.dtype).numpy)


@factory
def tensor(data: Any, dtype: Any = None) -> Tensor:
    """``torch.tensor``: a constant holding ``data`` (dtype as torch infers it, or ``dtype``)."""
    return constant(_data_array(data, dtype, "tensor"))


@factory
def as_tensor(data: Any, dtype: Any = None) -> Tensor:
    """``torch.as_tensor``: a Tensor is returned as it is (cast when ``dtype`` differs); data as ``gc.tensor``."""
    if isinstance(data, Tensor):
        return data if dtype is None or as_dtype(dtype) == data.dtype else cast(data, dtype)
    return constant(_data_array(data, dtype, "as_tensor"))


asarray = as_tensor


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """``torch.from_numpy``: a Tensor of the array's values and dtype (float64 kept), a constant in a capture; it
    holds the values of the call (no memory is shared with the array, as no graphc Tensor is written in place)."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"gc.from_numpy: expected np.ndarray (got {type(ndarray).__name__}); gc.tensor takes "
                        f"Python data")
    return as_tensor(ndarray)


def _trilu_indices(fn: str, row: int, col: int, offset: int, dtype: Any) -> Tensor:
    row, col = _count(row, "row", fn), _count(col, "col", fn)
    pick = np.tril_indices if fn == "tril_indices" else np.triu_indices
    return constant(np.stack(pick(row, int(offset), col)).astype(_dtype(dtype, "int64").numpy))


@factory
def tril_indices(row: int, col: int, offset: int = 0, dtype: Any = None) -> Tensor:
    """``torch.tril_indices``: the ``[2, k]`` (row, column) indices on and below diagonal ``offset``, row by row."""
    return _trilu_indices("tril_indices", row, col, offset, dtype)


@factory
def triu_indices(row: int, col: int, offset: int = 0, dtype: Any = None) -> Tensor:
    """``torch.triu_indices``: the ``[2, k]`` (row, column) indices on and above diagonal ``offset``, row by row."""
    return _trilu_indices("triu_indices", row, col, offset, dtype)


def new_tensor(x: Tensor, data: Any, dtype: Any = None) -> Tensor:
    """``x.new_tensor(data)``: a constant of ``x``'s dtype unless ``dtype`` says otherwise."""
    return constant(_data_array(data, x.dtype if dtype is None else dtype, "new_tensor"))


def new_empty(x: Tensor, *size: Any, dtype: Any = None) -> Tensor:
    """``x.new_empty(size)``: zeros of ``x``'s dtype unless ``dtype`` says otherwise."""
    return empty(*size, dtype=x.dtype if dtype is None else dtype)


# -- grids and products -----------------------------------------------------------------------


def _tensor_list(tensors: tuple, fn: str, ranks: tuple[int, ...], promoted: bool = False) -> list[Tensor]:
    """``tensors`` (or the one list given) as Tensors of one dtype, each of a rank in ``ranks``: ``promoted``
    as torch's ``result_type`` of them, else refused unless they already share one."""
    items = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)
    items = [lift(t) for t in items]
    for i, t in enumerate(items):
        if t.ndim not in ranks:
            raise op_error(fn, [t], f"tensor {i} has rank {t.ndim}; {fn} takes ranks {list(ranks)}, as torch",
                           user_source())
        if not promoted:
            same_dtype(fn, items[0], t)
    return promote(*items) if promoted and len({t.dtype for t in items}) > 1 else items


def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple[Tensor, ...]:
    """``torch.meshgrid``: each 1-D (or 0-D) Tensor expanded along its own dim to the grid of all their
    sizes (symbolic sizes too); ``indexing="xy"`` swaps the first two dims. Signature: ai.onnx@13::Expand"""
    if indexing not in ("ij", "xy"):
        raise CaptureError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r} (at {user_source()})")
    items = [t if t.ndim == 1 else reshape(t, [-1]) for t in _tensor_list(tensors, "meshgrid", (0, 1))]
    order = list(builtins.range(len(items)))
    if indexing == "xy" and len(items) > 1:
        order[0], order[1] = 1, 0
    grid = concat([dim_length(items[i], 0) for i in order], 0)
    sizes = tuple(items[i].shape[0] for i in order)
    out = []
    for k, t in enumerate(items):
        place = order.index(k)
        column = reshape(t, [-1 if j == place else 1 for j in builtins.range(len(items))])
        out.append(emit("Expand", [column, grid], out_types=[(t.dtype, sizes)]))
    return tuple(out)


def cartesian_prod(*tensors: Any) -> Tensor:
    """``torch.cartesian_prod``: the rows of every combination of the 1-D Tensors' entries (``[n1 * n2 ..., k]``);
    one Tensor is returned as it is."""
    items = _tensor_list(tensors, "cartesian_prod", (1,))
    if len(items) == 1:
        return items[0]
    return stack([reshape(g, [-1]) for g in meshgrid(*items, indexing="ij")], 1)


def combinations(x: Tensor, r: int = 2, with_replacement: bool = False) -> Tensor:
    """``torch.combinations``: the ``[k, r]`` rows of ``r`` entries of 1-D ``x`` in itertools' order (static size).
    Signature: ai.onnx@13::Gather"""
    (x,) = _tensor_list((x,), "combinations", (1,))
    r = _count(r, "r", "combinations")
    size = static_dim(x, 0, "combinations")
    if r == 0:
        return constant(np.zeros(0, x.dtype.numpy))  # torch's empty result
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    index = np.asarray(list(pick(builtins.range(size), r)), np.int64).reshape(-1, r)
    return emit("Gather", [x, constant(index)], {"axis": 0})


def block_diag(*tensors: Any) -> Tensor:
    """``torch.block_diag``: the (0-D to 2-D, static) Tensors on the diagonal of a zero matrix, each shifted
    right by the widths before it, all of the dtype torch's ``result_type`` gives them as passed (a 0-D Tensor
    counts below the others: a float64 0-D with a float32 matrix is float32). Signature: ai.onnx@13::Concat"""
    items = [atleast_2d(t) for t in _tensor_list(tensors, "block_diag", (0, 1, 2), promoted=True)]
    if not items:
        return constant(np.zeros((1, 0), np.float32))
    widths = [static_dim(t, 1, "block_diag") for t in items]
    rows = []
    for k, t in enumerate(items):
        height = static_dim(t, 0, "block_diag")
        left, right = builtins.sum(widths[:k]), builtins.sum(widths[k + 1:])
        parts = [full((height, width), 0, t.dtype) if width else None for width in (left, right)]
        rows.append(cat([p for p in (parts[0], t, parts[1]) if p is not None], 1))
    return cat(rows, 0)


def vander(x: Tensor, N: int | None = None, increasing: bool = False) -> Tensor:  # noqa: N803 - torch's name
    """``torch.vander``: columns ``x ** (N - 1) .. x ** 0`` (``increasing``: the other way), each power the last
    one times ``x`` as torch's cumprod; bool and integer ``x`` give int64, as torch. Signature: ai.onnx@14::Mul"""
    (x,) = _tensor_list((x,), "vander", (1,))
    n = static_dim(x, 0, "vander") if N is None else _count(N, "N", "vander")
    if x.dtype not in FLOAT_DTYPES:
        x = cast(x, "int64")
    if n == 0:
        return full((static_dim(x, 0, "vander"), 0), 0, x.dtype)
    columns = powers(x, n)
    return stack(columns if increasing else columns[::-1], 1)


def powers(x: Tensor, n: int) -> list[Tensor]:
    """``x ** 0 .. x ** (n - 1)``, each power the last one times ``x`` (torch's cumprod, its gradient too)."""
    columns = [full_like(x, 1)]
    while len(columns) < n:
        columns.append(x if len(columns) == 1 else columns[-1] * x)
    return columns


def unravel_index(indices: Any, shape: Any) -> tuple[Tensor, ...]:
    """``torch.unravel_index``: the coordinates of flat ``indices`` (an integer Tensor or int) in ``shape``, one
    int64 Tensor per dim; out-of-range and negative indices wrap, as torch's (floor division and modulo)."""
    indices = lift(indices)
    if indices.dtype in FLOAT_DTYPES or indices.dtype == "bool":
        raise op_error("Mod", [indices], f"unravel_index's indices must be integers, got {indices.dtype}",
                       user_source())
    dims = [shape] if isinstance(shape, (int, np.integer)) else list(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise CaptureError(f"unravel_index: shape must hold non-negative ints, got {shape!r} (at {user_source()})")
    rest, coords = cast(indices, "int64"), []
    for size in reversed(dims):
        size = constant(np.asarray(size, np.int64))
        coords.append(remainder(rest, size))
        rest = emit("Div", [rest - coords[-1], size])
    return tuple(reversed(coords))


@autocast_op()
def tensordot(a: Tensor, b: Tensor, dims: Any = 2) -> Tensor:
    """``torch.tensordot``: ``a`` and ``b`` contracted over the last ``dims`` dims of ``a`` and the first of ``b``,
    or over the listed pairs ``(dims_a, dims_b)``; ``a`` and ``b`` of one dtype, as torch's (it does not
    promote). Signature: ai.onnx@12::Einsum"""
    a, b = lift(a), lift(b)
    if a.dtype != b.dtype:
        raise op_error("Einsum", [a, b], f"tensordot takes two Tensors of one dtype (torch's does not promote), got "
                       f"{a.dtype} and {b.dtype}; cast one with .astype()", user_source())
    if isinstance(dims, (int, np.integer)):
        if dims < 0 or dims > builtins.min(a.ndim, b.ndim):
            raise op_error("Einsum", [a, b], f"tensordot dims={dims} must be in 0 .. {builtins.min(a.ndim, b.ndim)}",
                           user_source())
        dims_a, dims_b = list(builtins.range(a.ndim - dims, a.ndim)), list(builtins.range(dims))
    else:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
        if len(dims_a) != len(dims_b):
            raise op_error("Einsum", [a, b], f"tensordot dims {dims_a} and {dims_b} are not the same length",
                           user_source())
    letters = iter(string.ascii_letters)
    sub_a, sub_b = [next(letters) for _ in builtins.range(a.ndim)], [next(letters) for _ in builtins.range(b.ndim)]
    for da, db in zip(dims_a, dims_b):
        if not (-a.ndim <= da < a.ndim and -b.ndim <= db < b.ndim):
            raise op_error("Einsum", [a, b], f"tensordot dims ({da}, {db}) out of range", user_source())
        size_a, size_b = a.shape[da], b.shape[db]
        if isinstance(size_a, int) and isinstance(size_b, int) and size_a != size_b:
            raise op_error("Einsum", [a, b], f"contracted dims differ: size {size_a} in dim {da} of a, {size_b} in "
                           f"dim {db} of b", user_source())
        sub_b[db] = sub_a[da]
    contracted = set(sub_b) & set(sub_a)
    out = "".join(s for s in sub_a + sub_b if s not in contracted)
    return einsum(f"{''.join(sub_a)},{''.join(sub_b)}->{out}", a, b)


# -- stacking names ---------------------------------------------------------------------------


def hstack(tensors: Sequence[Any]) -> Tensor:
    """``torch.hstack``: 1-D Tensors (0-D as 1-D) joined end to end, others along dim 1."""
    items = atleast_1d(list(tensors))
    return cat(items, 0 if items[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Any]) -> Tensor:
    """``torch.vstack`` (``row_stack``): Tensors made at least 2-D, joined along dim 0."""
    return cat(atleast_2d(list(tensors)), 0)


row_stack = vstack


def dstack(tensors: Sequence[Any]) -> Tensor:
    """``torch.dstack``: Tensors made at least 3-D, joined along dim 2."""
    return cat(atleast_3d(list(tensors)), 2)


def column_stack(tensors: Sequence[Any]) -> Tensor:
    """``torch.column_stack``: 0-D and 1-D Tensors as columns ``[n, 1]``, joined with the others along dim 1."""
    items = [lift(t) for t in tensors]
    return cat([reshape(t, [-1, 1]) if t.ndim < 2 else t for t in items], 1)


def concatenate(tensors: Sequence[Any], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """``torch.concatenate``: ``gc.cat`` with numpy's ``axis`` (or ``dim``)."""
    return cat(tensors, axis if dim is None else dim)


def broadcast_shapes(*shapes: Any) -> tuple:
    """``torch.broadcast_shapes``: the shape ``shapes`` (ints count as 1-D shapes; dim names as in ``x.shape``)
    broadcast to."""
    shapes = tuple((s,) if isinstance(s, (int, np.integer)) else tuple(s) for s in shapes)
    try:
        return tuple(broadcast(*shapes)) if shapes else ()
    except InferenceError as exc:
        raise CaptureError(f"broadcast_shapes: {', '.join(map(str, shapes))} do not broadcast: {exc} "
                           f"(at {user_source()})") from None


__all__ = [
    "as_tensor", "asarray", "block_diag", "from_numpy", "broadcast_shapes", "can_cast", "cartesian_prod", "column_stack",
    "combinations", "concatenate", "dstack", "empty", "empty_like", "eye", "hstack", "linspace", "logspace",
    "meshgrid", "new_empty", "new_tensor", "promote_types", "range", "result_type", "row_stack", "scalar_tensor",
    "tensor", "tensordot", "tril_indices", "triu_indices", "unravel_index", "vander", "vstack",
]
