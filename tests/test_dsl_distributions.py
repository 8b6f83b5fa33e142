"""gc.distributions against torch.distributions: log_prob, entropy, cdf, icdf, mean/mode/variance/stddev
and kl_divergence values on the numpy and ort-cpu backends with their gradients against torch.autograd,
float64 central differences, rsample's gradient with its noise held fixed, samples' moments and a
Kolmogorov-Smirnov check, shapes (sample x batch x event), a symbolic batch dim, and the errors."""

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
R = np.random.default_rng(5)
LOC = np.array([[0.3, -1.2, 2.0], [0.0, 0.7, -0.4]])
SCALE = np.array([[0.5, 1.5, 2.0], [0.9, 0.3, 1.1]])
X = np.array([[0.1, 0.2, 3.0], [1.0, 2.0, -1.0]])
POS = np.abs(X) + 0.25
P = np.array([[0.1, 0.35, 0.5], [0.65, 0.8, 0.97]])
LOGITS = R.standard_normal((2, 4))
PROBS = np.abs(R.standard_normal((2, 4))) + 0.1
IDX = np.array([[3, 0], [1, 2]], np.int64)


# (id, make(Dist, *params), params, the value for log_prob/cdf, methods with gradients, methods without)
FAMILIES = [
    ("normal", lambda d, a, b: d.Normal(a, b), [LOC, SCALE], X,
     "log_prob entropy cdf icdf mean mode variance stddev", ""),
    ("lognormal", lambda d, a, b: d.LogNormal(a, b), [LOC, SCALE], POS,
     "log_prob entropy cdf icdf mean mode variance stddev", ""),
    ("laplace", lambda d, a, b: d.Laplace(a, b), [LOC, SCALE], X, "log_prob entropy cdf icdf mean mode variance stddev",
     ""),
    ("cauchy", lambda d, a, b: d.Cauchy(a, b), [LOC, SCALE], X, "log_prob entropy cdf icdf mode",
     "mean variance stddev"),
    ("exponential", lambda d, a: d.Exponential(a), [SCALE], POS, "log_prob entropy cdf icdf mean variance stddev",
     "mode"),
    ("uniform", lambda d, a, b: d.Uniform(a, a + b), [LOC, SCALE], LOC + 0.4 * SCALE,
     "log_prob entropy cdf icdf mean variance stddev", "mode"),
    ("gumbel", lambda d, a, b: d.Gumbel(a, b), [LOC, SCALE], X, "log_prob entropy cdf icdf mean mode variance stddev",
     ""),
    ("bernoulli_probs", lambda d, p: d.Bernoulli(probs=p), [P], (X > 0.5).astype(float),
     "log_prob entropy mean variance stddev", "mode"),
    ("bernoulli_logits", lambda d, a: d.Bernoulli(logits=a), [LOC], (X > 0.5).astype(float),
     "log_prob entropy mean variance stddev", "mode"),
    ("categorical_probs", lambda d, p: d.Categorical(probs=p), [PROBS], IDX, "log_prob entropy", "mode mean variance"),
    ("categorical_logits", lambda d, a: d.Categorical(logits=a), [LOGITS], IDX, "log_prob entropy",
     "mode mean variance"),
    ("onehot_logits", lambda d, a: d.OneHotCategorical(logits=a), [LOGITS], np.eye(4)[[1, 3]],
     "log_prob entropy mean variance stddev", "mode"),
    ("independent_normal", lambda d, a, b: d.Independent(d.Normal(a, b), 1), [LOC, SCALE], X,
     "log_prob entropy mean mode variance stddev", ""),
    ("independent_bernoulli_2", lambda d, a: d.Independent(d.Bernoulli(logits=a), 2), [LOC], (X > 0.5).astype(float),
     "log_prob entropy mean", ""),
]


CASES = [pytest.param(make, method, params, value, method in grads.split(), id=f"{name}-{method}")
         for name, make, params, value, grads, nograds in FAMILIES for method in grads.split() + nograds.split()]


@pytest.mark.parametrize("make, method, params, value, differentiable", CASES)
def test_values_and_gradients_match_torch(make, method, params, value, differentiable):
    """Values (numpy and ort-cpu, the full checker) and the gradients to every parameter and the value."""
    assert_method_matches_torch(make, method, params, value if method != "icdf" else X, differentiable, R)


def test_float32_and_python_number_parameters_match_torch():
    """A Python number takes the Tensor's dtype (float32 here), as torch's ``broadcast_all``."""
    x = X.astype(np.float32)
    fn = method_of(lambda d, s: d.Normal(0.5, s), "log_prob")
    assert_matches_torch(fn, [SCALE.astype(np.float32), x], {}, R)
    assert_matches_torch(method_of(lambda d, s: d.Laplace(s, 2.0), "cdf"), [SCALE.astype(np.float32), x], {}, R)


# (id, make(Dist, *params), params of p, params of q)
KL_CASES = [
    ("normal", lambda d, a, b: d.Normal(a, b), [LOC, SCALE], [X, POS]),
    ("lognormal", lambda d, a, b: d.LogNormal(a, b), [LOC, SCALE], [X, POS]),
    ("laplace", lambda d, a, b: d.Laplace(a, b), [LOC, SCALE], [X, POS]),
    ("cauchy", lambda d, a, b: d.Cauchy(a, b), [LOC, SCALE], [X, POS]),
    ("gumbel", lambda d, a, b: d.Gumbel(a, b), [LOC, SCALE], [X, POS]),
    ("exponential", lambda d, a: d.Exponential(a), [SCALE], [POS]),
    ("uniform_inside", lambda d, a, b: d.Uniform(a, a + b), [LOC, SCALE], [LOC - 0.5, SCALE + 1.0]),
    ("bernoulli_probs", lambda d, p: d.Bernoulli(probs=p), [P], [P[::-1].copy()]),
    ("bernoulli_logits", lambda d, a: d.Bernoulli(logits=a), [LOC], [X]),
    ("categorical", lambda d, a: d.Categorical(logits=a), [LOGITS], [LOGITS[::-1] * 2.0]),
    ("categorical_probs", lambda d, p: d.Categorical(probs=p), [PROBS], [PROBS[::-1].copy()]),
    ("onehot", lambda d, a: d.OneHotCategorical(logits=a), [LOGITS], [-LOGITS]),
    ("independent", lambda d, a, b: d.Independent(d.Normal(a, b), 2), [LOC, SCALE], [X, POS]),
]


@pytest.mark.parametrize("make, p, q", [pytest.param(*c[1:], id=c[0]) for c in KL_CASES])
def test_kl_divergence_matches_torch(make, p, q):
    n = len(p)
    assert_matches_torch(lambda M, *a: D(M).kl_divergence(make(D(M), *a[:n]), make(D(M), *a[n:])), [*p, *q], {}, R)


@pytest.mark.parametrize("make, p, q", [
    pytest.param(lambda d, a, b: d.Uniform(a, b), [np.array([0.0, 0.0, -1.0]), np.array([1.0, 2.0, 1.0])],
                 [np.array([-1.0, 0.5, -1.0]), np.array([2.0, 3.0, 0.5])], id="uniform_outside"),
    pytest.param(lambda d, p: d.Bernoulli(probs=p), [np.array([0.0, 1.0, 0.3, 0.3, 1.0])],
                 [np.array([0.5, 0.5, 0.0, 1.0, 1.0])], id="bernoulli_edges"),
    pytest.param(lambda d, p: d.Categorical(probs=p), [np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])],
                 [np.array([[0.5, 0.0, 0.5], [0.1, 0.1, 0.8]])], id="categorical_zeros"),
])
def test_kl_divergence_inf_and_zero_edges_match_torch(make, p, q):
    """inf where q has no mass on part of p's support, 0 terms where p has none, as torch's."""
    n = len(p)
    names = [f"a{i}" for i in range(n + len(q))]
    assert_matches_torch(lambda M, **kw: D(M).kl_divergence(make(D(M), *(kw[k] for k in names[:n])),
                                                              make(D(M), *(kw[k] for k in names[n:]))),
                         [], dict(zip(names, [*p, *q])), R)


@pytest.mark.parametrize("fn", [
    pytest.param(lambda M, x: gc.distributions.Cauchy(x * 0.0 + 0.3, 1.7).cdf(x * 4.0), id="cauchy_cdf_atan64"),
    pytest.param(lambda M, x: gc.distributions.Normal(x, 1.3).cdf(0.4)
                 + gc.distributions.Normal(x * 0.0 + 0.2, 0.7).icdf(gc.sigmoid(x)), id="normal_cdf_icdf"),
    pytest.param(lambda M, x: gc.distributions.kl_divergence(gc.distributions.Gumbel(x, gc.exp(x)),
                                                             gc.distributions.Gumbel(x * 0.0 + 0.5, 1.5)),
                 id="gumbel_kl"),
    pytest.param(lambda M, x: gc.distributions.Categorical(logits=x).entropy(), id="categorical_entropy"),
])
def test_gradients_match_central_differences(fn):
    assert_grads_match_central_differences(fn, R.standard_normal((3, 4)))


# (id, make(Dist, *params), params, torch's rsample as a function of the params and the standardized noise,
# the noise from graphc's sample and params)
RSAMPLE = [
    ("normal", lambda d, a, b: d.Normal(a, b), [LOC, SCALE], lambda a, b, e: a + b * e, lambda s, a, b: (s - a) / b),
    ("laplace", lambda d, a, b: d.Laplace(a, b), [LOC, SCALE], lambda a, b, e: a + b * e, lambda s, a, b: (s - a) / b),
    ("cauchy", lambda d, a, b: d.Cauchy(a, b), [LOC, SCALE], lambda a, b, e: a + b * e, lambda s, a, b: (s - a) / b),
    ("gumbel", lambda d, a, b: d.Gumbel(a, b), [LOC, SCALE], lambda a, b, e: a + b * e, lambda s, a, b: (s - a) / b),
    ("lognormal", lambda d, a, b: d.LogNormal(a, b), [LOC, SCALE], lambda a, b, e: (a + b * e).exp(),
     lambda s, a, b: (np.log(s) - a) / b),
    ("exponential", lambda d, a: d.Exponential(a), [SCALE], lambda a, e: e / a, lambda s, a: s * a),
    ("uniform", lambda d, a, b: d.Uniform(a, a + b), [LOC, SCALE], lambda a, b, e: a + e * b,
     lambda s, a, b: (s - a) / b),
    ("independent", lambda d, a, b: d.Independent(d.Normal(a, b), 1), [LOC, SCALE], lambda a, b, e: a + b * e,
     lambda s, a, b: (s - a) / b),
]


@pytest.mark.parametrize("make, params, torch_form, noise", [pytest.param(*c[1:], id=c[0]) for c in RSAMPLE])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_rsample_gradient_matches_torch_with_the_noise_fixed(make, params, torch_form, noise, backend):
    """The gradient of ``sum(rsample((5,)) * c)`` to the parameters: torch's reparameterised form fed the
    noise graphc drew (read back from the sample)."""
    names = [f"a{i}" for i in range(len(params))]
    c = R.standard_normal((5, *LOC.shape))
    got = gc_grads(lambda M, *a: make(gc.distributions, *a).rsample((5,)), dict(zip(names, params)), {}, c,
                   backend=backend)
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    eps = torch.tensor(noise(got["out"], *params))
    (torch_form(*ts, eps) * torch.tensor(c)).sum().backward()
    for n, t in zip(names, ts):
        np.testing.assert_allclose(got[n], t.grad.numpy(), rtol=1e-6, atol=1e-8, err_msg=n)


N = 20000
# (id, graphc distribution, torch's), one batch element each so the draws are i.i.d.
SAMPLED = [
    ("normal", lambda d: d.Normal(0.7, 1.9), True),
    ("lognormal", lambda d: d.LogNormal(0.2, 0.5), True),
    ("laplace", lambda d: d.Laplace(-1.0, 0.8), True),
    ("cauchy", lambda d: d.Cauchy(0.5, 2.0), False),
    ("exponential", lambda d: d.Exponential(2.5), True),
    ("uniform", lambda d: d.Uniform(-2.0, 3.0), True),
    ("gumbel", lambda d: d.Gumbel(1.0, 2.0), True),
]


@pytest.mark.parametrize("make, has_moments", [pytest.param(*c[1:], id=c[0]) for c in SAMPLED])
def test_samples_match_moments_and_pass_ks(make, has_moments):
    """Mean and variance within 5 standard errors of torch's, and the Kolmogorov-Smirnov distance to
    torch's cdf below its 0.1% critical value (1.95 / sqrt(n)); for rsample and sample."""
    model = gc.capture(lambda unused: {"r": make(gc.distributions).rsample((N,)),
                                       "s": make(gc.distributions).sample((N,))}, unused=np.zeros(1))
    out = gc.Session(model, backend="numpy").run({"unused": np.zeros(1)})
    ref = make(torch.distributions)
    for draws in out.values():
        assert draws.shape == (N,) and draws.dtype == np.float32
        x = np.sort(draws.astype(np.float64))
        if has_moments:
            mean, var = float(ref.mean), float(ref.variance)
            m4 = np.mean((x - x.mean()) ** 4)
            assert abs(x.mean() - mean) < 5 * math.sqrt(var / N)
            assert abs(x.var() - var) < 5 * math.sqrt((m4 - x.var() ** 2) / N)
        cdf = ref.cdf(torch.tensor(x)).numpy()
        ks = max(np.max(np.arange(1, N + 1) / N - cdf), np.max(cdf - np.arange(N) / N))
        assert ks < 1.95 / math.sqrt(N)


def test_discrete_samples_match_frequencies():
    """Bernoulli's and Categorical's frequencies, and OneHotCategorical's mean, within 5 standard errors."""
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    model = gc.capture(lambda unused: {"b": gc.distributions.Bernoulli(probs=probs).sample((N,)),
                                "c": gc.distributions.Categorical(probs=probs * 3).sample((N,)),
                                "o": gc.distributions.OneHotCategorical(logits=np.log(probs)).sample((N,))},
                       unused=np.zeros(1))
    out = gc.Session(model, backend="numpy").run({"unused": np.zeros(1)})
    assert out["c"].dtype == np.int64 and out["o"].shape == (N, 4) and set(np.unique(out["b"])) <= {0.0, 1.0}
    bound = 5 * np.sqrt(probs * (1 - probs) / N)
    assert np.all(np.abs(out["b"].mean(0) - probs) < bound)
    assert np.all(np.abs(np.bincount(out["c"], minlength=4) / N - probs) < bound)
    assert np.all(np.abs(out["o"].mean(0) - probs) < bound)
    assert np.all(out["o"].sum(-1) == 1)


SHAPED = [
    ("normal", lambda d: d.Normal(np.zeros((2, 3)), 1.0)),
    ("exponential", lambda d: d.Exponential(np.ones(4))),
    ("uniform", lambda d: d.Uniform(np.zeros(3), np.ones((2, 1)))),
    ("bernoulli", lambda d: d.Bernoulli(logits=np.zeros((3, 1)))),
    ("categorical", lambda d: d.Categorical(logits=np.zeros((2, 5)))),
    ("onehot", lambda d: d.OneHotCategorical(probs=np.ones((3, 5)))),
    ("independent", lambda d: d.Independent(d.Laplace(np.zeros((2, 3, 4)), 1.0), 2)),
    ("gumbel_scalar", lambda d: d.Gumbel(0.0, 1.0)),
]


def _torch_params(make):
    """``make`` on torch.distributions with numpy arrays as float32 tensors."""
    class Wrap:
        def __getattr__(self, name):
            cls = getattr(torch.distributions, name)
            def cast(v):  # graphc's constant arrays are float32, as its Python floats
                return torch.tensor(v, dtype=torch.float32) if isinstance(v, np.ndarray) else v
            return lambda *a, **k: cls(*map(cast, a), **{n: cast(v) for n, v in k.items()})
    return make(Wrap())


@pytest.mark.parametrize("make", [pytest.param(c[1], id=c[0]) for c in SHAPED])
@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 3)])
def test_shapes_match_torch(make, sample_shape):
    assert_shapes_match_torch(make, _torch_params(make), sample_shape)


def test_symbolic_batch_dim():
    """A batch dim named at capture: log_prob, entropy, kl and sample shapes follow the fed batch."""
    def f(loc, scale, x):
        p, q = gc.distributions.Normal(loc, scale), gc.distributions.Normal(gc.zeros_like(loc), 1.0)
        return {"lp": gc.distributions.Independent(p, 1).log_prob(x), "kl": gc.distributions.kl_divergence(p, q),
                "s": p.rsample((2,)), "c": gc.distributions.Categorical(logits=loc).sample((3,))}

    spec = gc.spec("float64", ("N", 3))
    model = gc.capture(f, loc=spec, scale=spec, x=spec)
    for n in (1, 4):
        feeds = {"loc": R.standard_normal((n, 3)), "scale": R.random((n, 3)) + 0.5, "x": R.standard_normal((n, 3))}
        tp = torch.distributions.Normal(torch.tensor(feeds["loc"]), torch.tensor(feeds["scale"]))
        want = {"lp": tp.log_prob(torch.tensor(feeds["x"])).sum(-1).numpy(),
                "kl": torch.distributions.kl_divergence(tp, torch.distributions.Normal(0.0, 1.0)).numpy()}
        for backend in ("numpy", "ort-cpu"):
            out = gc.Session(model, backend=backend).run(feeds)
            for k, v in want.items():
                np.testing.assert_allclose(out[k], v, rtol=1e-12, err_msg=f"{backend} {k}")
            assert out["s"].shape == (2, n, 3) and out["c"].shape == (3, n)


def test_opset_17():
    """Categorical's and Cauchy's graphs (GatherElements, ArgMax, float64 atan) at opset 17."""
    def f(x, i):
        d = gc.distributions.Categorical(logits=x)
        return {"lp": d.log_prob(i) + gc.distributions.Cauchy(x, 1.0).cdf(0.5).sum(-1), "s": d.sample((5,))}

    model = gc.capture(f, x=LOGITS, i=IDX[0], opset=17)
    want = (torch.distributions.Categorical(logits=torch.tensor(LOGITS)).log_prob(torch.tensor(IDX[0]))
            + torch.distributions.Cauchy(torch.tensor(LOGITS), 1.0).cdf(torch.tensor(0.5)).sum(-1)).numpy()
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"x": LOGITS, "i": IDX[0]})
        np.testing.assert_allclose(out["lp"], want, rtol=1e-12)
        assert out["s"].shape == (5, 2) and out["s"].min() >= 0 and out["s"].max() < 4


def test_validate_args_false_skips_the_checks():
    """As torch's: no check, the formula's value (nan for a negative scale's log)."""
    model = gc.capture(lambda x: gc.distributions.Normal(0.0, -1.0, validate_args=False).log_prob(x), x=X)
    want = torch.distributions.Normal(0.0, -1.0, validate_args=False).log_prob(torch.tensor(X)).numpy()
    np.testing.assert_allclose(run_both(model, {"x": X})["output"], want)


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc.distributions.Normal(x, -1.0), r"Normal.*scale must satisfy constraints.positive"),
    (lambda x: gc.distributions.Normal(np.nan, x), r"Normal.*loc must satisfy constraints.real"),
    (lambda x: gc.distributions.Exponential(np.array([1.0, 0.0])), r"Exponential.*rate must satisfy"),
    (lambda x: gc.distributions.Uniform(1.0, np.array([2.0, 0.5])), r"Uniform.*needs low < high"),
    (lambda x: gc.distributions.Bernoulli(probs=1.5), r"Bernoulli.*probs must satisfy constraints.unit_interval"),
    (lambda x: gc.distributions.Bernoulli(probs=x, logits=x), r"either probs or logits must be given, but not both"),
    (lambda x: gc.distributions.Categorical(), r"either probs or logits"),
    (lambda x: gc.distributions.Categorical(probs=0.5), r"probs must be at least one-dimensional"),
    (lambda x: gc.distributions.Categorical(probs=[0.5, -0.1]), r"probs must satisfy constraints.nonnegative"),
    (lambda x: gc.distributions.Exponential(x).log_prob(-1.0), r"value must satisfy constraints.nonnegative"),
    (lambda x: gc.distributions.Uniform(0.0, 1.0).log_prob(1.5), r"value must satisfy constraints.interval"),
    (lambda x: gc.distributions.Categorical(logits=x).log_prob(4), r"value must satisfy constraints.integer_int"),
    (lambda x: gc.distributions.Bernoulli(logits=x).log_prob(0.5), r"value must satisfy constraints.boolean"),
    (lambda x: gc.distributions.Normal(x, 1.0).log_prob(np.zeros(4)), r"value .*does not broadcast with the batch"),
    (lambda x: gc.distributions.Normal(x, np.ones(4)), r"the parameters .* do not broadcast"),
    (lambda x: gc.distributions.Normal(x, "1"), r"scale must be a Tensor or a number, got str"),
    (lambda x: gc.distributions.Normal(x, 1.0).sample((2, -1)), r"sample_shape must be ints >= 0"),
    (lambda x: gc.distributions.Bernoulli(logits=x).rsample(), r"has no rsample"),
    (lambda x: gc.distributions.Categorical(logits=x).cdf(1), r"has no cdf"),
    (lambda x: gc.distributions.Independent(gc.distributions.Normal(x, 1.0), 3), r"reinterpreted_batch_ndims must"),
    (lambda x: gc.distributions.Independent(x, 1), r"base_distribution must be a gc.distributions Distribution"),
    (lambda x: gc.distributions.kl_divergence(gc.distributions.Normal(x, 1.0), gc.distributions.Laplace(x, 1.0)),
     r"no KL divergence for p=Normal and q=Laplace"),
    (lambda x: gc.distributions.kl_divergence(gc.distributions.Normal(x, 1.0), gc.distributions.Normal(0.0, 1.0)),
     r"p's float64 parameters and q's float32 ones differ"),
    (lambda x: gc.distributions.kl_divergence(gc.distributions.Independent(gc.distributions.Normal(x, 1.0), 1),
                                              gc.distributions.Independent(gc.distributions.Normal(x, 1.0), 2)),
     r"reinterpreted_batch_ndims 1 and 2 differ"),
])
def test_bad_arguments_raise_with_the_user_line(fn, match):
    """torch refuses each of these too (ValueError or NotImplementedError); the message names the argument
    and this file's line."""
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.zeros((2, 3)))
    assert "test_dsl_distributions.py:" in str(info.value)
