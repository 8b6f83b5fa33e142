"""Channel (feature) dropout and alpha dropout with ``torch.nn.functional``'s names: ``dropout1d``,
``dropout2d``, ``dropout3d``, ``alpha_dropout`` and ``feature_alpha_dropout``. Each draws its mask
with one ONNX ``Dropout`` (``ops_nn.dropout``) on ones of the mask's shape, so the training
generator's explicit noise and inference mode (the identity) apply to them as to ``Dropout``."""

from __future__ import annotations

import math

import numpy as np

from graphc.dsl.batching import batch_rank
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.inplace import into, writes_input
from graphc.dsl.ops import concat, const_i64, emit, lift, scalar
from graphc.dsl.ops_array import ir_tensor, ones_like
from graphc.dsl.ops_nn import dropout
from graphc.dsl.tensor import Tensor

_SELU_ALPHA = 1.7580993408473766  # torch's alpha_dropout constant: SELU's scale * alpha


def _kept(x: Tensor, p: float, training: bool, features: int | None) -> Tensor:
    """``Dropout(ones)``: ``keep / (1 - p)`` with ``keep`` drawn per element (``features`` None) or
    per entry of the first ``features`` dims (the mask's other dims 1), 1 where not training."""
    if features is None:
        return dropout(ones_like(x), p, training)
    lead = emit("Slice", [emit("Shape", [x]), const_i64([0]), const_i64([features])])
    shape = concat([lead, const_i64([1] * (x.ndim - features))])
    ones = emit("ConstantOfShape", [shape], {"value": ir_tensor(np.ones(1, x.dtype.numpy))},
                out_types=[(x.dtype, [*x.shape[:features], *[1] * (x.ndim - features)])])
    return dropout(ones, p, training)


def _check_rank(fn: str, x: Tensor, ranks: tuple[int, ...], layout: str) -> None:
    if x.shape is None or x.ndim not in ranks:
        raise op_error("Dropout", [x], f"{fn} expects a {layout} input, got rank {x.ndim}", user_source())


@writes_input
def dropout1d(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Whole channels of a ``(N, C, L)`` or ``(C, L)`` input zeroed with probability ``p``, the
    others scaled by ``1 / (1 - p)``."""
    x = lift(x)
    batch_rank("dropout1d", x, "C, L")
    return into(x, x * _kept(x, p, training, x.ndim - 1), inplace)


@writes_input
def dropout2d(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """``dropout1d`` over ``(N, C, H, W)``: the mask is per entry of the first two dims, so a
    3-D input is read as ``(N, C, L)``, as torch does today (it warns that this will change)."""
    x = lift(x)
    _check_rank("dropout2d", x, tuple(range(2, 9)), "(N, C, H, W)")
    return into(x, x * _kept(x, p, training, 2), inplace)


@writes_input
def dropout3d(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """``dropout1d`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""
    x = lift(x)
    batch_rank("dropout3d", x, "C, D, H, W")
    return into(x, x * _kept(x, p, training, x.ndim - 3), inplace)


def _alpha(x: Tensor, p: float, training: bool, features: int | None) -> Tensor:
    """torch's alpha dropout: kept ``a x + alpha a p``, dropped ``alpha a (p - 1)``, where ``a =
    ((alpha^2 p + 1)(1 - p))^(-1/2)`` (a SELU net's mean and variance are kept). Written on
    ``d = Dropout(ones)`` (0 or ``q = 1/(1-p)`` in training, 1 in inference) as ``x + (d - 1) (x (1
    + e d) + alpha a (1 - p))`` with ``e = ((a - 1)/(q - 1) - 1)/q``: exactly ``x`` where ``d = 1``."""
    x = lift(x)
    if p == 0:  # no draw, as torch
        return x
    d = _kept(x, p, training, features)
    a = 1.0 / math.sqrt((_SELU_ALPHA ** 2 * p + 1) * (1 - p))
    q = 1.0 / (1.0 - p)
    e = ((a - 1) / (q - 1) - 1) / q
    slope = x * (scalar(1.0, x) + d * scalar(e, x)) + scalar(_SELU_ALPHA * a * (1 - p), x)
    return x + (d - scalar(1.0, x)) * slope


@writes_input
def alpha_dropout(x: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """Alpha dropout per element (see ``_alpha``); ``training`` defaults to False, as torch's."""
    return into(x, _alpha(x, p, training, None), inplace)


@writes_input
def feature_alpha_dropout(x: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """Alpha dropout of whole channels (the mask per entry of the first two dims)."""
    x = lift(x)
    _check_rank("feature_alpha_dropout", x, tuple(range(2, 9)), "(N, C, *)")
    return into(x, _alpha(x, p, training, 2), inplace)


__all__ = ["alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "feature_alpha_dropout"]
