"""The ``Transform`` interface of ``gc.distributions.transforms`` (torch's: ``__call__``, ``inv``,
``log_abs_det_jacobian``, ``domain``/``codomain``, ``event_dim``, ``sign``, ``bijective``, ``cache_size`` 0 or 1,
``forward_shape``/``inverse_shape``) and the transforms of transforms: ``_InverseTransform`` (``t.inv``),
``ComposeTransform``, ``IndependentTransform`` and ``ReshapeTransform``, with torch's event-dim bookkeeping."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions import constraints
from graphc.dsl.distributions.base import fail, sum_rightmost
from graphc.dsl.ops import reshape
from graphc.dsl.ops_array import zeros_like
from graphc.dsl.tensor import Tensor
from graphc.passes.infer import InferenceError, broadcast


def broadcast_shape(fn: str, *shapes: tuple) -> tuple:
    """``shapes`` broadcast (a CaptureError naming ``fn`` if they do not)."""
    try:
        return tuple(broadcast(*shapes))
    except InferenceError as exc:
        raise fail(fn, [], f"shapes {', '.join(map(str, shapes))} do not broadcast: {exc}") from None


def param_shape(p: Any) -> tuple:
    """A transform parameter's shape (a number's is ``()``)."""
    return tuple(p.shape) if isinstance(p, Tensor) else np.shape(p)


class Transform:
    """An invertible (or pseudo-invertible) map with a log-abs-det-Jacobian; subclasses define ``_call``,
    ``_inverse`` and ``log_abs_det_jacobian``."""

    bijective = False
    domain: constraints.Constraint = constraints.real
    codomain: constraints.Constraint = constraints.real

    def __init__(self, cache_size: int = 0):
        if cache_size not in (0, 1) or isinstance(cache_size, bool):
            raise fail(type(self).__name__, [], f"cache_size must be 0 or 1 (as torch), got {cache_size!r}")
        self._cache_size, self._inv, self._cached_x_y = cache_size, None, (None, None)

    @property
    def event_dim(self) -> int:
        if self.domain.event_dim == self.codomain.event_dim:
            return self.domain.event_dim
        raise fail(type(self).__name__, [], f"has domain.event_dim {self.domain.event_dim} and codomain.event_dim "
                                            f"{self.codomain.event_dim}: read one of them (as torch)")

    @property
    def inv(self) -> Transform:
        """The inverse transform; ``t.inv.inv is t``."""
        if self._inv is None:
            self._inv = _InverseTransform(self)
        return self._inv

    @property
    def sign(self) -> Any:
        raise fail(type(self).__name__, [], "has no sign (it is not a monotone univariate bijection)")

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        if type(self).__init__ is Transform.__init__:
            return type(self)(cache_size=cache_size)
        raise fail(type(self).__name__, [], "with_cache is not implemented (as torch)")

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = None  # as torch's, whose __eq__ makes transforms unhashable

    def _input(self, x: Any, name: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise fail(type(self).__name__, [], f"{name} must be a Tensor, got {type(x).__name__}")
        return x

    def __call__(self, x: Any) -> Tensor:
        """``y = t(x)`` (the cached ``y`` if ``x`` is the last input and ``cache_size`` is 1)."""
        return self._through_cache(self._input(x, "x"), 0, self._call)

    def _inv_call(self, y: Any) -> Tensor:
        return self._through_cache(self._input(y, "y"), 1, self._inverse)

    def _through_cache(self, v: Tensor, side: int, compute) -> Tensor:
        """``compute(v)`` for ``v`` on ``side`` of the map (0: x, 1: y); with ``cache_size`` 1 the
        other side of the last pair when ``v`` is its ``side``, and the pair kept."""
        if not self._cache_size:
            return compute(v)
        if v is self._cached_x_y[side]:
            return self._cached_x_y[1 - side]
        other = compute(v)
        self._cached_x_y = (v, other) if side == 0 else (other, v)
        return other

    def _call(self, x: Tensor) -> Tensor:
        raise fail(type(self).__name__, [x], "has no forward map")

    def _inverse(self, y: Tensor) -> Tensor:
        raise fail(type(self).__name__, [y], "has no inverse")

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        """``log |dy/dx|``, summed over ``event_dim``."""
        raise fail(type(self).__name__, [], "has no log_abs_det_jacobian (it is not bijective)")

    def forward_shape(self, shape: tuple) -> tuple:
        return tuple(shape)

    def inverse_shape(self, shape: tuple) -> tuple:
        return tuple(shape)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _InverseTransform(Transform):
    """``t.inv``: ``t``'s inverse, domain and codomain swapped."""

    def __init__(self, transform: Transform):
        super().__init__(transform._cache_size)
        self._inv = transform

    domain = property(lambda self: self._inv.codomain)
    codomain = property(lambda self: self._inv.domain)
    bijective = property(lambda self: self._inv.bijective)
    sign = property(lambda self: self._inv.sign)
    inv = property(lambda self: self._inv)

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self._inv.with_cache(cache_size).inv

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _InverseTransform) and self._inv == other._inv

    def __call__(self, x: Any) -> Tensor:
        return self._inv._inv_call(x)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -self._inv.log_abs_det_jacobian(y, x)

    def forward_shape(self, shape: tuple) -> tuple:
        return self._inv.inverse_shape(shape)

    def inverse_shape(self, shape: tuple) -> tuple:
        return self._inv.forward_shape(shape)

    def __repr__(self) -> str:
        return f"_InverseTransform({self._inv!r})"


def transform_list(fn: str, name: str, parts: Any) -> list[Transform]:
    """``parts`` checked to be a list or tuple of Transforms."""
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, Transform) for p in parts):
        raise fail(fn, [], f"{name} must be a list of gc.distributions.transforms Transforms, got {parts!r}")
    return list(parts)


class ComposeTransform(Transform):
    """``ComposeTransform(parts, cache_size=0)``: ``parts`` applied in order; its domain and codomain take the
    largest event dim any part needs, as torch's."""

    def __init__(self, parts: Any, cache_size: int = 0):
        parts = transform_list("ComposeTransform", "parts", parts)
        super().__init__(cache_size)
        self.parts = [p.with_cache(cache_size) for p in parts] if cache_size else parts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ComposeTransform) and self.parts == other.parts

    def _end(self, first: Transform, rest: list, into: str, out: str) -> constraints.Constraint:
        """The domain (``into="domain"``, parts read backwards) or codomain, widened to the event dim the
        chain needs."""
        end = getattr(first, into)
        event_dim = getattr(rest[0], out).event_dim
        for part in rest:
            event_dim = max(event_dim + getattr(part, into).event_dim - getattr(part, out).event_dim,
                            getattr(part, into).event_dim)
        return constraints.independent(end, event_dim - end.event_dim) if event_dim > end.event_dim else end

    @property
    def domain(self) -> constraints.Constraint:
        if not self.parts:
            return constraints.real
        return self._end(self.parts[0], self.parts[::-1], "domain", "codomain")

    @property
    def codomain(self) -> constraints.Constraint:
        if not self.parts:
            return constraints.real
        return self._end(self.parts[-1], self.parts, "codomain", "domain")

    bijective = property(lambda self: all(p.bijective for p in self.parts))

    @property
    def sign(self) -> Any:
        return math.prod((p.sign for p in self.parts), start=1)

    @property
    def inv(self) -> Transform:
        if self._inv is None:
            self._inv = ComposeTransform([p.inv for p in reversed(self.parts)])
            self._inv._inv = self
        return self._inv

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else ComposeTransform(self.parts, cache_size)

    def __call__(self, x: Any) -> Tensor:
        x = self._input(x, "x")
        for part in self.parts:
            x = part(x)
        return x

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        if not self.parts:
            return zeros_like(x)
        xs = [x]
        for part in self.parts[:-1]:
            xs.append(part(xs[-1]))
        xs.append(y)
        total, event_dim = None, self.domain.event_dim
        for part, a, b in zip(self.parts, xs[:-1], xs[1:]):
            term = sum_rightmost(part.log_abs_det_jacobian(a, b), event_dim - part.domain.event_dim)
            total = term if total is None else total + term
            event_dim += part.codomain.event_dim - part.domain.event_dim
        return total

    def forward_shape(self, shape: tuple) -> tuple:
        for part in self.parts:
            shape = part.forward_shape(shape)
        return tuple(shape)

    def inverse_shape(self, shape: tuple) -> tuple:
        for part in reversed(self.parts):
            shape = part.inverse_shape(shape)
        return tuple(shape)

    def __repr__(self) -> str:
        return "ComposeTransform(" + ", ".join(map(repr, self.parts)) + ")"


identity_transform = ComposeTransform([])


def _ndims(fn: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise fail(fn, [], f"reinterpreted_batch_ndims must be an int >= 0, got {n!r}")
    return n


class IndependentTransform(Transform):
    """``IndependentTransform(base_transform, reinterpreted_batch_ndims)``: the base's map, its log-det summed
    over ``reinterpreted_batch_ndims`` more rightmost dims."""

    def __init__(self, base_transform: Transform, reinterpreted_batch_ndims: int, cache_size: int = 0):
        if not isinstance(base_transform, Transform):
            raise fail("IndependentTransform", [], f"base_transform must be a gc.distributions.transforms Transform, "
                                                   f"got {type(base_transform).__name__}")
        super().__init__(cache_size)
        self.base_transform = base_transform.with_cache(cache_size)
        self.reinterpreted_batch_ndims = _ndims("IndependentTransform", reinterpreted_batch_ndims)

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else IndependentTransform(
            self.base_transform, self.reinterpreted_batch_ndims, cache_size)

    domain = property(lambda self: constraints.independent(self.base_transform.domain,
                                                           self.reinterpreted_batch_ndims))
    codomain = property(lambda self: constraints.independent(self.base_transform.codomain,
                                                             self.reinterpreted_batch_ndims))
    bijective = property(lambda self: self.base_transform.bijective)
    sign = property(lambda self: self.base_transform.sign)

    def _rank(self, t: Tensor, name: str, event_dim: int) -> Tensor:
        if t.ndim < event_dim:
            raise fail("IndependentTransform", [t], f"{name} needs at least {event_dim} dims (the event dim), got "
                                                    f"{t.type_str()}")
        return t

    def _call(self, x: Tensor) -> Tensor:
        return self.base_transform(self._rank(x, "x", self.domain.event_dim))

    def _inverse(self, y: Tensor) -> Tensor:
        return self.base_transform.inv(self._rank(y, "y", self.codomain.event_dim))

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return sum_rightmost(self.base_transform.log_abs_det_jacobian(x, y), self.reinterpreted_batch_ndims)

    def forward_shape(self, shape: tuple) -> tuple:
        return self.base_transform.forward_shape(shape)

    def inverse_shape(self, shape: tuple) -> tuple:
        return self.base_transform.inverse_shape(shape)

    def __repr__(self) -> str:
        return f"IndependentTransform({self.base_transform!r}, {self.reinterpreted_batch_ndims})"


def _static_shape(name: str, shape: Any) -> tuple:
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else None
    if dims is None or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise fail("ReshapeTransform", [], f"{name} must be a tuple of ints >= 0, got {shape!r}")
    return dims


class ReshapeTransform(Transform):
    """``ReshapeTransform(in_shape, out_shape)``: the rightmost ``in_shape`` dims reshaped to ``out_shape``
    (unit Jacobian)."""

    bijective = True

    def __init__(self, in_shape: Any, out_shape: Any, cache_size: int = 0):
        self.in_shape, self.out_shape = _static_shape("in_shape", in_shape), _static_shape("out_shape", out_shape)
        if math.prod(self.in_shape) != math.prod(self.out_shape):
            raise fail("ReshapeTransform", [], f"in_shape {self.in_shape} and out_shape {self.out_shape} have "
                                               f"different numbers of elements")
        super().__init__(cache_size)

    domain = property(lambda self: constraints.independent(constraints.real, len(self.in_shape)))
    codomain = property(lambda self: constraints.independent(constraints.real, len(self.out_shape)))

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else ReshapeTransform(self.in_shape, self.out_shape,
                                                                            cache_size)

    @staticmethod
    def _moved(shape: tuple, old: tuple, new: tuple, name: str) -> tuple:
        cut = len(shape) - len(old)
        if cut < 0 or tuple(shape[cut:]) != old:
            raise fail("ReshapeTransform", [], f"{name} of shape {tuple(shape)} does not end in {old}")
        return tuple(shape[:cut]) + new

    def _call(self, x: Tensor) -> Tensor:
        return reshape(x, self._moved(x.shape, self.in_shape, self.out_shape, "x"))

    def _inverse(self, y: Tensor) -> Tensor:
        return reshape(y, self._moved(y.shape, self.out_shape, self.in_shape, "y"))

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return sum_rightmost(zeros_like(x), len(self.in_shape))

    def forward_shape(self, shape: tuple) -> tuple:
        return self._moved(shape, self.in_shape, self.out_shape, "the input")

    def inverse_shape(self, shape: tuple) -> tuple:
        return self._moved(shape, self.out_shape, self.in_shape, "the input")

    def __repr__(self) -> str:
        return f"ReshapeTransform({self.in_shape}, {self.out_shape})"


__all__ = ["ComposeTransform", "IndependentTransform", "ReshapeTransform", "Transform", "broadcast_shape",
           "identity_transform", "param_shape", "transform_list"]
