"""torch's transforms of vectors and matrices: ``SoftmaxTransform`` and ``StickBreakingTransform`` (onto the
simplex), ``LowerCholeskyTransform`` and ``PositiveDefiniteTransform`` (static matrix size), and the functors
``CatTransform`` and ``StackTransform`` (a transform per slice of one dim), with torch's formulas."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.distributions import constraints
from graphc.dsl.distributions.base import fail, finfo, sum_rightmost
from graphc.dsl.distributions.transform_base import Transform, transform_list
from graphc.dsl.distributions.transforms_elementwise import clipped_sigmoid
from graphc.dsl.ops import clip, concat, constant, exp, log, matmul, softmax, stack
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import cumsum, pad, static_dim, tril
from graphc.dsl.ops_layers import logsigmoid
from graphc.dsl.ops_linalg import cumprod, diag_embed, diagonal
from graphc.dsl.ops_solve import cholesky
from graphc.dsl.ops_views import narrow, select, swap_last
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import to_numpy


class Structured(Transform):
    """A parameterless transform of the last dim(s), equal to every instance of its class."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, type(self))

    def _last(self, t: Tensor, name: str, rank: int = 1) -> int:
        if t.ndim < rank:
            raise fail(type(self).__name__, [t], f"{name} needs at least {rank} dims, got {t.type_str()}")
        return static_dim(t, -1, type(self).__name__)

    def forward_shape(self, shape: tuple) -> tuple:
        if len(shape) < self.domain.event_dim:
            raise fail(type(self).__name__, [], f"shape {tuple(shape)} has too few dims")
        return tuple(shape)

    inverse_shape = forward_shape


class SoftmaxTransform(Structured):
    """``y = softmax(x)`` over the last dim; not bijective (``inv`` is ``log``), as torch's."""

    domain, codomain = constraints.real_vector, constraints.simplex

    def _call(self, x: Tensor) -> Tensor:
        self._last(x, "x")
        return softmax(x, -1)

    def _inverse(self, y: Tensor) -> Tensor:
        return log(y)


def _offsets(n: int, like: Tensor) -> Tensor:
    """``log([n, n - 1, ..., 1])`` in ``like``'s dtype."""
    return constant(np.log(np.arange(n, 0, -1)).astype(to_numpy(like.dtype)))


class StickBreakingTransform(Structured):
    """Reals ``(..., K)`` onto the ``(..., K + 1)`` simplex by stick breaking (bijective)."""

    bijective = True
    domain, codomain = constraints.real_vector, constraints.simplex

    def _call(self, x: Tensor) -> Tensor:
        z = clipped_sigmoid(x - _offsets(self._last(x, "x"), x))
        return pad(z, [0, 1], value=1.0) * pad(cumprod(1.0 - z, -1), [1, 0], value=1.0)

    def _inverse(self, y: Tensor) -> Tensor:
        n = self._last(y, "y") - 1
        crop = narrow(y, -1, 0, n)
        rest = clip(1.0 - cumsum(crop, -1), float(finfo(y).tiny))
        return log(crop) - log(rest) + _offsets(n, y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        n = self._last(x, "x")
        x = x - _offsets(n, x)
        return sum_(-x + logsigmoid(x) + log(narrow(y, -1, 0, n)), axis=-1)

    def forward_shape(self, shape: tuple) -> tuple:
        return super().forward_shape(shape)[:-1] + (shape[-1] + 1,)

    def inverse_shape(self, shape: tuple) -> tuple:
        return super().inverse_shape(shape)[:-1] + (shape[-1] - 1,)


class LowerCholeskyTransform(Structured):
    """Square matrices onto lower-triangular ones with a positive diagonal: the strict lower triangle kept, the
    diagonal exponentiated."""

    domain, codomain = constraints.independent(constraints.real, 2), constraints.lower_cholesky

    def _map(self, t: Tensor, name: str, fn: Any) -> Tensor:
        self._last(t, name, 2)
        return tril(t, -1) + diag_embed(fn(diagonal(t, 0, -2, -1)))

    def _call(self, x: Tensor) -> Tensor:
        return self._map(x, "x", exp)

    def _inverse(self, y: Tensor) -> Tensor:
        return self._map(y, "y", log)


class PositiveDefiniteTransform(Structured):
    """Square matrices onto positive-definite ones: ``L @ L^T`` of ``LowerCholeskyTransform``'s ``L``; the inverse
    reads ``gc.linalg.cholesky``."""

    domain, codomain = constraints.independent(constraints.real, 2), constraints.positive_definite

    def _call(self, x: Tensor) -> Tensor:
        low = LowerCholeskyTransform()(x)
        return matmul(low, swap_last(low))

    def _inverse(self, y: Tensor) -> Tensor:
        self._last(y, "y", 2)
        return LowerCholeskyTransform().inv(cholesky(y))


def _dim_of(fn: str, t: Tensor, dim: int, name: str) -> int:
    if not -t.ndim <= dim < t.ndim:
        raise fail(fn, [t], f"dim {dim} is out of range for {name} {t.type_str()}")
    return dim % t.ndim


def _dim_arg(fn: str, dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise fail(fn, [], f"dim must be an int, got {dim!r}")
    return dim


class CatTransform(Transform):
    """``CatTransform(tseq, dim=0, lengths=None)``: ``tseq[i]`` applied to the ``i``-th run of ``lengths[i]``
    entries of ``dim`` (1 each by default), as ``torch.cat`` joins them."""

    def __init__(self, tseq: Any, dim: int = 0, lengths: Any = None, cache_size: int = 0):
        tseq = transform_list("CatTransform", "tseq", tseq)
        super().__init__(cache_size)
        self.transforms = [t.with_cache(cache_size) for t in tseq] if cache_size else tseq
        self.lengths = [1] * len(tseq) if lengths is None else list(lengths)
        if len(self.lengths) != len(tseq) or not all(isinstance(n, int) and n >= 0 for n in self.lengths):
            raise fail("CatTransform", [], f"lengths must be {len(tseq)} ints >= 0 (one per transform), got "
                                           f"{lengths!r}")
        self.dim = _dim_arg("CatTransform", dim)

    event_dim = property(lambda self: max(t.event_dim for t in self.transforms))
    length = property(lambda self: sum(self.lengths))
    bijective = property(lambda self: all(t.bijective for t in self.transforms))

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else CatTransform(self.transforms, self.dim, self.lengths,
                                                                        cache_size)

    def _slices(self, t: Tensor, name: str) -> list[Tensor]:
        dim = _dim_of("CatTransform", t, self.dim, name)
        if t.shape[dim] != self.length:
            raise fail("CatTransform", [t], f"{name} has {t.shape[dim]} entries on dim {self.dim}, the lengths "
                                            f"{self.lengths} sum to {self.length}")
        starts = np.cumsum([0, *self.lengths[:-1]])
        return [narrow(t, dim, int(s), n) for s, n in zip(starts, self.lengths)]

    def _call(self, x: Tensor) -> Tensor:
        return concat([t(s) for t, s in zip(self.transforms, self._slices(x, "x"))], self.dim % x.ndim)

    def _inverse(self, y: Tensor) -> Tensor:
        return concat([t.inv(s) for t, s in zip(self.transforms, self._slices(y, "y"))], self.dim % y.ndim)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        event_dim = self.event_dim
        terms = [sum_rightmost(t.log_abs_det_jacobian(a, b), event_dim - t.event_dim)
                 for t, a, b in zip(self.transforms, self._slices(x, "x"), self._slices(y, "y"))]
        dim = (self.dim - x.ndim if self.dim >= 0 else self.dim) + event_dim
        if dim < 0:
            return concat(terms, dim % terms[0].ndim)
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    domain = property(lambda self: _joined("cat", [t.domain for t in self.transforms]))
    codomain = property(lambda self: _joined("cat", [t.codomain for t in self.transforms]))


class StackTransform(Transform):
    """``StackTransform(tseq, dim=0)``: ``tseq[i]`` applied to entry ``i`` of ``dim``, as ``torch.stack`` joins
    them."""

    def __init__(self, tseq: Any, dim: int = 0, cache_size: int = 0):
        tseq = transform_list("StackTransform", "tseq", tseq)
        super().__init__(cache_size)
        self.transforms = [t.with_cache(cache_size) for t in tseq] if cache_size else tseq
        self.dim = _dim_arg("StackTransform", dim)

    bijective = property(lambda self: all(t.bijective for t in self.transforms))

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else StackTransform(self.transforms, self.dim, cache_size)

    def _slices(self, t: Tensor, name: str) -> list[Tensor]:
        dim = _dim_of("StackTransform", t, self.dim, name)
        if t.shape[dim] != len(self.transforms):
            raise fail("StackTransform", [t], f"{name} has {t.shape[dim]} entries on dim {self.dim}, one per "
                                              f"transform needs {len(self.transforms)}")
        return [select(t, dim, i) for i in range(len(self.transforms))]

    def _joined(self, parts: list[Tensor], like: Tensor) -> Tensor:
        return stack(parts, self.dim % like.ndim)

    def _call(self, x: Tensor) -> Tensor:
        return self._joined([t(s) for t, s in zip(self.transforms, self._slices(x, "x"))], x)

    def _inverse(self, y: Tensor) -> Tensor:
        return self._joined([t.inv(s) for t, s in zip(self.transforms, self._slices(y, "y"))], y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        terms = [t.log_abs_det_jacobian(a, b)
                 for t, a, b in zip(self.transforms, self._slices(x, "x"), self._slices(y, "y"))]
        return self._joined(terms, x)

    domain = property(lambda self: _joined("stack", [t.domain for t in self.transforms], self.dim))
    codomain = property(lambda self: _joined("stack", [t.codomain for t in self.transforms], self.dim))


def _joined(kind: str, cseq: list, dim: int = 0) -> constraints.Constraint:
    """torch's ``constraints.cat``/``stack`` of ``cseq``: the largest event dim of its parts (one more for a
    stack along an event dim), its values not checked by slice."""
    event_dim = max((c.event_dim for c in cseq), default=0)
    event_dim += kind == "stack" and dim + event_dim < 0
    return constraints.Constraint(f"{kind}({', '.join(c.name for c in cseq)})", lambda v, d: True, event_dim)


__all__ = ["CatTransform", "LowerCholeskyTransform", "PositiveDefiniteTransform", "SoftmaxTransform",
           "StackTransform", "StickBreakingTransform"]
