"""torch.distributions' ``Bernoulli``, ``Categorical``, ``OneHotCategorical`` and
``OneHotCategoricalStraightThrough``, each from ``probs`` or ``logits`` (the other derived as torch's: probs clamped
to ``[eps, 1 - eps]`` before their log). Categorical draws by the Gumbel-max trick (``argmax(logits + Gumbel
noise)``); only the straight-through one has ``rsample``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl.distributions.base import (BOOLEAN, NONNEGATIVE, REAL, UNIT_INTERVAL, Distribution, check, enumerated,
                                           fail, finfo, params)
from graphc.dsl.ops import cast, clip, constant, detach, log, maximum, sigmoid, softmax, where
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import argmax, full_like, gather, logsumexp, one_hot
from graphc.dsl.ops_elementwise import log1p
from graphc.dsl.ops_layers import logsigmoid
from graphc.dsl.ops_reshape import broadcast_tensors, squeeze, unsqueeze
from graphc.dsl.ops_sample import rand_like
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import to_numpy


def softplus(x: Tensor) -> Tensor:
    """``log(1 + exp(x))`` as ``-logsigmoid(-x)`` (onnxruntime has no float64 Softplus)."""
    return -logsigmoid(-x)


def one_of(dist: str, probs: Any, logits: Any) -> None:
    if (probs is None) == (logits is None):
        raise fail(dist, [], "either probs or logits must be given, but not both (as torch)")


def clamped_probs(probs: Tensor) -> Tensor:
    eps = float(finfo(probs).eps)
    return clip(probs, eps, 1 - eps)


def binary_params(dist: str, probs: Any, logits: Any, validate: bool, constraint: tuple = UNIT_INTERVAL,
                  **first: Any) -> list[Tensor]:
    """``[*first, probs, logits]`` of a two-outcome family, broadcast together as torch's ``broadcast_all``,
    from ``probs`` or ``logits`` (the other derived as torch's ``probs_to_logits(is_binary=True)``/``sigmoid``)."""
    one_of(dist, probs, logits)
    name = "probs" if probs is not None else "logits"
    *lead, param = params(dist, **first, **{name: probs if probs is not None else logits})
    if validate:
        check(dist, name, param, constraint if probs is not None else REAL)
    if probs is None:
        return [*lead, sigmoid(param), param]
    p = clamped_probs(param)
    return [*lead, param, log(p) - log1p(-p)]


class Bernoulli(Distribution):
    """``torch.distributions.Bernoulli(probs=None, logits=None)``."""

    support, has_enumerate_support = BOOLEAN, True

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None):
        super().__init__((), (), validate_args)
        self.probs, self.logits = binary_params("Bernoulli", probs, logits, self._validate_args)
        self._batch_shape = tuple(self.probs.shape)

    mean = property(lambda self: self.probs)
    variance = property(lambda self: self.probs * (1.0 - self.probs))

    @property
    def mode(self) -> Tensor:
        return where(self.probs == 0.5, full_like(self.probs, math.nan), cast(self.probs >= 0.5, self.probs.dtype))

    def sample(self, sample_shape: Any = ()) -> Tensor:
        u = rand_like(self._expanded(self.probs, sample_shape))
        return cast(u < self.probs, self.probs.dtype)

    def log_prob(self, value: Any) -> Tensor:
        return self.logits * self._value(value, self.logits) - softplus(self.logits)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """``[0, 1]`` in the parameters' dtype, ``(2, *batch_shape)`` (ones for the batch unless ``expand``)."""
        values = constant(np.array([0, 1], to_numpy(self.probs.dtype)))
        return enumerated(values, self.probs, len(self._batch_shape), expand)

    def entropy(self) -> Tensor:
        return softplus(self.logits) - self.logits * self.probs


def _index_check(v: np.ndarray, dist: Categorical) -> Any:
    k = dist.num_events
    return (v >= 0) & (v == np.floor(v)) & (v < k if isinstance(k, int) else True)


class Categorical(Distribution):
    """``torch.distributions.Categorical(probs=None, logits=None)`` over the last dim; probs are normalized,
    logits shifted by their logsumexp, as torch's."""

    support, has_enumerate_support = ("integer_interval [0, K)", _index_check), True

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None):
        one_of("Categorical", probs, logits)
        super().__init__((), (), validate_args)
        name = "probs" if probs is not None else "logits"
        (param,) = params("Categorical", **{name: probs if probs is not None else logits})
        if param.ndim < 1:
            raise fail("Categorical", [param], f"{name} must be at least one-dimensional, got {param.type_str()}")
        if self._validate_args:
            check("Categorical", name, param, NONNEGATIVE if probs is not None else REAL)
        if probs is not None:
            self.probs = param / sum_(param, axis=-1, keepdims=True)
            self.logits = log(clamped_probs(self.probs))
        else:
            self.logits = param - logsumexp(param, -1, keepdim=True)
            self.probs = softmax(self.logits)
        self.num_events = param.shape[-1]
        self._batch_shape = tuple(param.shape[:-1])

    mean = variance = property(lambda self: full_like(sum_(self.probs, axis=-1), math.nan))
    mode = property(lambda self: argmax(self.probs, -1))

    def static_events(self, dist: str, needs: str = "needs") -> int:
        """``num_events`` where it is static; a CaptureError for ``dist`` (what ``needs`` it) otherwise."""
        if not isinstance(self.num_events, int):
            raise fail(dist, [], f"{needs} a static number of categories, got the dim {self.num_events!r}")
        return self.num_events

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """Gumbel-max: the argmax of ``logits - log(-log(u))``, ``u`` uniform on ``[tiny, 1)``."""
        tiny = float(finfo(self.logits).tiny)
        u = maximum(rand_like(self._expanded(self.logits, sample_shape)), tiny)
        return argmax(self.logits - log(-log(u)), -1)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """``arange(K)`` (int64), ``(K, *batch_shape)`` (ones for the batch unless ``expand``); K static."""
        values = constant(np.arange(self.static_events("Categorical", "enumerate_support needs"), dtype=np.int64))
        return enumerated(values, self.logits[..., 0], len(self._batch_shape), expand)

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.logits)
        index, logits = broadcast_tensors(unsqueeze(cast(v, "int64"), -1), self.logits)
        return squeeze(gather(logits, -1, index[..., :1]), -1)

    def entropy(self) -> Tensor:
        low = float(finfo(self.logits).min)
        return -sum_(clip(self.logits, low) * self.probs, axis=-1)


def _one_hot_check(v: np.ndarray, dist: OneHotCategorical) -> Any:
    return np.all((v == 0) | (v == 1)) and np.all(v.sum(-1) == 1)


class OneHotCategorical(Distribution):
    """``torch.distributions.OneHotCategorical(probs=None, logits=None)``: a Categorical whose values are
    one-hot vectors (event shape ``(K,)``, K static)."""

    support, has_enumerate_support = ("one_hot", _one_hot_check), True

    def __init__(self, probs: Any = None, logits: Any = None, validate_args: bool | None = None):
        self._categorical = Categorical(probs, logits, validate_args)
        k = self._categorical.static_events("OneHotCategorical")
        super().__init__(self._categorical.batch_shape, (k,), validate_args)

    probs = property(lambda self: self._categorical.probs)
    logits = property(lambda self: self._categorical.logits)
    mean = property(lambda self: self.probs)
    variance = property(lambda self: self.probs * (1.0 - self.probs))
    mode = property(lambda self: self._one_hot(argmax(self.probs, -1)))

    def _one_hot(self, index: Tensor) -> Tensor:
        return cast(one_hot(index, self.event_shape[0]), self.probs.dtype)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        return self._one_hot(self._categorical.sample(sample_shape))

    def log_prob(self, value: Any) -> Tensor:
        return self._categorical.log_prob(argmax(self._value(value, self.probs), -1))

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """The ``K`` one-hot vectors in the parameters' dtype, ``(K, *batch_shape, K)``."""
        values = constant(np.eye(self.event_shape[0], dtype=to_numpy(self.probs.dtype)))
        return enumerated(values, self.probs, len(self._batch_shape), expand)

    def entropy(self) -> Tensor:
        return self._categorical.entropy()


class OneHotCategoricalStraightThrough(OneHotCategorical):
    """``torch.distributions.OneHotCategoricalStraightThrough``: ``rsample`` is the one-hot draw whose gradient is
    that of ``probs`` (the straight-through estimator: ``sample + probs - detach(probs)``)."""

    has_rsample = True

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self.sample(sample_shape) + (self.probs - detach(self.probs))


__all__ = ["Bernoulli", "Categorical", "OneHotCategorical", "OneHotCategoricalStraightThrough", "binary_params",
           "clamped_probs", "one_of", "softplus"]
