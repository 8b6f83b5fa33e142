"""Reductions and axis-wise normalizations: Reduce*, ArgMax/ArgMin, Softmax family, CumSum, TopK.

Versioning: ``axes`` is an attribute until ReduceSum-13 / other Reduce*-18 and an input after;
Softmax, LogSoftmax and Hardmax before opset 13 flatten the input to 2-D at ``axis`` and
normalize each row (later versions normalize along ``axis`` only).
"""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel, scalar


def _axes_tuple(axes) -> tuple[int, ...] | None:
    if axes is None:
        return None
    axes = np.asarray(axes).ravel()
    return tuple(int(a) for a in axes) if axes.size else None


def _lowest(dtype: np.dtype):
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype: np.dtype):
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


def _logsumexp(x, axis, keepdims):
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _mean(x, axis, keepdims):
    """The sum over the count: over an empty set 0/0, NaN (the spec leaves it undefined;
    onnx.reference gives NaN, onnxruntime 0). Integers have no NaN: that raises."""
    count = int(np.prod([x.shape[a] for a in axis], dtype=np.int64))
    if count == 0 and x.dtype.kind in "biu":
        raise ValueError(f"ReduceMean over an empty set (axes {list(axis)} of shape {list(x.shape)}) is 0/0, "
                         f"which {x.dtype} cannot hold")
    total = np.sum(x, axis=axis, keepdims=keepdims, dtype=np.float64 if x.dtype.kind in "biu" else x.dtype)
    return np.divide(total, count) if count else np.full_like(total, np.nan)


# name -> fn(x, axis, keepdims), each returning an array of x's dtype.
_REDUCERS = {
    "ReduceSum": lambda x, a, k: np.sum(x, axis=a, keepdims=k, dtype=x.dtype),
    "ReduceMean": lambda x, a, k: _mean(x, a, k),
    "ReduceMax": lambda x, a, k: np.max(x, axis=a, keepdims=k, initial=_lowest(x.dtype)),
    "ReduceMin": lambda x, a, k: np.min(x, axis=a, keepdims=k, initial=_highest(x.dtype)),
    "ReduceProd": lambda x, a, k: np.prod(x, axis=a, keepdims=k, dtype=x.dtype),
    "ReduceL1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k, dtype=x.dtype),
    "ReduceL2": lambda x, a, k: np.sqrt(np.sum(np.square(x), axis=a, keepdims=k)),
    "ReduceSumSquare": lambda x, a, k: np.sum(np.square(x), axis=a, keepdims=k, dtype=x.dtype),
    "ReduceLogSum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "ReduceLogSumExp": _logsumexp,
}


def _reduce(fn, x, axes, keepdims, noop_with_empty_axes):
    axes = _axes_tuple(axes)
    if axes is None:  # a no-op still applies the op's elementwise part (x^2, |x|, log x)
        axes = () if noop_with_empty_axes else tuple(range(x.ndim))
    if x.dtype == np.bool_:
        return (fn(x.astype(np.uint8), axes, bool(keepdims)).astype(np.bool_),)
    if x.dtype.kind not in "biufc" or x.dtype == np.float16:
        # float16 and bfloat16 reduced in float32 and rounded once, as onnxruntime's CPU provider (which casts
        # them to float32 around the node) and torch do: numpy sums them in their own dtype (a bfloat16 sum of
        # 1,000 values near 50 stops at 16,384)
        return (np.asarray(fn(x.astype(np.float32), axes, bool(keepdims))).astype(x.dtype),)
    out = np.asarray(fn(x, axes, bool(keepdims)))
    return (out.astype(x.dtype, copy=False),)


def reduce_axes(op_type: str, x, axes: tuple[int, ...]):
    """``op_type`` (a Reduce* name) of ``x`` over ``axes``, kept as size-1 dims (none: ``x``)."""
    return _reduce(_REDUCERS[op_type], x, axes, 1, 1)[0]


def _register_reduce(op_type: str, fn, axes_input_since: int) -> None:
    @kernel(op_type, since=1)
    def reduce_attr(x, *, axes=None, keepdims=1):
        return _reduce(fn, x, axes, keepdims, 0)

    @kernel(op_type, since=axes_input_since)
    def reduce_input(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(fn, x, axes, keepdims, noop_with_empty_axes)


for _op, _fn in _REDUCERS.items():
    _register_reduce(_op, _fn, 13 if _op == "ReduceSum" else 18)


def _arg(fn, x, axis, keepdims, select_last_index):
    if select_last_index:
        n = x.shape[axis]
        out = n - 1 - fn(np.flip(x, axis), axis=axis)
    else:
        out = fn(x, axis=axis)
    out = out.astype(np.int64)
    return (np.expand_dims(out, axis) if keepdims else out,)


@kernel("ArgMax", since=1)
def argmax(x, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(np.argmax, x, axis, keepdims, select_last_index)


@kernel("ArgMin", since=1)
def argmin(x, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(np.argmin, x, axis, keepdims, select_last_index)


# -- softmax family -----------------------------------------------------------------------------
def _shifted(x, axis):
    """``x`` less its maximum along ``axis``; an empty axis (whose result is empty) has none."""
    return x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)


def _softmax(x, axis):
    e = np.exp(_shifted(x, axis))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x, axis):
    shifted = _shifted(x, axis)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _hardmax(x, axis):
    if not x.size:
        return x.copy()
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out


def _coerced_2d(fn, x, axis):
    """Opset < 13: flatten to [prod(shape[:axis]), prod(shape[axis:])], normalize rows."""
    axis = axis % x.ndim if x.ndim else 0
    rows, cols = (int(np.prod(part, dtype=np.int64)) for part in (x.shape[:axis], x.shape[axis:]))
    return fn(x.reshape(rows, cols), 1).reshape(x.shape)  # (cols, not -1: rows may be 0)


for _op, _fn in (("Softmax", _softmax), ("LogSoftmax", _log_softmax), ("Hardmax", _hardmax)):
    kernel(_op, since=1)(lambda x, *, axis=1, _fn=_fn: (_coerced_2d(_fn, x, axis),))
    kernel(_op, since=13)(lambda x, *, axis=-1, _fn=_fn: (_fn(x, axis),))


# -- scans and selection ------------------------------------------------------------------------
def _cumulative(fn, identity, x, axis, exclusive, reverse):
    axis = int(scalar(axis))
    if reverse:
        x = np.flip(x, axis)
    out = fn(x, axis=axis, dtype=x.dtype)
    if exclusive and x.shape[axis]:  # shift by one along the axis, the identity first
        first = np.full_like(np.take(out, [0], axis=axis), identity)
        out = np.concatenate([first, np.take(out, range(out.shape[axis] - 1), axis=axis)], axis=axis)
    return (np.flip(out, axis) if reverse else out,)


@kernel("CumSum", since=11)
def cumsum(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(np.cumsum, 0, x, axis, exclusive, reverse)


@kernel("CumProd", since=26)
def cumprod(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(np.cumprod, 1, x, axis, exclusive, reverse)


def _topk(x, k, axis, largest, sorted_):
    k = int(scalar(k))
    if largest:  # descending, ties lower index first: the stable ascending order of x reversed, read backwards
        n = x.shape[axis]  # (negating x overflowed int64's least value; NaN sorts as numpy's, largest)
        order = np.flip(n - 1 - np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")  # ties: lower index first
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


@kernel("TopK", since=1)
def topk_v1(x, *, axis=-1, k):
    return _topk(x, k, axis, 1, 1)


@kernel("TopK", since=10)
def topk_v10(x, k, *, axis=-1):
    return _topk(x, k, axis, 1, 1)


@kernel("TopK", since=11)
def topk(x, k, *, axis=-1, largest=1, sorted=1):  # noqa: A002 - spec name
    return _topk(x, k, axis, largest, sorted)
