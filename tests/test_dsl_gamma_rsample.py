"""Reparameterised Gamma-family draws (graphc/dsl/ops_gamma_grad.py, ``gc._standard_gamma``, ``rsample`` of Gamma,
Chi2, Beta, Dirichlet and StudentT) against torch: the gradient ``gc.grad`` builds at graphc's own draws equals
``torch._standard_gamma_grad`` / torch's Dirichlet backward at those draws (alpha from 1e-3 to 1e4, float32 and
float64, numpy and ort-cpu); an independent float64 oracle (the implicit-function gradient of the regularised
incomplete gamma function, by mpmath or by central differences of ``gc.igamma``); the mean gradient over 1e5 draws
against the derivative of the mean; a training graph through ``rsample``; ``has_rsample`` and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc

try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

torch = pytest.importorskip("torch")
BACKENDS = ["numpy", "ort-cpu"]
ALPHAS = np.logspace(-3, 4, 29)  # 1e-3 ... 1e4, four per decade
REPEATS = 40  # draws per alpha
NS = 100_000


def _grid(dtype: str) -> np.ndarray:
    return np.repeat(ALPHAS, REPEATS).astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_standard_gamma_gradient_at_its_draws_is_torchs(dtype, backend):
    """d x / d alpha of ``gc._standard_gamma(alpha)`` through ``gc.grad`` is ``torch._standard_gamma_grad(alpha,
    x)`` at the drawn ``x`` (each branch of aten's: the series below 0.8, the saddle point above alpha 8, the
    rational fit between); the draws are the exact ones, at least the dtype's smallest normal number."""
    alpha = _grid(dtype)
    c = np.random.default_rng(0).uniform(0.5, 2.0, alpha.shape).astype(dtype)
    got = gc_grads(lambda M, a: gc._standard_gamma(a), {"a": alpha}, {}, c, backend=backend)
    x = got["out"]
    assert x.dtype == dtype and np.all(x >= np.finfo(dtype).tiny) and np.all(np.isfinite(x))
    want = torch._standard_gamma_grad(torch.from_numpy(alpha), torch.from_numpy(x)).numpy() * c
    assert np.any(x < 0.8) and np.any((alpha > 8) & (np.abs(x / alpha - 1) < 0.1)) and np.any((alpha > 8) & (
        np.abs(x / alpha - 1) > 0.1)) and np.any((alpha <= 8) & (x >= 0.8))
    np.testing.assert_allclose(got["a"], want, rtol=1e-6 if dtype == "float32" else 1e-10, atol=0)


def test_standard_gamma_grad_matches_torch_off_the_draws():
    """``gc._standard_gamma_grad`` as a function: torch's on a (alpha, x) grid spanning every branch and both sides
    of its switches (x = 0.8, x = 0.9 alpha and 1.1 alpha, alpha = 8)."""
    a = np.concatenate([ALPHAS, [7.99, 8.0, 8.01]])
    x = np.concatenate([np.logspace(-30, 4.5, 40), [0.8 * (1 - 1e-7), 0.8, 0.8 * (1 + 1e-7)]])
    a, x = (v.ravel() for v in np.meshgrid(a, x))
    x = np.concatenate([x, a * float(np.float32(0.9)), a * float(np.float32(1.1)), a * 0.95])
    a = np.concatenate([a, a, a, a])
    model = gc.capture(lambda a, x: gc._standard_gamma_grad(a, x), a=a, x=x)
    want = torch._standard_gamma_grad(torch.from_numpy(a), torch.from_numpy(x)).numpy()
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run({"a": a, "x": x})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300, err_msg=backend)


def _dirichlet_concentrations(dtype: str) -> np.ndarray:
    """(n, 3) concentrations, each a random triple from the 1e-3 ... 1e4 grid (every branch of aten's: near 0, near
    1, both concentrations large, the rational fit)."""
    rng = np.random.default_rng(1)
    return rng.choice(ALPHAS, (1200, 3)).astype(dtype)


def _assert_close_to_torch(got, want, dtype):
    """Float64 within 1e-6 (psi(total) - psi(alpha) cancels where total - alpha is tiny); float32 within 1e-5 but
    for the few draws where glibc's logf, which torch's float32 digamma calls, is off by an ulp (it is not correctly
    rounded): a last-digit difference of psi in that cancellation, within 3e-3."""
    rel = np.abs(got - want) / np.maximum(np.abs(want), np.finfo(dtype).tiny)
    if dtype == "float64":
        assert rel.max() < 1e-6, rel.max()
    else:
        assert np.mean(rel > 1e-5) < 0.01 and rel.max() < 3e-3, (np.mean(rel > 1e-5), rel.max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dirichlet_gradient_at_its_draws_is_torchs(dtype, backend):
    """``Dirichlet(c).rsample()``'s gradient of ``sum(x * w)`` is torch's Dirichlet backward (``_dirichlet_grad`` and
    its simplex projection) at the drawn ``x``; ``gc._dirichlet_grad`` at those draws is ``torch._dirichlet_grad``."""
    conc = _dirichlet_concentrations(dtype)
    w = np.random.default_rng(2).normal(size=conc.shape).astype(dtype)
    got = gc_grads(lambda M, k: gc.distributions.Dirichlet(k).rsample(), {"k": conc}, {}, w, backend=backend)
    x = got["out"]
    assert x.dtype == dtype and np.all(x >= np.finfo(dtype).tiny)
    tx, tc = torch.from_numpy(x), torch.from_numpy(conc)
    total = tc.sum(-1, True).expand_as(tc)
    want = torch.distributions.dirichlet._Dirichlet_backward(tx, tc, torch.from_numpy(w)).numpy()
    _assert_close_to_torch(got["k"], want, dtype)

    model = gc.capture(lambda x, c, t: gc._dirichlet_grad(x, c, t), x=x, c=conc, t=total.numpy().copy())
    direct = gc.Session(model, backend=backend).run({"x": x, "c": conc, "t": total.numpy().copy()})["output"]
    _assert_close_to_torch(direct, torch._dirichlet_grad(tx, tc, total).numpy(), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_beta_gradient_at_its_draws_is_torchs(backend):
    """``Beta(a, b).rsample()`` is the first component of a Dirichlet draw ``(x, y)``: its gradient in ``a`` is
    torch's ``_dirichlet_grad(x, a, a + b) (1 - x)``; in ``b`` it needs ``y``, which is ``1 - x`` to the last digits
    where ``x <= 1/2``, so it is checked there (and on Dirichlet draws above)."""
    rng = np.random.default_rng(3)
    a, b = rng.choice(ALPHAS, 1500), rng.choice(ALPHAS, 1500)
    w = rng.normal(size=a.shape)
    got = gc_grads(lambda M, a, b: gc.distributions.Beta(a, b).rsample(), {"a": a, "b": b}, {}, w, backend=backend)
    x = got["out"]
    pair = torch.from_numpy(np.stack([x, 1.0 - x], -1))
    conc = torch.from_numpy(np.stack([a, b], -1))
    want = torch.distributions.dirichlet._Dirichlet_backward(pair, conc, torch.from_numpy(np.stack([w, 0 * w], -1)))
    np.testing.assert_allclose(got["a"], want[:, 0].numpy(), rtol=1e-6, atol=0)
    low = x <= 0.5
    assert low.sum() > 300
    np.testing.assert_allclose(got["b"][low], want[low, 1].numpy(), rtol=1e-6, atol=0)


def _mpmath_dx_dalpha(a: float, x: float) -> float:
    """``-(dP/dalpha) / (dP/dx)`` of the regularised lower incomplete gamma function ``P(alpha, x)`` in mpmath."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(30):
        a_, x_ = mpmath.mpf(a), mpmath.mpf(x)
        dp_da = mpmath.diff(lambda s: mpmath.gammainc(s, 0, x_, regularized=True), a_)
        pdf = mpmath.exp((a_ - 1) * mpmath.log(x_) - x_ - mpmath.loggamma(a_))
        return float(-dp_da / pdf)


def _igamma_dx_dalpha(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The same by float64 central differences of ``gc.igamma`` in alpha (step ``1e-5 alpha``) over its density."""
    def implicit(a, x):
        h = a * 1e-5
        dp_da = (gc.igamma(a + h, x) - gc.igamma(a - h, x)) / (2.0 * h)
        return -dp_da / gc.exp((a - 1.0) * gc.log(x) - x - gc.lgamma(a))

    model = gc.capture(implicit, a=a, x=x)
    return gc.Session(model, backend="numpy").run({"a": a, "x": x})["output"]


@pytest.mark.parametrize("oracle", ["mpmath", "igamma"])
def test_standard_gamma_gradient_is_the_implicit_function_gradient(oracle):
    """Independent of torch: at graphc's float64 draws (three per alpha), the gradient is ``-(dP/dalpha) /
    (dP/dx)`` within 2e-3 (aten's approximations' own error: about 7e-4 at worst on this grid)."""
    alpha = np.repeat(ALPHAS, 3)
    got = gc_grads(lambda M, a: gc._standard_gamma(a), {"a": alpha}, {}, np.ones_like(alpha))
    x = got["out"]
    if oracle == "mpmath":
        want = np.array([_mpmath_dx_dalpha(a, v) for a, v in zip(alpha, x)])
    else:
        keep = x > 1e-250  # the difference quotient of P ~ x**alpha underflows below
        alpha, x, got = alpha[keep], x[keep], {"a": got["a"][keep]}
        want = _igamma_dx_dalpha(alpha, x)
    np.testing.assert_allclose(got["a"], want, rtol=2e-3, atol=1e-300)


def _per_draw_gradients(make, params: dict, backend: str) -> dict:
    """``make(*params)`` with each parameter repeated ``NS`` times: ``rsample()``'s derivative per draw."""
    wide = {k: np.full(NS, v) for k, v in params.items()}
    return gc_grads(lambda M, *ps: make(*ps).rsample(), wide, {}, np.ones(NS), backend=backend)


@pytest.mark.parametrize("make, params, dmean, backend", [
    (lambda k: gc.distributions.Gamma(k, 1.0), {"k": 0.01}, {"k": 1.0}, "numpy"),
    (lambda k: gc.distributions.Gamma(k, 1.0), {"k": 0.7}, {"k": 1.0}, "ort-cpu"),
    (lambda k: gc.distributions.Gamma(k, 1.0), {"k": 30.0}, {"k": 1.0}, "numpy"),
    (lambda k, r: gc.distributions.Gamma(k, r), {"k": 2.5, "r": 4.0}, {"k": 0.25, "r": -2.5 / 16}, "ort-cpu"),
    (lambda df: gc.distributions.Chi2(df), {"df": 3.0}, {"df": 1.0}, "numpy"),
    (lambda a, b: gc.distributions.Beta(a, b), {"a": 0.5, "b": 3.0}, {"a": 3.0 / 3.5 ** 2, "b": -0.5 / 3.5 ** 2},
     "ort-cpu"),
    (lambda df, s: gc.distributions.StudentT(df, 1.0, s), {"df": 5.0, "s": 2.0}, {"df": 0.0, "s": 0.0}, "numpy"),
], ids=["gamma-0.01", "gamma-0.7", "gamma-30", "gamma-rate", "chi2", "beta", "student_t"])
def test_mean_gradient_is_the_derivative_of_the_mean(make, params, dmean, backend):
    """Over 1e5 draws the mean of ``d x / d theta`` is ``d E[x] / d theta`` within 5 standard errors (E = alpha /
    rate, df, a / (a + b), loc); the backends take turns (both run each construction in the tests above)."""
    got = _per_draw_gradients(make, params, backend)
    for name, want in dmean.items():
        g = got[name]
        assert np.all(np.isfinite(g)), name
        se = g.std() / math.sqrt(NS)
        assert abs(g.mean() - want) < 5 * se + 1e-12, (name, g.mean(), want, se)


def test_dirichlet_mean_gradient_is_the_derivative_of_the_mean():
    """E[x_0] = c_0 / sum(c): over 1e5 draws its gradient ((T - c_0) / T^2, -c_0 / T^2) within 5 standard errors."""
    c = np.array([0.3, 2.0, 5.0])
    conc = np.tile(c, (NS, 1))
    w = np.zeros_like(conc)
    w[:, 0] = 1.0
    got = gc_grads(lambda M, k: gc.distributions.Dirichlet(k).rsample(), {"k": conc}, {}, w)["k"]
    total = c.sum()
    want = np.array([total - c[0], -c[0], -c[0]]) / total ** 2
    se = got.std(0) / math.sqrt(NS)
    assert np.all(np.abs(got.mean(0) - want) < 5 * se), (got.mean(0), want, se)


class _FitGamma(gc.nn.Module):
    """Fits Gamma(exp(log_c), exp(log_r)) to ``target`` by ``mean((rsample - target)^2)`` of 256 draws."""

    def __init__(self):
        super().__init__()
        self.log_c = gc.nn.Parameter(np.array([0.5], np.float32))
        self.log_r = gc.nn.Parameter(np.array([-0.2], np.float32))

    def forward(self, target):
        d = gc.distributions.Gamma(gc.exp(self.log_c), gc.exp(self.log_r))
        x = d.rsample((256,))
        return {"loss": gc.mean((x - target) * (x - target))}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_graph_through_rsample(backend):
    """``gc.training.generate`` builds through the draws (the Loop detached, the implicit gradient kept): the
    gradients graph's gradients are finite and not zero, and Adam steps run."""
    target = np.full((256, 1), 3.0, np.float32)
    arts = gc.training.generate(gc.capture(_FitGamma(), target=target), "loss", gc.optim.Adam(0.05))
    grads = gc.Session(arts.gradients, backend=backend).run({"target": target})
    for name in ("log_c_grad", "log_r_grad"):
        assert np.all(np.isfinite(grads[name])) and np.all(grads[name] != 0), (name, grads[name])
    trainer = gc.Trainer(arts, backend=backend)
    losses = [trainer.step({"target": target}) for _ in range(5)]
    assert np.all(np.isfinite(losses))


def test_has_rsample_is_torchs():
    """True for Gamma, Chi2, Beta, Dirichlet and StudentT; VonMises, Poisson and NegativeBinomial still refuse, as
    torch's (tests/test_dsl_distributions_more.py has their errors)."""
    d = gc.distributions
    for name in ("Gamma", "Chi2", "Beta", "Dirichlet", "StudentT", "VonMises", "Poisson", "NegativeBinomial"):
        assert getattr(d, name).has_rsample == getattr(torch.distributions, name).has_rsample, name
    with pytest.raises(gc.CaptureError, match=r"VonMises.*has no rsample"):
        gc.capture(lambda x: d.VonMises(x, 1.0).rsample(), x=np.ones(3))


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc._standard_gamma_grad(gc.cast(x, "int64"), x),
     r"_standard_gamma_grad\(int64\[3\], float32\[3\]\): alpha must be a floating point Tensor, got int64"),
    (lambda x: gc._standard_gamma_grad(x, gc.cast(x, "float64")),
     r"_standard_gamma_grad\(.*\): the operands must have one dtype, got alpha float32, x float64"),
    (lambda x: gc._dirichlet_grad(x, x, gc.cast(x, "int32")), r"total must be a floating point Tensor, got int32"),
    (lambda x: gc._standard_gamma(gc.cast(x, "int32")), r"_standard_gamma\(int32\[3\]\): alpha must be a floating"),
    (lambda x: gc.distributions.Dirichlet(x[0]).rsample(), r"concentration must be at least one-dimensional"),
])
def test_bad_arguments_raise_with_the_user_line(fn, match):
    """torch refuses these too (an integer dtype, mixed dtypes, a scalar Dirichlet concentration)."""
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=gc.spec("float32", [3]))
    assert "test_dsl_gamma_rsample.py:" in str(info.value)
