"""``gc.special``: torch.special's functions under its names. The gamma and Bessel family is
``graphc.dsl.ops_special``'s; the normal distribution's (``ndtr``, ``ndtri``, ``log_ndtr``, ``erfcx``)
are here, in float64 without Erf (which onnxruntime lacks in float64 and its sessions write out):
``erf`` and ``erfc`` from ``P(1/2, x**2)``'s series and ``Q(1/2, x**2)``'s continued fraction,
``ndtri`` by Cephes' rational fits, as torch. The Bessel and Airy functions are ``graphc.dsl.special_bessel``'s,
the orthogonal polynomials ``graphc.dsl.special_polynomials``'; the others are the DSL's functions (``erf``,
``expm1``, ``softmax``, ...). The ones torch.special takes complex Tensors in take them too, as
``graphc.dsl.complex_math.SPECIAL``'s; the others refuse one, as torch's."""

from __future__ import annotations

import functools
import math
from typing import Any

from graphc.dsl import ops
from graphc.dsl.builder import user_source
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import cast, erf, exp, lift, log, scalar, sqrt, where
from graphc.dsl.ops import sigmoid as expit
from graphc.dsl.ops_array import logsumexp
from graphc.dsl.ops_binary import to_float_pair, xlogy
from graphc.dsl.ops_elementwise import erfc, erfinv, exp2, expm1, horner, log1p, logit, sinc
from graphc.dsl.ops_math import isinf, isnan, round
from graphc.dsl.ops_special import (digamma, float_input, gamma_fraction, gamma_series, i0, i0e, i1, i1e, igamma,
                                    igammac, in_float64, lgamma, multigammaln, polygamma, zeta)
from graphc.dsl.special_bessel import (airy_ai, bessel_j0, bessel_j1, bessel_y0, bessel_y1, modified_bessel_i0,
                                      modified_bessel_i1, modified_bessel_k0, modified_bessel_k1,
                                      scaled_modified_bessel_k0, scaled_modified_bessel_k1, spherical_bessel_j0)
from graphc.dsl.special_polynomials import (chebyshev_polynomial_t, chebyshev_polynomial_u, chebyshev_polynomial_v,
                                           chebyshev_polynomial_w, hermite_polynomial_h, hermite_polynomial_he,
                                           laguerre_polynomial_l, legendre_polynomial_p,
                                           shifted_chebyshev_polynomial_t, shifted_chebyshev_polynomial_u,
                                           shifted_chebyshev_polynomial_v, shifted_chebyshev_polynomial_w)
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.dsl.torch_keywords import torch_names
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

gammaln, psi, gammainc, gammaincc = lgamma, digamma, igamma, igammac

_NDTRI_P0 = (-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968, -1.2391658386738125)
_NDTRI_Q0 = (1.0, 1.9544885833814176, 4.676279128988815, 86.36024213908905, -225.46268785411937, 200.26021238006066,
             -82.03722561683334, 15.90562251262117, -1.1833162112133)
_NDTRI_P1 = (4.0554489230596245, 31.525109459989388, 57.16281922464213, 44.08050738932008, 14.684956192885803,
             2.1866330685079025, -0.1402560791713545, -0.03504246268278482, -0.0008574567851546854)
_NDTRI_Q1 = (1.0, 15.779988325646675, 45.39076351288792, 41.3172038254672, 15.04253856929075, 2.504649462083094,
             -0.14218292285478779, -0.03808064076915783, -0.0009332594808954574)
_NDTRI_P2 = (3.2377489177694603, 6.915228890689842, 3.9388102529247444, 1.3330346081580755, 0.20148538954917908,
             0.012371663481782003, 0.00030158155350823543, 2.6580697468673755e-06, 6.239745391849833e-09)
_NDTRI_Q2 = (1.0, 6.02427039364742, 3.6798356385616087, 1.3770209948908132, 0.21623699359449663, 0.013420400608854318,
             0.00032801446468212774, 2.8924786474538068e-06, 6.790194080099813e-09)
_EXP_M2 = math.exp(-2)
# terms of erf's series (|x| < sqrt(1.5)) and erfc's continued fraction (beyond): relative error 1.2e-11 at the
# switch (the fraction converges slowest there), 1e-13 and less away from it
_ERF_TERMS = 32
_SQRT_PI = math.sqrt(math.pi)
_SERIES_EDGE = math.sqrt(1.5)  # x**2 = a + 1 for a = 1/2: series below, continued fraction above
_HUGE = 1e100  # beyond, erfcx(x) = 1 / (sqrt(pi) x) to float64


def _erf_small(z: Tensor) -> Tensor:
    """``erf(z)`` for ``|z| < sqrt(1.5)``: ``2 z exp(-z**2) / sqrt(pi)`` times ``P(1/2, z**2)``'s series."""
    half = scalar(0.5, z)
    z2 = z * z
    return scalar(2 / _SQRT_PI, z) * z * exp(-z2) * gamma_series(half, z2, _ERF_TERMS)


def _erfcx_large(z: Tensor) -> Tensor:
    """``exp(z**2) erfc(z)`` for ``z >= sqrt(1.5)`` (inf: 0): ``z / sqrt(pi)`` over ``Q(1/2, z**2)``'s
    continued fraction."""
    huge = z > scalar(_HUGE, z)
    zf = where(huge, scalar(_HUGE, z), z)
    fraction = zf / (scalar(_SQRT_PI, z) * gamma_fraction(scalar(0.5, z), zf * zf, _ERF_TERMS))
    return where(huge, scalar(1 / _SQRT_PI, z) / z, fraction)


def _erfc_parts(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(small, 1 - erf(x) where small, erfcx(|x|) where not)``, each branch reading only its own inputs."""
    small = abs_(x) < scalar(_SERIES_EDGE, x)
    near = scalar(1, x) - _erf_small(where(small, x, scalar(0, x)))
    far = _erfcx_large(where(small, scalar(_SERIES_EDGE, x), abs_(x)))
    return small, near, far


def _erfc64(x: Tensor) -> Tensor:
    small, near, far = _erfc_parts(x)
    xf = where(small, scalar(_SERIES_EDGE, x), x)
    tail = exp(-(xf * xf)) * far
    return where(small, near, where(x > scalar(0, x), tail, scalar(2, x) - tail))


def _erfcx64(x: Tensor) -> Tensor:
    small, near, far = _erfc_parts(x)
    xs = where(small, x, scalar(0, x))
    xn = where(small | (x > scalar(0, x)), scalar(0, x), x)
    return where(small, exp(xs * xs) * near, where(x > scalar(0, x), far, scalar(2, x) * exp(xn * xn) - far))


def erfcx(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The scaled complementary error function ``exp(x**2) erfc(x)``, finite where ``erfc``
    underflows (``1 / (sqrt(pi) x)`` for huge ``x``); inf for ``x`` below about -26.6, as torch."""
    return in_float64(_erfcx64, float_input(input))


def ndtr(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The standard normal CDF ``erfc(-x / sqrt(2)) / 2``, its relative accuracy kept in the lower tail."""
    return in_float64(lambda x: scalar(0.5, x) * _erfc64(x * scalar(-math.sqrt(0.5), x)), float_input(input))


def _log_ndtr64(x: Tensor) -> Tensor:
    t = x * scalar(math.sqrt(0.5), x)
    lower = x < scalar(-1, x)
    tl = where(lower, t, scalar(-1, x))
    tail = log(_erfcx64(-tl) * scalar(0.5, x)) - tl * tl
    return where(lower, tail, log1p(-_erfc64(where(lower, scalar(0, x), t)) * scalar(0.5, x)))


def log_ndtr(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``log(ndtr(x))``: below -1 ``log(erfcx(-t) / 2) - t**2`` (``t = x / sqrt(2)``), so the far
    tail is finite (-5e9 at -1e5), else ``log1p(-erfc(t) / 2)``, as torch."""
    return in_float64(_log_ndtr64, float_input(input))


def _ndtri64(y: Tensor) -> Tensor:
    one = scalar(1, y)
    invalid = (y <= scalar(0, y)) | (y >= one) | isnan(y)
    upper = y > scalar(1 - _EXP_M2, y)
    yt = where(upper, one - y, y)
    central = (yt > scalar(_EXP_M2, y)) & ~invalid
    yc = where(central, y, scalar(0.5, y)) - scalar(0.5, y)
    y2 = yc * yc
    middle = (yc + yc * (y2 * horner(_NDTRI_P0, y2) / horner(_NDTRI_Q0, y2))) * scalar(math.sqrt(2 * math.pi), y)
    t = sqrt(scalar(-2, y) * log(where(central | invalid, scalar(0.1, y), yt)))
    z = one / t
    near = t < scalar(8, y)
    correction = where(near, horner(_NDTRI_P1, z) / horner(_NDTRI_Q1, z), horner(_NDTRI_P2, z) / horner(_NDTRI_Q2, z))
    tail = t - log(t) / t - z * correction
    value = where(central, middle, where(upper, tail, -tail))
    inf = scalar(math.inf, y)
    return where(y == scalar(0, y), -inf, where(y == one, inf, where(invalid, scalar(math.nan, y), value)))


def ndtri(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The inverse of ``ndtr`` on [0, 1] (-inf at 0, inf at 1, nan outside): Cephes' rational fits,
    as torch (central for ``|y - 1/2| <= 1/2 - exp(-2)``, in ``sqrt(-2 log y)`` in the tails)."""
    return in_float64(_ndtri64, float_input(input))


def entr(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``-x log(x)`` for ``x > 0``, 0 at 0, -inf below (nan stays nan), as torch."""
    x = float_input(input)
    zero = scalar(0, x)
    positive = x > zero
    value = -x * log(where(positive, x, scalar(1, x)))
    return where(positive | isnan(x), value, where(x == zero, zero, scalar(-math.inf, x)))


def xlog1py(input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
    """``input * log1p(other)``, 0 where ``input`` is 0 unless ``other`` is nan, as ``xlogy``; where
    ``0 * log1p(other)`` would not be 0 the log reads 0, so no nan gradient leaks from it."""
    x, y = to_float_pair("xlog1py", input, other)
    zero = (x == scalar(0, x)) & ~isnan(y)
    product = x * log1p(where(zero & ((y <= scalar(-1, y)) | isinf(y)), scalar(0, y), y))
    return where(zero, product + scalar(0, x), product)


def _with_dtype(x: Any, dtype: Any, fn: str) -> Tensor:
    x = lift(x)
    if dtype is None:
        if x.dtype not in FLOAT_DTYPES:
            raise CaptureError(f"special.{fn} input: expected a floating-point Tensor (or dtype=), got {x.dtype} "
                               f"(at {user_source()})")
        return x
    return cast(x, dtype)


def softmax(input: Any, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002 - torch's names
    """``torch.special.softmax``: ``gc.softmax`` along ``dim``, after casting to ``dtype`` if given."""
    return ops.softmax(_with_dtype(input, dtype, "softmax"), dim)


def log_softmax(input: Any, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002 - torch's names
    """``torch.special.log_softmax``: ``gc.log_softmax`` along ``dim``, after casting to ``dtype`` if given."""
    return ops.log_softmax(_with_dtype(input, dtype, "log_softmax"), dim)


__all__ = [
    "airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "chebyshev_polynomial_t", "chebyshev_polynomial_u",
    "chebyshev_polynomial_v", "chebyshev_polynomial_w", "digamma", "entr", "erf", "erfc", "erfcx", "erfinv", "exp2",
    "expit", "expm1", "gammainc", "gammaincc", "gammaln", "hermite_polynomial_h", "hermite_polynomial_he", "i0",
    "i0e", "i1", "i1e", "laguerre_polynomial_l", "legendre_polynomial_p", "log1p", "log_ndtr", "log_softmax", "logit",
    "logsumexp", "modified_bessel_i0", "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
    "multigammaln", "ndtr", "ndtri", "polygamma", "psi", "round", "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "sinc", "softmax", "spherical_bessel_j0",
    "xlog1py", "xlogy", "zeta",
]

def _taking_complex(name: str, fn: Any) -> Any:
    """``fn``, or for a complex Tensor argument ``complex_math.SPECIAL[name]``, refused where torch.special
    refuses one (not implemented for 'ComplexDouble')."""
    @functools.wraps(fn)
    def either(*args: Any, **kwargs: Any) -> Any:
        z = next((a for a in (*args, *kwargs.values()) if isinstance(a, ComplexTensor)), None)
        if z is None:
            return fn(*args, **kwargs)
        from graphc.dsl.complex_math import SPECIAL  # complex_ops imports this module (through distributions)
        if name not in SPECIAL:
            raise CaptureError(f"special.{name} is not implemented for {z.dtype} (as torch.special.{name}: "
                               f"'Complex{'Float' if z.dtype == 'complex64' else 'Double'}') at {user_source()}; "
                               f"gc.special's complex functions: {', '.join(SPECIAL)}")
        return SPECIAL[name](*args, **kwargs)
    return either


for _name in __all__:  # torch's keyword names (gc.special.expit(input=x)), complex Tensors where torch takes them
    globals()[_name] = torch_names(_taking_complex(_name, globals()[_name]))
del _name
