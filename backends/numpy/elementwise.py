"""Elementwise kernels: arithmetic, activations, comparisons, logic, casts.

numpy broadcasting is ONNX's multidirectional broadcasting, so binary kernels are one call.
Python-float attributes keep the input's dtype (NEP 50 weak scalars).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from graphc.backends.numpy.kernels import kernel, require_unidirectional


def _same_dtype(result: np.ndarray, like: np.ndarray) -> np.ndarray:
    return result if result.dtype == like.dtype else result.astype(like.dtype)


# -- arithmetic ---------------------------------------------------------------------------------
def _binary(op_type: str, fn, since: int = 7) -> None:
    kernel(op_type, since=since)(lambda a, b: (fn(a, b),))


_binary("Add", np.add)
_binary("Sub", np.subtract)
_binary("Mul", np.multiply)


@kernel("Div", since=7)
def div(a, b):
    if a.dtype.kind in "iu":  # ONNX integer division truncates toward zero; exact past 2**53 (no float)
        with np.errstate(divide="ignore", over="ignore"):
            floor = np.floor_divide(a, b)
            return (floor + ((floor * b != a) & ((a < 0) != (b < 0))).astype(floor.dtype),)
    return (np.divide(a, b),)


@kernel("Pow", since=7)
def pow_(x, y):
    return (_same_dtype(np.power(x, y), x),)


@kernel("Mod", since=10)
def mod(a, b, *, fmod=0):
    return ((np.fmod if fmod else np.mod)(a, b),)


def _variadic(op_type: str, fn, since: int = 8) -> None:
    kernel(op_type, since=since)(lambda *xs: (functools.reduce(fn, xs),))


_variadic("Max", np.maximum)
_variadic("Min", np.minimum)
_variadic("Sum", np.add)


@kernel("Mean", since=8)
def mean(*xs):
    return (_same_dtype(functools.reduce(np.add, xs) / len(xs), xs[0]),)


# -- unary math ---------------------------------------------------------------------------------
_UNARY = {
    "Abs": np.abs, "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt,
    "Floor": np.floor, "Ceil": np.ceil, "Round": np.round, "Sign": np.sign, "Tanh": np.tanh,
    "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos,
    "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh,
    "Acosh": np.arccosh, "Atanh": np.arctanh, "Not": np.logical_not, "IsNaN": np.isnan,
    "BitwiseNot": np.invert,
}
for _op, _fn in _UNARY.items():
    kernel(_op)(lambda x, _fn=_fn: (_fn(x),))


@kernel("Reciprocal")
def reciprocal(x):
    return (_same_dtype(np.reciprocal(x), x),)


@kernel("IsInf", since=10)
def isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return (np.isinf(x),)
    if detect_negative:
        return (np.isneginf(x),)
    return (np.isposinf(x),) if detect_positive else (np.zeros(x.shape, bool),)


# erf: numpy has none (and scipy is not a dependency).
# float64: Maclaurin series for |x| < 2.5 and a continued fraction for erfc beyond, both to
# ~1e-15. Narrower floats: the rational approximation Eigen and XLA use for float32 (relative
# error < 5e-7 everywhere), computed in float32 and about ten times faster.
_ERF_TERMS = np.array([(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(60)])
_ERF32_P = [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
            -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
            -1.60960333262415e-02]
_ERF32_Q = [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
            -7.37332916720468e-03, -1.42647390514189e-02]


def _erf32(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, -4, 4).astype(np.float32)  # erf(4) is 1 in float32
    x2 = x * x
    p = np.full_like(x2, _ERF32_P[0])
    for c in _ERF32_P[1:]:
        p = p * x2 + np.float32(c)
    q = np.full_like(x2, _ERF32_Q[0])
    for c in _ERF32_Q[1:]:
        q = q * x2 + np.float32(c)
    return x * p / q


def _erf64(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    small = np.minimum(ax, 2.5)
    z2 = small * small
    series = np.full_like(z2, _ERF_TERMS[-1])
    for c in _ERF_TERMS[-2::-1]:
        series = series * z2 + c
    out = np.asarray(series * small * (2 / math.sqrt(math.pi)))  # a 0-d array, not a scalar, to write into
    big = ax >= 2.5
    if big.any():
        xb = ax[big]
        frac = xb.copy()
        for k in range(60, 0, -1):  # erfc(x) = exp(-x^2)/sqrt(pi) / (x + 1/2/(x + 1/(x + 3/2/...)))
            frac = xb + (k / 2) / frac
        out[big] = 1 - np.exp(-xb * xb) / math.sqrt(math.pi) / frac
    return np.copysign(out, x)


def erf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.float64:
        return _erf64(x)
    return _erf32(x).astype(x.dtype, copy=False)


@kernel("Erf", since=9)
def erf_kernel(x):
    return (erf(x),)


# -- activations --------------------------------------------------------------------------------
@kernel("Relu", since=6)
def relu(x):
    return (np.maximum(x, 0).astype(x.dtype, copy=False),)


@kernel("LeakyRelu", since=6)
def leaky_relu(x, *, alpha=0.01):
    return (np.where(x >= 0, x, x * alpha).astype(x.dtype, copy=False),)


@kernel("PRelu", since=7)
def prelu(x, slope):
    require_unidirectional(slope, x.shape, "slope")
    return (np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False),)


@kernel("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    return (np.where(x > alpha, x, 0).astype(x.dtype, copy=False),)


@kernel("Elu", since=6)
def elu(x, *, alpha=1.0):
    return (np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0))).astype(x.dtype, copy=False),)


@kernel("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    neg = alpha * np.expm1(np.minimum(x, 0))
    return ((gamma * np.where(x > 0, x, neg)).astype(x.dtype, copy=False),)


@kernel("Celu", since=12)
def celu(x, *, alpha=1.0):
    neg = alpha * np.expm1(np.minimum(x, 0) / alpha)
    return (np.where(x > 0, x, neg).astype(x.dtype, copy=False),)


@kernel("Sigmoid", since=6)
def sigmoid(x):
    e = np.exp(-np.abs(x))  # never overflows
    return (np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False),)


@kernel("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return (np.clip(x * alpha + beta, 0, 1).astype(x.dtype, copy=False),)


@kernel("HardSwish", since=14)
def hard_swish(x):
    return ((x * np.clip(x / 6 + 0.5, 0, 1)).astype(x.dtype, copy=False),)


@kernel("Softplus")
def softplus(x):
    return (np.logaddexp(0, x).astype(x.dtype, copy=False),)


@kernel("Softsign")
def softsign(x):
    return ((x / (1 + np.abs(x))).astype(x.dtype, copy=False),)


@kernel("Mish", since=18)
def mish(x):
    return ((x * np.tanh(np.logaddexp(0, x))).astype(x.dtype, copy=False),)


@kernel("Swish", since=24)
def swish(x, *, alpha=1.0):
    return ((x * sigmoid(x * alpha)[0]).astype(x.dtype, copy=False),)


@kernel("Gelu", since=20)
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        return ((0.5 * x * (1 + np.tanh(inner))).astype(x.dtype, copy=False),)
    return ((0.5 * x * (1 + erf(x / math.sqrt(2)))).astype(x.dtype, copy=False),)


@kernel("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    out = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    return (out.astype(x.dtype, copy=False),)


@kernel("Clip", since=6)
def clip_v6(x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002 - spec names
    return (np.clip(x, min, max).astype(x.dtype, copy=False),)


@kernel("Clip", since=11)
def clip(x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return (x,)


# -- comparison and logic -----------------------------------------------------------------------
_binary("Equal", np.equal)
_binary("Less", np.less)
_binary("Greater", np.greater)
_binary("LessOrEqual", np.less_equal, since=12)
_binary("GreaterOrEqual", np.greater_equal, since=12)
_binary("And", np.logical_and)
_binary("Or", np.logical_or)
_binary("Xor", np.logical_xor)
_binary("BitwiseAnd", np.bitwise_and, since=18)
_binary("BitwiseOr", np.bitwise_or, since=18)
_binary("BitwiseXor", np.bitwise_xor, since=18)


@kernel("BitShift", since=11)
def bit_shift(x, y, *, direction):
    return ((np.left_shift if direction == "LEFT" else np.right_shift)(x, y),)


@kernel("Where", since=9)
def where(cond, x, y):
    return (np.where(cond, x, y),)


# -- casts --------------------------------------------------------------------------------------
def cast_to(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if x.dtype.kind in "OUS" or dtype.kind in "OUS":  # strings go through Python str
        if dtype.kind in "OUS":
            return np.vectorize(lambda v: str(v), otypes=[object])(x).astype(object)
        return np.array([float(v) for v in x.ravel()]).reshape(x.shape).astype(dtype)
    return x.astype(dtype, copy=False)


@kernel("Cast", since=6)
def cast(x, *, to, saturate=1):
    return (cast_to(x, np.dtype(tensor_dtype_to_np_dtype(to))),)


@kernel("CastLike", since=15)
def cast_like(x, like, *, saturate=1):
    return (cast_to(x, like.dtype),)


@kernel("Identity")
def identity(x):
    return (x,)


@kernel("BitCast", since=26)
def bit_cast(x, *, to):
    return (x.view(np.dtype(tensor_dtype_to_np_dtype(to))),)


@kernel("SwiGLU", since=28)
def swiglu(a, b, *, alpha=1.0):
    return ((a * sigmoid(a * alpha)[0] * b).astype(a.dtype, copy=False),)
