"""torch's elementwise transforms: ``ExpTransform``, ``PowerTransform``, ``SigmoidTransform`` (clamped to
``[tiny, 1 - eps]`` as torch's), ``SoftplusTransform``, ``TanhTransform``, ``AbsTransform``,
``AffineTransform(loc, scale, event_dim=0)`` and ``CumulativeDistributionTransform(distribution)``, with torch's
formulas for the log-abs-det-Jacobian."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions import constraints
from graphc.dsl.distributions.base import Distribution, fail, finfo, known, sum_rightmost
from graphc.dsl.distributions.discrete import softplus
from graphc.dsl.distributions.transform_base import Transform, broadcast_shape, param_shape
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import clip, constant, exp, log, sigmoid, tanh
from graphc.dsl.ops_array import pow as pow_
from graphc.dsl.ops_array import zeros_like
from graphc.dsl.ops_elementwise import expm1, log1p
from graphc.dsl.ops_math import sign
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import to_numpy


def _parameter(fn: str, name: str, v: Any) -> Any:
    """A transform parameter: a Tensor, a Python number (kept as one, as torch keeps numbers) or an array (a
    constant in the dtype of the Tensor it meets)."""
    if isinstance(v, (list, tuple)):
        v = np.asarray(v)
    if isinstance(v, (Tensor, np.ndarray)) or (isinstance(v, (int, float, np.number)) and not isinstance(v, bool)):
        return v
    raise fail(fn, [], f"{name} must be a Tensor, an array or a number, got {type(v).__name__}")


def _like(p: Any, t: Tensor) -> Any:
    """Parameter ``p`` ready to meet ``t``: an array as a constant of ``t``'s dtype."""
    return constant(p.astype(to_numpy(t.dtype))) if isinstance(p, np.ndarray) else p


def _sign(p: Any) -> Any:
    """torch's ``sign`` of a parameter: an int for a number, else a Tensor."""
    if isinstance(p, Tensor):
        return sign(p)
    return constant(np.sign(p)) if isinstance(p, np.ndarray) else int(np.sign(p))


def _same(a: Any, b: Any) -> bool:
    """Parameters known equal: the same Tensor, equal numbers, or constants of equal values."""
    if a is b:
        return True
    va, vb = (known(v) if isinstance(v, Tensor) else v for v in (a, b))
    return va is not None and vb is not None and np.array_equal(np.asarray(va), np.asarray(vb))


class _Elementwise(Transform):
    """A parameterless elementwise bijection (equal to every instance of its class, as torch's)."""

    bijective, sign = True, 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, type(self))


class ExpTransform(_Elementwise):
    """``y = exp(x)``."""

    domain, codomain = constraints.real, constraints.positive

    def _call(self, x: Tensor) -> Tensor:
        return exp(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return log(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return x


def clipped_sigmoid(x: Tensor) -> Tensor:
    fi = finfo(x)
    return clip(sigmoid(x), float(fi.tiny), float(1 - fi.eps))


class SigmoidTransform(_Elementwise):
    """``y = sigmoid(x)`` clamped to ``[tiny, 1 - eps]``; the inverse clamps ``y`` alike."""

    domain, codomain = constraints.real, constraints.unit_interval

    def _call(self, x: Tensor) -> Tensor:
        return clipped_sigmoid(x)

    def _inverse(self, y: Tensor) -> Tensor:
        fi = finfo(y)
        y = clip(y, float(fi.tiny), float(1 - fi.eps))
        return log(y) - log1p(-y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -softplus(-x) - softplus(x)


class SoftplusTransform(_Elementwise):
    """``y = log(1 + exp(x))``."""

    domain, codomain = constraints.real, constraints.positive

    def _call(self, x: Tensor) -> Tensor:
        return softplus(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return log(-expm1(-y)) + y

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -softplus(-x)


class TanhTransform(_Elementwise):
    """``y = tanh(x)``; its inverse is ``atanh`` written ``(log1p(y) - log1p(-y)) / 2`` (onnxruntime has no
    float64 Atanh)."""

    domain, codomain = constraints.real, constraints.interval(-1.0, 1.0)

    def _call(self, x: Tensor) -> Tensor:
        return tanh(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return (log1p(y) - log1p(-y)) * 0.5

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return 2.0 * (math.log(2.0) - x - softplus(-2.0 * x))


class AbsTransform(Transform):
    """``y = |x|``; not bijective: its inverse is the identity, as torch's."""

    domain, codomain = constraints.real, constraints.positive

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AbsTransform)

    def _call(self, x: Tensor) -> Tensor:
        return abs_(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return y


class PowerTransform(Transform):
    """``y = x ** exponent`` on positive ``x``; ``sign`` is ``exponent``'s."""

    bijective = True
    domain = codomain = constraints.positive

    def __init__(self, exponent: Any, cache_size: int = 0):
        super().__init__(cache_size)
        self.exponent = _parameter("PowerTransform", "exponent", exponent)

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else PowerTransform(self.exponent, cache_size)

    sign = property(lambda self: _sign(self.exponent))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PowerTransform) and _same(self.exponent, other.exponent)

    def _call(self, x: Tensor) -> Tensor:
        return pow_(x, _like(self.exponent, x))

    def _inverse(self, y: Tensor) -> Tensor:
        return pow_(y, 1.0 / _like(self.exponent, y))

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return log(abs_(_like(self.exponent, x) * y / x))

    def forward_shape(self, shape: tuple) -> tuple:
        return broadcast_shape("PowerTransform", tuple(shape), param_shape(self.exponent))

    inverse_shape = forward_shape


class AffineTransform(Transform):
    """``y = loc + scale * x``; ``event_dim`` rightmost dims form one event (the log-det sums over them)."""

    bijective = True

    def __init__(self, loc: Any, scale: Any, event_dim: int = 0, cache_size: int = 0):
        super().__init__(cache_size)
        self.loc = _parameter("AffineTransform", "loc", loc)
        self.scale = _parameter("AffineTransform", "scale", scale)
        if isinstance(event_dim, bool) or not isinstance(event_dim, int) or event_dim < 0:
            raise fail("AffineTransform", [], f"event_dim must be an int >= 0, got {event_dim!r}")
        self._event_dim = event_dim

    event_dim = property(lambda self: self._event_dim)
    domain = codomain = property(lambda self: constraints.independent(constraints.real, self._event_dim)
                                 if self._event_dim else constraints.real)

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else AffineTransform(self.loc, self.scale, self._event_dim,
                                                                           cache_size)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AffineTransform) and _same(self.loc, other.loc)
                and _same(self.scale, other.scale))

    sign = property(lambda self: _sign(self.scale))

    def _call(self, x: Tensor) -> Tensor:
        return _like(self.loc, x) + _like(self.scale, x) * x

    def _inverse(self, y: Tensor) -> Tensor:
        return (y - _like(self.loc, y)) / _like(self.scale, y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        """``log|scale|`` broadcast with ``x``, summed over the event dims."""
        s = _like(self.scale, x)
        per_element = zeros_like(x) + (log(abs_(s)) if isinstance(s, Tensor) else math.log(abs(s)))
        return sum_rightmost(per_element, self._event_dim)

    def forward_shape(self, shape: tuple) -> tuple:
        return broadcast_shape("AffineTransform", tuple(shape), param_shape(self.loc), param_shape(self.scale))

    inverse_shape = forward_shape

    def __repr__(self) -> str:
        return f"AffineTransform(event_dim={self._event_dim})"


class CumulativeDistributionTransform(Transform):
    """``y = distribution.cdf(x)`` on the distribution's support; ``log_abs_det_jacobian`` is its
    ``log_prob(x)``."""

    bijective, sign, codomain = True, 1, constraints.unit_interval

    def __init__(self, distribution: Distribution, cache_size: int = 0):
        if not isinstance(distribution, Distribution):
            raise fail("CumulativeDistributionTransform", [], f"distribution must be a gc.distributions "
                                                              f"Distribution, got {type(distribution).__name__}")
        super().__init__(cache_size)
        self.distribution = distribution

    domain = property(lambda self: constraints.as_constraint(self.distribution.support,
                                                             "CumulativeDistributionTransform"))

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self if self._cache_size == cache_size else CumulativeDistributionTransform(self.distribution,
                                                                                           cache_size)

    def _call(self, x: Tensor) -> Tensor:
        return self.distribution.cdf(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return self.distribution.icdf(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return self.distribution.log_prob(x)


__all__ = ["AbsTransform", "AffineTransform", "CumulativeDistributionTransform", "ExpTransform", "PowerTransform",
           "SigmoidTransform", "SoftplusTransform", "TanhTransform", "clipped_sigmoid"]
