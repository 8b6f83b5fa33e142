"""PyTorch's ``Tensor`` methods on ``gc.Tensor`` (``x.view``, ``x.permute``, ``x.size()``,
``x.masked_fill``, ``x.split``, ``x.float()``, ...), bound to the class at import as ``methods``
binds the operators, so a ``forward`` written for torch runs unchanged. A name ``methods``
already defines keeps its definition there."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import (
    grad_hooks,
    linalg_legacy,
    methods_values,
    ops,
    ops_aliases,
    ops_array,
    ops_binary,
    ops_counts,
    ops_divide,
    ops_elementwise,
    ops_factories,
    ops_layers,
    ops_linalg,
    ops_math,
    ops_nextafter,
    ops_order,
    ops_reshape,
    ops_sample,
    ops_scatter,
    ops_search,
    ops_solve,
    ops_special,
    ops_spectral,
    ops_stats,
    ops_strided,
    ops_torch_misc,
    ops_views,
)
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.devices import device, is_device
from graphc.dsl.inplace import in_place
from graphc.dsl.tensor import Tensor, is_contiguous, strides, view_strides
from graphc.errors import CaptureError
from graphc.model.dtypes import as_dtype


def _dims(dims: tuple) -> list:
    return list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else list(dims)


def _dims_or_keyword(method: str, dims: tuple, keyword: Any) -> list:
    """torch's three spellings of a method's dims: ``x.permute(0, 2, 1)``, ``x.permute((0, 2, 1))``
    and ``x.permute(dims=(0, 2, 1))``."""
    if dims and keyword is not None:
        raise CaptureError(f"{method}() got its dims both positionally and by keyword (at {user_source()})")
    if keyword is None:
        return _dims(dims)
    return [keyword] if isinstance(keyword, (int, np.integer)) else list(keyword)


def _permute(self: Tensor, *args: Any, dims: Any = None) -> Tensor:
    return ops.transpose(self, _dims_or_keyword("permute", args, dims))


def _flip(self: Tensor, *args: Any, dims: Any = None) -> Tensor:
    return ops_array.flip(self, _dims_or_keyword("flip", args, dims))


def _squeeze(self: Tensor, *args: Any, dim: Any = None) -> Tensor:
    """``x.squeeze()``, ``x.squeeze(1)``, ``x.squeeze((0, 1))`` or ``x.squeeze(dim=1)``."""
    return ops_reshape.squeeze(self, _dims_or_keyword("squeeze", args, dim) or None)


def _view(self: Tensor, *shape: Any) -> Tensor:
    """``x.view(*shape)``: a Reshape, where torch can view ``x``'s strides as ``shape``; where it cannot (a
    transposed or strided view spanning the merged dims), torch's error, not a silent copy as ``reshape``."""
    out = ops.reshape(self, _dims(shape))
    old = strides(self)
    static = out.shape is not None and all(isinstance(d, int) for d in out.shape)
    if old is not None and static and view_strides(self.shape, old, out.shape) is None:
        raise op_error("view", [self], f"view size {list(out.shape)} is not compatible with the input's size "
                       f"{list(self.shape)} and strides {list(old)} (at least one dimension spans across two "
                       f"contiguous subspaces), as torch's; use .reshape(...) to copy", user_source())
    return out


def _size(self: Tensor, dim: int | None = None) -> Any:
    """``x.size()`` is the shape (ints and dim names); ``x.size(d)`` one dim."""
    return self.shape if dim is None else self.shape[dim]


def _new_full(self: Tensor, size: Any, fill_value: Any, dtype: Any = None) -> Tensor:
    """``x.new_full(size, fill_value)``: a constant of ``x``'s dtype unless ``dtype`` says otherwise."""
    return ops_array.full(size, fill_value, self.dtype if dtype is None else dtype)


# torch's legacy tensor type names (``x.type()``) by dtype
TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor", "int16": "ShortTensor",
               "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor"}


def _dtype_or_device(arg: Any) -> tuple[Any, bool]:
    """``(dtype, False)`` for a dtype (a gc dtype, its name, a numpy or torch dtype), ``(None, True)``
    for a torch device or its name; a CaptureError for anything else."""
    text = str(arg).removeprefix("torch.")
    try:
        return as_dtype(text if text != str(arg) else arg), False
    except TypeError:
        pass
    if is_device(text) or is_device(arg):  # ``x.to("cuda:0")`` captures as ``x``: the session's backend places it
        return None, True
    raise CaptureError(f"to() takes a dtype, a device (cpu, cuda[:N], mps, xpu, hip, meta) or a Tensor, got "
                       f"{arg!r} (at {user_source()})")


def _to(self: Tensor, *args: Any, dtype: Any = None, device: Any = None, non_blocking: bool = False,
        copy: bool = False, memory_format: Any = None) -> Tensor:
    """``x.to(dtype)``, ``x.to(other)`` (its dtype), ``x.to(device, dtype=None)``: a Cast when the
    dtype changes; a device is accepted and ignored (graphs are device-free: a gc.Session's backend
    places them)."""
    targets = [dtype] if dtype is not None else []
    for arg in ([device] if device is not None else []) + list(args):
        if isinstance(arg, Tensor):
            targets.append(arg.dtype)
        else:
            found, _ = _dtype_or_device(arg)
            targets += [found] if found is not None else []
    if len(targets) > 1:
        raise CaptureError(f"to() got more than one dtype: {targets} (at {user_source()})")
    return ops.cast(self, targets[0]) if targets and targets[0] != self.dtype else self


def _as(self: Tensor, dtype: Any) -> Tensor:
    """``x.double()``, ``x.type_as(y)``, ...: ``x`` cast to ``dtype``, or ``x`` itself where it has it, as torch's."""
    return self if as_dtype(dtype) == self.dtype else ops.cast(self, dtype)


def _type(self: Tensor, dtype: Any = None, non_blocking: bool = False) -> Any:
    """``x.type()``: torch's type name (``"torch.FloatTensor"``); ``x.type(dtype)``: ``x`` cast, the
    dtype also as such a name."""
    if dtype is None:
        return f"torch.{TYPE_NAMES.get(self.dtype, self.dtype)}"
    names = {f"torch.{v}": k for k, v in TYPE_NAMES.items()}
    found, device = _dtype_or_device(names.get(str(dtype), dtype))
    if device:
        raise CaptureError(f"type() takes a dtype, got the device {dtype!r} (at {user_source()})")
    return ops.cast(self, found) if found != self.dtype else self


METHODS = {
    "view": _view,
    "permute": _permute,
    "size": _size,
    "dim": lambda a: a.ndim,
    "unsqueeze": ops_reshape.unsqueeze,
    "squeeze": _squeeze,
    "contiguous": lambda a: a if is_contiguous(a) else ops_reshape.clone(a),
    "float": lambda a: _as(a, "float32"), "double": lambda a: _as(a, "float64"),
    "half": lambda a: _as(a, "float16"), "long": lambda a: _as(a, "int64"),
    "cfloat": lambda a: ops.cast(a, "complex64"), "cdouble": lambda a: ops.cast(a, "complex128"),
    "int": lambda a: _as(a, "int32"), "bool": lambda a: _as(a, "bool"),
    "type_as": lambda a, other: _as(a, other.dtype),
    "matmul": ops.matmul, "mm": ops_linalg.mm, "bmm": ops_linalg.bmm,
    "sigmoid": ops.sigmoid, "tanh": ops.tanh, "abs": ops.abs, "erf": ops.erf,
    "masked_fill": ops_array.masked_fill, "split": ops_array.split, "chunk": ops_array.chunk,
    "expand": ops_array.expand, "repeat": ops_array.repeat, "pow": ops_array.pow, "clamp": ops_array.clamp,
    "cumsum": ops_array.cumsum, "argmax": ops_array.argmax, "argmin": ops_array.argmin, "topk": ops_array.topk,
    "gather": ops_array.gather, "index_select": ops_array.index_select, "scatter": ops_array.scatter,
    "tril": ops_array.tril, "triu": ops_array.triu, "sin": ops_array.sin, "cos": ops_array.cos,
    "rsqrt": ops_array.rsqrt,
    "var": ops_array.var, "std": ops_array.std, "logsumexp": ops_array.logsumexp, "roll": ops_array.roll,
    "flip": _flip,
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
    "expand_as": ops_views.expand_as, "view_as": lambda a, other: _view(a, other.shape), "reshape_as": ops.reshape_like,
    "new_zeros": lambda a, *size, dtype=None: _new_full(a, _dims(size), 0, dtype),
    "new_ones": lambda a, *size, dtype=None: _new_full(a, _dims(size), 1, dtype),
    "new_full": _new_full, "clone": ops_reshape.clone, "numel": ops_reshape.numel,
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
    # arrays: reshaping, splitting, scattering, masks and dtypes
    "unbind": ops_reshape.unbind, "tensor_split": ops_reshape.tensor_split, "hsplit": ops_reshape.hsplit,
    "vsplit": ops_reshape.vsplit, "dsplit": ops_reshape.dsplit, "split_with_sizes": ops_reshape.split_with_sizes,
    "swapaxes": ops_reshape.swapaxes, "swapdims": ops_reshape.swapdims, "rot90": ops_reshape.rot90,
    "fliplr": ops_reshape.fliplr, "flipud": ops_reshape.flipud, "ravel": ops_reshape.ravel,
    "broadcast_to": ops_reshape.broadcast_to, "take_along_dim": ops_reshape.take_along_dim, "take": ops_reshape.take,
    "scatter_add": ops_scatter.scatter_add, "scatter_reduce": ops_scatter.scatter_reduce,
    "index_fill": ops_scatter.index_fill, "index_put": ops_scatter.index_put,
    "select_scatter": ops_scatter.select_scatter, "slice_scatter": ops_scatter.slice_scatter,
    "diagonal_scatter": ops_scatter.diagonal_scatter, "masked_scatter": ops_scatter.masked_scatter,
    "masked_select": ops_scatter.masked_select, "nonzero": ops_scatter.nonzero, "argwhere": ops_scatter.argwhere,
    "short": lambda a: ops.cast(a, "int16"), "byte": lambda a: ops.cast(a, "uint8"),
    "char": lambda a: ops.cast(a, "int8"), "bfloat16": lambda a: ops.cast(a, "bfloat16"),
    "to": _to, "type": _type, "ndimension": lambda a: a.ndim, "nelement": ops_reshape.numel,
    "device": property(lambda a: device("cpu")), "is_cuda": property(lambda a: False),  # the session's backend places it
    "element_size": lambda a: a.dtype.numpy.itemsize, "is_floating_point": ops_reshape.is_floating_point,
    "is_complex": lambda a: False,
    # elementwise functions of two or three Tensors, comparisons and bitwise ops (ops_binary)
    **{name: getattr(ops_binary, name) for name in ops_binary.__all__},
    # one-input elementwise math (ops_elementwise)
    **{name: getattr(ops_elementwise, name) for name in ops_elementwise.__all__},
    "hardshrink": ops_layers.hardshrink,
    # random numbers: sampling from a tensor, and refilling it in place (ops_sample.py)
    "bernoulli": ops_sample.bernoulli, "multinomial": ops_sample.multinomial, "uniform_": ops_sample.uniform_,
    "normal_": ops_sample.normal_, "bernoulli_": ops_sample.bernoulli_, "exponential_": ops_sample.exponential_,
    "geometric_": ops_sample.geometric_, "cauchy_": ops_sample.cauchy_, "log_normal_": ops_sample.log_normal_,
    "random_": ops_sample.random_,
    # creation and combinatorics (ops_factories.py)
    "new_tensor": ops_factories.new_tensor, "new_empty": ops_factories.new_empty,
    # short-time Fourier transforms (ops_spectral.py)
    "stft": ops_spectral.stft, "istft": ops_spectral.istft,
    # simple methods, in-place forms and the conjugate family of real dtypes (ops_aliases.py)
    **ops_aliases.METHODS,
    # reading values into Python, the legacy new, and torch's autograd attributes (methods_values.py)
    **methods_values.METHODS,
    # searching, binning, distances, windows over a dim and index writes (ops_search.py)
    "unfold": ops_search.windows, "put": ops_search.put, "put_": in_place(ops_search.put),
    "index_reduce": ops_search.index_reduce, "index_reduce_": in_place(ops_search.index_reduce),
    "fill_diagonal_": in_place(ops_search.fill_diagonal), "renorm": ops_search.renorm,
    "renorm_": in_place(ops_search.renorm), "histogram": ops_search.histogram,
    # special functions (ops_special.py), and their in-place forms
    "lgamma": ops_special.lgamma, "digamma": ops_special.digamma, "i0": ops_special.i0, "igamma": ops_special.igamma,
    "igammac": ops_special.igammac, "mvlgamma": ops_special.mvlgamma, "frexp": ops_special.frexp,
    "ldexp": ops_special.ldexp, "polygamma": lambda a, n: ops_special.polygamma(n, a),
    **{f"{name}_": in_place(getattr(ops_special, name))
       for name in ("lgamma", "digamma", "i0", "igamma", "igammac", "mvlgamma", "ldexp")},
    "polygamma_": in_place(lambda a, n: ops_special.polygamma(n, a)),
    # solvers and factorizations (ops_solve.py)
    "inverse": ops_solve.inverse, "cholesky": ops_solve.cholesky, "cholesky_solve": ops_solve.cholesky_solve,
    "cholesky_inverse": ops_solve.cholesky_inverse, "matrix_power": ops_solve.matrix_power,
    "matrix_exp": ops_solve.matrix_exp, "triangular_solve": ops_solve.triangular_solve,
    "lu_solve": lambda b, LU_data, LU_pivots: ops_solve.lu_solve(LU_data, LU_pivots, b),
    # counting and uniqueness (ops_counts.py), nextafter (ops_nextafter.py)
    "bincount": ops_counts.bincount, "unique": ops_counts.unique, "unique_consecutive": ops_counts.unique_consecutive,
    "nextafter": ops_nextafter.nextafter, "nextafter_": in_place(ops_nextafter.nextafter),
    # the torch coverage sweep (linalg_legacy.py, ops_strided.py, ops_torch_misc.py)
    "svd": linalg_legacy.svd, "qr": linalg_legacy.qr, "lu": linalg_legacy.lu, "pinverse": linalg_legacy.pinverse,
    "as_strided": ops_strided.as_strided, "as_strided_scatter": ops_strided.as_strided_scatter,
    "nonzero_static": ops_torch_misc.nonzero_static, "unsafe_chunk": ops_torch_misc.unsafe_chunk,
    "unsafe_split": ops_torch_misc.unsafe_split, "unsafe_split_with_sizes": ops_torch_misc.unsafe_split_with_sizes,
    "angle": ops_torch_misc.angle,
    # gradient hooks (grad_hooks.py): gc.autograd.Functions whose backward is the hook
    "register_hook": grad_hooks.register_hook,
}

for _name, _method in METHODS.items():
    if not hasattr(Tensor, _name):
        setattr(Tensor, _name, _method)
