"""gc.distributions' Weibull, Kumaraswamy, InverseGamma, FisherSnedecor, GeneralizedPareto and LogisticNormal against
torch.distributions 2.13 (float64): values on numpy and ort-cpu with gradients to every parameter (and a continuous
value) against torch.autograd, central differences, rsample's gradient with the noise held fixed, samples' moments and
a Kolmogorov-Smirnov check, shapes, expand and the errors naming the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc

try:
    from distribution_util import D, assert_method_matches_torch, assert_shapes_match_torch
    from torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, gc_grads
except ImportError:  # tests/ collected as a package
    from tests.distribution_util import D, assert_method_matches_torch, assert_shapes_match_torch
    from tests.torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, gc_grads

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(11)
A = np.array([[0.4, 1.3, 2.5], [0.8, 3.1, 0.6]])
B = np.array([[1.2, 0.5, 2.0], [0.9, 1.7, 4.0]])
X = np.array([[0.2, 0.7, 1.9], [0.05, 2.4, 0.6]])
U = np.array([[0.15, 0.5, 0.8], [0.3, 0.65, 0.95]])
LOC = np.array([[0.3, -1.2, 2.0], [0.0, 0.7, -0.4]])
CONC = np.array([[0.3, -0.2, 0.0], [1e-9, 0.6, -0.45]])  # 0 and 1e-9: the exponential limit
SIMPLEX4 = np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.05, 0.6, 0.1]])

_gpd = (lambda d, m, s, c: d.GeneralizedPareto(m, s, c))
# (id, make(Dist, *params), params, the value for log_prob/cdf, methods with gradients, methods without)
FAMILIES = [
    ("weibull", lambda d, a, b: d.Weibull(a, b), [A, B * 2.0], X, "log_prob entropy cdf icdf mean mode variance", ""),
    ("weibull_below_1", lambda d, a, b: d.Weibull(a, b), [A, B * 0.5], X, "log_prob entropy mean variance", "mode"),
    ("kumaraswamy", lambda d, a, b: d.Kumaraswamy(a, b), [A, B], U, "log_prob entropy cdf icdf mean variance", ""),
    ("inverse_gamma", lambda d, a, b: d.InverseGamma(a, b), [A * 2.0, B], X, "log_prob entropy mean mode variance",
     ""),
    ("inverse_gamma_heavy", lambda d, a, b: d.InverseGamma(a, b), [A, B], X, "mean variance", ""),
    ("fisher_snedecor", lambda d, a, b: d.FisherSnedecor(a, b), [A * 3.0, B * 4.0 + 4.0], X,
     "log_prob mean mode variance", ""),
    # variance nan where df2 <= 4: its gradient to df1 is 0 there (torch's nan)
    ("fisher_snedecor_nan", lambda d, a, b: d.FisherSnedecor(a, b), [A, B * 2.0], X, "log_prob mean mode", "variance"),
    ("generalized_pareto", _gpd, [LOC, B, CONC], LOC + X, "log_prob entropy cdf icdf mean mode variance", ""),
    ("logistic_normal", lambda d, m, s: d.LogisticNormal(m, s), [LOC, B], SIMPLEX4, "log_prob", ""),
]
CASES = [pytest.param(make, method, params, value, method in grads.split(), id=f"{name}-{method}")
         for name, make, params, value, grads, nograds in FAMILIES for method in grads.split() + nograds.split()]


@pytest.fixture(autouse=True)
def _torch_float64():
    """torch 2.13's GeneralizedPareto compares its concentration with ``torch.tensor(0.0)``, which fails for float64
    parameters unless float64 is torch's default dtype."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@pytest.mark.parametrize("make, method, params, value, differentiable", CASES)
def test_values_and_gradients_match_torch(make, method, params, value, differentiable):
    """Values (numpy and ort-cpu, the full checker) and the gradients to every parameter (and the value)."""
    assert_method_matches_torch(make, method, params, value if method != "icdf" else X, differentiable, RNG)


def test_generalized_pareto_log_survival_and_log_cdf_match_torch():
    for method in ("log_survival_function", "log_cdf"):
        assert_matches_torch(lambda M, m, s, c, v: getattr(_gpd(D(M), m, s, c), method)(v), [LOC, B, CONC, LOC + X],
                             {}, RNG)


@pytest.mark.parametrize("a, b", [(2.0, 3.0), (1.5, 1.8), (4.0, 1.3)])
def test_kumaraswamy_mode_is_the_density_peak(a, b):
    """The argmax of the density on a fine grid (torch 2.13's mode is nan for every parameter: its formula
    takes log1p of ``-b`` and ``-a b``)."""
    grid = np.linspace(1e-4, 1 - 1e-4, 200001)
    feeds = {"a": np.array(a), "b": np.array(b), "v": grid}
    model = gc.capture(lambda a, b, v: {"lp": gc.distributions.Kumaraswamy(a, b).log_prob(v),
                                        "mode": gc.distributions.Kumaraswamy(a, b).mode}, **feeds)
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run(feeds)
        np.testing.assert_allclose(out["mode"], grid[np.argmax(out["lp"])], atol=2e-5, err_msg=backend)
    below = gc.capture(lambda a, b: gc.distributions.Kumaraswamy(a, b).mode, a=np.array([0.5, 2.0]),
                       b=np.array([2.0, 0.7]))
    assert np.all(np.isnan(gc.Session(below, backend="numpy").run({"a": np.array([0.5, 2.0]),
                                                                   "b": np.array([2.0, 0.7])})["output"]))


@pytest.mark.parametrize("fn", [
    pytest.param(lambda M, x: gc.distributions.Weibull(gc.exp(x), gc.exp(-x) + 1.0).log_prob(gc.exp(x * 0.3)),
                 id="weibull_log_prob"),
    pytest.param(lambda M, x: gc.distributions.Kumaraswamy(gc.exp(x), 1.5).log_prob(gc.sigmoid(x)),
                 id="kumaraswamy_log_prob"),
    pytest.param(lambda M, x: gc.distributions.Kumaraswamy(gc.exp(x), gc.exp(-x)).entropy(), id="kumaraswamy_entropy"),
    pytest.param(lambda M, x: gc.distributions.InverseGamma(gc.exp(x) + 2.0, gc.exp(-x)).variance,
                 id="inverse_gamma_variance"),
    pytest.param(lambda M, x: gc.distributions.FisherSnedecor(gc.exp(x) + 1.0, gc.exp(-x) + 5.0).log_prob(1.3),
                 id="fisher_snedecor_log_prob"),
    pytest.param(lambda M, x: gc.distributions.GeneralizedPareto(x, gc.exp(x), x * 0.2).log_prob(x + 0.7),
                 id="generalized_pareto_log_prob"),
    pytest.param(lambda M, x: gc.distributions.LogisticNormal(x, gc.exp(x)).log_prob(
        np.array([0.1, 0.2, 0.3, 0.4])), id="logistic_normal_log_prob"),
])
def test_gradients_match_central_differences(fn):
    assert_grads_match_central_differences(fn, RNG.standard_normal((4, 3)) * 0.5)


# (id, make(Dist, *params), params, torch's rsample as a function of the params and the noise, the noise from
# graphc's sample and params)
RSAMPLE = [
    ("weibull", lambda d, a, b: d.Weibull(a, b), [A, B], lambda a, b, e: a * e ** (1 / b),
     lambda s, a, b: (s / a) ** b),
    ("kumaraswamy", lambda d, a, b: d.Kumaraswamy(a, b), [A, B], lambda a, b, e: (1 - e ** (1 / b)) ** (1 / a),
     lambda s, a, b: (1 - s ** a) ** b),
    ("generalized_pareto", _gpd, [LOC, B, CONC],
     lambda m, s, c, e: torch.distributions.GeneralizedPareto(m, s, c).icdf(e),
     lambda x, m, s, c: torch.distributions.GeneralizedPareto(*map(torch.tensor, (m, s, c))).cdf(
         torch.tensor(x)).numpy()),
    ("logistic_normal", lambda d, m, s: d.LogisticNormal(m, s), [LOC, B],
     lambda m, s, e: torch.distributions.transforms.StickBreakingTransform()(m + s * e),
     lambda x, m, s: (torch.distributions.transforms.StickBreakingTransform().inv(torch.tensor(x)).numpy() - m) / s),
]


@pytest.mark.parametrize("make, params, torch_form, noise", [pytest.param(*c[1:], id=c[0]) for c in RSAMPLE])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_rsample_gradient_matches_torch_with_the_noise_fixed(make, params, torch_form, noise, backend):
    """The gradient of ``sum(rsample((5,)) * c)`` to the parameters: torch's reparameterised form fed the noise
    graphc drew (read back from the sample)."""
    names = [f"a{i}" for i in range(len(params))]
    c_shape = (5, *np.broadcast_shapes(*(np.shape(p) for p in params)))
    if make(torch.distributions, *map(torch.tensor, params)).event_shape:
        c_shape = c_shape[:-1] + (c_shape[-1] + 1,)
    c = RNG.standard_normal(c_shape)
    got = gc_grads(lambda M, *a: make(gc.distributions, *a).rsample((5,)), dict(zip(names, params)), {}, c,
                   backend=backend)
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    eps = torch.tensor(noise(got["out"], *params))
    (torch_form(*ts, eps) * torch.tensor(c)).sum().backward()
    for n, t in zip(names, ts):
        np.testing.assert_allclose(got[n], t.grad.numpy(), rtol=1e-6, atol=1e-8, err_msg=n)


NS = 20000
KS_BOUND = 1.95 / math.sqrt(NS)  # the Kolmogorov-Smirnov distance's 0.1% critical value


def _draws(make, method):
    model = gc.capture(lambda unused: getattr(make(gc.distributions), method)((NS,)), unused=np.zeros(1))
    return gc.Session(model, backend="numpy").run({"unused": np.zeros(1)})["output"].astype(np.float64)


def _ks(x, cdf):
    x = np.sort(x)
    c = cdf(x)
    return max(np.max(np.arange(1, len(x) + 1) / len(x) - c), np.max(c - np.arange(len(x)) / len(x)))


@pytest.mark.parametrize("make", [
    pytest.param(lambda d: d.Weibull(1.5, 2.0), id="weibull"),
    pytest.param(lambda d: d.Kumaraswamy(2.0, 3.0), id="kumaraswamy"),
    pytest.param(lambda d: d.InverseGamma(6.0, 2.0), id="inverse_gamma"),
    pytest.param(lambda d: d.FisherSnedecor(5.0, 12.0), id="fisher_snedecor"),
    pytest.param(lambda d: d.GeneralizedPareto(0.5, 1.5, 0.2), id="generalized_pareto"),
    pytest.param(lambda d: d.GeneralizedPareto(0.5, 1.5, -0.3), id="generalized_pareto_bounded"),
])
@pytest.mark.parametrize("method", ["sample", "rsample"])
def test_samples_match_moments_and_pass_ks(make, method):
    """Mean and variance within 5 standard errors of torch's, and the KS distance to torch's cdf (FisherSnedecor,
    which has none: the two-sample distance to as many of torch's draws)."""
    x = _draws(make, method)
    ref = make(torch.distributions)
    mean, var = float(ref.mean), float(ref.variance)
    m4 = np.mean((x - x.mean()) ** 4)
    assert x.shape == (NS,)
    assert abs(x.mean() - mean) < 5 * math.sqrt(var / NS)
    assert abs(x.var() - var) < 5 * math.sqrt((m4 - x.var() ** 2) / NS)
    if isinstance(ref, torch.distributions.FisherSnedecor):
        torch.manual_seed(0)
        theirs = np.sort(ref.sample((NS,)).numpy())
        assert _ks(x, lambda v: np.searchsorted(theirs, v, side="right") / NS) < KS_BOUND * math.sqrt(2)
    else:
        assert _ks(x, lambda v: ref.cdf(torch.tensor(v)).numpy()) < KS_BOUND


def test_logistic_normal_samples_are_stick_broken_normals():
    """Each draw on the simplex, and the inverse stick breaking of the draws: Normal(loc, scale) coordinates."""
    loc, scale = np.array([0.3, -0.5, 1.0]), np.array([0.5, 1.2, 0.8])
    for method in ("sample", "rsample"):
        s = _draws(lambda d: d.LogisticNormal(loc, scale), method)
        assert s.shape == (NS, 4) and np.all(s > 0) and np.allclose(s.sum(-1), 1, atol=1e-5)
        z = torch.distributions.transforms.StickBreakingTransform().inv(torch.tensor(s)).numpy()
        assert np.all(np.abs(z.mean(0) - loc) < 5 * scale / math.sqrt(NS))
        for k in range(3):
            assert _ks(z[:, k], lambda v: torch.distributions.Normal(loc[k], scale[k]).cdf(torch.tensor(v)).numpy()) \
                < KS_BOUND


SHAPED = [
    ("weibull", lambda d: d.Weibull(np.ones((2, 3)), 2.0)),
    ("kumaraswamy", lambda d: d.Kumaraswamy(np.ones(3), np.full((2, 1), 2.0))),
    ("inverse_gamma", lambda d: d.InverseGamma(np.full(3, 3.0), 1.0)),
    ("fisher_snedecor", lambda d: d.FisherSnedecor(np.full((2, 1), 3.0), np.full(3, 5.0))),
    ("generalized_pareto", lambda d: d.GeneralizedPareto(0.0, np.ones(3), 0.1)),
    ("logistic_normal", lambda d: d.LogisticNormal(np.zeros((2, 3)), 1.0)),
    ("logistic_normal_scalar", lambda d: d.LogisticNormal(0.0, 1.0)),
]


def _torch_float32(make):
    class Wrap:
        def __getattr__(self, name):
            cls = getattr(torch.distributions, name)

            def cast(v):
                return torch.tensor(v, dtype=torch.float32) if isinstance(v, (np.ndarray, float)) else v
            return lambda *a, **k: cls(*map(cast, a), **{n: cast(v) for n, v in k.items()})
    return make(Wrap())


@pytest.mark.parametrize("make", [pytest.param(c[1], id=c[0]) for c in SHAPED])
@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 3)])
def test_shapes_match_torch(make, sample_shape):
    torch.set_default_dtype(torch.float32)
    assert_shapes_match_torch(make, _torch_float32(make), sample_shape)


@pytest.mark.parametrize("make, params, value", [
    pytest.param(lambda d, a, b: d.Weibull(a, b), [A[0], B[0]], X, id="weibull"),
    pytest.param(lambda d, a, b: d.Kumaraswamy(a, b), [A[0], B[0]], U, id="kumaraswamy"),
    pytest.param(lambda d, a, b: d.InverseGamma(a, b), [A[0] + 2.0, B[0]], X, id="inverse_gamma"),
    pytest.param(lambda d, a, b: d.FisherSnedecor(a, b), [A[0], B[0] + 2.0], X, id="fisher_snedecor"),
    pytest.param(lambda d, m, s: d.GeneralizedPareto(m, s, 0.2), [LOC[0], B[0]], LOC[0] + X, id="generalized_pareto"),
])
def test_expand_matches_torch(make, params, value):
    def fn(M, *a, v):
        d = make(D(M), *a).expand((2, 3))
        assert tuple(d.batch_shape) == (2, 3)
        return d.log_prob(v) + d.mean
    assert_matches_torch(fn, list(params), {"v": value}, RNG)


def test_logistic_normal_expand_matches_torch():
    assert_matches_torch(lambda M, m, s, v: D(M).LogisticNormal(m, s).expand((2,)).log_prob(v), [LOC[0], B[0],
                                                                                                  SIMPLEX4], {}, RNG)


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc.distributions.Weibull(x, -1.0), r"Weibull.*concentration must satisfy constraints.positive"),
    (lambda x: gc.distributions.Weibull(0.0, x), r"Weibull.*scale must satisfy constraints.positive"),
    (lambda x: gc.distributions.Weibull(1.0, 2.0).log_prob(-0.5), r"value must satisfy constraints.positive"),
    (lambda x: gc.distributions.Kumaraswamy(x, 0.0), r"Kumaraswamy.*concentration0 must satisfy constraints.pos"),
    (lambda x: gc.distributions.Kumaraswamy(1.0, 2.0).log_prob(1.5), r"value must satisfy constraints.unit_interval"),
    (lambda x: gc.distributions.InverseGamma(-1.0, x), r"concentration must satisfy constraints.positive"),
    (lambda x: gc.distributions.FisherSnedecor(x, -2.0), r"FisherSnedecor.*df2 must satisfy constraints.positive"),
    (lambda x: gc.distributions.FisherSnedecor(2.0, 3.0).entropy(), r"FisherSnedecor.*has no closed-form entropy"),
    (lambda x: gc.distributions.GeneralizedPareto(x, -1.0, 0.1), r"GeneralizedPareto.*scale must satisfy const"),
    (lambda x: gc.distributions.GeneralizedPareto(0.0, 1.0, -0.5).log_prob(2.5), r"value must satisfy constraints.int"),
    (lambda x: gc.distributions.GeneralizedPareto(1.0, 1.0, 0.5).log_prob(0.5), r"value must satisfy constraints.int"),
    (lambda x: gc.distributions.LogisticNormal(x, 0.0), r"Normal.*scale must satisfy constraints.positive"),
    (lambda x: gc.distributions.LogisticNormal(x, 1.0).log_prob(np.full(4, 0.3)), r"value must satisfy"),
    (lambda x: gc.distributions.LogisticNormal(x, 1.0).mean, r"has no mean"),
])
def test_bad_arguments_raise_with_the_user_line(fn, match):
    """torch refuses each of these too (ValueError or NotImplementedError); the message names the argument and
    this file's line."""
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.ones((2, 3)))
    assert "test_dsl_distributions_power.py:" in str(info.value)
