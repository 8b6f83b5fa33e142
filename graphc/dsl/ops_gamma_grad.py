"""torch's reparameterisation gradients of Gamma-family draws, as DSL formulas with aten's branches, constants and
precisions (``standard_gamma_grad_one`` and ``dirichlet_grad_one`` in its ``Distributions.h``), so a gradient equals
torch's at the same draw:

- ``gc._standard_gamma_grad(alpha, x)``: ``d x / d alpha`` of a Gamma(alpha, 1) draw ``x``, ``-(dF/dalpha) / pdf``
  of the Gamma cdf ``F``: its power series for ``x < 0.8``, Rice's saddle-point expansion for ``alpha > 8``, else a
  bivariate rational fit in ``log(x / alpha)`` and ``log(alpha)``; float64, rounded to the inputs' dtype.
- ``gc._dirichlet_grad(x, alpha, total)``: the same for a Beta(alpha, total - alpha) draw ``x``, divided by
  ``1 - x``: Taylor series near 0 and 1 (in the inputs' dtype, as aten), a saddle-point expansion where both
  concentrations exceed 6, else a rational correction of ``x (psi(total) - psi(alpha)) / (total - alpha)``.
- ``implicit_term(wrt, slope)``: a zero whose gradient to ``wrt`` is ``slope``, added to a draw to differentiate it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import cast, detach, exp, lift, log, sqrt, where
from graphc.dsl.ops_array import pow as pow_
from graphc.dsl.ops_elementwise import horner
from graphc.dsl.ops_math import isfinite, isnan
from graphc.dsl.ops_special import digamma
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES


def _c_float(v: float) -> float:
    """The value of the C literal ``<v>f`` (aten compares doubles with float constants such as ``0.8f``)."""
    return float(np.float32(v))


# log(dx/dalpha) = p / q, p and q cubics in log(alpha) whose coefficients are quadratics in log(x / alpha): for each
# of p's four and q's four coefficients, its quadratic's (constant, linear, square) terms
_GAMMA_PQ = (
    (0.16009398, 0.53487893, 0.040121004), (-0.094634809, 0.1298071, -0.0065914022),
    (0.025146376, 0.065735949, -0.0026286047), (-0.0030648343, -0.0015649758, -0.0013441777),
    (1.0, 0.16639465, 0.017050642), (0.32668115, 0.020070113, -0.0021309326),
    (0.10406089, -0.0035938915, 0.00085092367), (0.0014179084, -0.00058392623, -1.5247877e-07),
)

# The Beta gradient's rational correction p / q: _BETA_P[i][j] (and _BETA_Q[i][j]) is the cubic in
# b = log(total) - log(alpha / x) multiplying log(x)**i log(alpha / x)**j, constant term first
_BETA_P = (
    ((1.003668233, -0.01061107488, -0.0657888334, 0.01201642863),
     (0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033),
     (-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013)),
    ((0.221950385, -0.3187676331, 0.01799915743, 0.01074823814),
     (-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057),
     (0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05)),
    ((-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565),
     (0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181),
     (0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05)),
)
_BETA_Q = (
    ((1.0, -0.02924021934, -0.04438342661, 0.007285809825),
     (0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521),
     (-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149)),
    ((0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273),
     (0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956),
     (-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05)),
    ((0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05),
     (0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05),
     (-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06)),
)


def _operands(fn: str, **named: Any) -> list[Tensor]:
    """The named operands as float Tensors of one dtype (torch refuses others)."""
    ts = [lift(v) for v in named.values()]
    for (name, _), t in zip(named.items(), ts):
        if t.dtype not in FLOAT_DTYPES:
            raise op_error(fn, ts, f"{name} must be a floating point Tensor, got {t.dtype}", user_source())
    if len({t.dtype for t in ts}) > 1:
        got = ", ".join(f"{name} {t.dtype}" for name, t in zip(named, ts))
        raise op_error(fn, ts, f"the operands must have one dtype, got {got}", user_source())
    return ts


def _f64(t: Tensor) -> Tensor:
    return t if t.dtype == "float64" else cast(t, "float64")


def _rounded(fn: Any, x: Tensor, *args: Any) -> Tensor:
    """``fn(x, *args)`` computed in float64 and rounded to ``x``'s dtype: C's correctly rounded ``logf``/``powf``,
    which numpy's and onnxruntime's float32 kernels miss by an ulp in a few percent of cases."""
    if x.dtype == "float64":
        return fn(x, *args)
    return cast(fn(_f64(x), *(_f64(a) if isinstance(a, Tensor) else a for a in args)), x.dtype)


def _nested(coeffs: list, t: Tensor) -> Tensor:
    """``coeffs[0] + t (coeffs[1] + t (...))`` for Tensor or float coefficients, innermost first."""
    p = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        p = t * p + c
    return p


def _zero_nan(r: Tensor) -> Tensor:
    return where(isnan(r), 0.0, r)


def _gamma_series(a: Tensor, x: Tensor) -> Tensor:
    """``-(dF/dalpha) / pdf`` from six terms of the series ``F = x^a sum_n (-x)^n / (n! (a + n))``; 0 where nan."""
    numer, denom = 1.0, a
    series1, series2 = 1.0 / a, 1.0 / (a * a)
    for i in range(1, 6):
        numer = numer * (-x / float(i))
        denom = denom + 1.0
        series1 = series1 + numer / denom
        series2 = series2 + numer / (denom * denom)
    x_pow_a = pow_(x, a)
    pdf = pow_(x, a - 1.0) * exp(-x)
    cdf_a = (log(x) - digamma(a)) * (x_pow_a * series1) - x_pow_a * series2
    return _zero_nan(-cdf_a / pdf)


def _gamma_saddle(a: Tensor, x: Tensor) -> Tensor:
    """Rice's saddle-point expansion for large ``a``; a polynomial within 10% of ``x = a`` (its singularity)."""
    near = ((1.0 + 24.0 * a * (1.0 + 12.0 * a))
            * (1440.0 * (a * a) + 6.0 * x * (53.0 - 120.0 * x) - 65.0 * x * x / a + a * (107.0 + 3600.0 * x))
            / (1244160.0 * (a * a) * (a * a)))
    root = sqrt(8.0 * a)
    t2 = root / (a - x)
    t3 = pow_(x - a - a * log(x / a), -1.5)
    t1 = log(x / a) * where(x < a, t2 - t3, t2 + t3) - sqrt(2.0 / a) * (a + x) / ((a - x) * (a - x))
    stirling = 1.0 + 1.0 / (12.0 * a) * (1.0 + 1.0 / (24.0 * a))
    far = -stirling * (x * t1) / root
    return where((_c_float(0.9) * a <= x) & (x <= _c_float(1.1) * a), near, far)


def _gamma_rational(a: Tensor, x: Tensor) -> Tensor:
    u, v = log(x / a), log(a)
    coef = [_nested(list(c), u) for c in _GAMMA_PQ]
    return exp(_nested(coef[:4], v) / _nested(coef[4:], v))


def _standard_gamma_grad64(a: Tensor, x: Tensor) -> Tensor:
    return where(x < _c_float(0.8), _gamma_series(a, x),
                 where(a > 8.0, _gamma_saddle(a, x), _gamma_rational(a, x)))


def standard_gamma_grad(alpha: Any, x: Any) -> Tensor:
    """torch's ``_standard_gamma_grad``: ``d x / d alpha`` at Gamma(alpha, 1) draws ``x`` (broadcast), in their
    dtype; no gradient flows through it."""
    a, xs = _operands("_standard_gamma_grad", alpha=alpha, x=x)
    g = _standard_gamma_grad64(detach(_f64(a)), detach(_f64(xs)))
    return g if a.dtype == "float64" else cast(g, a.dtype)


# Cephes' asymptotic series of digamma (in 1 / x**2), highest power first
_PSI_SERIES = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
               -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
               8.33333333333333333333e-2)
_PSI_10 = 2.25175258906672110764


def _digamma_as_aten(x: Tensor) -> Tensor:
    """digamma of positive ``x`` as aten's ``digamma_one`` computes it for the Beta gradients: for float64 exact, for
    a narrower dtype with that dtype's ``1 / x`` steps up to 10, ``log x``, ``0.5 / x`` and ``x * x`` in a float64
    sum, which is what torch's float32 gradients are (exact float64 digammas differ by ulps, and by 3% where ``b`` is
    small against ``a`` in ``psi(a + b) - psi(a)``)."""
    if x.dtype == "float64":
        return digamma(x)
    shift = _f64(x) * 0.0
    for _ in range(10):  # any positive x reaches 10 within ten steps
        below = x < 10.0
        shift = shift - where(below, _f64(1.0 / x), 0.0)
        x = where(below, x + 1.0, x)
    z = 1.0 / _f64(x * x)
    asymptotic = shift + _f64(_rounded(log, x)) - _f64(0.5 / x) - z * horner(_PSI_SERIES, z)
    return cast(where(x == 10.0, shift + _PSI_10, asymptotic), x.dtype)


def _beta_small_alpha(x: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """The Beta(a, b) gradient in ``a`` (over ``1 - x``) from eleven terms of its Taylor series at ``x = 0``."""
    factor = _digamma_as_aten(a) - _digamma_as_aten(a + b) - _rounded(log, x)
    numer = 1.0
    series = numer / a * (factor + 1.0 / a)
    for i in range(1, 11):
        numer = numer * ((float(i) - b) * x / float(i))
        denom = a + float(i)
        series = series + numer / denom * (factor + 1.0 / denom)
    return _zero_nan(x * _rounded(pow_, 1.0 - x, -b) * series)


def _beta_small_beta(x: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """The Beta(a, b) gradient in ``b`` from nine terms of its Taylor series at ``x = 0``."""
    factor = _digamma_as_aten(a + b) - _digamma_as_aten(b)
    numer, betas, dbetas, series = 1.0, 1.0, 0.0, factor / a
    for i in range(1, 9):
        numer = numer * (-x / float(i))
        dbetas = dbetas * (b - float(i)) + betas
        betas = betas * (b - float(i))
        series = series + numer / (a + float(i)) * (dbetas + factor * betas)
    return _zero_nan(-_rounded(pow_, 1.0 - x, 1.0 - b) * series)


def _beta_mid(x: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Rice's saddle-point expansion where ``a`` and ``b`` are both large; a polynomial within a tenth of a standard
    deviation of the mean (its singularity)."""
    total = a + b
    mean = a / total
    std = sqrt(a * b / (total + 1.0)) / total
    bb = b * b
    poly = 47.0 * x * bb * bb + a * (
        (43.0 + 20.0 * (16.0 + 27.0 * b) * x) * bb * b + a * (
            3.0 * (59.0 + 180.0 * b - 90.0 * x) * bb + a * (
                (453.0 + 1620.0 * b * (1.0 - x) - 455.0 * x) * b + a * (8.0 * (1.0 - x) * (135.0 * b - 11.0)))))
    near = ((1.0 + 12.0 * a) * (1.0 + 12.0 * b) / (total * total) / (1.0 - x) * poly
            / (12960.0 * a * a * a * b * b * (1.0 + 12.0 * total)))
    prefactor = -x / sqrt(2.0 * a * b / total)

    def stirling(z: Tensor) -> Tensor:
        return 1.0 + 1.0 / (12.0 * z) + 1.0 / (288.0 * z * z)

    axbx = a * (x - 1.0) + b * x
    t1 = ((2.0 * (a * a) * (x - 1.0) + a * b * (x - 1.0) - x * bb)
          / (sqrt(2.0 * a / b) * pow_(total, 1.5) * axbx * axbx))
    t2 = 0.5 * log(a / (total * x))
    t3 = sqrt(8.0 * a * b / total) / (b * x + a * (x - 1.0))
    t4 = pow_(b * log(b / (total * (1.0 - x))) + a * log(a / (total * x)), -1.5)
    far = stirling(a) * stirling(b) / stirling(total) * prefactor * (t1 + t2 * (t3 + where(x < mean, t4, -t4)))
    return where((mean - 0.1 * std <= x) & (x <= mean + 0.1 * std), near, far)


def _beta_rational(x: Tensor, a: Tensor, total: Tensor, psi_gap: Tensor) -> Tensor:
    """``x psi_gap / (total - a)`` (``psi_gap = psi(total) - psi(a)``) times a rational correction."""
    u = log(x)
    la = log(a) - u
    lb = log(total) - la
    p = q = 0.0
    for i, pu in enumerate((1.0, u, u * u)):
        for j, pa in enumerate((1.0, la, la * la)):
            p = p + pu * pa * _nested(list(_BETA_P[i][j]), lb)
            q = q + pu * pa * _nested(list(_BETA_Q[i][j]), lb)
    return p / q * (x * psi_gap / (total - a))


def dirichlet_grad(x: Any, alpha: Any, total: Any) -> Tensor:
    """torch's ``_dirichlet_grad``: at Beta(alpha, total - alpha) draws ``x`` (broadcast), ``-(dF/dalpha) / pdf /
    (1 - x)``, in their dtype; no gradient flows through it."""
    xs, a, t = (detach(v) for v in _operands("_dirichlet_grad", x=x, alpha=alpha, total=total))
    b = t - a
    boundary = t * xs * (1.0 - xs)
    x64, a64, t64 = _f64(xs), _f64(a), _f64(t)
    psi_gap = _f64(_digamma_as_aten(t) - _digamma_as_aten(a))  # a difference in the inputs' dtype, as aten's
    rest = where((a > 6.0) & (b > 6.0), _beta_mid(x64, a64, t64 - a64), _beta_rational(x64, a64, t64, psi_gap))
    rest = rest if xs.dtype == "float64" else cast(rest, xs.dtype)
    return where((xs <= 0.5) & (boundary < 2.5), _beta_small_alpha(xs, a, b),
                 where((xs >= 0.5) & (boundary < 0.75), -_beta_small_beta(1.0 - xs, b, a), rest))


def implicit_term(wrt: Tensor, slope: Tensor) -> Tensor:
    """A zero of ``wrt``'s shape whose gradient to ``wrt`` is ``slope`` (elementwise, detached): ``slope (wrt -
    detach(wrt))``. A non-finite slope counts as 0, so the zero, and a draw it is added to, stay exact."""
    finite = detach(where(isfinite(slope), slope, 0.0))
    return finite * (wrt - detach(wrt))


_standard_gamma_grad, _dirichlet_grad = standard_gamma_grad, dirichlet_grad  # torch's names

__all__ = ["_dirichlet_grad", "_standard_gamma_grad", "dirichlet_grad", "implicit_term", "standard_gamma_grad"]
