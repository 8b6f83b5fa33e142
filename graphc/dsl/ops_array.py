# Over 500 lines: torch's array functions beside the dim, shape and sort-key helpers they and the other
# function modules share (dim_length, dim_positions, static_dim, sort_key; dim_index from ``dims``).
"""Array functions with ``torch``'s names and signatures (``gc.pad``, ``gc.split``, ``gc.gather``,
``gc.arange``, ``gc.masked_fill``, ...), each recorded as standard ONNX ops so the existing
kernels and gradient rules apply. ``dim`` follows PyTorch; integer and bool tensors work where
PyTorch's do (indices, masks, ``arange``, ``one_hot``, ``argmax``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.model.dtypes import FLOAT_DTYPES, as_dtype
from graphc.errors import CaptureError
from graphc.dsl.ops import (binary, cast, clip, concat, const_i64, constant, dim_read, emit, exp, in_range, int64_accumulated,
                            known_in_range, lift, log, mean, reduction, reshape, reshape_like, run_time_int,
                            same_dtype, scalar, sqrt, squeeze, transpose, unary, unsqueeze, where)
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.dim_sizes import dim_length, sized
from graphc.dsl.dims import dim_index, one_element
from graphc.dsl.ops_divide import to_float
from graphc.dsl.ops_einsum import einsum
from graphc.dsl.promotion import kind
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.devices import factory

# -- elementwise ------------------------------------------------------------------------------


def sin(x: Tensor) -> Tensor:
    """Signature: ai.onnx@7::Sin"""
    return unary("Sin", x)


def cos(x: Tensor) -> Tensor:
    """Signature: ai.onnx@7::Cos"""
    return unary("Cos", x)


@autocast_op()
def rsqrt(x: Tensor) -> Tensor:
    """``1 / sqrt(x)`` (Reciprocal of Sqrt)."""
    return unary("Reciprocal", sqrt(x))


@autocast_op()
def pow(x: Any, exponent: Any) -> Tensor:  # noqa: A001 - torch's name
    """``x ** exponent``; a Python exponent takes ``x``'s dtype (refused where that changes it), a
    Python float base keeps float32. Signature: ai.onnx@15::Pow"""
    return binary("Pow", x, exponent)


def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - torch's names
    """``torch.clamp``: ``gc.clip`` under PyTorch's name."""
    return clip(x, min, max)


def zero_dim_value(fn: str, x: Tensor, value: Any) -> None:
    """Refuse a Tensor ``value`` of dims for ``x``, as torch's ``fn`` (``fill_``, ``masked_fill``) takes a 0-D one."""
    if isinstance(value, Tensor) and value.shape is not None and len(value.shape):  # an unknown rank trusted
        raise op_error(fn, [x, value], f"{fn} takes a 0-D Tensor value (as torch's), got one of {len(value.shape)} "
                       "dims; index one element (v[0]) or use where(mask, v, x)", user_source())


def masked_fill(x: Tensor, mask: Tensor, value: Any) -> Tensor:
    """``value`` where the bool ``mask`` (broadcast to ``x``) is true, else ``x``; ``value`` (a 0-D Tensor too)
    in ``x``'s dtype, as torch's: a float truncated into an integer one, an int out of its range refused.
    Signature: ai.onnx@16::Where"""
    x, mask = lift(x), lift(mask)
    if mask.dtype != "bool":
        raise op_error("Where", [x, mask], f"masked_fill's mask must be bool, got {mask.dtype}", user_source())
    if not isinstance(value, Tensor):
        in_range(x.dtype, value)
        value = lift(value, x)
    elif value.dtype != x.dtype:
        known_in_range(x.dtype, value)  # torch reads a 0-D value as a number, checked as one
    zero_dim_value("masked_fill", x, value)
    return emit("Where", [mask, value if value.dtype == x.dtype else cast(value, x.dtype), x])


# -- creation ---------------------------------------------------------------------------------


@factory
def full(size: Sequence[Any], fill_value: Any, dtype: Any = None, *, fn: str = "full") -> Tensor:
    """``size`` filled with ``fill_value`` (dtype: float32 for floats, int64 for ints, bool for bools, as PyTorch
    infers it): a constant where the sizes are ints, else a ConstantOfShape of the sizes read at run time (dim
    names, ``B * T``). Signature: ai.onnx@9::ConstantOfShape"""
    if dtype is None:
        category = kind(fill_value.dtype) if isinstance(fill_value, Tensor) else \
            0 if isinstance(fill_value, bool) else 1 if isinstance(fill_value, int) else 2
        dtype = ("bool", "int64", "float32")[category]
    dt = as_dtype(dtype)
    shape, shape_t = sized(tuple(size), fn)
    if isinstance(fill_value, Tensor):
        return _filled(fn, fill_value, dt, const_i64(shape) if shape_t is None else shape_t, shape)
    in_range(dt, fill_value)
    if shape_t is None:
        return constant(np.full(shape, fill_value, dt.numpy))
    return emit("ConstantOfShape", [shape_t], {"value": ir_tensor(np.full((1,), fill_value, dt.numpy))},
                out_types=[(dt, shape)])


def _filled(fn: str, value: Tensor, dtype: Any, shape_t: Tensor, shape: Any) -> Tensor:
    """A 0-D Tensor ``value`` cast to ``dtype`` (as torch reads it as a number: a float truncated, an int out of
    an integer dtype's range refused where its value is known at capture) and expanded to ``shape_t``."""
    if value.shape is None or len(value.shape):
        raise op_error(fn, [value], f"{fn} takes a number or a 0-D Tensor fill_value (as torch's), got a Tensor "
                       f"of shape {value.shape}; index one element (v[0])", user_source())
    known_in_range(dtype, value)
    value = value if value.dtype == dtype else cast(value, dtype)
    return emit("Expand", [value, shape_t], out_types=[(dtype, shape)])


@factory
def zeros(*size: Any, dtype: Any = "float32") -> Tensor:
    return full(size, 0, dtype, fn="zeros")


@factory
def ones(*size: Any, dtype: Any = "float32") -> Tensor:
    return full(size, 1, dtype, fn="ones")


@factory
def full_like(x: Tensor, fill_value: Any, dtype: Any = None) -> Tensor:
    """``x``'s shape (symbolic dims too) filled with ``fill_value``. Signature: ai.onnx@9::ConstantOfShape"""
    x = lift(x)
    dt = as_dtype(dtype if dtype is not None else x.dtype)
    if isinstance(fill_value, Tensor):
        return _filled("full_like", fill_value, dt, emit("Shape", [x]), x.shape)
    in_range(dt, fill_value)
    value = np.full((1,), fill_value, dt.numpy)
    return emit("ConstantOfShape", [emit("Shape", [x])], {"value": ir_tensor(value)},
                out_types=[(dt, x.shape)])


@factory
def zeros_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full_like(x, 0, dtype)


@factory
def ones_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full_like(x, 1, dtype)


def ir_tensor(array: np.ndarray):
    """``array`` as an attribute tensor (ConstantOfShape's ``value``)."""
    import onnx_ir as ir

    return ir.Tensor(array)


@factory
def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None) -> Tensor:
    """``torch.arange``: int64 for int arguments (dim names too), else float32. Python numbers give a constant;
    a Tensor or dim name bound gives ``Range`` (``arange(T)`` of a dim name ``T`` is ``[T]``). Signature:
    ai.onnx@11::Range"""
    if end is None:
        start, end = 0, start
    counted = isinstance(end, str) and not isinstance(start, (Tensor, str)) and start == 0 and step == 1
    return _range(start, end, step, dtype, str(end) if counted else None)


def _range(start: Any, end: Any, step: Any, dtype: Any, length: str | None) -> Tensor:
    """``arange``'s values; a Range's output of ``length`` (a dim name) where one is known."""
    args = (start, end, step)
    if dtype is None:
        floats = any(isinstance(a, float) or (isinstance(a, Tensor) and a.dtype.startswith("float")) for a in args)
        dtype = "float32" if floats else "int64"
    dt = as_dtype(dtype)
    if not any(isinstance(a, (Tensor, str)) for a in args):
        return constant(np.arange(start, end, step).astype(dt.numpy))
    parts = [run_time_int(a, f"arange's {k}", "Range") if isinstance(a, str) else a
             for k, a in zip(("start", "end", "step"), args)]
    parts = [lift(a).astype(dt) if isinstance(a, Tensor) else constant(np.asarray(a, dt.numpy)) for a in parts]
    return emit("Range", [reshape(p, []) if p.ndim else p for p in parts],
                out_types=[(dt, [length])] if length is not None else None)


# -- shapes -----------------------------------------------------------------------------------


def dim_positions(x: Tensor, dim: int) -> Tensor:
    """``0 .. size - 1`` along dim ``dim`` (non-negative) of ``x``, int64: a constant when it is static, else
    read at run time, its length ``x``'s dim name (the batch's ``N`` stays ``N`` through indexing by it)."""
    size = x.shape[dim]
    return arange(size) if isinstance(size, int) else _range(0, dim_length(x, dim), 1, None, size)


def static_dim(x: Tensor, dim: int, op: str) -> int:
    """The static size of ``x``'s ``dim``; a GraphError for ``op`` when it is symbolic or unknown."""
    size = x.shape[dim] if x.shape is not None else None
    if not isinstance(size, int):
        raise op_error(op, [x], f"needs a static size on dim {dim}", user_source())
    return size


def split(x: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.split``: pieces of ``split_size`` (the last one smaller) or of the listed sizes.
    Signature: ai.onnx@18::Split"""
    x = lift(x)
    dim = dim_index(x, dim, "Split")
    size = static_dim(x, dim, "Split")
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        sizes = [min(step, size - i) for i in range(0, size, step)]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != size:
            raise op_error("Split", [x], f"sections {sizes} do not add up to dim {dim}'s size {size}", user_source())
    if len(sizes) == 1:
        return (x,)
    outs = emit("Split", [x, const_i64(sizes)], {"axis": dim}, num_outputs=len(sizes))
    return tuple(outs)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``torch.chunk``: ``chunks`` pieces of ``ceil(size / chunks)`` (fewer when that covers it)."""
    x = lift(x)
    size = static_dim(x, dim_index(x, dim, "Split"), "Split")
    return split(x, max(1, math.ceil(size / chunks)), dim)


def expand(x: Tensor, *sizes: Any) -> Tensor:
    """``Tensor.expand``: -1 (or the input's dim name) keeps a dim. Signature: ai.onnx@13::Expand"""
    x = lift(x)
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    offset = len(sizes) - x.ndim
    dims = []
    for i, d in enumerate(sizes):
        keep = d == -1 or (isinstance(d, str) and i >= offset and x.shape[i - offset] == d)
        if not keep and not isinstance(d, (int, np.integer)):
            raise op_error("Expand", [x], f"size {d!r} is neither an int, -1 nor a dim name of the input",
                           user_source())
        dims.append(1 if keep else int(d))
    return emit("Expand", [x, const_i64(dims)])


def tile(x: Tensor, dims: Sequence[int]) -> Tensor:
    """``torch.tile``: ``dims`` shorter than the rank are padded with leading ones; longer ones
    add leading axes to ``x``. Signature: ai.onnx@13::Tile"""
    x = lift(x)
    dims = [int(d) for d in dims]
    if len(dims) > x.ndim:
        x = unsqueeze(x, list(range(len(dims) - x.ndim)))
    dims = [1] * (x.ndim - len(dims)) + dims
    return emit("Tile", [x, const_i64(dims)])


def repeat(x: Tensor, *sizes: Any) -> Tensor:
    """``Tensor.repeat`` (numpy's ``tile``): as many sizes as dims, or more."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    x = lift(x)
    if len(sizes) < x.ndim:
        raise op_error("Tile", [x], f"repeat needs at least {x.ndim} sizes, got {len(sizes)}", user_source())
    return tile(x, sizes)


@autocast_op()
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``torch.cat``: ``gc.concat`` under PyTorch's name."""
    return concat(tensors, dim)


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    """``torch.permute``: ``gc.transpose`` with a full permutation."""
    return transpose(x, list(dims))


@one_element("dims")
def flip(x: Tensor, dims: Sequence[int]) -> Tensor:
    """Reverse the order along each of ``dims``. Signature: ai.onnx@13::Slice (step -1)"""
    x = lift(x)
    dims = [dim_index(x, d, "Slice") for d in ([dims] if isinstance(dims, int) else dims)]
    k = len(dims)
    return emit("Slice", [x, const_i64([-1] * k), const_i64([np.iinfo(np.int64).min] * k), const_i64(dims),
                          const_i64([-1] * k)])


def roll(x: Tensor, shifts: Any, dims: Any = None) -> Tensor:
    """``torch.roll`` along ``dims`` (static sizes): each a Slice pair joined end to front;
    ``dims=None`` rolls the flattened tensor and restores its shape, as torch."""
    x = lift(x)
    if dims is None:
        flat = roll(reshape(x, [-1]), shifts, 0 if isinstance(shifts, int) else [0] * len(shifts))
        return reshape_like(flat, x)
    shifts, dims = ([shifts], [dims]) if isinstance(shifts, int) else (list(shifts), list(dims))
    for shift, dim in zip(shifts, dims):
        dim = dim_index(x, dim, "Slice")
        shift %= static_dim(x, dim, "Slice")
        if shift:
            head, tail = ((emit("Slice", [x, const_i64([a]), const_i64([b]), const_i64([dim])]))
                          for a, b in ((-shift, np.iinfo(np.int64).max), (0, -shift)))
            x = concat([head, tail], dim)
    return x


def _trilu(x: Tensor, diagonal: int, upper: int) -> Tensor:
    return emit("Trilu", [lift(x), constant(np.asarray(diagonal, np.int64))], {"upper": upper})


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """Zero below the ``diagonal``-th diagonal. Signature: ai.onnx@14::Trilu"""
    return _trilu(x, diagonal, 1)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """Zero above the ``diagonal``-th diagonal. Signature: ai.onnx@14::Trilu"""
    return _trilu(x, diagonal, 0)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
# (mode, dims padded) -> torch's op, for autocast's policy
_PADS = {(mode, nd): f"{op}_pad{nd}d" for mode, op in (("reflect", "reflection"), ("replicate", "replication"))
         for nd in (1, 2, 3)}


@autocast_op(named=lambda a: _PADS.get((a["mode"], len(a["pad"]) // 2)))
def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """``torch.nn.functional.pad``: ``pad`` lists (left, right) pairs from the last dim backwards;
    modes constant, reflect, replicate, circular; negative pads crop, as in torch. Signature: ai.onnx@19::Pad"""
    x = lift(x)
    if mode not in _PAD_MODES:
        raise CaptureError(f"pad mode={mode!r}; expected one of {sorted(_PAD_MODES)} (at {user_source()})")
    if mode != "constant" and value:
        raise CaptureError(f"pad mode={mode!r} takes no value (got {value}), as in torch (at {user_source()})")
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise op_error("Pad", [x], f"pad {pad} must hold (left, right) pairs for at most {x.ndim} dims",
                       user_source())
    begin, end = [0] * x.ndim, [0] * x.ndim
    for i in range(len(pad) // 2):
        begin[x.ndim - 1 - i], end[x.ndim - 1 - i] = pad[2 * i], pad[2 * i + 1]
    for axis, (before, after) in enumerate(zip(begin, end)):
        _check_pad(x, mode, axis, before, after)
    pads = begin + end
    if mode == "reflect" and min(pads) < 0:
        # torch mirrors within the whole dim and then crops; ONNX Pad crops first (and mirrors less)
        if max(pads) > 0:
            x = _pad_node(x, [max(p, 0) for p in pads], "reflect")
        return _pad_node(x, [min(p, 0) for p in pads], "constant")
    return _pad_node(x, pads, _PAD_MODES[mode], value if mode == "constant" else None)


def _pad_node(x: Tensor, pads: list[int], mode: str, value: float | None = None) -> Tensor:
    inputs = [x, const_i64(pads)] + ([scalar(value, x)] if value else [])
    return emit("Pad", inputs, {"mode": mode})


def _check_pad(x: Tensor, mode: str, axis: int, before: int, after: int) -> None:
    """torch's limits on one dim's pads, where its size is static: no crop past the dim, reflect
    pads smaller than the dim, circular ones no larger than what the crops leave of it."""
    size = x.shape[axis] if x.shape is not None else None
    if not isinstance(size, int) or before == after == 0:
        return
    kept = size - max(-before, 0) - max(-after, 0)
    problem = None
    if kept < 0 or size + before + after < 0:
        problem = f"crops more than dim {axis}'s size {size}"
    elif mode == "reflect" and max(before, after) >= size:
        problem = f"reflect pads must be smaller than dim {axis}'s size {size}"
    elif mode == "circular" and max(before, after) > kept:
        problem = f"circular pads wrap around dim {axis} more than once (the crops leave {kept} of its {size})"
    if problem:
        raise op_error("Pad", [x], f"pad ({before}, {after}) {problem}", user_source())


# -- indexing ---------------------------------------------------------------------------------


def _indices(index: Tensor, op: str, x: Tensor) -> Tensor:
    index = lift(index)
    if index.dtype not in ("int64", "int32"):
        raise op_error(op, [x, index], f"index must be int64 or int32, got {index.dtype}", user_source())
    return index


@one_element()
def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """``torch.gather``: ``out[i][j] = x[index[i][j]][j]`` for ``dim=0``. Signature: ai.onnx@13::GatherElements"""
    x = lift(x)
    axis = dim_index(x, dim, "GatherElements")
    return emit("GatherElements", [x, _indices(index, "GatherElements", x)], {"axis": axis})


def refusing_negatives(index: Tensor, x: Tensor, axis: int) -> Tensor:
    """``index`` with each negative entry moved below ``-size`` (``x``'s dim ``axis``), where the backends'
    Gather refuses it, as torch refuses a negative index ("index out of range in self"): ONNX's Gather
    reads [-size, 0) from the end, a silently wrong row. The backend's error names the entry less the
    size (-1 of 5 rows as -6)."""
    size = x.shape[axis] if x.shape is not None and isinstance(x.shape[axis], int) else None
    size = constant(np.asarray(size, dtype=index.dtype)) if size is not None else \
        cast(dim_read(x, axis % x.ndim), index.dtype)
    return where(index < constant(np.asarray(0, dtype=index.dtype)), index - size, index)


@one_element()
def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries of 1-D ``index`` along ``dim`` (a 0-D index is one entry: the dim stays, as in
    torch); a negative one fails in the backend, as torch refuses it (``refusing_negatives``).
    Signature: ai.onnx@13::Gather"""
    x = lift(x)
    index = _indices(index, "Gather", x)
    if index.shape is not None and len(index.shape) > 1:
        raise op_error("Gather", [x, index], f"index_select takes a 1-D index, as torch, got rank {len(index.shape)} "
                       "(x[index] picks rows by a multi-dim index)", user_source())
    if index.shape == ():
        index = reshape(index, [1])
    axis = dim_index(x, dim, "Gather")
    return emit("Gather", [x, refusing_negatives(index, x, axis)], {"axis": axis})


@one_element()
def scatter(x: Tensor, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
    """``torch.scatter``: ``x`` with ``src`` (a tensor, or a scalar spread over ``index``'s shape)
    written at ``index`` along ``dim``; ``reduce`` "add"/"multiply". Signature: ai.onnx@18::ScatterElements"""
    x = lift(x)
    index = _indices(index, "ScatterElements", x)
    src = lift(src, x)
    if src.ndim == 0:
        src = emit("Expand", [src, emit("Shape", [index])], out_types=[(x.dtype, index.shape)])
    same_dtype("ScatterElements", x, src)
    reductions = {None: "none", "add": "add", "multiply": "mul"}
    if reduce not in reductions:
        raise CaptureError(f"scatter reduce={reduce!r}; expected None, 'add' or 'multiply' (at {user_source()})")
    attrs = {"axis": dim_index(x, dim, "ScatterElements")}
    if reduce is not None:
        attrs["reduction"] = reductions[reduce]
    return emit("ScatterElements", [x, index, src], attrs)


def one_hot(x: Tensor, num_classes: int = -1) -> Tensor:
    """int64 ``[..., num_classes]`` with a 1 at each index; ``num_classes`` must be given (PyTorch's
    -1, the data's max + 1, is not known to a graph). Signature: ai.onnx@11::OneHot"""
    x = _indices(x, "OneHot", lift(x))
    if num_classes is None or int(num_classes) < 1:
        raise CaptureError(f"one_hot needs num_classes >= 1 (the graph cannot read it from the data), got "
                         f"{num_classes} (at {user_source()})")
    if x.shape is not None and not x.shape:  # ONNX's OneHot takes indices of rank >= 1; torch's a 0-d one too
        return reshape(one_hot(reshape(x, [1]), num_classes), [int(num_classes)])
    depth = constant(np.asarray(int(num_classes), np.int64))
    values = constant(np.asarray([0, 1], np.int64))
    return emit("OneHot", [x, depth, values], {"axis": -1})


# -- reductions and scans ---------------------------------------------------------------------


@one_element()
@autocast_op()
@in_float32
def cumsum(x: Tensor, dim: int) -> Tensor:
    """Running sum along ``dim``; of a bool or integer Tensor, in int64 as torch's. Signature: ai.onnx@14::CumSum"""
    x = int64_accumulated(lift(x))
    return emit("CumSum", [x, constant(np.asarray(dim_index(x, dim, "CumSum"), np.int64))])


def nan_as(x: Tensor, fill: float) -> Tensor:
    """``x`` with each NaN read as ``fill`` (a float ``x``; other dtypes have none)."""
    return where(unary("IsNaN", x), scalar(fill, x), x) if x.dtype in FLOAT_DTYPES else x


def arg_index(op: str, x: Tensor, dim: int | None, keepdim: bool) -> Tensor:
    """ArgMax/ArgMin's first index along ``dim`` (None: of all, ``keepdim`` keeping all dims as 1); a NaN's if any."""
    x = lift(x)
    if dim is None:
        flat = arg_index(op, reshape(x, [-1]), 0, False)
        return reshape(flat, [1] * x.ndim) if keepdim else flat
    attrs = {"axis": dim_index(x, dim, op), "keepdims": int(bool(keepdim))}
    if x.dtype not in FLOAT_DTYPES:
        return emit(op, [x], attrs)
    index, nans = emit(op, [x], attrs), cast(emit("IsNaN", [x]), "int32")
    return where(reduction("ReduceMax", nans, [attrs["axis"]], bool(keepdim)) > scalar(0, nans),
                 emit("ArgMax", [nans], attrs), index)


@one_element()
def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """int64 index of the largest entry (first on ties; a NaN's first). Signature: ai.onnx@13::ArgMax"""
    return arg_index("ArgMax", x, dim, keepdim)


@one_element()
def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """int64 index of the smallest entry (first on ties; a NaN's first). Signature: ai.onnx@13::ArgMin"""
    return arg_index("ArgMin", x, dim, keepdim)


@one_element()
def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> tuple[Tensor, Tensor]:  # noqa: A002 - torch's name
    """``(values, indices)`` of the ``k`` largest (or smallest) along ``dim``. Signature: ai.onnx@11::TopK"""
    x = lift(x)
    attrs = {"axis": dim_index(x, dim, "TopK"), "largest": int(bool(largest)), "sorted": int(bool(sorted))}
    if x.dtype not in FLOAT_DTYPES:
        return tuple(emit("TopK", [x, const_i64([int(k)])], attrs, num_outputs=2))
    index = emit("TopK", [sort_key(x), const_i64([int(k)])], attrs, num_outputs=2)[1]
    return gather(x, attrs["axis"], index), index


def sort_key(x: Tensor) -> Tensor:
    """A TopK key ordering a float ``x`` as torch (onnxruntime's TopK places NaNs by position): ``x`` in
    float64, +inf as float64's largest finite value (ties it), NaN as +inf, so NaN is the largest."""
    key = cast(x, "float64")
    key = where(emit("IsInf", [x], {"detect_negative": 0}), scalar(np.finfo(np.float64).max, key), key)
    return where(emit("IsNaN", [x]), scalar(np.inf, key), key)


def sort_order(x: Tensor, dim: int, descending: bool) -> Tensor:
    """The int64 indices that sort ``x`` along ``dim`` (>= 0) as torch's stable sort, a NaN the
    largest (``sort_key``); equal values in their order, as TopK keeps them."""
    key = sort_key(x) if x.dtype in FLOAT_DTYPES else x
    return emit("TopK", [key, dim_length(x, dim)], {"axis": dim, "largest": int(bool(descending)), "sorted": 1},
                num_outputs=2, out_types=[(key.dtype, x.shape), ("int64", x.shape)])[1]


@autocast_op("logsumexp")
@one_element()
@in_float32
def logsumexp(x: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` over ``dim``, computed from the maximum so it never overflows; an
    infinite maximum is taken as 0, as torch does, so a slice of -inf gives -inf (not nan); an integer
    Tensor is read as float32, as torch's."""
    x = to_float(lift(x))
    top = reduction("ReduceMax", x, dim, True)  # a NaN the sum carries: no NaN step (gc.max's) needed
    top = where(emit("IsInf", [top]), scalar(0.0, top), top)
    out = log(reduce_sum(exp(x - top), dim, keepdims=True)) + top
    return out if keepdim else squeeze(out, [dim] if isinstance(dim, int) else list(dim))


@one_element()
@in_float32
def var(x: Tensor, dim: Any = None, correction: int = 1, keepdim: bool = False, *,
        unbiased: bool | None = None) -> Tensor:
    """``torch.var``: mean squared deviation over ``dim`` (None: all), divided by ``n - correction``
    (static ``n``); torch's older ``unbiased=False`` is ``correction=0``, ``var(x, False)`` too."""
    x = lift(x)
    if isinstance(dim, bool):  # torch.var(x, unbiased)
        dim, unbiased = None, dim
    correction = correction if unbiased is None else int(bool(unbiased))
    dims = list(range(x.ndim)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    n = math.prod(static_dim(x, d, "ReduceSum") for d in dims)
    centered = x - mean(x, dims, keepdims=True)
    return reduce_sum(centered * centered, dims, keepdims=keepdim) / scalar(n - correction, x)


@one_element()
@in_float32
def std(x: Tensor, dim: Any = None, correction: int = 1, keepdim: bool = False, *,
        unbiased: bool | None = None) -> Tensor:
    """``torch.std``: the square root of ``var``; where that is 0, a 0 gradient (torch's), not sqrt's NaN."""
    v = var(x, dim, correction, keepdim, unbiased=unbiased)
    zero = v == scalar(0.0, v)
    return where(zero, scalar(0.0, v), sqrt(where(zero, scalar(1.0, v), v)))


__all__ = [
    "arange", "argmax", "argmin", "cat", "chunk", "flip", "logsumexp", "roll", "std", "var", "clamp", "cos", "cumsum", "einsum", "expand", "full", "full_like",
    "gather", "index_select", "masked_fill", "one_hot", "ones", "ones_like", "pad", "permute", "pow", "repeat", "rsqrt",
    "scatter", "sin", "split", "tile", "topk", "tril", "triu", "zeros", "zeros_like",
]
