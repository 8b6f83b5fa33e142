"""Fractional max pooling (``torch.nn.functional.fractional_max_pool2d`` / ``3d``, Graham 2014): ``k``-wide
windows whose starts are torch's pseudo-random sequence ``int((i + u) * alpha) - int(u * alpha)``
(``alpha = (in - k) / (out - 1)``, the last start ``in - k``) from one uniform ``u`` per sample, channel
and dim, ``_random_samples`` ``(N, C, nd)`` (drawn in the graph when not given; torch's order of the
dims in it: W, H for 2-D, T, H, W for 3-D). The windows are gathered at computed flat indices; each
output is the first largest of its window (the last NaN if any, as torch), with its flat index in the
plane."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import (
    cast,
    constant,
    emit,
    lift,
    reshape,
    scalar,
    squeeze,
    unsqueeze,
    where,
)
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_array import argmax, expand, flip, full_like
from graphc.dsl.ops_math import floor
from graphc.dsl.ops_sample import rand_like
from graphc.dsl.ops_views import narrow
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES

_SAMPLE_DIM = {2: [1, 0], 3: [0, 1, 2]}  # spatial dim d reads _random_samples[..., _SAMPLE_DIM[nd][d]]


def _tuple(fn: str, x: Tensor, name: str, value: Any, nd: int, kind: type) -> list:
    values = [value] * nd if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(values, (list, tuple)) or len(values) != nd or not all(isinstance(v, (int, float)) for v in values):
        raise op_error(fn, [x], f"{name} must be one {kind.__name__} or {nd} of them, got {value!r}", user_source())
    return [kind(v) for v in values]


def _output_size(fn: str, x: Tensor, spatial: list[int], kernel: list[int], output_size: Any, output_ratio: Any,
                 nd: int) -> list[int]:
    if output_size is None and output_ratio is None:
        raise op_error(fn, [x], "give output_size or output_ratio", user_source())
    if output_size is None:
        ratio = _tuple(fn, x, "output_ratio", output_ratio, nd, float)
        if not all(0 < r < 1 for r in ratio):
            raise op_error(fn, [x], f"output_ratio must be in (0, 1), got {output_ratio!r}", user_source())
        return [int(s * r) for s, r in zip(spatial, ratio)]
    return _tuple(fn, x, "output_size", output_size, nd, int)


def _starts(u: Tensor, size: int, out: int, k: int) -> Tensor:
    """torch's window starts ``(N, C, out)`` (int64) from the samples ``u`` ``(N, C)``, in ``u``'s dtype."""
    u = unsqueeze(u, [-1])
    last = full_like(u, size - k, "int64")
    if out == 1:
        return last
    dtype = u.dtype.numpy
    alpha = scalar(float(dtype.type(size - k) / dtype.type(out - 1)), u)
    i = constant(np.arange(out - 1, dtype=dtype))
    head = cast(floor((i + u) * alpha), "int64") - cast(floor(u * alpha), "int64")
    return emit("Concat", [head, last], {"axis": -1})


@autocast_op(named=lambda a: f"fractional_max_pool{a['nd']}d")
def fractional_max_pool(fn: str, input: Any, nd: int, kernel_size: Any, output_size: Any = None,
                        output_ratio: Any = None, _random_samples: Any = None) -> tuple[Tensor, Tensor]:
    """``(out, indices)`` of ``nd``-D fractional max pooling of ``(N, C, *spatial)`` or unbatched input."""
    x = lift(input)
    if x.dtype not in FLOAT_DTYPES or x.ndim not in (nd + 1, nd + 2):
        raise op_error(fn, [x], f"input must be floating point (N, C, *{nd} dims) or (C, *{nd} dims), got "
                       f"{x.type_str()}", user_source())
    batched = x.ndim == nd + 2
    x = x if batched else unsqueeze(x, [0])
    spatial = list(x.shape[2:])
    if not all(isinstance(s, int) for s in spatial) or not isinstance(x.shape[1], int):
        raise op_error(fn, [x], f"needs static channels and spatial dims, got {x.type_str()}", user_source())
    kernel = _tuple(fn, x, "kernel_size", kernel_size, nd, int)
    out_size = _output_size(fn, x, spatial, kernel, output_size, output_ratio, nd)
    for d, (s, k, o) in enumerate(zip(spatial, kernel, out_size)):
        if k < 1 or o < 1 or o + k - 1 > s:
            raise op_error(fn, [x], f"output_size {out_size} with kernel_size {kernel} is too large for input size "
                           f"{spatial} (dim {d}: needs output + kernel - 1 <= input)", user_source())
    plane = reshape(x, [-1 if not isinstance(x.shape[0], int) else x.shape[0], x.shape[1], int(np.prod(spatial))])
    if _random_samples is None:
        samples = rand_like(expand(narrow(plane, 2, 0, 1), -1, -1, nd))
    else:
        samples = lift(_random_samples)
        if samples.dtype != x.dtype or samples.ndim != 3 or list(samples.shape[1:]) != [x.shape[1], nd]:
            raise op_error(fn, [x, samples], f"_random_samples must be {x.dtype} (N, {x.shape[1]}, {nd}), got "
                           f"{samples.type_str()}", user_source())
    strides = [int(np.prod(spatial[d + 1:])) for d in range(nd)]
    flat = None
    for d in range(nd):  # flat: (N, C, O_1, .., O_nd, K_1, .., K_nd), the windows' flat indices
        u = squeeze(narrow(samples, 2, _SAMPLE_DIM[nd][d], 1), [2])
        start = _starts(u, spatial[d], out_size[d], kernel[d])  # (N, C, O_d)
        pos = unsqueeze(start, [-1]) + constant(np.arange(kernel[d], dtype=np.int64))  # (N, C, O_d, K_d)
        pos = reshape(pos * constant(np.asarray(strides[d], np.int64)),
                      [-1, x.shape[1]] + [out_size[d] if a == d else 1 for a in range(nd)]
                      + [kernel[d] if a == d else 1 for a in range(nd)])
        flat = pos if flat is None else flat + pos
    windows = int(np.prod(kernel))
    index = reshape(flat, [-1, x.shape[1], int(np.prod(out_size)) * windows])
    values = reshape(emit("GatherElements", [plane, index], {"axis": 2}), [-1, x.shape[1], *out_size, windows])
    index = reshape(index, [-1, x.shape[1], *out_size, windows])
    nans = cast(emit("IsNaN", [values]), "int64")
    last_nan = constant(np.asarray(windows - 1, np.int64)) - argmax(flip(nans, [-1]), -1, True)
    best = where(reduce_sum(nans, [-1], keepdims=True) > constant(np.asarray(0, np.int64)), last_nan,
                 argmax(values, -1, True))
    out = squeeze(emit("GatherElements", [values, best], {"axis": 2 + nd}), [-1])
    indices = squeeze(emit("GatherElements", [index, best], {"axis": 2 + nd}), [-1])
    return (out, indices) if batched else (squeeze(out, [0]), squeeze(indices, [0]))


def fractional_max_pool2d_with_indices(input: Any, kernel_size: Any, output_size: Any = None,
                                       output_ratio: Any = None, return_indices: bool = False,
                                       _random_samples: Any = None) -> tuple[Tensor, Tensor]:
    """``torch.nn.functional.fractional_max_pool2d_with_indices``: ``(out, indices)``."""
    return fractional_max_pool("fractional_max_pool2d", input, 2, kernel_size, output_size, output_ratio,
                               _random_samples)


def fractional_max_pool3d_with_indices(input: Any, kernel_size: Any, output_size: Any = None,
                                       output_ratio: Any = None, return_indices: bool = False,
                                       _random_samples: Any = None) -> tuple[Tensor, Tensor]:
    """``torch.nn.functional.fractional_max_pool3d_with_indices``: ``(out, indices)``."""
    return fractional_max_pool("fractional_max_pool3d", input, 3, kernel_size, output_size, output_ratio,
                               _random_samples)


def fractional_max_pool2d(input: Any, kernel_size: Any, output_size: Any = None, output_ratio: Any = None,
                          return_indices: bool = False, _random_samples: Any = None) -> Any:
    """``torch.nn.functional.fractional_max_pool2d``: the pooled input, with the indices if ``return_indices``."""
    out = fractional_max_pool2d_with_indices(input, kernel_size, output_size, output_ratio, True, _random_samples)
    return out if return_indices else out[0]


def fractional_max_pool3d(input: Any, kernel_size: Any, output_size: Any = None, output_ratio: Any = None,
                          return_indices: bool = False, _random_samples: Any = None) -> Any:
    """``torch.nn.functional.fractional_max_pool3d``: the pooled input, with the indices if ``return_indices``."""
    out = fractional_max_pool3d_with_indices(input, kernel_size, output_size, output_ratio, True, _random_samples)
    return out if return_indices else out[0]


__all__ = ["fractional_max_pool", "fractional_max_pool2d", "fractional_max_pool2d_with_indices",
           "fractional_max_pool3d", "fractional_max_pool3d_with_indices"]
