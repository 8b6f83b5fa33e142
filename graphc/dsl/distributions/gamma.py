"""torch.distributions' families of the Gamma function: ``Gamma``, ``Chi2``, ``Beta``, ``Dirichlet``,
``StudentT``, ``FisherSnedecor`` and ``VonMises``, with torch's formulas (``gc.lgamma``/``gc.digamma``/``gc.xlogy``).
``sample`` draws by rejection (Marsaglia-Tsang Gamma draws, ``graphc.dsl.ops_rejection``); ``rsample`` draws the same
and differentiates them implicitly, as torch's: Gamma draws by ``gc._standard_gamma``'s gradient, Dirichlet (and Beta,
its first component) draws by ``gc._dirichlet_grad`` (``graphc.dsl.ops_gamma_grad``). VonMises has no ``rsample``,
as torch's."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from graphc.dsl.distributions.base import (NONNEGATIVE, POSITIVE, REAL, SIMPLEX, UNIT_INTERVAL, Distribution, check,
                                           fail, finfo, params)
from graphc.dsl.ops import cast, clip, detach, log, maximum, sqrt, stack, where
from graphc.dsl.ops import sum as sum_
from graphc.dsl.ops_array import argmax, cos, full_like, one_hot
from graphc.dsl.ops_binary import xlogy
from graphc.dsl.ops_elementwise import acos, log1p
from graphc.dsl.ops_gamma_grad import dirichlet_grad, implicit_term
from graphc.dsl.ops_math import all as all_
from graphc.dsl.ops_math import any as any_
from graphc.dsl.ops_math import floor
from graphc.dsl.ops_rejection import gamma_draws, standard_gamma, until_accepted
from graphc.dsl.ops_reshape import unsqueeze
from graphc.dsl.ops_sample import rand_like, randn_like
from graphc.dsl.ops_special import digamma, i0e, i1e, igamma, lgamma
from graphc.dsl.tensor import Tensor


class _GammaDrawn(Distribution):
    """A family drawn from Gamma draws (rejection sampling), reparameterised as torch's."""

    has_rsample = True

    def _gammas(self, concentration: Tensor, sample_shape: Any, draw: Callable[[Tensor], Tensor]) -> Tensor:
        """Gamma(concentration, 1) draws of ``sample_shape`` + ``concentration``'s shape by ``draw``
        (``gamma_draws``, or ``standard_gamma`` to differentiate them)."""
        return draw(self._expanded(concentration, sample_shape))


class Gamma(_GammaDrawn):
    """``torch.distributions.Gamma(concentration, rate)``; ``cdf`` is ``gc.igamma``."""

    support = NONNEGATIVE

    def __init__(self, concentration: Any, rate: Any, validate_args: bool | None = None):
        name = self._name()
        self.concentration, self.rate = params(name, concentration=concentration, rate=rate)
        super().__init__(self.concentration.shape, (), validate_args)
        if self._validate_args:
            check(name, "concentration", self.concentration, POSITIVE)
            check(name, "rate", self.rate, POSITIVE)

    mean = property(lambda self: self.concentration / self.rate)
    mode = property(lambda self: clip((self.concentration - 1.0) / self.rate, 0.0))
    variance = property(lambda self: self.concentration / (self.rate * self.rate))

    def _draw(self, sample_shape: Any, draw: Callable[[Tensor], Tensor]) -> Tensor:
        """``standard_gamma(concentration) / rate``, at least the dtype's smallest normal number (a floor the
        gradient passes through), as torch's."""
        x = self._gammas(self.concentration, sample_shape, draw) / self._expanded(self.rate, sample_shape)
        return x - detach(x) + detach(maximum(x, float(finfo(x).tiny)))

    def sample(self, sample_shape: Any = ()) -> Tensor:
        return detach(self._draw(sample_shape, gamma_draws))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self._draw(sample_shape, standard_gamma)

    def log_prob(self, value: Any) -> Tensor:
        v, c = self._value(value, self.rate), self.concentration
        return xlogy(c, self.rate) + xlogy(c - 1.0, v) - self.rate * v - lgamma(c)

    def cdf(self, value: Any) -> Tensor:
        return igamma(self.concentration, self.rate * self._value(value, self.rate))

    def entropy(self) -> Tensor:
        c = self.concentration
        return c - log(self.rate) + lgamma(c) + (1.0 - c) * digamma(c)


class Chi2(Gamma):
    """``torch.distributions.Chi2(df)``: ``Gamma(df / 2, 1 / 2)``."""

    def __init__(self, df: Any, validate_args: bool | None = None):
        (df,) = params("Chi2", df=df)
        if validate_args is not False:
            check("Chi2", "df", df, POSITIVE)
        super().__init__(0.5 * df, full_like(df, 0.5), validate_args)

    df = property(lambda self: self.concentration * 2.0)


class Dirichlet(_GammaDrawn):
    """``torch.distributions.Dirichlet(concentration)`` over the last dim (event shape ``(K,)``)."""

    support = SIMPLEX

    def __init__(self, concentration: Any, validate_args: bool | None = None):
        (c,) = params("Dirichlet", concentration=concentration)
        if c.ndim < 1:
            raise fail("Dirichlet", [c], f"concentration must be at least one-dimensional, got {c.type_str()}")
        self.concentration = c
        super().__init__(c.shape[:-1], c.shape[-1:], validate_args)
        if self._validate_args:
            check("Dirichlet", "concentration", c, POSITIVE)

    @property
    def mean(self) -> Tensor:
        return self.concentration / sum_(self.concentration, axis=-1, keepdims=True)

    @property
    def mode(self) -> Tensor:
        """``(c - 1)+`` normalized; one-hot at the largest where every ``c < 1``, as torch's."""
        cm1 = clip(self.concentration - 1.0, 0.0)
        mode = cm1 / sum_(cm1, axis=-1, keepdims=True)
        peak = cast(one_hot(argmax(mode, -1), self.concentration.shape[-1]), mode.dtype)
        return where(unsqueeze(all_(self.concentration < 1.0, -1), -1), peak, mode)

    @property
    def variance(self) -> Tensor:
        c = self.concentration
        c0 = sum_(c, axis=-1, keepdims=True)
        return c * (c0 - c) / (c0 * c0 * (c0 + 1.0))

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """Float64 Gamma draws normalised over the last dim, at least the dtype's smallest normal number, as torch's."""
        g = self._gammas(cast(self.concentration, "float64"), sample_shape, gamma_draws)
        x = maximum(g / sum_(g, axis=-1, keepdims=True), float(finfo(self.concentration).tiny))
        return cast(x, self.concentration.dtype)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        """``sample``'s draws ``x``, whose vector-Jacobian product with ``dy`` is torch's: ``d_i (dy_i - sum_k x_k
        dy_k)``, ``d = gc._dirichlet_grad(x, concentration, its sum)``."""
        x = self.sample(sample_shape)
        c = self._expanded(self.concentration, sample_shape)
        t = implicit_term(c, dirichlet_grad(x, c, sum_(c, axis=-1, keepdims=True)))
        return x + t - x * sum_(t, axis=-1, keepdims=True)

    def log_prob(self, value: Any) -> Tensor:
        v, c = self._value(value, self.concentration), self.concentration
        return sum_(xlogy(c - 1.0, v), axis=-1) + lgamma(sum_(c, axis=-1)) - sum_(lgamma(c), axis=-1)

    def entropy(self) -> Tensor:
        c = self.concentration
        k, a0 = c.shape[-1], sum_(c, axis=-1)
        return (sum_(lgamma(c), axis=-1) - lgamma(a0) - (k - a0) * digamma(a0)
                - sum_((c - 1.0) * digamma(c), axis=-1))


class Beta(_GammaDrawn):
    """``torch.distributions.Beta(concentration1, concentration0)``: a Dirichlet of ``(x, 1 - x)``."""

    support = UNIT_INTERVAL

    def __init__(self, concentration1: Any, concentration0: Any, validate_args: bool | None = None):
        self.concentration1, self.concentration0 = params("Beta", concentration1=concentration1,
                                                          concentration0=concentration0)
        super().__init__(self.concentration1.shape, (), validate_args)
        if self._validate_args:
            check("Beta", "concentration1", self.concentration1, POSITIVE)
            check("Beta", "concentration0", self.concentration0, POSITIVE)
        self._dirichlet = Dirichlet(stack([self.concentration1, self.concentration0], -1), validate_args=False)

    mean = property(lambda self: self.concentration1 / (self.concentration1 + self.concentration0))
    mode = property(lambda self: self._dirichlet.mode[..., 0])

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """``X / (X + Y)`` of Gamma draws: the Dirichlet's first component, as torch's."""
        return self._dirichlet.sample(sample_shape)[..., 0]

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self._dirichlet.rsample(sample_shape)[..., 0]

    @property
    def variance(self) -> Tensor:
        total = self.concentration1 + self.concentration0
        return self.concentration1 * self.concentration0 / (total * total * (total + 1.0))

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.concentration1)
        return self._dirichlet.log_prob(stack([v, 1.0 - v], -1))

    def entropy(self) -> Tensor:
        return self._dirichlet.entropy()


class StudentT(_GammaDrawn):
    """``torch.distributions.StudentT(df, loc=0.0, scale=1.0)``: mean nan for ``df <= 1``, variance inf
    for ``1 < df <= 2`` and nan for ``df <= 1``, as torch's."""

    support = REAL

    def __init__(self, df: Any, loc: Any = 0.0, scale: Any = 1.0, validate_args: bool | None = None):
        self.df, self.loc, self.scale = params("StudentT", df=df, loc=loc, scale=scale)
        super().__init__(self.df.shape, (), validate_args)
        if self._validate_args:
            check("StudentT", "df", self.df, POSITIVE)
            check("StudentT", "loc", self.loc, REAL)
            check("StudentT", "scale", self.scale, POSITIVE)

    mean = property(lambda self: where(self.df <= 1.0, math.nan, self.loc))

    mode = property(lambda self: self.loc)

    def _draw(self, sample_shape: Any, draw: Callable[[Tensor], Tensor]) -> Tensor:
        """``loc + scale z / sqrt(chi2 / df)``: a standard normal ``z`` over a Chi2(df) draw (``2 Gamma(df / 2)``)."""
        df = self._expanded(self.df, sample_shape)
        chi2 = self._gammas(self.df * 0.5, sample_shape, draw) * 2.0
        y = randn_like(df) / sqrt(chi2 / df)
        return self._expanded(self.loc, sample_shape) + self._expanded(self.scale, sample_shape) * y

    def sample(self, sample_shape: Any = ()) -> Tensor:
        return detach(self._draw(sample_shape, gamma_draws))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self._draw(sample_shape, standard_gamma)

    @property
    def variance(self) -> Tensor:
        df = self.df
        finite = self.scale * self.scale * df / where(df > 2.0, df - 2.0, 1.0)
        return where(df > 2.0, finite, where(df > 1.0, full_like(df, math.inf), full_like(df, math.nan)))

    def log_prob(self, value: Any) -> Tensor:
        y = (self._value(value, self.loc) - self.loc) / self.scale
        z = (log(self.scale) + 0.5 * log(self.df) + 0.5 * math.log(math.pi) + lgamma(0.5 * self.df)
             - lgamma(0.5 * (self.df + 1.0)))
        return -0.5 * (self.df + 1.0) * log1p(y * y / self.df) - z

    def entropy(self) -> Tensor:
        half, half1 = 0.5 * self.df, 0.5 * (self.df + 1.0)
        lbeta = lgamma(half) + math.lgamma(0.5) - lgamma(half1)
        return log(self.scale) + half1 * (digamma(half1) - digamma(half)) + 0.5 * log(self.df) + lbeta


class FisherSnedecor(_GammaDrawn):
    """``torch.distributions.FisherSnedecor(df1, df2)``: ``X1 / X2`` of ``Gamma(df / 2, df)`` draws; mean nan for
    ``df2 <= 2``, mode nan for ``df1 <= 2``, variance nan for ``df2 <= 4``, no entropy, as torch's."""

    support = POSITIVE

    def __init__(self, df1: Any, df2: Any, validate_args: bool | None = None):
        self.df1, self.df2 = params("FisherSnedecor", df1=df1, df2=df2)
        super().__init__(self.df1.shape, (), validate_args)
        if self._validate_args:
            check("FisherSnedecor", "df1", self.df1, POSITIVE)
            check("FisherSnedecor", "df2", self.df2, POSITIVE)
        self._gamma1 = Gamma(self.df1 * 0.5, self.df1, validate_args=False)
        self._gamma2 = Gamma(self.df2 * 0.5, self.df2, validate_args=False)

    @property
    def mean(self) -> Tensor:
        d2 = where(self.df2 > 2.0, self.df2, 3.0)  # a safe df2 where nan is the answer (no inf in the gradient)
        return where(self.df2 > 2.0, d2 / (d2 - 2.0), math.nan)

    @property
    def mode(self) -> Tensor:
        d1, d2 = self.df1, self.df2
        return where(d1 > 2.0, (d1 - 2.0) / d1 * d2 / (d2 + 2.0), math.nan)

    @property
    def variance(self) -> Tensor:
        d1, d2 = self.df1, where(self.df2 > 4.0, self.df2, 5.0)
        return where(self.df2 > 4.0, 2.0 * d2 * d2 * (d1 + d2 - 2.0) / (d1 * (d2 - 2.0) * (d2 - 2.0) * (d2 - 4.0)),
                     math.nan)

    def _draw(self, sample_shape: Any, draw: Callable[[Gamma, Any], Tensor]) -> Tensor:
        """``X1 / X2``, each at least the dtype's smallest normal number (floors the gradient stops at), as torch's."""
        tiny = float(finfo(self.df1).tiny)
        x1, x2 = (draw(g, sample_shape) for g in (self._gamma1, self._gamma2))
        return maximum(x1 / maximum(x2, tiny), tiny)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        return detach(self._draw(sample_shape, Gamma.sample))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        return self._draw(sample_shape, Gamma.rsample)

    def log_prob(self, value: Any) -> Tensor:
        v = self._value(value, self.df1)
        ct1, ct2, ct3 = self.df1 * 0.5, self.df2 * 0.5, self.df1 / self.df2
        t1 = lgamma(ct1 + ct2) - lgamma(ct1) - lgamma(ct2)
        return t1 + ct1 * log(ct3) + (ct1 - 1.0) * log(v) - (ct1 + ct2) * log1p(ct3 * v)


class VonMises(Distribution):
    """``torch.distributions.VonMises(loc, concentration)``: ``log I0``/``I1`` from ``gc.special.i0e``/``i1e``;
    ``sample`` by Best-Fisher rejection in float64, as torch's (which has no ``rsample``)."""

    support = REAL

    def __init__(self, loc: Any, concentration: Any, validate_args: bool | None = None):
        self.loc, self.concentration = params("VonMises", loc=loc, concentration=concentration)
        super().__init__(self.loc.shape, (), validate_args)
        if self._validate_args:
            check("VonMises", "loc", self.loc, REAL)
            check("VonMises", "concentration", self.concentration, POSITIVE)

    mean = mode = property(lambda self: self.loc)
    variance = property(lambda self: 1.0 - i1e(self.concentration) / i0e(self.concentration))

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """Best and Fisher's (1979) wrapped-Cauchy envelope: ``f = (1 + r z) / (r + z)``, ``z = cos(pi u1)``, accepted
        where ``c (2 - c) > u2`` or ``log(c / u2) + 1 >= c`` (``c = k (r - f)``), the angle ``sign(u3 - 1/2) acos f``
        shifted by ``loc`` into ``[-pi, pi)``; at least 65% of tries accept."""
        loc, k = (cast(detach(self._expanded(t, sample_shape)), "float64") for t in (self.loc, self.concentration))
        tau = sqrt(4.0 * k * k + 1.0) + 1.0
        rho = (tau - sqrt(2.0 * tau)) / (2.0 * k)
        r = where(k < 1e-5, 1.0 / k + k, (rho * rho + 1.0) / (2.0 * rho))  # torch's Taylor form for small k

        def step(f0: Tensor, flip0: Tensor, done: Tensor) -> tuple:
            z = cos(rand_like(f0) * math.pi)
            u2, u3 = rand_like(f0), rand_like(f0)
            f = (r * z + 1.0) / (r + z)
            c = k * (r - f)
            ok = ((c * (2.0 - c) - u2 > 0.0) | (log(c / u2) + 1.0 - c >= 0.0)) & ~done
            return any_(~(done | ok)), where(ok, f, f0), (ok & (u3 < 0.5)) | (~ok & flip0), done | ok  # no bool Where

        f, flip, _ = until_accepted(step, (k * 0.0, k < 0.0, k < 0.0))
        theta = acos(clip(f, -1.0, 1.0))
        x = where(flip, -theta, theta) + loc + math.pi
        return cast(x - floor(x / (2 * math.pi)) * (2 * math.pi) - math.pi, self.loc.dtype)

    def log_prob(self, value: Any) -> Tensor:
        k = self.concentration
        return k * cos(self._value(value, self.loc) - self.loc) - math.log(2 * math.pi) - (log(i0e(k)) + k)


__all__ = ["Beta", "Chi2", "Dirichlet", "FisherSnedecor", "Gamma", "StudentT", "VonMises"]
