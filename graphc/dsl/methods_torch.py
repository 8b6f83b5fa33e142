"""PyTorch's ``Tensor`` methods on ``gc.Tensor`` (``x.view``, ``x.permute``, ``x.size()``,
``x.masked_fill``, ``x.split``, ``x.float()``, ...), bound to the class at import as ``methods``
binds the operators, so a ``forward`` written for torch runs unchanged. A name ``methods``
already defines keeps its definition there."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl import ops, ops_array, ops_divide, ops_linalg, ops_math, ops_order, ops_stats, ops_views
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.tensor import Tensor


def _dims(dims: tuple) -> list:
    return list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else list(dims)


def _size(self: Tensor, dim: int | None = None) -> Any:
    """``x.size()`` is the shape (ints and dim names); ``x.size(d)`` one dim."""
    return tuple(self.shape) if dim is None else self.shape[dim]


def _numel(self: Tensor) -> int:
    """``x.numel()``, where every dim is static."""
    if self.shape is None or not all(isinstance(d, int) for d in self.shape):
        raise op_error("Size", [self], "numel() needs static dims; gc.sum(gc.ones_like(x)) counts at run time",
                       user_source())
    return math.prod(self.shape)


def _new_full(self: Tensor, size: Any, fill_value: Any, dtype: Any = None) -> Tensor:
    """``x.new_full(size, fill_value)``: a constant of ``x``'s dtype unless ``dtype`` says otherwise."""
    return ops_array.full(size, fill_value, self.dtype if dtype is None else dtype)


METHODS = {
    "view": lambda a, *shape: ops.reshape(a, _dims(shape)),
    "permute": lambda a, *dims: ops.transpose(a, _dims(dims)),
    "size": _size,
    "dim": lambda a: a.ndim,
    "unsqueeze": lambda a, dim: ops.unsqueeze(a, [dim]),
    "squeeze": lambda a, dim=None: ops.squeeze(a, None if dim is None else [dim]),
    "contiguous": lambda a: a,
    "float": lambda a: ops.cast(a, "float32"), "double": lambda a: ops.cast(a, "float64"),
    "half": lambda a: ops.cast(a, "float16"), "long": lambda a: ops.cast(a, "int64"),
    "int": lambda a: ops.cast(a, "int32"), "bool": lambda a: ops.cast(a, "bool"),
    "type_as": lambda a, other: ops.cast(a, other.dtype),
    "matmul": ops.matmul, "mm": ops_linalg.mm, "bmm": ops_linalg.bmm,
    "sigmoid": ops.sigmoid, "tanh": ops.tanh, "abs": ops.abs, "erf": ops.erf,
    "masked_fill": ops_array.masked_fill, "split": ops_array.split, "chunk": ops_array.chunk,
    "expand": ops_array.expand, "repeat": ops_array.repeat, "pow": ops_array.pow, "clamp": ops_array.clamp,
    "cumsum": ops_array.cumsum, "argmax": ops_array.argmax, "argmin": ops_array.argmin, "topk": ops_array.topk,
    "gather": ops_array.gather, "index_select": ops_array.index_select, "scatter": ops_array.scatter,
    "tril": ops_array.tril, "triu": ops_array.triu, "sin": ops_array.sin, "cos": ops_array.cos,
    "rsqrt": ops_array.rsqrt,
    "var": ops_array.var, "std": ops_array.std, "logsumexp": ops_array.logsumexp, "roll": ops_array.roll,
    "flip": lambda a, *dims: ops_array.flip(a, _dims(dims)),
    "remainder": ops_divide.remainder, "fmod": ops_divide.fmod,
    "maximum": ops.maximum, "minimum": ops.minimum, "where": lambda a, condition, other: ops.where(condition, a, other),
    "square": ops_math.square, "reciprocal": ops_math.reciprocal, "neg": ops_math.neg, "negative": ops_math.neg,
    "sign": ops_math.sign, "floor": ops_math.floor, "ceil": ops_math.ceil, "round": ops_math.round,
    "trunc": ops_math.trunc, "frac": ops_math.frac, "logaddexp": ops_math.logaddexp,
    "logical_not": ops_math.logical_not, "logical_and": ops_math.logical_and, "logical_or": ops_math.logical_or,
    "logical_xor": ops_math.logical_xor, "isnan": ops_math.isnan, "isinf": ops_math.isinf,
    "isfinite": ops_math.isfinite, "nan_to_num": ops_math.nan_to_num,
    "prod": ops_math.prod, "amax": ops_math.amax, "amin": ops_math.amin, "any": ops_math.any, "all": ops_math.all,
    "norm": ops_math.norm,
    "unflatten": ops_views.unflatten, "movedim": ops_views.movedim, "moveaxis": ops_views.movedim,
    "narrow": ops_views.narrow, "select": ops_views.select, "t": ops_views.t, "mT": property(ops_views.swap_last),
    "diff": ops_views.diff, "sort": ops_views.sort, "argsort": ops_views.argsort, "outer": ops_views.outer,
    "addmm": ops_views.addmm, "baddbmm": ops_views.baddbmm, "index_add": ops_views.index_add,
    "index_copy": ops_views.index_copy, "repeat_interleave": ops_views.repeat_interleave,
    "expand_as": ops_views.expand_as, "view_as": ops.reshape_like, "reshape_as": ops.reshape_like,
    "new_zeros": lambda a, *size, dtype=None: _new_full(a, _dims(size), 0, dtype),
    "new_ones": lambda a, *size, dtype=None: _new_full(a, _dims(size), 1, dtype),
    "new_full": _new_full, "clone": lambda a, memory_format=None: Tensor(a.value, a.eager_value), "numel": _numel,
    "median": ops_order.median, "nanmedian": ops_order.nanmedian, "cummax": ops_order.cummax,
    "cummin": ops_order.cummin,
    # matrix products, diagonals, determinants, cumulative products (ops_linalg)
    "mv": ops_linalg.mv, "dot": ops_linalg.dot, "vdot": ops_linalg.vdot, "inner": ops_linalg.inner,
    "kron": ops_linalg.kron, "cross": ops_linalg.cross, "diag": ops_linalg.diag, "diagonal": ops_linalg.diagonal,
    "diag_embed": ops_linalg.diag_embed, "diagflat": ops_linalg.diagflat, "trace": ops_linalg.trace,
    "addmv": ops_linalg.addmv, "addr": ops_linalg.addr, "addbmm": ops_linalg.addbmm, "det": ops_linalg.det,
    "logdet": ops_linalg.logdet, "slogdet": ops_linalg.slogdet, "cumprod": ops_linalg.cumprod,
    "logcumsumexp": ops_linalg.logcumsumexp,
    # NaN-aware reductions, quantiles and statistics
    "nansum": ops_stats.nansum, "nanmean": ops_stats.nanmean, "count_nonzero": ops_stats.count_nonzero,
    "aminmax": ops_stats.aminmax, "quantile": ops_stats.quantile, "nanquantile": ops_stats.nanquantile,
    "kthvalue": ops_stats.kthvalue, "mode": ops_stats.mode, "cov": ops_stats.cov, "corrcoef": ops_stats.corrcoef,
    "dist": ops_stats.dist, "histc": ops_stats.histc,
}

for _name, _method in METHODS.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _method)
