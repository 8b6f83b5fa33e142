"""gc.distributions' further families (Gamma, Chi2, Beta, Dirichlet, StudentT, VonMises, Poisson, Binomial,
Geometric, NegativeBinomial, HalfNormal, HalfCauchy, Pareto, ContinuousBernoulli, RelaxedBernoulli,
RelaxedOneHotCategorical, MultivariateNormal), ``expand``, ``enumerate_support``, ``perplexity``, ``register_kl``
and the KL pairs, against torch.distributions: values on numpy and ort-cpu with gradients against torch.autograd,
float64 central differences, rsample's gradient with its noise held fixed, samples' moments, frequencies and a
Kolmogorov-Smirnov check, shapes, a symbolic batch dim, and the errors (rsample refused where sampling needs
rejection)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc

try:
    from torch_grad_util import (assert_grads_match_central_differences, assert_matches_torch, gc_grads,
                                 run_both)
    from distribution_util import D, assert_method_matches_torch, assert_shapes_match_torch, method_of
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (assert_grads_match_central_differences, assert_matches_torch, gc_grads,
                                       run_both)
    from tests.distribution_util import D, assert_method_matches_torch, assert_shapes_match_torch, method_of

torch = pytest.importorskip("torch")
R = np.random.default_rng(7)
A = np.array([[0.4, 1.3, 2.5], [0.8, 3.1, 0.6]])
B = np.array([[1.2, 0.5, 2.0], [0.9, 1.7, 4.0]])
X = np.array([[0.2, 0.7, 1.9], [0.05, 2.4, 0.6]])
U = np.array([[0.15, 0.5, 0.8], [0.3, 0.65, 0.95]])
P = np.array([[0.1, 0.35, 0.5], [0.65, 0.8, 0.97]])
LOGITS = np.array([[0.3, -1.2, 2.0], [0.0, 0.7, -0.4]])
K = np.array([[0.0, 1.0, 3.0], [2.0, 0.0, 5.0]])
N = np.array([[3.0, 5.0, 5.0], [6.0, 1.0, 5.0]])
SIMPLEX = U / U.sum(-1, keepdims=True)
_M = R.standard_normal((2, 3, 3))
COV = _M @ _M.transpose(0, 2, 1) + np.eye(3)
TRIL = np.linalg.cholesky(COV)
LOC = R.standard_normal((2, 3))
VEC = R.standard_normal((4, 2, 3))


# (id, make(Dist, *params), params, the value for log_prob/cdf, methods with gradients, methods without)
FAMILIES = [
    ("gamma", lambda d, a, b: d.Gamma(a, b), [A, B], X, "log_prob entropy mean mode variance stddev", ""),
    ("gamma_cdf", lambda d, b: d.Gamma(2.5, b), [B], X, "cdf", ""),  # torch has no gradient to concentration
    ("chi2", lambda d, a: d.Chi2(a), [A * 2], X, "log_prob entropy mean mode variance", ""),
    ("beta", lambda d, a, b: d.Beta(a, b), [A, B], U, "log_prob entropy mean variance", "mode"),
    ("beta_mode", lambda d, a, b: d.Beta(a + 1.0, b + 1.0), [A, B], U, "mode", ""),
    ("dirichlet", lambda d, a: d.Dirichlet(a), [A], SIMPLEX, "log_prob entropy mean variance", "mode"),
    ("dirichlet_mode", lambda d, a: d.Dirichlet(a * 0.2), [A], SIMPLEX, "", "mode"),
    ("studentt", lambda d, a, b, c: d.StudentT(a * 2.0, b, c), [A, LOGITS, B], X, "log_prob entropy mode",
     "mean variance"),
    ("vonmises", lambda d, a, b: d.VonMises(a, b), [LOGITS, B], X, "log_prob mean mode variance", ""),
    ("poisson", lambda d, a: d.Poisson(a), [A], K, "log_prob mean variance", "mode"),
    ("geometric_probs", lambda d, p: d.Geometric(probs=p), [P], K, "log_prob entropy mean variance", "mode"),
    ("geometric_logits", lambda d, a: d.Geometric(logits=a), [LOGITS], K, "log_prob entropy mean variance", ""),
    ("binomial", lambda d, p, n: d.Binomial(n, probs=p), [P, N], K, "log_prob mean variance", "mode"),
    ("binomial_logits", lambda d, a: d.Binomial(5, logits=a), [LOGITS], K, "log_prob entropy mean variance",
     "mode"),
    ("negative_binomial", lambda d, p, n: d.NegativeBinomial(n, probs=p * 0.9), [P, A], K,
     "log_prob mean variance", "mode"),
    ("negative_binomial_logits", lambda d, a, n: d.NegativeBinomial(n, logits=a), [LOGITS, A], K,
     "log_prob mean variance", ""),
    ("half_normal", lambda d, a: d.HalfNormal(a), [A], X, "log_prob entropy cdf icdf mean variance stddev", "mode"),
    ("half_cauchy", lambda d, a: d.HalfCauchy(a), [A], X, "log_prob entropy cdf icdf", "mean variance mode"),
    ("pareto", lambda d, a, b: d.Pareto(a, b), [A, B * 2], A + X, "log_prob entropy cdf icdf mean mode variance", ""),
    ("pareto_heavy", lambda d, a, b: d.Pareto(a, b), [A, B * 0.5], A + X, "mean variance", ""),
    ("relaxed_bernoulli", lambda d, a, t: d.RelaxedBernoulli(t, logits=a), [LOGITS, B], U, "log_prob", ""),
    ("relaxed_bernoulli_probs", lambda d, p, t: d.RelaxedBernoulli(t, probs=p), [P, B], U, "log_prob", ""),
    ("relaxed_one_hot", lambda d, a, t: d.RelaxedOneHotCategorical(t, logits=a), [LOGITS, np.array(0.7)], SIMPLEX,
     "log_prob", ""),
    ("continuous_bernoulli", lambda d, p: d.ContinuousBernoulli(probs=p), [P], U,
     "log_prob entropy cdf icdf mean variance stddev", ""),
    ("continuous_bernoulli_logits", lambda d, a: d.ContinuousBernoulli(logits=a), [LOGITS], U,
     "log_prob entropy cdf icdf mean variance", ""),
    ("continuous_bernoulli_taylor", lambda d, p: d.ContinuousBernoulli(probs=p),
     [np.array([0.4995, 0.5, 0.5005, 0.2, 0.501, 0.499])], np.array([0.0, 0.3, 1.0, 0.5, 0.7, 0.9]),
     "log_prob entropy cdf mean variance", ""),
    ("mvn_cov", lambda d, m, c: d.MultivariateNormal(m, covariance_matrix=c), [LOC, COV], VEC,
     "log_prob entropy mean variance covariance_matrix scale_tril precision_matrix", ""),
    ("mvn_precision", lambda d, m, c: d.MultivariateNormal(m, precision_matrix=c), [LOC, COV], VEC,
     "log_prob entropy variance covariance_matrix precision_matrix", ""),
    ("mvn_tril", lambda d, m, c: d.MultivariateNormal(m, scale_tril=c), [LOC[0], TRIL], VEC,
     "log_prob entropy mode variance covariance_matrix scale_tril", ""),
]


CASES = [pytest.param(make, method, params, value, method in grads.split(), id=f"{name}-{method}")
         for name, make, params, value, grads, nograds in FAMILIES for method in grads.split() + nograds.split()]


@pytest.mark.parametrize("make, method, params, value, differentiable", CASES)
def test_values_and_gradients_match_torch(make, method, params, value, differentiable):
    """Values (numpy and ort-cpu, the full checker) and the gradients to every parameter (and, for a
    continuous family's log_prob/cdf/icdf, the value)."""
    assert_method_matches_torch(make, method, params, value if method != "icdf" else X, differentiable, R)


@pytest.mark.parametrize("make, value", [
    pytest.param(lambda d, a, b: d.Gamma(a, b), X, id="gamma"),
    pytest.param(lambda d, a, b: d.Beta(a, b), U, id="beta"),
    pytest.param(lambda d, a, b: d.StudentT(a, 0.5, b), X, id="studentt"),
    pytest.param(lambda d, a, b: d.Pareto(a, b), A + X, id="pareto"),
    pytest.param(lambda d, a, b: d.ContinuousBernoulli(logits=a - b), U, id="continuous_bernoulli"),
])
def test_float32_parameters_match_torch(make, value):
    """float32 parameters (a Python number takes their dtype, as torch's ``broadcast_all``)."""
    fn = method_of(make, "log_prob")
    assert_matches_torch(fn, [A.astype(np.float32), B.astype(np.float32), value.astype(np.float32)], {}, R)


# (id, make(Dist, *params) for p, for q, params of p, params of q)
_gamma = (lambda d, a, b: d.Gamma(a, b))
_exponential = (lambda d, a: d.Exponential(a))
_beta = (lambda d, a, b: d.Beta(a, b))
_pareto = (lambda d, a, b: d.Pareto(a, b))
KL_CASES = [
    ("gamma", _gamma, _gamma, [A, B], [B, A]),
    ("chi2", lambda d, a: d.Chi2(a), lambda d, a: d.Chi2(a), [A], [B]),
    ("beta", _beta, _beta, [A, B], [B, A]),
    ("dirichlet", lambda d, a: d.Dirichlet(a), lambda d, a: d.Dirichlet(a), [A], [B]),
    ("poisson", lambda d, a: d.Poisson(a), lambda d, a: d.Poisson(a), [A], [B]),
    ("binomial", lambda d, p: d.Binomial(5, probs=p), lambda d, p: d.Binomial(5, probs=p), [P], [P[::-1].copy()]),
    ("geometric", lambda d, p: d.Geometric(probs=p), lambda d, a: d.Geometric(logits=a), [P], [LOGITS]),
    ("half_normal", lambda d, a: d.HalfNormal(a), lambda d, a: d.HalfNormal(a), [A], [B]),
    ("pareto", _pareto, _pareto, [A, B], [A * 0.5, B]),
    ("mvn", lambda d, m, c: d.MultivariateNormal(m, covariance_matrix=c),
     lambda d, m, c: d.MultivariateNormal(m, scale_tril=c), [LOC, COV], [LOC[::-1].copy(), TRIL[0]]),
    ("exponential_gamma", _exponential, _gamma, [A], [B, A]),
    ("gamma_exponential", _gamma, _exponential, [A, B], [B]),
    ("beta_exponential", _beta, _exponential, [A, B], [B]),
    ("beta_gamma", _beta, _gamma, [A, B], [B, A]),
    ("beta_uniform", _beta, lambda d, a, b: d.Uniform(a, b), [A, B], [A * 0.0 - 0.5, B + 1.0]),
    ("pareto_exponential", _pareto, _exponential, [A, B + 1.0], [B]),
    ("pareto_gamma", _pareto, _gamma, [A, B + 1.0], [B, A]),
    ("bernoulli_poisson", lambda d, p: d.Bernoulli(probs=p), lambda d, a: d.Poisson(a), [P], [A]),
    ("continuous_bernoulli", lambda d, p: d.ContinuousBernoulli(probs=p), lambda d, a: d.ContinuousBernoulli(logits=a),
     [P], [LOGITS]),
    ("beta_continuous_bernoulli", _beta, lambda d, p: d.ContinuousBernoulli(probs=p), [A, B], [P]),
    ("continuous_bernoulli_exponential", lambda d, p: d.ContinuousBernoulli(probs=p), _exponential, [P], [B]),
]


@pytest.mark.parametrize("make_p, make_q, p, q", [pytest.param(*c[1:], id=c[0]) for c in KL_CASES])
def test_kl_divergence_matches_torch(make_p, make_q, p, q):
    n = len(p)
    assert_matches_torch(lambda M, *a: D(M).kl_divergence(make_p(D(M), *a[:n]), make_q(D(M), *a[n:])), [*p, *q],
                         {}, R)


@pytest.mark.parametrize("make_p, make_q, p, q", [
    pytest.param(_pareto, _pareto, [np.array([1.0, 2.0, 0.5]), np.array([2.0, 1.0, 3.0])],
                 [np.array([1.5, 1.0, 0.5]), np.array([1.0, 2.0, 0.5])], id="pareto_support"),
    pytest.param(_pareto, _exponential, [np.array([1.0, 2.0]), np.array([0.5, 3.0])], [np.array([1.0, 1.0])],
                 id="pareto_exponential_alpha"),
    pytest.param(lambda d, n, p: d.Binomial(n, probs=p), lambda d, n, p: d.Binomial(n, probs=p),
                 [np.array([5.0, 4.0]), np.array([0.3, 0.6])], [np.array([5.0, 3.0]), np.array([0.5, 0.5])],
                 id="binomial_counts"),
    pytest.param(_gamma, lambda d, a, b: d.Uniform(a, b), [np.array([1.0]), np.array([2.0])],
                 [np.array([0.0]), np.array([1.0])], id="gamma_uniform"),
    pytest.param(lambda d, a: d.Poisson(a), lambda d, p: d.Bernoulli(probs=p), [np.array([1.0, 2.0])],
                 [np.array([0.5, 0.5])], id="poisson_bernoulli"),
    pytest.param(lambda d, a: d.Exponential(a), _beta, [np.array([1.0])], [np.array([1.0]), np.array([2.0])],
                 id="exponential_beta"),
    pytest.param(lambda d, p: d.ContinuousBernoulli(probs=p), _pareto, [np.array([0.3])],
                 [np.array([1.0]), np.array([2.0])], id="continuous_bernoulli_pareto"),
])
def test_kl_divergence_inf_edges_match_torch(make_p, make_q, p, q):
    """inf where q has no mass on part of p's support (or p's moment is infinite), as torch's."""
    n = len(p)
    names = [f"a{i}" for i in range(n + len(q))]
    assert_matches_torch(lambda M, **kw: D(M).kl_divergence(make_p(D(M), *(kw[k] for k in names[:n])),
                                                              make_q(D(M), *(kw[k] for k in names[n:]))),
                         [], dict(zip(names, [*p, *q])), R)


@pytest.mark.parametrize("fn", [
    pytest.param(lambda M, x: gc.distributions.Beta(gc.exp(x), 1.5).log_prob(gc.sigmoid(x * 0.5)), id="beta_log_prob"),
    pytest.param(lambda M, x: gc.distributions.StudentT(gc.exp(x) + 1.0, x, 2.0).entropy(), id="studentt_entropy"),
    pytest.param(lambda M, x: gc.distributions.Dirichlet(gc.exp(x)).entropy(), id="dirichlet_entropy"),
    pytest.param(lambda M, x: gc.distributions.kl_divergence(gc.distributions.Gamma(gc.exp(x), 1.2),
                                                             gc.distributions.Gamma(2.0, gc.exp(-x))), id="gamma_kl"),
    pytest.param(lambda M, x: gc.distributions.Binomial(7, logits=x).log_prob(3.0), id="binomial_log_prob"),
    pytest.param(lambda M, x: gc.distributions.Binomial(4, logits=x).entropy(), id="binomial_entropy"),
    pytest.param(lambda M, x: gc.distributions.NegativeBinomial(gc.exp(x), logits=x).log_prob(2.0),
                 id="negative_binomial_log_prob"),
    pytest.param(lambda M, x: gc.distributions.VonMises(x, gc.exp(x)).log_prob(0.3), id="vonmises_log_prob"),
    pytest.param(lambda M, x: gc.distributions.RelaxedOneHotCategorical(0.6, logits=x).log_prob(gc.softmax(-x)),
                 id="relaxed_one_hot_log_prob"),
    pytest.param(lambda M, x: gc.distributions.MultivariateNormal(
        x[0], covariance_matrix=gc.matmul(x[1:], x[1:].transpose(0, 1)) + 4.0 * np.eye(3)).log_prob(x[1:]),
        id="mvn_cov_log_prob"),
    pytest.param(lambda M, x: gc.distributions.kl_divergence(
        gc.distributions.MultivariateNormal(x[0], precision_matrix=gc.matmul(x[1:], x[1:].transpose(0, 1))
                                            + 4.0 * np.eye(3)),
        gc.distributions.MultivariateNormal(x[1], scale_tril=np.diag([1.0, 2.0, 0.5]))), id="mvn_kl"),
])
def test_gradients_match_central_differences(fn):
    assert_grads_match_central_differences(fn, R.standard_normal((4, 3)) * 0.5)


def _logit(s):
    return np.log(s) - np.log1p(-s)


# (id, make(Dist, *params), params, torch's rsample as a function of the params and the noise, the noise from
# graphc's sample and params)
RSAMPLE = [
    ("half_normal", lambda d, a: d.HalfNormal(a), [A], lambda a, e: (a * e).abs(), lambda s, a: s / a),
    ("pareto", lambda d, a, b: d.Pareto(a, b), [A, B], lambda a, b, e: a * (e / b).exp(),
     lambda s, a, b: np.log(s / a) * b),
    ("relaxed_bernoulli", lambda d, a, t: d.RelaxedBernoulli(t, logits=a), [LOGITS, B],
     lambda a, t, e: torch.sigmoid((a + e) / t), lambda s, a, t: _logit(s) * t - a),
    ("relaxed_one_hot", lambda d, a: d.RelaxedOneHotCategorical(0.7, logits=a), [LOGITS],
     lambda a, e: torch.softmax((a + e) / 0.7, -1), lambda s, a: 0.7 * np.log(s) - a),
    ("continuous_bernoulli", lambda d, p: d.ContinuousBernoulli(probs=p), [P],
     lambda p, e: torch.distributions.ContinuousBernoulli(probs=p).icdf(e),
     lambda s, p: torch.distributions.ContinuousBernoulli(probs=torch.tensor(p)).cdf(torch.tensor(s)).numpy()),
    ("mvn_tril", lambda d, m, c: d.MultivariateNormal(m, scale_tril=c), [LOC, TRIL],
     lambda m, c, e: m + (c @ e[..., None])[..., 0], lambda s, m, c: np.linalg.solve(c, (s - m)[..., None])[..., 0]),
    ("mvn_cov", lambda d, m, c: d.MultivariateNormal(m, covariance_matrix=c), [LOC, COV],
     lambda m, c, e: m + (torch.linalg.cholesky(c) @ e[..., None])[..., 0],
     lambda s, m, c: np.linalg.solve(np.linalg.cholesky(c), (s - m)[..., None])[..., 0]),
]


@pytest.mark.parametrize("make, params, torch_form, noise", [pytest.param(*c[1:], id=c[0]) for c in RSAMPLE])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_rsample_gradient_matches_torch_with_the_noise_fixed(make, params, torch_form, noise, backend):
    """The gradient of ``sum(rsample((5,)) * c)`` to the parameters: torch's reparameterised form fed the
    noise graphc drew (read back from the sample)."""
    names = [f"a{i}" for i in range(len(params))]
    shape = (5, *np.broadcast_shapes(*(np.shape(p) if np.ndim(p) != 3 else np.shape(p)[:-1] for p in params)))
    c = R.standard_normal(shape)
    got = gc_grads(lambda M, *a: make(gc.distributions, *a).rsample((5,)), dict(zip(names, params)), {}, c,
                   backend=backend)
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    eps = torch.tensor(noise(got["out"], *params))
    (torch_form(*ts, eps) * torch.tensor(c)).sum().backward()
    for n, t in zip(names, ts):
        np.testing.assert_allclose(got[n], t.grad.numpy(), rtol=1e-6, atol=1e-8, err_msg=n)


NS = 20000
KS_BOUND = 1.95 / math.sqrt(NS)  # the Kolmogorov-Smirnov distance's 0.1% critical value


def _draws(make, method="sample"):
    model = gc.capture(lambda unused: getattr(make(gc.distributions), method)((NS,)), unused=np.zeros(1))
    return gc.Session(model, backend="numpy").run({"unused": np.zeros(1)})["output"]


def _ks(x, cdf):
    x = np.sort(x)
    c = cdf(x)
    return max(np.max(np.arange(1, len(x) + 1) / len(x) - c), np.max(c - np.arange(len(x)) / len(x)))


@pytest.mark.parametrize("make, has_moments", [
    pytest.param(lambda d: d.HalfNormal(1.5), True, id="half_normal"),
    pytest.param(lambda d: d.HalfCauchy(0.8), False, id="half_cauchy"),
    pytest.param(lambda d: d.Pareto(1.0, 5.0), True, id="pareto"),
    pytest.param(lambda d: d.ContinuousBernoulli(probs=0.8), True, id="continuous_bernoulli"),
])
@pytest.mark.parametrize("method", ["sample", "rsample"])
def test_continuous_samples_match_moments_and_pass_ks(make, has_moments, method):
    """Mean and variance within 5 standard errors of torch's, and the KS distance to torch's cdf."""
    x = _draws(make, method).astype(np.float64)
    assert x.shape == (NS,)
    ref = make(torch.distributions)
    if has_moments:
        mean, var = float(ref.mean), float(ref.variance)
        m4 = np.mean((x - x.mean()) ** 4)
        assert abs(x.mean() - mean) < 5 * math.sqrt(var / NS)
        assert abs(x.var() - var) < 5 * math.sqrt((m4 - x.var() ** 2) / NS)
    assert _ks(x, lambda v: ref.cdf(torch.tensor(v)).numpy()) < KS_BOUND


def test_relaxed_samples_match_their_distribution():
    """RelaxedBernoulli: the KS distance to its cdf ``sigmoid(t logit(y) - logits)``; RelaxedOneHotCategorical:
    points of the simplex whose argmax has Categorical(probs)'s frequencies (Gumbel-max, any temperature)."""
    t, logit, probs = 0.6, 0.4, np.array([0.1, 0.2, 0.3, 0.4])
    y = _draws(lambda d: d.RelaxedBernoulli(t, logits=logit), "rsample").astype(np.float64)
    assert np.all((y > 0) & (y < 1))
    assert _ks(y, lambda v: 1 / (1 + np.exp(-(t * _logit(v) - logit)))) < KS_BOUND
    s = _draws(lambda d: d.RelaxedOneHotCategorical(0.5, probs=probs), "rsample")
    assert s.shape == (NS, 4) and np.allclose(s.sum(-1), 1, atol=1e-5)
    freq = np.bincount(s.argmax(-1), minlength=4) / NS
    assert np.all(np.abs(freq - probs) < 5 * np.sqrt(probs * (1 - probs) / NS))


@pytest.mark.parametrize("make, support", [
    pytest.param(lambda d: d.Geometric(probs=0.3), 8, id="geometric"),
    pytest.param(lambda d: d.Geometric(logits=-0.5), 8, id="geometric_logits"),
    pytest.param(lambda d: d.Binomial(6, probs=0.35), 7, id="binomial"),
    pytest.param(lambda d: d.Binomial(4, logits=0.3), 5, id="binomial_logits"),
])
def test_discrete_samples_match_torch_frequencies(make, support):
    """Frequencies of 0..support-1 within 5 standard errors of torch's probabilities."""
    k = _draws(make)
    assert k.dtype == np.float32 and np.all(k == np.floor(k)) and k.min() >= 0
    pmf = make(torch.distributions).log_prob(torch.arange(support, dtype=torch.float32)).exp().numpy()
    freq = np.bincount(k.astype(np.int64), minlength=support)[:support] / NS
    assert np.all(np.abs(freq - pmf) < 5 * np.sqrt(pmf * (1 - pmf) / NS) + 1e-12)


def test_binomial_samples_stay_below_each_total_count():
    """An array total_count: each batch element counts only its own number of trials."""
    n = np.array([0.0, 1.0, 3.0, 10.0])
    k = _draws(lambda d: d.Binomial(n, probs=np.array([0.5, 0.9, 0.5, 0.2])))
    assert k.shape == (NS, 4) and np.all(k <= n) and np.all(k[:, 0] == 0)
    assert np.all(np.abs(k.mean(0) - n * [0.5, 0.9, 0.5, 0.2]) < 5 * np.sqrt(n * 0.25 / NS) + 1e-12)


def test_multivariate_normal_samples_match_mean_and_covariance():
    cov, loc = np.array([[2.0, 0.5, -0.3], [0.5, 1.0, 0.2], [-0.3, 0.2, 0.5]]), np.array([1.0, -2.0, 0.5])
    for method in ("sample", "rsample"):
        x = _draws(lambda d: d.MultivariateNormal(loc, covariance_matrix=cov), method).astype(np.float64)
        assert x.shape == (NS, 3)
        var = np.diag(cov)
        assert np.all(np.abs(x.mean(0) - loc) < 5 * np.sqrt(var / NS))
        assert np.all(np.abs(np.cov(x.T) - cov) < 5 * np.sqrt((np.outer(var, var) + cov ** 2) / NS))


@pytest.mark.parametrize("make, why", [
    (lambda x: gc.distributions.VonMises(x, 1.0), "not reparameterizable"),
    (lambda x: gc.distributions.Poisson(x), "not reparameterizable"),
    (lambda x: gc.distributions.NegativeBinomial(x, probs=0.5), "not reparameterizable"),
])
def test_rsample_of_rejection_sampled_families_is_refused(make, why):
    """sample() draws (tests/test_dsl_rejection_sampling.py); rsample is a CaptureError naming the family, the reason
    and this line."""
    with pytest.raises(gc.CaptureError, match=r"has no rsample") as info:
        gc.capture(lambda x: make(x).rsample((3,)), x=A + 1.0)
    assert why in str(info.value) and "test_dsl_distributions_more.py:" in str(info.value)


SHAPED = [
    ("half_normal", lambda d: d.HalfNormal(np.ones((2, 3)))),
    ("pareto", lambda d: d.Pareto(np.ones(3), 2.0)),
    ("geometric", lambda d: d.Geometric(probs=np.full((3, 1), 0.5))),
    ("binomial", lambda d: d.Binomial(4, logits=np.zeros((2, 3)))),
    ("relaxed_bernoulli", lambda d: d.RelaxedBernoulli(np.array(0.5), probs=np.full(4, 0.3))),
    ("relaxed_one_hot", lambda d: d.RelaxedOneHotCategorical(np.array(0.5), logits=np.zeros((2, 5)))),
    ("continuous_bernoulli", lambda d: d.ContinuousBernoulli(probs=np.full((2, 1), 0.3))),
    ("mvn", lambda d: d.MultivariateNormal(np.zeros((2, 3)), scale_tril=np.eye(3))),
    ("mvn_matrix_batch", lambda d: d.MultivariateNormal(np.zeros(3), covariance_matrix=np.tile(np.eye(3), (4, 1, 1)))),
]


def _torch_float32(make):
    """``make`` on torch.distributions with numpy arrays as float32 tensors (graphc's constant arrays)."""
    class Wrap:
        def __getattr__(self, name):
            cls = getattr(torch.distributions, name)

            def cast(v):
                return torch.tensor(v, dtype=torch.float32) if isinstance(v, np.ndarray) else v
            return lambda *a, **k: cls(*map(cast, a), **{n: cast(v) for n, v in k.items()})
    return make(Wrap())


@pytest.mark.parametrize("make", [pytest.param(c[1], id=c[0]) for c in SHAPED])
@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 3)])
def test_shapes_match_torch(make, sample_shape):
    assert_shapes_match_torch(make, _torch_float32(make), sample_shape)


@pytest.mark.parametrize("make, param", [
    pytest.param(lambda d, p: d.Bernoulli(probs=p), P, id="bernoulli"),
    pytest.param(lambda d, a: d.Categorical(logits=a), LOGITS, id="categorical"),
    pytest.param(lambda d, a: d.OneHotCategorical(logits=a), LOGITS, id="one_hot"),
    pytest.param(lambda d, p: d.Binomial(3, probs=p), P, id="binomial"),
])
@pytest.mark.parametrize("expand", [True, False])
def test_enumerate_support_matches_torch(make, param, expand):
    """Values, dtype and shape, and log_prob of the support (summing to 1 over it)."""
    assert make(torch.distributions, torch.tensor(param)).has_enumerate_support
    assert_matches_torch(lambda M, p: make(D(M), p).enumerate_support(expand), [], {"p": param}, R)
    assert_matches_torch(lambda M, p: make(D(M), p).log_prob(make(D(M), p).enumerate_support(expand)).exp().sum(0),
                         [], {"p": param}, R)


@pytest.mark.parametrize("make, params, value, batch", [
    pytest.param(lambda d, a, b: d.Normal(a, b), [A[0], B[0]], X, (2, 3), id="normal"),
    pytest.param(lambda d, a, b: d.Gamma(a, b), [A[:, :1], B[:, :1]], X, (4, 2, 3), id="gamma"),
    pytest.param(lambda d, a: d.Categorical(logits=a), [LOGITS[:1]], K[:, :2] % 3, (2, 2), id="categorical"),
    pytest.param(lambda d, a: d.Dirichlet(a), [A[:1]], SIMPLEX, (5, 2), id="dirichlet"),
    pytest.param(lambda d, a, b: d.Independent(d.Normal(a, b), 1), [A[:1], B[:1]], X, (3, 2), id="independent"),
    pytest.param(lambda d, m, c: d.MultivariateNormal(m, scale_tril=c), [LOC[:1], TRIL[0]], VEC, (4, 2), id="mvn"),
    pytest.param(lambda d, p: d.Binomial(5, probs=p), [P[:1]], K, (2, 3), id="binomial"),
])
def test_expand_matches_torch(make, params, value, batch):
    """``expand(batch_shape)``: its batch shape, log_prob (with gradients to the unexpanded parameters),
    entropy/mean where the family has them."""
    ref = make(torch.distributions, *map(torch.tensor, params)).expand(batch)
    seen = {}

    def fn(M, *a, v):
        d = make(D(M), *a).expand(batch)
        seen["batch"] = d.batch_shape
        return d.log_prob(v) if isinstance(d, (gc.distributions.Categorical, torch.distributions.Categorical)) else (
            d.log_prob(v) + d.mean.sum())
    assert_matches_torch(fn, list(params), {"v": value}, R)
    assert seen["batch"] == tuple(ref.batch_shape)


@pytest.mark.parametrize("make, params", [
    pytest.param(lambda d, a, b: d.Normal(a, b), [A, B], id="normal"),
    pytest.param(lambda d, a: d.Categorical(logits=a), [LOGITS], id="categorical"),
    pytest.param(lambda d, a, b: d.Beta(a, b), [A, B], id="beta"),
    pytest.param(lambda d, a: d.Geometric(logits=a), [LOGITS], id="geometric"),
])
def test_perplexity_matches_torch(make, params):
    assert_matches_torch(lambda M, *a: make(D(M), *a).perplexity(), list(params), {}, R)


class MyNormal(gc.distributions.Normal):
    """A subclass: kl_divergence finds Normal's rule, or a more specific one registered for it."""


def test_register_kl_adds_a_pair_and_subclasses_dispatch():
    D_ = gc.distributions
    with pytest.raises(gc.CaptureError, match="no KL divergence for p=MyNormal and q=Laplace"):
        gc.capture(lambda x: D_.kl_divergence(MyNormal(x, 1.0), D_.Laplace(x, 1.0)), x=X)
    inherited = gc.capture(lambda x, y: D_.kl_divergence(MyNormal(x, 1.5), D_.Normal(y, 0.5)), x=X, y=LOC[0])
    want = torch.distributions.kl_divergence(torch.distributions.Normal(torch.tensor(X), 1.5),
                                             torch.distributions.Normal(torch.tensor(LOC[0]), 0.5)).numpy()
    np.testing.assert_allclose(run_both(inherited, {"x": X, "y": LOC[0]})["output"], want, rtol=1e-12)

    @D_.register_kl(MyNormal, D_.Laplace)
    def _mine(p, q):
        return p.loc - q.loc

    @D_.register_kl(MyNormal, MyNormal)
    def _specific(p, q):
        return p.scale * q.scale

    mine = gc.capture(lambda x, y: {"a": D_.kl_divergence(MyNormal(x, 1.0), D_.Laplace(y, 1.0)),
                                    "b": D_.kl_divergence(MyNormal(x, 2.0), MyNormal(y, 3.0))}, x=X, y=LOC[0])
    out = run_both(mine, {"x": X, "y": LOC[0]})
    np.testing.assert_allclose(out["a"], X - LOC[0], rtol=1e-15)
    np.testing.assert_allclose(out["b"], np.full(X.shape, 6.0), rtol=1e-15)
    with pytest.raises(gc.CaptureError, match=r"register_kl.*type_p must be a subclass of gc.distributions"):
        D_.register_kl(int, D_.Normal)


def test_symbolic_batch_dim():
    """A batch dim named at capture: log_prob, entropy, KL, samples and the expanded support follow the fed
    batch."""
    def f(loc, a, p):
        mvn = gc.distributions.MultivariateNormal(loc, covariance_matrix=COV[0])
        g = gc.distributions.Gamma(a, 2.0)
        b = gc.distributions.Binomial(3, probs=p)
        return {"mvn": mvn.log_prob(loc * 0.5), "h": mvn.entropy(), "g": g.log_prob(a),
                "kl": gc.distributions.kl_divergence(g, gc.distributions.Gamma(1.5, a)),
                "b": b.log_prob(b.sample((2,))), "s": mvn.rsample((2,)), "support": b.enumerate_support()}

    spec = gc.spec("float64", ("N", 3))
    model = gc.capture(f, loc=spec, a=spec, p=spec)
    for n in (1, 4):
        feeds = {"loc": R.standard_normal((n, 3)), "a": R.random((n, 3)) + 0.5, "p": R.random((n, 3))}
        t = {k: torch.tensor(v) for k, v in feeds.items()}
        tm = torch.distributions.MultivariateNormal(t["loc"], covariance_matrix=torch.tensor(COV[0]))
        tg = torch.distributions.Gamma(t["a"], 2.0)
        want = {"mvn": tm.log_prob(t["loc"] * 0.5), "h": tm.entropy(), "g": tg.log_prob(t["a"]),
                "kl": torch.distributions.kl_divergence(tg, torch.distributions.Gamma(1.5, t["a"])),
                "support": torch.distributions.Binomial(3, probs=t["p"]).enumerate_support()}
        for backend in ("numpy", "ort-cpu"):
            out = gc.Session(model, backend=backend).run(feeds)
            for k, v in want.items():
                np.testing.assert_allclose(out[k], v.numpy(), rtol=1e-12, err_msg=f"{backend} {k}")
            assert out["s"].shape == (2, n, 3) and out["b"].shape == (2, n, 3) and np.all(np.isfinite(out["b"]))


def test_opset_17():
    """MultivariateNormal, Dirichlet and Binomial sampling at opset 17."""
    def f(loc, a):
        return {"lp": gc.distributions.MultivariateNormal(loc, covariance_matrix=COV[0]).log_prob(loc * 0.5)
                + gc.distributions.Dirichlet(a).log_prob(SIMPLEX),
                "s": gc.distributions.Binomial(4, probs=0.5).sample((5,))}

    model = gc.capture(f, loc=LOC, a=A, opset=17)
    want = (torch.distributions.MultivariateNormal(torch.tensor(LOC), covariance_matrix=torch.tensor(COV[0]))
            .log_prob(torch.tensor(LOC) * 0.5) + torch.distributions.Dirichlet(torch.tensor(A))
            .log_prob(torch.tensor(SIMPLEX))).numpy()
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"loc": LOC, "a": A})
        np.testing.assert_allclose(out["lp"], want, rtol=1e-12)
        assert out["s"].shape == (5,) and np.all((out["s"] >= 0) & (out["s"] <= 4))


E3 = np.eye(3)


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc.distributions.Gamma(x, -1.0), r"Gamma.*rate must satisfy constraints.positive"),
    (lambda x: gc.distributions.Chi2(np.array([1.0, -1.0])), r"Chi2.*df must satisfy constraints.positive"),
    (lambda x: gc.distributions.Beta(x, 0.0), r"Beta.*concentration0 must satisfy constraints.positive"),
    (lambda x: gc.distributions.Dirichlet(1.0), r"concentration must be at least one-dimensional"),
    (lambda x: gc.distributions.Dirichlet(x + 1.0).log_prob(np.array([0.5, 0.6, 0.1])),
     r"value must satisfy constraints.simplex"),
    (lambda x: gc.distributions.Beta(x + 1.0, 1.0).log_prob(1.5), r"value must satisfy constraints.unit_interval"),
    (lambda x: gc.distributions.StudentT(x, scale=-2.0), r"StudentT.*scale must satisfy constraints.positive"),
    (lambda x: gc.distributions.Poisson(x).log_prob(1.5), r"value must satisfy constraints.nonnegative_integer"),
    (lambda x: gc.distributions.Poisson(-1.0), r"Poisson.*rate must satisfy constraints.nonnegative"),
    (lambda x: gc.distributions.Binomial(3, probs=0.5).log_prob(4.0), r"value must satisfy constraints.integer_int"),
    (lambda x: gc.distributions.Binomial(-1, probs=0.5), r"total_count must satisfy constraints.nonnegative_integer"),
    (lambda x: gc.distributions.Binomial(2.5, probs=0.5), r"total_count must satisfy constraints.nonnegative_integer"),
    (lambda x: gc.distributions.Binomial(3, probs=x, logits=x), r"either probs or logits must be given"),
    (lambda x: gc.distributions.Binomial(x, probs=0.5).sample(), r"sample needs total_count of constant values"),
    (lambda x: gc.distributions.Binomial(np.array([2.0, 3.0]), probs=0.5).entropy(),
     r"enumerate_support needs total_count of one constant value"),
    (lambda x: gc.distributions.Binomial(5000, probs=0.5).sample(), r"sample takes total_count <= 4096"),
    (lambda x: gc.distributions.Geometric(probs=0.0), r"Geometric.*probs must satisfy constraints.positive"),
    (lambda x: gc.distributions.NegativeBinomial(2.0, probs=1.0), r"probs must satisfy constraints.half_open_int"),
    (lambda x: gc.distributions.Pareto(1.0, 2.0).log_prob(0.5), r"value must satisfy constraints.greater_than_eq"),
    (lambda x: gc.distributions.HalfNormal(x).log_prob(-1.0), r"value must satisfy constraints.nonnegative"),
    (lambda x: gc.distributions.HalfCauchy(0.0), r"HalfCauchy.*scale must satisfy constraints.positive"),
    (lambda x: gc.distributions.MultivariateNormal(x), r"exactly one of covariance_matrix, precision_matrix or scale"),
    (lambda x: gc.distributions.MultivariateNormal(x, covariance_matrix=E3, scale_tril=E3), r"exactly one of"),
    (lambda x: gc.distributions.MultivariateNormal(x, covariance_matrix=np.eye(2)),
     r"covariance_matrix must be \(\.\.\., 3, 3\) matrices"),
    (lambda x: gc.distributions.MultivariateNormal(1.0, covariance_matrix=E3), r"loc must be at least one-dim"),
    (lambda x: gc.distributions.MultivariateNormal(x, covariance_matrix=-E3),
     r"covariance_matrix must satisfy constraints.positive_definite"),
    (lambda x: gc.distributions.MultivariateNormal(x, scale_tril=np.ones((3, 3))),
     r"scale_tril must satisfy constraints.lower_cholesky"),
    (lambda x: gc.distributions.MultivariateNormal(x, scale_tril=np.tile(E3, (3, 1, 1))),
     r"loc's and scale_tril's batch dims do not broadcast"),
    (lambda x: gc.distributions.kl_divergence(gc.distributions.MultivariateNormal(x, covariance_matrix=E3),
                                              gc.distributions.MultivariateNormal(x[:, :2], scale_tril=np.eye(2))),
     r"MultivariateNormals of event shapes \(3,\) and \(2,\)"),
    (lambda x: gc.distributions.kl_divergence(gc.distributions.Binomial(3, probs=x),
                                              gc.distributions.Binomial(5, probs=x)), r"q.total_count > p.total_count"),
    (lambda x: gc.distributions.kl_divergence(x, gc.distributions.Normal(x, 1.0)),
     r"p must be a gc.distributions Distribution, got Tensor"),
    (lambda x: gc.distributions.Normal(x, 1.0).expand((3,)), r"expand: batch_shape \(3,\) is not an expansion"),
    (lambda x: gc.distributions.Normal(x, 1.0).expand((2, -1)), r"expand: batch_shape \(2, -1\) is not an expansion"),
    (lambda x: gc.distributions.Normal(x, 1.0).enumerate_support(), r"Normal.*has no enumerate_support"),
    (lambda x: gc.distributions.RelaxedBernoulli(0.5, logits=x).mean, r"RelaxedBernoulli.*has no mean"),
    (lambda x: gc.distributions.RelaxedOneHotCategorical(0.5, logits=x).stddev, r"has no variance"),
    (lambda x: gc.distributions.VonMises(x, 1.0).entropy(), r"VonMises.*has no closed-form entropy"),
    (lambda x: gc.distributions.Poisson(x + 1.0).perplexity(), r"Poisson.*has no closed-form entropy"),
])
def test_bad_arguments_raise_with_the_user_line(fn, match):
    """torch refuses each of these too (ValueError or NotImplementedError); the message names the argument
    and this file's line."""
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.zeros((2, 3)))
    assert "test_dsl_distributions_more.py:" in str(info.value)


@pytest.mark.parametrize("make, match", [
    (lambda x: gc.distributions.OneHotCategorical(logits=x), r"^OneHotCategorical\(\): needs"),
    (lambda x: gc.distributions.RelaxedOneHotCategorical(0.5, logits=x), r"^RelaxedOneHotCategorical\(\): needs"),
    (lambda x: gc.distributions.Categorical(logits=x).enumerate_support(),
     r"^Categorical\(\): enumerate_support needs"),
])
def test_a_symbolic_number_of_categories_is_refused_where_it_must_be_static(make, match):
    with pytest.raises(gc.CaptureError, match=match + r" a static number of categories, got the dim 'K' at .*more.py:"):
        gc.capture(make, x=gc.spec("float32", (2, "K")))


@pytest.mark.parametrize("make", [lambda M, a: M.distributions.OneHotCategorical(logits=a),
                                  lambda M, a: M.distributions.Dirichlet(a.exp() + 1.0)], ids=["one_hot", "dirichlet"])
def test_the_mode_of_one_unbatched_distribution_is_torchs(make):
    """A 1-D parameter: no batch dims, so the mode's argmax is 0-d (one_hot of a 0-d index, as torch's)."""
    a = np.array([0.3, 1.2, -0.4])
    want = make(torch, torch.from_numpy(a)).mode.numpy()
    got = run_both(gc.capture(lambda a: make(gc, a).mode, a=a), {"a": a})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_one_unbatched_one_hot_categorical_samples_a_one_hot_vector():
    model = gc.capture(lambda a: gc.distributions.OneHotCategorical(logits=a).sample(), a=np.zeros(3))
    for backend in ("numpy", "ort-cpu"):
        drawn = gc.Session(model, backend=backend).run({"a": np.zeros(3)})["output"]
        assert drawn.shape == (3,) and set(np.unique(drawn)) <= {0.0, 1.0} and drawn.sum() == 1, backend
