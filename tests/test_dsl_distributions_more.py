"""gc.distributions' further families (Gamma, Chi2, Beta, Dirichlet, StudentT, VonMises, Poisson, Binomial,
Geometric, NegativeBinomial, HalfNormal, HalfCauchy, Pareto, RelaxedBernoulli, RelaxedOneHotCategorical,
MultivariateNormal), ``expand``, ``enumerate_support``, ``perplexity``, ``register_kl`` and the KL pairs,
against torch.distributions: values on numpy and ort-cpu with gradients against torch.autograd, float64
central differences, rsample's gradient with its noise held fixed, samples' moments, frequencies and a
Kolmogorov-Smirnov check, shapes, a symbolic batch dim, and the errors (sampling refused where it needs
rejection)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc

try:
    from torch_grad_util import (TorchNS, assert_grads_match_central_differences, assert_matches_torch, gc_grads,
                                 run_both)
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import (TorchNS, assert_grads_match_central_differences, assert_matches_torch, gc_grads,
                                       run_both)

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


def D(M):
    """torch.distributions for torch's namespace, gc.distributions for the DSL's."""
    return M.torch.distributions if isinstance(M, TorchNS) else gc.distributions


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
    ("mvn_cov", lambda d, m, c: d.MultivariateNormal(m, covariance_matrix=c), [LOC, COV], VEC,
     "log_prob entropy mean variance covariance_matrix scale_tril precision_matrix", ""),
    ("mvn_precision", lambda d, m, c: d.MultivariateNormal(m, precision_matrix=c), [LOC, COV], VEC,
     "log_prob entropy variance covariance_matrix precision_matrix", ""),
    ("mvn_tril", lambda d, m, c: d.MultivariateNormal(m, scale_tril=c), [LOC[0], TRIL], VEC,
     "log_prob entropy mode variance covariance_matrix scale_tril", ""),
]


def _method(make, method):
    def fn(M, *args):
        *params, value = args
        dist = make(D(M), *params)
        if method in ("log_prob", "cdf"):
            return getattr(dist, method)(value)
        if method == "icdf":
            return dist.icdf(M.sigmoid(value))
        if method == "entropy":
            return dist.entropy()
        return getattr(dist, method)
    return fn


CASES = [pytest.param(make, method, params, value, method in grads.split(), id=f"{name}-{method}")
         for name, make, params, value, grads, nograds in FAMILIES for method in grads.split() + nograds.split()]


@pytest.mark.parametrize("make, method, params, value, differentiable", CASES)
def test_values_and_gradients_match_torch(make, method, params, value, differentiable):
    """Values (numpy and ort-cpu, the full checker) and the gradients to every parameter (and, for a
    continuous family's log_prob/cdf/icdf, the value)."""
    fn = _method(make, method)
    value = value if method != "icdf" else X
    continuous = not np.array_equal(value, np.floor(value))
    if differentiable and continuous and method in ("log_prob", "cdf", "icdf"):
        assert_matches_torch(fn, [*params, value], {}, R)
    elif differentiable:
        assert_matches_torch(lambda M, *a, v: fn(M, *a, v), list(params), {"v": value}, R)
    else:
        names = [f"a{i}" for i in range(len(params))]
        assert_matches_torch(lambda M, v, **kw: fn(M, *(kw[n] for n in names), v), [],
                             {"v": value, **dict(zip(names, params))}, R)


@pytest.mark.parametrize("make, value", [
    pytest.param(lambda d, a, b: d.Gamma(a, b), X, id="gamma"),
    pytest.param(lambda d, a, b: d.Beta(a, b), U, id="beta"),
    pytest.param(lambda d, a, b: d.StudentT(a, 0.5, b), X, id="studentt"),
    pytest.param(lambda d, a, b: d.Pareto(a, b), A + X, id="pareto"),
])
def test_float32_parameters_match_torch(make, value):
    """float32 parameters (a Python number takes their dtype, as torch's ``broadcast_all``)."""
    fn = _method(make, "log_prob")
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
