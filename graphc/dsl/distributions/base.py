"""The ``Distribution`` base of ``gc.distributions``: parameters broadcast as torch's ``broadcast_all``,
shapes, the sample shape, and the capture-time checks of ``validate_args`` (of constant values only)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from graphc.dsl.builder import current, op_error, user_source
from graphc.dsl.ops import cast, constant, detach, exp, reshape, sqrt
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import expand
from graphc.dsl.ops_factories import promote_types
from graphc.dsl.ops_reshape import broadcast_tensors
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, as_dtype, to_numpy
from graphc.model.dtypes import finfo as dtype_finfo
from graphc.passes.infer import InferenceError, broadcast

# torch's constraints, as checks of a constant's values: (name, test)
REAL = ("real", lambda v, d: v == v)
POSITIVE = ("positive", lambda v, d: v > 0)
NONNEGATIVE = ("nonnegative", lambda v, d: v >= 0)
UNIT_INTERVAL = ("unit_interval", lambda v, d: (v >= 0) & (v <= 1))
BOOLEAN = ("boolean", lambda v, d: (v == 0) | (v == 1))
SIMPLEX = ("simplex", lambda v, d: np.all(v >= 0, -1) & (np.abs(v.sum(-1) - 1) < 1e-6))


def fail(dist: str, operands: list, msg: str) -> CaptureError:
    return op_error(dist, operands, msg, user_source())


def known(t: Tensor) -> np.ndarray | None:
    """``t``'s values where it is a constant of the graph (a Python number or array), expanded or not (the
    array before expansion), else None."""
    value = t.value
    node = value.producer()
    while node is not None and node.op_type == "Expand":  # broadcast_tensors expands by each other's shape
        value = node.inputs[0]
        node = value.producer()
    return current().known(value)


def check(dist: str, name: str, t: Tensor, constraint: tuple, extra: Any = None) -> None:
    """Refuse a constant ``t`` with values outside ``constraint``, as torch's ``validate_args``."""
    value = known(t)
    if value is None:
        return
    with np.errstate(all="ignore"):
        ok = np.all(constraint[1](np.asarray(value), extra))
    if not ok:
        raise fail(dist, [t], f"{name} must satisfy constraints.{constraint[0]}, got {np.asarray(value)}")


def params(dist: str, **values: Any) -> list[Tensor]:
    """torch's ``broadcast_all``: Python numbers take the first Tensor's dtype (float32 if none), integer
    Tensors become float, mixed floats promote; all are expanded to their common shape."""
    tensors = [v for v in values.values() if isinstance(v, Tensor)]
    for name, v in values.items():
        if not isinstance(v, (Tensor, bool, int, float, np.number, np.ndarray, list, tuple)):
            raise fail(dist, [], f"{name} must be a Tensor or a number, got {type(v).__name__}")
    dtype = as_dtype("float32")
    if tensors:
        dtype = tensors[0].dtype if tensors[0].dtype in FLOAT_DTYPES else dtype
        for t in tensors[1:]:
            dtype = promote_types(dtype, t.dtype) if t.dtype in FLOAT_DTYPES else dtype
    lifted = [cast(v, dtype) if isinstance(v, Tensor) and v.dtype != dtype else
              v if isinstance(v, Tensor) else constant(np.asarray(v, to_numpy(dtype))) for v in values.values()]
    try:
        broadcast(*(t.shape for t in lifted))
    except InferenceError as exc:
        shapes = ", ".join(f"{n}={t.type_str()}" for n, t in zip(values, lifted))
        raise fail(dist, lifted, f"the parameters {shapes} do not broadcast: {exc}") from None
    return list(broadcast_tensors(*lifted)) if len(lifted) > 1 else lifted


def sample_shape_of(dist: str, sample_shape: Any) -> tuple:
    shape = (sample_shape,) if isinstance(sample_shape, (int, np.integer)) else tuple(sample_shape)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise fail(dist, [], f"sample_shape must be ints >= 0, got {sample_shape!r}")
    return tuple(int(d) for d in shape)


def event_dims_match(dist: str, value: Tensor, shape: tuple) -> None:
    """torch's ``_validate_sample`` shape check: ``value`` must broadcast with ``batch_shape + event_shape``."""
    if value.shape is None:
        return
    try:
        broadcast(value.shape, shape)
    except InferenceError:
        raise fail(dist, [value], f"value {value.type_str()} does not broadcast with the batch and event shape "
                                  f"{tuple(shape)}") from None


class Distribution:
    """torch.distributions.Distribution's interface; ``stddev`` is ``sqrt(variance)`` unless a family says."""

    has_rsample = has_enumerate_support = False
    support: tuple | None = None
    _unexpanded: tuple = ()  # Tensor attributes ``expand`` leaves as they are

    def __init__(self, batch_shape: tuple = (), event_shape: tuple = (), validate_args: bool | None = None):
        self._batch_shape, self._event_shape = tuple(batch_shape), tuple(event_shape)
        self._validate_args = True if validate_args is None else bool(validate_args)

    @property
    def batch_shape(self) -> tuple:
        return self._batch_shape

    @property
    def event_shape(self) -> tuple:
        return self._event_shape

    @property
    def stddev(self) -> Tensor:
        return sqrt(self.variance)

    def _missing(self, what: str) -> CaptureError:
        return fail(self._name(), [], f"has no {what} (torch's raises NotImplementedError too)")

    @property
    def mean(self) -> Tensor:
        raise self._missing("mean")

    @property
    def mode(self) -> Tensor:
        raise self._missing("mode")

    @property
    def variance(self) -> Tensor:
        raise self._missing("variance")

    def entropy(self) -> Tensor:
        raise self._missing("closed-form entropy")

    def _name(self) -> str:
        return type(self).__name__

    def _shape(self, sample_shape: Any) -> tuple:
        return sample_shape_of(self._name(), sample_shape) + self._batch_shape + self._event_shape

    def _expanded(self, t: Tensor, sample_shape: Any) -> Tensor:
        """``t`` (batch (+ event) shaped) expanded by ``sample_shape`` in front."""
        extra = sample_shape_of(self._name(), sample_shape)
        return expand(t, *extra, *([-1] * t.ndim)) if extra else t

    def _value(self, value: Any, like: Tensor) -> Tensor:
        """``value`` for ``log_prob``/``cdf`` in the parameters' dtype (``like``'s), its shape and, if constant,
        its support checked."""
        value = self._prob(value, like)
        if self._validate_args:
            event_dims_match(self._name(), value, self._batch_shape + self._event_shape)
            if self.support is not None:
                check(self._name(), "value", value, self.support, self)
        return value

    def _prob(self, value: Any, like: Tensor) -> Tensor:
        """An ``icdf`` argument in the parameters' dtype (``like``'s); not validated, as torch's."""
        value = value if isinstance(value, Tensor) else constant(np.asarray(value, to_numpy(like.dtype)))
        return value if value.dtype == like.dtype else cast(value, like.dtype)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        raise fail(self._name(), [], "has no rsample (it is not reparameterizable); use sample()")

    def expand(self, batch_shape: Any) -> Distribution:
        """A copy whose parameters (batch-shaped in front, as this package keeps them) are expanded to
        ``batch_shape``, as torch's ``expand``."""
        new_shape = tuple(batch_shape) if isinstance(batch_shape, (tuple, list)) else (batch_shape,)
        ok = all(isinstance(d, str) or isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
                 for d in new_shape)
        try:
            ok = ok and tuple(broadcast(self._batch_shape, new_shape)) == new_shape
        except InferenceError:
            ok = False
        if not ok:
            raise fail(self._name(), [], f"expand: batch_shape {tuple(new_shape)} is not an expansion of the batch "
                                         f"shape {self._batch_shape}")
        new, rank = copy.copy(self), len(self._batch_shape)
        for name, v in vars(self).items():
            if isinstance(v, Tensor) and name not in self._unexpanded:
                setattr(new, name, expand(v, *new_shape, *([-1] * (v.ndim - rank))))
            elif isinstance(v, Distribution):
                setattr(new, name, v.expand(tuple(new_shape) + v.batch_shape[rank:]))
        new._batch_shape = tuple(new_shape)
        return new

    def perplexity(self) -> Tensor:
        """``exp(entropy())``."""
        return exp(self.entropy())

    def enumerate_support(self, expand: bool = True) -> Tensor:
        raise fail(self._name(), [], "has no enumerate_support (its support is not finite, or torch's has none)")

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """A draw of ``sample_shape + batch_shape + event_shape``, without gradient."""
        return detach(self.rsample(sample_shape))

    def cdf(self, value: Any) -> Tensor:
        raise fail(self._name(), [], "has no cdf (torch's has none either)")

    def icdf(self, value: Any) -> Tensor:
        raise fail(self._name(), [], "has no icdf (torch's has none either)")

    def __repr__(self) -> str:
        return f"{self._name()}(batch_shape={self._batch_shape}, event_shape={self._event_shape})"


def finfo(t: Tensor) -> np.finfo:
    """numpy's ``finfo`` of ``t``'s float dtype (bfloat16's too)."""
    return dtype_finfo(t.dtype)


def param_dtype(d: Distribution) -> str:
    """The dtype of ``d``'s parameters (its first Tensor attribute's, or its base distribution's)."""
    for v in vars(d).values():
        if isinstance(v, Tensor):
            return str(v.dtype)
        if isinstance(v, Distribution):
            return param_dtype(v)
    raise fail(d._name(), [], "holds no parameter Tensor")


def enumerated(values: Tensor, like: Tensor, batch_rank: int, expand: bool) -> Tensor:
    """torch's ``enumerate_support``: ``values`` (``(K, *event)``) with ``batch_rank`` ones after the first dim,
    or, where ``expand``, broadcast with ``like`` (batch shaped, then the event dims) over the batch."""
    v = reshape(values, [values.shape[0], *([1] * batch_rank), *values.shape[1:]])
    return broadcast_tensors(v, like)[0] if expand else v


def sum_rightmost(t: Tensor, n: int) -> Tensor:
    """``t`` summed over its last ``n`` dims."""
    return sum_(t, axis=list(range(-n, 0))) if n > 0 else t


__all__ = ["BOOLEAN", "NONNEGATIVE", "POSITIVE", "REAL", "SIMPLEX", "UNIT_INTERVAL", "Distribution", "check",
           "enumerated", "event_dims_match", "fail", "finfo", "known", "param_dtype", "params", "sample_shape_of",
           "sum_rightmost"]
