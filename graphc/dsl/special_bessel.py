"""torch.special's Bessel and Airy functions beyond ``i0``..``i1e``: ``bessel_j0``/``j1``/``y0``/``y1``,
``modified_bessel_i0``/``i1``/``k0``/``k1``, ``scaled_modified_bessel_k0``/``k1``, ``spherical_bessel_j0`` and
``airy_ai``, each by torch's (Cephes') piecewise fits: rationals or Chebyshev sums near 0, asymptotic amplitude
and phase fits beyond, computed in float64 as ``ops_special``'s. torch differentiates none of them; all but
``bessel_j0``/``j1`` (which keep the lowering's gradient, ``-J1`` and ``J0 - J1 / x``) mark their result
(``no_derivative``) so that autodiff refuses a path through it, naming the function."""

from __future__ import annotations

import math
from typing import Any

from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import exp, log, scalar, sqrt, where
from graphc.dsl.ops_array import cos, sin
from graphc.dsl.ops_elementwise import horner
from graphc.dsl.ops_math import isinf
from graphc.dsl.ops_special import chebyshev, float_input, i0, i1, in_float64, no_derivative
from graphc.dsl.tensor import Tensor

# bessel_j0/j1 (and y0/y1 beyond 5): rational fits in x**2 to 5, beyond the amplitude and phase fits in
# 25 / x**2 (highest power first)
_BESSEL_J0 = {
    "PP": (0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
           5.303240382353949, 1.0),
    "PQ": (0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695,
           5.306052882353947, 1.0),
    "QP": (-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683, -177.68116798048806,
           -147.07750515495118, -51.41053267665993, -6.050143506007285),
    "QQ": (64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
           2062.0933166032783, 242.0057402402914),
    "RP": (-4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0),
    "RQ": (499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
           310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18),
    "YP": (15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
           -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16),
    "YQ": (1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
           3171577528429750.5, 2.5059625617265306e+17),
}
_BESSEL_J1 = {
    "PP": (0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724,
           5.214515986823615, 1.0),
    "PQ": (0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
           5.209828486823619, 1.0),
    "QP": (0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
           597.4896124006136, 211.68875710057213, 25.207020585802372),
    "QQ": (74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
           2826.1927851763908, 336.0936078106983),
    "RP": (-899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0),
    "RQ": (620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
           784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18),
    "YP": (1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0, 2.024394757135949e+17,
           -7.788771962659501e+17),
    "YQ": (594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
           620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18),
}
# modified_bessel_k0/k1: Chebyshev sums in x**2 - 2 to 2 ("A"), beyond in 8 / x - 2 ("B")
_K0 = {
    "A": (1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
          2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615, 0.3442898999246285,
          -0.5353273932339028),
    "B": (5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16,
          5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15, -2.2275133269916698e-14,
          8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12, -4.514597883373944e-12,
          1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10, -1.69753450938906e-09,
          8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07, -1.8317555227191195e-06,
          1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533, -0.0314481013119645,
          2.4403030820659555),
}
_K1 = {
    "A": (-7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13, -1.4114883926335278e-10,
          -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864,
          -0.12261118082265715, -0.3531559607765449, 1.5253002273389478),
    "B": (-5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17, 1.838093544366639e-16,
          -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15, 2.4771544244813043e-14,
          -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12,
          -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10, 2.015049755197033e-09,
          -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06,
          -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
          2.7206261904844427),
}
# airy_ai: beyond 2.09 a rational in 1 / zeta ("N"/"D"), below -2.09 amplitude ("FN"/"FD") and phase
# ("GN"/"GD") rationals in 1 / zeta**2, zeta = 2 |x|**1.5 / 3; between, the Maclaurin series of f and g
_AIRY = {
    "N": (0.346538101525629, 12.007595273964581, 76.27960536152345, 168.08922493463058, 159.75639135016442,
          70.53609068404442, 14.026469116338967, 1.0),
    "D": (0.5675945326387702, 14.75625625848472, 84.51389701414746, 177.31808814540045, 164.2346928715297,
          71.47784008255756, 14.095913560783403, 1.0),
    "FN": (-0.1316963234183318, -0.6264565444319123, -0.6931580360369335, -0.2797799815451191, -0.04919001326095003,
           -0.004062659235948854, -0.0001592764962392621, -2.776491081552329e-06, -1.6778769848911465e-08),
    "FD": (13.356042070655324, 32.682503279522464, 26.736704094149957, 9.187074029072596, 1.4752914677166642,
           0.11568717379518804, 0.004402916416152112, 7.547203482874142e-05, 4.5185009297058035e-07),
    "GN": (0.01973399320916857, 0.39110302961568827, 1.0657989759959559, 0.9391692298166502, 0.35146565610554764,
           0.06338889196289255, 0.005858041130483885, 0.000282851600836737, 6.98793669997261e-06,
           8.117892395543892e-08, 3.415517847659236e-10),
    "GD": (9.30892908077442, 19.835292871831214, 15.564662893286462, 5.476860694229755, 0.9542936116189619,
           0.08645808263523921, 0.004126565238242226, 0.00010125908511650914, 1.1716673321441352e-06,
           4.9183457006293e-09),
}
_AIRY_TERMS = 16  # of f and g's series: for |x| < 2.09 the 13th is below float64's epsilon of the sum
_AIRY_EDGE, _AIRY_ZERO_FROM = 2.09, 103.892  # torch's (Cephes') switch points; Ai is 0 from the second on
_AI0, _AI0_PRIME = 0.355028053887817239260, 0.258819403792806798405  # Ai(0), -Ai'(0)
_SQRT_2_PI, _INV_SQRT_PI = math.sqrt(2 / math.pi), 1 / math.sqrt(math.pi)
_SPHERICAL_J0 = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(6, -1, -1))  # sin(x) / x in x**2


def _amplitude_phase(xf: Tensor, fit: dict, odd: bool, second_kind: bool) -> Tensor:
    """``J`` (or, ``second_kind``, ``Y``) of order 0 or 1 (``odd``) for ``xf >= 5`` by the asymptotic fits."""
    w = scalar(25, xf) / (xf * xf)
    phase = xf - scalar(3 * math.pi / 4 if odd else math.pi / 4, xf)
    amplitude = horner(fit["PP"], w) / horner(fit["PQ"], w)
    shift = scalar(5, xf) / xf * horner(fit["QP"], w) / horner(fit["QQ"], w)
    if second_kind:
        wave = amplitude * sin(phase) + shift * cos(phase)
    else:
        wave = amplitude * cos(phase) - shift * sin(phase)
    return wave * scalar(_SQRT_2_PI, xf) / sqrt(xf)


def _split(x: Tensor, ax: Tensor, edge: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(ax <= edge, ax there else 1, ax beyond else edge)``: each branch reads only values it holds at."""
    near = ax <= scalar(edge, x)
    return near, where(near, ax, scalar(1, x)), where(near, scalar(edge, x), ax)


def _bessel_j64(x: Tensor, fit: dict, odd: bool) -> Tensor:
    near, xn, xf = _split(x, abs_(x), 5)
    x2 = xn * xn
    ratio = horner(fit["RP"], x2) / horner(fit["RQ"], x2)
    if odd:  # zeros of J1 at 3.8317 and 7.0156 (their squares below)
        small = ratio * xn * (x2 - scalar(1.46819706421238932572e1, x)) * (x2 - scalar(4.92184563216946036703e1, x))
    else:  # zeros of J0 at 2.4048 and 5.5201
        small = (x2 - scalar(5.78318596294678452118, x)) * (x2 - scalar(3.04712623436620863991e1, x)) * ratio
        small = where(xn < scalar(1e-5, x), scalar(1, x) - x2 / scalar(4, x), small)
    y = where(near, small, _amplitude_phase(xf, fit, odd, second_kind=False))
    return where(x < scalar(0, x), -y, y) if odd else y


def _bessel_y64(x: Tensor, fit: dict, odd: bool) -> Tensor:
    near, xn, xf = _split(x, x, 5)
    x2 = xn * xn
    j = _bessel_j64(xn, fit, odd)
    if odd:
        small = xn * (horner(fit["YP"], x2) / horner(fit["YQ"], x2)) + scalar(2 / math.pi, x) * (
            j * log(xn) - scalar(1, x) / xn)
    else:
        small = horner(fit["YP"], x2) / horner(fit["YQ"], x2) + scalar(2 / math.pi, x) * log(xn) * j
    y = where(near, small, _amplitude_phase(xf, fit, odd, second_kind=True))
    zero = scalar(0, x)
    return where(x == zero, scalar(-math.inf, x), where(x < zero, scalar(math.nan, x), y))


def _bessel_k64(x: Tensor, fit: dict, odd: bool, scaled: bool) -> Tensor:
    near, xn, xf = _split(x, x, 2)
    series = chebyshev(fit["A"], xn * xn - scalar(2, x))
    if odd:
        small = log(scalar(0.5, x) * xn) * i1(xn) + series / xn
    else:
        small = series - log(scalar(0.5, x) * xn) * i0(xn)
    far = chebyshev(fit["B"], scalar(8, x) / xf - scalar(2, x)) / sqrt(xf)
    y = where(near, small * exp(xn), far) if scaled else where(near, small, exp(-xf) * far)
    zero = scalar(0, x)
    return where(x == zero, scalar(math.inf, x), where(x < zero, scalar(math.nan, x), y))


def _airy_series(x: Tensor) -> Tensor:
    """``Ai(0) f(x) + Ai'(0) g(x)``, ``f = 1 + x**3 / 6 + ...``, ``g = x + x**4 / 12 + ...`` (each term the last
    times ``x**3`` over two consecutive integers' product)."""
    z = x * x * x
    m, n, f, g = scalar(1, x), x, scalar(1, x), x
    for k in range(1, _AIRY_TERMS):
        m = m * z / scalar((3 * k - 1) * 3 * k, x)
        n = n * z / scalar(3 * k * (3 * k + 1), x)
        f, g = f + m, g + n
    return scalar(_AI0, x) * f - scalar(_AI0_PRIME, x) * g


def _airy_ai64(x: Tensor) -> Tensor:
    edge = scalar(_AIRY_EDGE, x)
    below, above = x < -edge, x >= edge
    xb, xa = where(below, -x, edge), where(above & ~isinf(x), x, edge)
    root_b, root_a = sqrt(xb), sqrt(xa)
    zeta_b = scalar(2, x) * xb * root_b / scalar(3, x)
    z = scalar(1, x) / zeta_b
    z2 = z * z
    t = zeta_b + scalar(math.pi / 4, x)
    oscillating = scalar(_INV_SQRT_PI, x) / sqrt(root_b) * (
        sin(t) * (scalar(1, x) + z2 * horner(_AIRY["FN"], z2) / horner(_AIRY["FD"], z2))
        - cos(t) * (z * horner(_AIRY["GN"], z2) / horner(_AIRY["GD"], z2)))
    zeta_a = scalar(2, x) * xa * root_a / scalar(3, x)
    w = scalar(1, x) / zeta_a
    decaying = scalar(_INV_SQRT_PI, x) * (horner(_AIRY["N"], w) / horner(_AIRY["D"], w)) / (
        scalar(2, x) * sqrt(root_a) * exp(zeta_a))
    y = where(below, oscillating, where(above, decaying, _airy_series(where(below | above, scalar(0, x), x))))
    y = where(x > scalar(_AIRY_ZERO_FROM, x), scalar(0, x), y)
    return where(isinf(x), scalar(math.nan, x), y)


def _spherical_j064(x: Tensor) -> Tensor:
    small = abs_(x) < scalar(0.5, x)
    xl = where(small | isinf(x), scalar(1, x), x)
    xs = where(small, x, scalar(0, x))
    y = where(small, horner(_SPHERICAL_J0, xs * xs), sin(xl) / xl)
    return where(isinf(x), scalar(0, x), y)


def _special(fn: str, lowering: Any, input: Any) -> Tensor:  # noqa: A002 - torch's names
    """torch.special's ``fn`` of ``input`` by ``lowering`` (on float64), which torch does not differentiate."""
    return no_derivative(in_float64(lowering, float_input(input)), f"special.{fn}")


def bessel_j0(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The Bessel function of the first kind ``J0``: Cephes' rational fit to 5, its asymptotic
    amplitude and phase fits beyond, as torch (nan at +-inf, as torch's ``cos(inf)``). torch has no
    gradient for it; graphc's is the lowering's (``-J1``)."""
    return in_float64(lambda t: _bessel_j64(t, _BESSEL_J0, odd=False), float_input(input))


def bessel_j1(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The Bessel function of the first kind ``J1`` (odd), as ``bessel_j0``."""
    return in_float64(lambda t: _bessel_j64(t, _BESSEL_J1, odd=True), float_input(input))


def bessel_y0(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The Bessel function of the second kind ``Y0``: a rational fit plus ``2/pi log(x) J0(x)`` to 5, the
    asymptotic fits beyond, as torch; -inf at 0, nan below 0 and at +inf."""
    return _special("bessel_y0", lambda t: _bessel_y64(t, _BESSEL_J0, odd=False), input)


def bessel_y1(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``Y1``: ``x`` times a rational fit plus ``2/pi (J1(x) log(x) - 1/x)`` to 5, as ``bessel_y0``."""
    return _special("bessel_y1", lambda t: _bessel_y64(t, _BESSEL_J1, odd=True), input)


def modified_bessel_i0(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``I0``, the values of ``gc.special.i0`` (the same fits), without its gradient, as torch."""
    return _special("modified_bessel_i0", i0, input)


def modified_bessel_i1(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``I1``, the values of ``gc.special.i1``, without its gradient, as torch."""
    return _special("modified_bessel_i1", i1, input)


def modified_bessel_k0(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The modified Bessel function of the second kind ``K0``: a Chebyshev sum minus ``log(x/2) I0(x)``
    to 2, ``exp(-x) / sqrt(x)`` times a Chebyshev sum beyond, as torch; inf at 0, nan below, 0 at inf."""
    return _special("modified_bessel_k0", lambda t: _bessel_k64(t, _K0, odd=False, scaled=False), input)


def modified_bessel_k1(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``K1``: ``log(x/2) I1(x)`` plus a Chebyshev sum over ``x`` to 2, as ``modified_bessel_k0``."""
    return _special("modified_bessel_k1", lambda t: _bessel_k64(t, _K1, odd=True, scaled=False), input)


def scaled_modified_bessel_k0(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``exp(x) K0(x)`` (finite where ``K0`` underflows)."""
    return _special("scaled_modified_bessel_k0", lambda t: _bessel_k64(t, _K0, odd=False, scaled=True), input)


def scaled_modified_bessel_k1(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``exp(x) K1(x)``."""
    return _special("scaled_modified_bessel_k1", lambda t: _bessel_k64(t, _K1, odd=True, scaled=True), input)


def spherical_bessel_j0(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``sin(x) / x``: its Maclaurin series to ``x**12`` below 0.5 in magnitude, 0 at +-inf, as torch."""
    return _special("spherical_bessel_j0", _spherical_j064, input)


def airy_ai(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The Airy function ``Ai``: Cephes' fits, as torch (the Maclaurin series of ``f`` and ``g`` for
    ``|x| < 2.09``, asymptotic rationals beyond); 0 above 103.892, nan at +-inf."""
    return _special("airy_ai", _airy_ai64, input)


__all__ = ["airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0", "modified_bessel_i1",
           "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1",
           "spherical_bessel_j0"]
