"""torch's gamma-family and Bessel special functions (``gc.lgamma``, ``gc.digamma``, ``gc.polygamma``,
``gc.mvlgamma``, ``gc.igamma``/``gc.igammac``, ``gc.i0``, and ``zeta``, ``i0e``, ``i1``, ``i1e`` for
``gc.special``) and ``gc.frexp``/``gc.ldexp``, in standard ONNX ops. They compute in float64 (a
float32 or half Tensor is widened and its result rounded back; an integer or bool one is float32, as
torch's) without Erf or Tan, which onnxruntime lacks in float64 (its sessions write them out); series,
continued fractions and Chebyshev sums run a fixed number of terms, unrolled."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import abs as abs_
from graphc.dsl.ops import binary, cast, detach, exp, lift, log, maximum, minimum, operand_pair, scalar
from graphc.dsl.ops import sqrt, unary, where
from graphc.dsl.ops_array import cos, sin
from graphc.dsl.ops_binary import to_float_pair
from graphc.dsl.ops_divide import to_float
from graphc.dsl.ops_elementwise import horner, signbit
from graphc.dsl.ops_math import isinf, isnan
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES
from graphc.passes.values import NO_DERIVATIVE_KEY

# Chebyshev coefficients of torch's (Cephes') i0e and i1e, float64: on [0, 8] in x / 2 - 2, beyond in 32 / x - 2
_I0E_A = (-4.4153416464793395e-18, 3.3307945188222384e-17, -2.431279846547955e-16, 1.715391285555133e-15,
          -1.1685332877993451e-14, 7.676185498604936e-14, -4.856446783111929e-13, 2.95505266312964e-12,
          -1.726826291441556e-11, 9.675809035373237e-11, -5.189795601635263e-10, 2.6598237246823866e-09,
          -1.300025009986248e-08, 6.046995022541919e-08, -2.670793853940612e-07, 1.1173875391201037e-06,
          -4.4167383584587505e-06, 1.6448448070728896e-05, -5.754195010082104e-05, 0.00018850288509584165,
          -0.0005763755745385824, 0.0016394756169413357, -0.004324309995050576, 0.010546460394594998,
          -0.02373741480589947, 0.04930528423967071, -0.09490109704804764, 0.17162090152220877, -0.3046826723431984,
          0.6767952744094761)
_I0E_B = (-7.233180487874754e-18, -4.830504485944182e-18, 4.46562142029676e-17, 3.461222867697461e-17,
          -2.8276239805165836e-16, -3.425485619677219e-16, 1.7725601330565263e-15, 3.8116806693526224e-15,
          -9.554846698828307e-15, -4.150569347287222e-14, 1.54008621752141e-14, 3.8527783827421426e-13,
          7.180124451383666e-13, -1.7941785315068062e-12, -1.3215811840447713e-11, -3.1499165279632416e-11,
          1.1889147107846439e-11, 4.94060238822497e-10, 3.3962320257083865e-09, 2.266668990498178e-08,
          2.0489185894690638e-07, 2.8913705208347567e-06, 6.889758346916825e-05, 0.0033691164782556943,
          0.8044904110141088)
_I1E_A = (2.7779141127610464e-18, -2.111421214358166e-17, 1.5536319577362005e-16, -1.1055969477353862e-15,
          7.600684294735408e-15, -5.042185504727912e-14, 3.223793365945575e-13, -1.9839743977649436e-12,
          1.1736186298890901e-11, -6.663489723502027e-11, 3.625590281552117e-10, -1.8872497517228294e-09,
          9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07,
          3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674,
          0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197,
          0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406, 0.25258718644363365)
_I1E_B = (7.517296310842105e-18, 4.414348323071708e-18, -4.6503053684893586e-17, -3.209525921993424e-17,
          2.96262899764595e-16, 3.3082023109209285e-16, -1.8803547755107825e-15, -3.8144030724370075e-15,
          1.0420276984128802e-14, 4.272440016711951e-14, -2.1015418427726643e-14, -4.0835511110921974e-13,
          -7.198551776245908e-13, 2.0356285441470896e-12, 1.4125807436613782e-11, 3.2526035830154884e-11,
          -1.8974958123505413e-11, -5.589743462196584e-10, -3.835380385964237e-09, -2.6314688468895196e-08,
          -2.512236237870209e-07, -3.882564808877691e-06, -0.00011058893876262371, -0.009761097491361469,
          0.7785762350182801)
# Lanczos (g = 7, 9 terms): Gamma(z + 1) = sqrt(2 pi) t**(z + 1/2) exp(-t) A(z), t = z + 7.5; relative error ~1e-15
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
            12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7)
# Cephes' digamma asymptotic series in 1 / x**2 (highest power first), for x >= 10
_PSI_SERIES = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
               -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
               8.33333333333333333333e-2)
# Cephes' Hurwitz zeta: (2k)! / B_2k, the Euler-Maclaurin tail's divisors
_ZETA_EM = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
            -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
            -7.1661652561756670113e18)
# terms of the incomplete gamma series and continued fraction: within 1e-12 of mpmath for a <= 100 (the terms
# needed near x = a grow as sqrt(a))
GAMMA_TERMS = 64
# Temme's uniform expansion (DLMF 8.12.3-8.12.12), used for a > TEMME_MIN_A and |x / a - 1| < TEMME_MAX_MU:
# Q(a, x) = erfc(y) / 2 + exp(-y**2) / sqrt(2 pi a) sum_k C_k(eta) / a**k, y = eta sqrt(a / 2), eta**2 / 2 =
# mu - log(1 + mu), mu = x / a - 1, eta of mu's sign. C_0..C_4's Taylor coefficients in eta (highest power first),
# from C_0 = 1/mu - 1/eta, C_k = C_{k-1}' / eta + (-1)**k g_k / mu (g_k: Stirling's series' coefficients)
_TEMME = (
    (-2.5514193994946248e-11, 9.14769958223679e-10, -4.382036018453353e-09, 1.0261809784240309e-08,
     6.707853543401498e-09, -1.7665952736826078e-07, 8.296711340953087e-07, -1.85406221071516e-06,
     -2.185448510679992e-06, 3.919263178522438e-05, -0.0001787551440329218, 0.0003527336860670194,
     0.0011574074074074073, -0.014814814814814815, 0.08333333333333333, -0.3333333333333333),
    (-1.7543241719747647e-11, 1.1951628599778148e-08, -5.752545603517705e-08, 1.378633446915721e-07,
     4.647127802807434e-09, -1.6120900894563446e-06, 7.64916091608111e-06, -1.8098550334489977e-05,
     -4.018775720164609e-07, 0.00020576131687242798, -0.0009902263374485596, 0.0026455026455026454,
     -0.003472222222222222, -0.001851851851851852),
    (-2.0477098421990866e-10, 1.4280614206064242e-07, -6.298992138380055e-07, 1.3721957309062934e-06,
     3.423578734096138e-08, -1.2760635188618728e-05, 5.2923448829120125e-05, -0.0001073665322636516,
     2.0093878600823047e-06, 0.0007716049382716049, -0.0026813271604938273, 0.004133597883597883),
    (-2.7861080291528143e-11, 1.4230900732435883e-06, -5.6749528269915965e-06, 1.1082654115347302e-05,
     -2.396505113867297e-07, -7.561801671883977e-05, 0.00026772063206283885, -0.0004691894943952557,
     0.00022947209362139917, 0.0006494341563786008),
    (2.507497226237533e-10, 1.1375726970678419e-05, -3.968365047179435e-05, 6.641498215465122e-05,
     -1.4638452578843418e-06, -0.0002990724803031902, 0.0007840392217200666, -0.0008618882909167117),
)
TEMME_MIN_A, TEMME_MAX_MU = 100.0, 0.3
_LOG1PMX = tuple(2 * (-1) ** k / (k + 2) for k in range(31, -1, -1))  # 2 (mu - log(1 + mu)) / mu**2, |mu| < 0.3


class Frexp(NamedTuple):
    """``gc.frexp``'s result, as ``torch.return_types.frexp``: ``mantissa`` and int32 ``exponent``."""

    mantissa: Tensor
    exponent: Tensor


def float_input(x: Any) -> Tensor:
    """``x`` as a float Tensor: an integer or bool one becomes float32, as torch's."""
    return to_float(lift(x))


def in_float64(fn: Callable[..., Tensor], *xs: Tensor) -> Tensor:
    """``fn(*xs)`` computed on ``xs`` (float Tensors of one dtype) widened to float64, rounded back."""
    dtype = xs[0].dtype
    y = fn(*(x if dtype == "float64" else cast(x, "float64") for x in xs))
    return y if dtype == "float64" else cast(y, dtype)


def no_derivative(y: Tensor, fn: str) -> Tensor:
    """``y``, the result of torch's ``fn`` (``"special.airy_ai"``), which torch does not differentiate: its node
    is marked so that autodiff refuses a path through it, naming ``fn``."""
    y.value.producer().metadata_props[NO_DERIVATIVE_KEY] = fn
    return y


def chebyshev(coeffs: tuple, t: Tensor) -> Tensor:
    """Cephes' ``chbevl``: the Chebyshev series with ``coeffs`` at ``t`` (Clenshaw's recurrence)."""
    b0, b1, b2 = scalar(coeffs[0], t), scalar(0, t), scalar(0, t)
    for c in coeffs[1:]:
        b0, b1, b2 = t * b0 - b1 + scalar(c, t), b0, b1
    return scalar(0.5, t) * (b0 - b2)


def _pi_frac(x: Tensor) -> Tensor:
    """``pi * (x - round(x))``: ``pi x`` reduced exactly to [-pi/2, pi/2], where sin and cos stay accurate."""
    return (x - unary("Round", x)) * scalar(math.pi, x)


def _lgamma_positive(z: Tensor) -> Tensor:
    """``lgamma(z)`` for finite ``z >= 0.5`` (Lanczos)."""
    zm = z - scalar(1, z)
    series = scalar(_LANCZOS[0], z)
    for i, c in enumerate(_LANCZOS[1:], 1):
        series = series + scalar(c, z) / (zm + scalar(i, z))
    t = zm + scalar(7.5, z)
    return scalar(0.5 * math.log(2 * math.pi), z) + (zm + scalar(0.5, z)) * log(t) - t + log(series)


def _lgamma64(x: Tensor) -> Tensor:
    infinite = isinf(x)
    x = where(infinite, scalar(1, x), x)  # each branch reads only values it is finite at (so are its gradients)
    reflected = x < scalar(0.5, x)
    positive = _lgamma_positive(where(reflected, scalar(1, x) - x, x))
    sin_abs = abs_(sin(_pi_frac(where(reflected, x, scalar(0.25, x)))))
    pole = sin_abs == scalar(0, x)
    mirrored = log(scalar(math.pi, x) / where(pole, scalar(1, x), sin_abs)) - positive
    inf = scalar(math.inf, x)
    return where(infinite | pole, inf, where(reflected, mirrored, positive))


def lgamma(x: Any) -> Tensor:
    """``log|Gamma(x)|``: Lanczos' sum from 0.5 on, reflected below (``log(pi / |sin(pi x)|) -
    lgamma(1 - x)``, ``sin`` of ``x`` reduced by its nearest integer); +inf at 0, the negative integers
    and +-inf, as torch. Float64 within ~1e-15 (absolute near the zeros 1 and 2); the gradient is the
    lowering's (digamma's to ~1e-13)."""
    return in_float64(_lgamma64, float_input(x))


def _digamma64(x: Tensor) -> Tensor:
    zero, infinite = x == scalar(0, x), isinf(x)
    xs = where(zero | infinite, scalar(1, x), x)
    reflected = xs < scalar(0, x)
    z = where(reflected, scalar(1, x) - xs, xs)  # > 0
    small = z < scalar(10, x)
    zs = where(small, z, scalar(1, x))
    shift = scalar(1, x) / zs
    for k in range(1, 10):
        shift = shift + scalar(1, x) / (zs + scalar(k, x))
    y = where(small, z + scalar(10, x), z)  # psi(z) = psi(z + 10) - sum 1 / (z + k), k < 10
    w = scalar(1, x) / (y * y)
    positive = log(y) - scalar(0.5, x) / y - w * horner(_PSI_SERIES, w) - where(small, shift, scalar(0, x))
    angle = _pi_frac(where(reflected, xs, scalar(0.25, x)))
    pole = reflected & (angle == scalar(0, x))
    angle = where(pole, scalar(0.25, x), angle)
    mirrored = positive - scalar(math.pi, x) * cos(angle) / sin(angle)  # psi(x) = psi(1 - x) - pi cot(pi x)
    inf, nan = scalar(math.inf, x), scalar(math.nan, x)
    y = where(pole, nan, where(reflected, mirrored, positive))
    y = where(zero, where(signbit(x), inf, -inf), y)
    return where(infinite, where(x > scalar(0, x), inf, nan), y)


def digamma(x: Any) -> Tensor:
    """``lgamma``'s derivative: shifted by ``psi(z) = psi(z + 10) - sum_k 1 / (z + k)`` to Cephes'
    asymptotic series, reflected below 0 (``psi(1 - x) - pi cot(pi x)``); as torch, -inf at +0, +inf
    at -0, nan at the negative integers and -inf, +inf at +inf. Float64 within ~1e-15 (absolute
    near the zero 1.4616)."""
    return in_float64(_digamma64, float_input(x))


def hurwitz_zeta(s: Tensor, q: Tensor) -> Tensor:
    """``sum_k (q + k)**-s`` for ``s > 1`` and finite ``q > 0``: Cephes' ten terms and the
    Euler-Maclaurin tail's twelve."""
    total = binary("Pow", q, -s)
    for k in range(1, 10):
        total = total + binary("Pow", q + scalar(k, q), -s)
    w = q + scalar(9, q)
    b = binary("Pow", w, -s)
    total = total + b * w / (s - scalar(1, s)) - scalar(0.5, q) * b
    a = scalar(1, q)
    for i, divisor in enumerate(_ZETA_EM):
        a = a * (s + scalar(2 * i, s))
        b = b / w
        total = total + a * b / scalar(divisor, q)
        a = a * (s + scalar(2 * i + 1, s))
        b = b / w
    return total


def _zeta64(s: Tensor, q: Tensor) -> Tensor:
    integer_q = (q <= scalar(0, q)) & (unary("Floor", q) == q)
    valid = (s > scalar(1, s)) & (q > scalar(0, q)) & ~isinf(q)
    s_, q_ = where(valid, s, scalar(2, s)), where(valid, q, scalar(1, q))
    value = hurwitz_zeta(s_, q_)
    # Cephes (torch) returns q**-s alone when the next term is below its epsilon: so q**-s overflowing
    # (q < 1, large s) gives inf and s = inf at q = 1 gives 1, where the full sum would give nan
    first = binary("Pow", q_, -s_)
    alone = abs_(binary("Pow", q_ + scalar(1, q), -s_) / first) < scalar(2.0**-53, q)
    inf, nan = scalar(math.inf, q), scalar(math.nan, q)
    value = where(valid, where(alone, first, value), nan)
    return where(s == scalar(1, s), inf, where((s > scalar(1, s)) & integer_q, inf, value))


def zeta(input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
    """``torch.special.zeta(x, q)``, Hurwitz's ``sum_k (q + k)**-x`` for ``x > 1``: Cephes'
    Euler-Maclaurin sum, as torch; inf at ``x = 1`` and at ``q`` = 0 or a negative integer, nan for
    ``x < 1`` and at ``q = inf``, ``q**-x`` alone where the next term is below float64's epsilon of it
    (inf where it overflows, 1 at ``x = inf, q = 1``), as torch. ``q < 0`` otherwise gives nan (torch
    sums the series there for an integer ``x``). Gradients reach ``q`` and ``x`` (the lowering's; torch has
    none for ``x``)."""
    s, q = to_float_pair("zeta", input, other)
    return in_float64(_zeta64, s, q)


def _cot_derivative(n: int) -> np.ndarray:
    """Coefficients (highest power first) of ``P_n`` with ``d^n/dx^n cot(pi x) = pi**n P_n(cot(pi x))``."""
    p = np.polynomial.Polynomial([0.0, 1.0])
    for _ in range(n):
        p = -np.polynomial.Polynomial([1.0, 0.0, 1.0]) * p.deriv()
    return p.coef[::-1]


def _polygamma64(n: int, x: Tensor) -> Tensor:
    infinite = isinf(x)
    xs = where(infinite, scalar(1, x), x)
    reflected = xs <= scalar(0, x)
    z = where(reflected, scalar(1, x) - xs, xs)
    factor = (-1) ** (n + 1) * math.factorial(n)
    positive = scalar(factor, x) * hurwitz_zeta(scalar(n + 1, x), z)
    angle = _pi_frac(where(reflected, xs, scalar(0.25, x)))
    pole = reflected & (angle == scalar(0, x))
    angle = where(pole, scalar(0.25, x), angle)
    cot = cos(angle) / sin(angle)
    # d^n/dx^n of psi(1 - x) - psi(x) = pi cot(pi x): psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) P_n(cot)
    mirrored = scalar((-1) ** n, x) * positive - scalar(math.pi ** (n + 1), x) * horner(tuple(_cot_derivative(n)), cot)
    y = where(pole, scalar(math.inf if n % 2 else -math.inf, x), where(reflected, mirrored, positive))
    return where(infinite, where(x > scalar(0, x), scalar(0, x), scalar(math.nan, x)), y)


def polygamma(n: int, input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The ``n``-th derivative of ``digamma`` (``n = 0``: ``digamma``): ``(-1)**(n+1) n!
    zeta(n + 1, x)`` for ``x > 0``, and below by the ``n``-th derivative of the reflection
    ``psi(1 - x) - psi(x) = pi cot(pi x)`` (a polynomial in ``cot(pi x)``). At 0 and the negative
    integers +inf for odd ``n``, -inf for even (torch gives large finite values at the negative
    integers for odd ``n``); 0 at +inf, nan at -inf."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise CaptureError(f"polygamma n={n!r}: expected an int >= 0, as torch (polygamma(n, x) does not support "
                           f"negative n) (at {user_source()})")
    x = float_input(input)
    if n == 0:
        return digamma(x)
    return in_float64(lambda t: _polygamma64(int(n), t), x)


def mvlgamma(input: Any, p: int) -> Tensor:  # noqa: A002 - torch's names
    """The multivariate log-gamma ``sum_i lgamma(x - i / 2) + p (p - 1) / 4 log(pi)``, ``i < p``."""
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise CaptureError(f"mvlgamma p={p!r}: expected an int >= 1, as torch (p has to be greater than or equal "
                           f"to 1) (at {user_source()})")
    if isinstance(input, Tensor) and input.dtype == "bool":
        raise op_error("mvlgamma", [input], "input: expected a float or integer Tensor, got bool; torch refuses a "
                       "boolean tensor", user_source())
    x = float_input(input)
    total = scalar(p * (p - 1) / 4 * math.log(math.pi), x)
    for i in range(p):
        total = total + lgamma(x - scalar(i / 2, x))
    return total


multigammaln = mvlgamma


def gamma_series(a: Tensor, x: Tensor, terms: int) -> Tensor:
    """``sum_n x**n / ((a + 1) ... (a + n))``, ``n < terms``: ``P(a, x) = x**a exp(-x) / Gamma(a + 1)``
    times it."""
    term = total = scalar(1, x)
    for n in range(1, terms):
        term = term * x / (a + scalar(n, x))
        total = total + term
    return total


def gamma_fraction(a: Tensor, x: Tensor, terms: int) -> Tensor:
    """Legendre's continued fraction ``x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / ...)``,
    ``terms`` deep, evaluated from the bottom: ``Q(a, x) = x**a exp(-x) / Gamma(a)`` divided by it
    (for ``x >= a + 1``, where it converges fast)."""
    base = x + scalar(1, x) - a
    f = base + scalar(2 * terms, x)
    for k in range(terms - 1, -1, -1):
        f = base + scalar(2 * k, x) - scalar(k + 1, x) * (scalar(k + 1, x) - a) / f
    return f


def _temme(a: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(y, S)`` of Temme's expansion, ``Q(a, x) = erfc(y) / 2 + S`` (for ``a > TEMME_MIN_A``,
    ``|x / a - 1| < TEMME_MAX_MU``)."""
    mu = (x - a) / a
    eta = mu * sqrt(horner(_LOG1PMX, mu))
    y = eta * sqrt(a * scalar(0.5, a))
    inv_a = scalar(1, a) / a
    total = horner(_TEMME[-1], eta)
    for c in reversed(_TEMME[:-1]):
        total = total * inv_a + horner(c, eta)
    return y, exp(-(y * y)) / sqrt(scalar(2 * math.pi, a) * a) * total


def _incomplete_gamma64(a: Tensor, x: Tensor, upper: bool) -> Tensor:
    zero = scalar(0, x)
    regular = (a > zero) & (x > zero) & ~isinf(a) & ~isinf(x)
    a_, x_ = where(regular, a, scalar(1, a)), where(regular, x, scalar(1, x))
    one = scalar(1, x)
    # huge a near x = a: the fixed-length series and fraction fall short, Temme's expansion takes over (reading
    # a = x = its bound elsewhere); its erfc(|y|) = Q(1/2, y**2) comes from the series and fraction below
    temme = (a_ > scalar(TEMME_MIN_A, a_)) & (abs_(x_ - a_) < scalar(TEMME_MAX_MU, a_) * a_)
    at = where(temme, a_, scalar(TEMME_MIN_A, a_))
    y, tail = _temme(at, where(temme, x_, at))
    above = y >= zero
    y_ = where(above, y, -y) + where(y * y < scalar(1e-300, y), scalar(1e-100, y), zero)  # y**2 > 0: finite x-grads
    a_, x_ = where(temme, scalar(0.5, a_), a_), where(temme, y_ * y_, x_)
    series = x_ < a_ + one
    xs, xf = minimum(x_, a_ + one), maximum(x_, a_ + one)  # the other branch reads a + 1
    lower = exp(a_ * log(xs) - xs - _lgamma64(a_ + one)) * gamma_series(a_, xs, GAMMA_TERMS)
    rest = exp(a_ * log(xf) - xf - _lgamma64(a_)) / gamma_fraction(a_, xf, GAMMA_TERMS)
    p = where(series, lower, one - rest)
    q = where(series, one - lower, rest)
    small = scalar(0.5, x) * q + where(above, tail, -tail)  # Temme's Q above x = a, P below: no cancellation
    p = where(temme, where(above, one - small, small), p)
    q = where(temme, where(above, small, one - small), q)
    # torch's (scipy's) edges: x = 0 -> P = 0, a = 0 or x = inf -> P = 1, a = inf -> P = 0; nan for a < 0, x < 0,
    # a = x = 0 and a = x = inf
    nan = scalar(math.nan, x)
    p_edge = where((x == zero) | isinf(a), zero, one)
    invalid = (a < zero) | (x < zero) | ((a == zero) & (x == zero)) | (isinf(a) & isinf(x)) | isnan(a) | isnan(x)
    edge = where(invalid, nan, one - p_edge if upper else p_edge)
    return where(regular, q if upper else p, edge)


def _incomplete_gamma(fn: str, input: Any, other: Any, upper: bool) -> Tensor:
    a, x = operand_pair(input, other)
    if a.dtype not in FLOAT_DTYPES:
        raise CaptureError(f"{fn} input: expected float Tensors, got {a.dtype}; torch refuses integer ones "
                           f"(at {user_source()})")
    return in_float64(lambda s, t: _incomplete_gamma64(detach(s), t, upper), a, x)


def igamma(input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
    """The regularized lower incomplete gamma ``P(a, x)`` (``a = input``): the series below ``x = a + 1``,
    ``1 - Q`` by Legendre's continued fraction above, ``GAMMA_TERMS`` terms each; Temme's uniform
    expansion for ``a > TEMME_MIN_A`` near ``x = a``; torch's values at the edges. No gradient reaches
    ``a`` (torch raises for one)."""
    return _incomplete_gamma("igamma", input, other, upper=False)


def igammac(input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
    """The regularized upper incomplete gamma ``Q(a, x) = 1 - P(a, x)`` (``igamma``'s branches; below
    ``x = a + 1`` it is ``1 - P``, so where ``Q`` is tiny there its relative accuracy is ``P``'s
    absolute)."""
    return _incomplete_gamma("igammac", input, other, upper=True)


def _bessel64(x: Tensor, small: tuple, large: tuple, odd: bool, scaled: bool) -> Tensor:
    ax = abs_(x)
    near = ax <= scalar(8, x)
    an = where(near, ax, scalar(8, x))
    af = where(near, scalar(8, x), ax)
    inner = chebyshev(small, an / scalar(2, x) - scalar(2, x))
    far = chebyshev(large, scalar(32, x) / af - scalar(2, x)) / sqrt(af)
    if odd:  # near 0 the fit times the signed x, so the slope at 0 is the fit's value (|x|'s would give 0)
        inner, far = inner * where(near, x, scalar(8, x)), where(x < scalar(0, x), -far, far)
    y = where(near, inner, far)
    return y if scaled else y * exp(ax)


def _bessel(x: Any, small: tuple, large: tuple, odd: bool, scaled: bool) -> Tensor:
    return in_float64(lambda t: _bessel64(t, small, large, odd, scaled), float_input(x))


def i0(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The modified Bessel function ``I0``: Cephes' Chebyshev fits of ``exp(-|x|) I0(x)`` on [0, 8]
    and beyond, as torch (nan at +-inf, as torch's ``exp(inf) * 0``)."""
    return _bessel(input, _I0E_A, _I0E_B, odd=False, scaled=False)


def i0e(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``exp(-|x|) i0(x)`` (``i0``'s fits without the ``exp``)."""
    return _bessel(input, _I0E_A, _I0E_B, odd=False, scaled=True)


def i1(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """The modified Bessel function ``I1`` (odd): Cephes' Chebyshev fits of ``exp(-|x|) I1(x)``, as torch."""
    return _bessel(input, _I1E_A, _I1E_B, odd=True, scaled=False)


def i1e(input: Any) -> Tensor:  # noqa: A002 - torch's names
    """``exp(-|x|) i1(x)``."""
    return _bessel(input, _I1E_A, _I1E_B, odd=True, scaled=True)


def _halved_powers(v: Tensor, e: Tensor) -> Tensor:
    """``v / 2**e`` as two divisions by powers of 2, each exact (a subnormal one too), so that
    ``e = 1024`` (``|v|`` from ``2**1023``, where ``2**e`` is inf) stays finite."""
    half = unary("Floor", e / scalar(2, e))
    return v / binary("Pow", scalar(2, e), half) / binary("Pow", scalar(2, e), e - half)


def _frexp64(x: Tensor) -> tuple[Tensor, Tensor]:
    finite = ~isinf(x) & ~isnan(x) & (x != scalar(0, x))
    ax = abs_(where(finite, x, scalar(1, x)))
    e = unary("Floor", log(ax) / scalar(math.log(2), x)) + scalar(1, x)
    m = _halved_powers(ax, e)
    e = e + where(m >= scalar(1, x), scalar(1, x), where(m < scalar(0.5, x), scalar(-1, x), scalar(0, x)))
    exponent = where(finite, e, scalar(0, x))
    return _halved_powers(x, detach(exponent)), cast(exponent, "int32")


def frexp(input: Any) -> Frexp:  # noqa: A002 - torch's names
    """``x = mantissa * 2**exponent`` with ``|mantissa|`` in [0.5, 1) (0, inf and nan: themselves,
    exponent 0), as torch; the exponent from ``log2|x|``, corrected by one where rounding moved it.
    A float input only, as torch; the mantissa's gradient is ``2**-exponent``."""
    x = lift(input)
    if x.dtype not in FLOAT_DTYPES:
        raise CaptureError(f"frexp input: expected a floating-point Tensor, got {x.dtype}; torch.frexp() only "
                           f"supports floating-point dtypes (at {user_source()})")
    wide = x if x.dtype == "float64" else cast(x, "float64")
    mantissa, exponent = _frexp64(wide)
    return Frexp(mantissa if wide is x else cast(mantissa, x.dtype), exponent)


def ldexp(input: Any, other: Any) -> Tensor:  # noqa: A002 - torch's names
    """``input * 2**other``, as torch: the two promoted (``ops.promote``), then float32 if integer."""
    x, e = to_float_pair("ldexp", input, other)
    return x * binary("Pow", scalar(2, x), e)


__all__ = ["digamma", "frexp", "i0", "i0e", "i1", "i1e", "igamma", "igammac", "ldexp", "lgamma", "multigammaln",
           "mvlgamma", "polygamma", "zeta"]
