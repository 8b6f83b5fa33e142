"""Rejection sampling (graphc/dsl/ops_rejection.py): ``gc._standard_gamma``, ``gc.poisson`` and ``sample()`` of Gamma,
Chi2, Beta, Dirichlet, StudentT, VonMises, Poisson and NegativeBinomial. 1e5 draws per case on numpy and ort-cpu:
the Kolmogorov-Smirnov distance to the exact cdf below its 0.1% critical value (torch.special.gammainc, a float64
continued fraction for the incomplete beta function checked against mpmath, the von Mises density integrated on a
fine grid), moments within 5 standard errors, counts' frequencies against the exact pmf; shapes and dtypes against
torch's samples (a symbolic batch dim too), the Loop drawing anew each iteration, seeds, opset 17, the zero gradient
and the errors."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.dsl.ops_rejection import MAX_TRIES, until_accepted

try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

torch = pytest.importorskip("torch")
NS = 100_000
KS_BOUND = 1.95 / math.sqrt(NS)  # the Kolmogorov-Smirnov distance's 0.1% critical value
BACKENDS = ["numpy", "ort-cpu"]
_lgamma = np.vectorize(math.lgamma)


def _run(fn, backend, opset=21, **inputs):
    """``fn`` captured on symbolic-free specs of ``inputs``, checked in full and run on ``backend``."""
    specs = {k: gc.spec(v.dtype.name, list(v.shape)) for k, v in inputs.items()}
    model = gc.capture(fn, opset=opset, **specs)
    onnx.checker.check_model(model.proto, full_check=True)
    return gc.Session(model, backend=backend).run(inputs)


def _ks(x, cdf, cdf_left=None):
    """The KS distance of the draws ``x`` to ``cdf``; ``cdf_left`` its left limits where it has atoms (counts, or the
    dtype's smallest normal number, where smaller draws are clamped)."""
    x = np.sort(x)
    left = (cdf_left or cdf)(x)
    return max(np.max(np.arange(1, len(x) + 1) / len(x) - cdf(x)), np.max(left - np.arange(len(x)) / len(x)))


def _assert_moments(x, mean, var):
    m4 = np.mean((x - x.mean()) ** 4)
    assert abs(x.mean() - mean) < 5 * math.sqrt(var / len(x)), (x.mean(), mean)
    assert abs(x.var() - var) < 5 * math.sqrt((m4 - x.var() ** 2) / len(x)), (x.var(), var)


def _gamma_cdf(a, x):
    return torch.special.gammainc(torch.tensor(float(a), dtype=torch.float64), torch.from_numpy(x)).numpy()


def _betacf(a, b, x):
    """The continued fraction of the incomplete beta function (Lentz; Numerical Recipes' betacf), vectorised."""
    tiny = 1e-300

    def nz(v):
        return np.where(np.abs(v) < tiny, tiny, v)

    c, d = np.ones_like(x), 1.0 / nz(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 150):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 / nz(1.0 + aa * d)
            c = nz(1.0 + aa / c)
            h = h * d * c
    return h


def _betainc(a, b, x):
    """The regularised incomplete beta function ``I_x(a, b)`` in float64."""
    x = np.clip(np.asarray(x, np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        front = np.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * np.log(x) + b * np.log1p(-x))
        low = x < (a + 1.0) / (a + b + 2.0)
        xs = np.where(low, x, 1.0 - x)
        out = np.where(low, front * _betacf(a, b, xs) / a, 1.0 - front * _betacf(b, a, xs) / b)
    return np.where(x == 0.0, 0.0, np.where(x == 1.0, 1.0, out))


def _student_cdf(df, t):
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return np.where(t < 0, tail, 1.0 - tail)


def _von_mises_cdf(loc, k):
    """The cdf on [-pi, pi) of the density ``exp(k cos(x - loc)) / (2 pi I0(k))``, integrated on a fine grid."""
    grid = np.linspace(-math.pi, math.pi, 400_001)
    pdf = np.exp(k * (np.cos(grid - loc) - 1.0)) / (2 * math.pi * np.i0(k) * np.exp(-k))
    cdf = np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(grid))])
    return lambda x: np.interp(x, grid, cdf / cdf[-1])


def test_the_incomplete_beta_oracle_matches_mpmath():
    mpmath = pytest.importorskip("mpmath")
    for a, b in [(0.5, 0.5), (2.0, 5.0), (0.05, 1.0), (15.0, 0.5), (40.0, 60.0)]:
        for x in [1e-6, 0.01, 0.3, 0.5, 0.77, 0.999]:
            want = float(mpmath.betainc(a, b, 0, x, regularized=True))
            assert abs(_betainc(a, b, np.array([x]))[0] - want) < 1e-12, (a, b, x)


ALPHAS = np.array([0.05, 0.5, 1.0, 3.0, 50.0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_standard_gamma_matches_the_gamma_cdf(backend, dtype):
    """Small (0.05, 0.5: the ``u^(1/alpha)`` boost), unit and large concentrations, fed at run time."""
    a = np.broadcast_to(ALPHAS, (NS, len(ALPHAS))).astype(dtype)
    x = _run(lambda a: gc._standard_gamma(a), backend, a=a)["output"]
    assert x.dtype == dtype and x.shape == a.shape and np.all(x >= np.finfo(dtype).tiny)
    assert torch._standard_gamma(torch.from_numpy(a[:2])).dtype == getattr(torch, dtype)
    for j, alpha in enumerate(ALPHAS):
        col = x[:, j].astype(np.float64)
        tiny = np.finfo(dtype).tiny  # an atom there: torch clamps the draws below it, as graphc does
        assert _ks(col, lambda v, a=alpha: _gamma_cdf(a, v),
                   lambda v, a=alpha, t=tiny: np.where(v <= t, 0.0, _gamma_cdf(a, v))) < KS_BOUND, alpha
        _assert_moments(col, alpha, alpha)


def _arrays(d):
    """Parameter arrays as float32: numpy ones (graphc constants) or torch tensors."""
    if d is torch.distributions:
        return lambda *v: torch.tensor(v, dtype=torch.float32)
    return lambda *v: np.array(v, np.float32)


def _gamma_family(d, name):
    a = _arrays(d)
    return {
        "gamma": lambda: d.Gamma(a(0.05, 0.5, 2.0, 50.0), a(2.0, 0.5, 1.0, 3.0)),
        "chi2": lambda: d.Chi2(a(0.1, 1.0, 7.0)),
        "beta": lambda: d.Beta(a(0.5, 2.0, 0.05, 15.0), a(0.5, 5.0, 1.0, 0.5)),
        "dirichlet": lambda: d.Dirichlet(a(0.3, 2.0, 5.0)),
        "student_t": lambda: d.StudentT(a(0.7, 3.0, 30.0), a(1.0, -2.0, 0.0), a(2.0, 0.5, 1.0)),
        "von_mises": lambda: d.VonMises(a(0.5, -2.8, 3.0, 0.0), a(1e-6, 0.7, 4.0, 50.0)),
    }[name]()


def _gamma_family_oracles(name, ref, j):
    """(cdf, mean or None, variance or None) of column ``j`` of the family ``name`` (torch's ``ref``)."""
    def p(attr):
        return float(np.asarray(getattr(ref, attr).numpy(), np.float64).reshape(-1)[j])

    if name in ("gamma", "chi2"):
        rate = p("rate")
        return (lambda v: _gamma_cdf(p("concentration"), v * rate)), p("mean"), p("variance")
    if name == "beta":
        a, b = p("concentration1"), p("concentration0")
        return (lambda v: _betainc(a, b, v)), p("mean"), p("variance")
    if name == "dirichlet":  # the marginals are Beta(c_j, sum(c) - c_j)
        c = ref.concentration.numpy().astype(np.float64)
        return (lambda v: _betainc(c[j], c.sum() - c[j], v)), p("mean"), p("variance")
    if name == "student_t":
        df, loc, scale = p("df"), p("loc"), p("scale")
        moments = (p("mean"), p("variance")) if df > 4 else (None, None)  # the variance's error needs m4
        return (lambda v: _student_cdf(df, (v - loc) / scale)), *moments
    loc, k = p("loc"), p("concentration")
    return _von_mises_cdf(loc, k), None, None


@pytest.mark.parametrize("name", ["gamma", "chi2", "beta", "dirichlet", "student_t", "von_mises"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gamma_family_samples_match_their_cdf_and_moments(name, backend):
    """Each batch column (the Dirichlet's each component) against torch.distributions' parameters."""
    x = _run(lambda unused: _gamma_family(gc.distributions, name).sample((NS,)), backend,
             unused=np.zeros(1, np.float32))["output"]
    ref = _gamma_family(torch.distributions, name)
    assert x.shape == tuple(ref.sample((NS,)).shape) and x.dtype == np.float32
    assert np.all(np.isfinite(x))
    for j in range(x.shape[-1]):
        cdf, mean, var = _gamma_family_oracles(name, ref, j)
        col = x[:, j].astype(np.float64)
        # Gamma draws are clamped to the smallest normal float32 (as torch's): an atom at the least draw (divided by
        # the rate), below which there is no mass
        assert _ks(col, cdf, lambda v, cdf=cdf: np.where(v == v.min(), 0.0, cdf(v))) < KS_BOUND, (name, j)
        if mean is not None:
            _assert_moments(col, mean, var)
    if name == "dirichlet":
        np.testing.assert_allclose(x.sum(-1), 1.0, rtol=1e-5)
    if name == "von_mises":
        assert np.all((x >= -math.pi) & (x <= math.pi))


def _counts_check(k, log_pmf, support_end, mean, var):
    """Counts: integers, the KS distance at the integers, each frequency with at least 10 expected draws within 5
    standard errors of the pmf, and the moments."""
    assert np.all(k == np.floor(k)) and k.min() >= 0
    ks = np.arange(support_end + 1, dtype=np.float64)
    pmf = np.exp(log_pmf(ks))
    cdf = np.cumsum(pmf)
    def at(v, shift=0):
        i = np.minimum(v.astype(np.int64), support_end) - shift
        return np.where(i >= 0, cdf[np.maximum(i, 0)], 0.0)

    assert _ks(k, at, lambda v: at(v, 1)) < KS_BOUND
    freq = np.bincount(k.astype(np.int64), minlength=support_end + 1)[:support_end + 1] / len(k)
    seen = pmf * len(k) >= 10
    assert np.all(np.abs(freq - pmf)[seen] < 5 * np.sqrt(pmf * (1 - pmf) / len(k))[seen])
    _assert_moments(k, mean, var)


RATES = np.array([0.0, 0.1, 5.0, 9.99, 10.0, 50.0, 1e4])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_poisson_matches_the_pmf(backend, dtype):
    """``gc.poisson`` of rates fed at run time, both sides of the switch from inversion to PTRS at 10."""
    r = np.broadcast_to(RATES, (NS, len(RATES))).astype(dtype)
    k = _run(lambda r: gc.poisson(r), backend, r=r)["output"]
    assert k.dtype == dtype and k.shape == r.shape
    assert np.all(k[:, 0] == 0)
    for j, rate in enumerate(RATES[1:], 1):
        _counts_check(k[:, j].astype(np.float64), lambda v, r=rate: v * math.log(r) - r - _lgamma(v + 1.0),
                      int(rate + 12 * math.sqrt(rate) + 30), rate, rate)


@pytest.mark.parametrize("backend", BACKENDS)
def test_poisson_and_negative_binomial_distributions_match_torch_pmf(backend):
    def make(d):
        a = _arrays(d)
        return {"poisson": d.Poisson(a(0.3, 12.0, 400.0)),
                "nb": d.NegativeBinomial(a(0.5, 5.0, 30.0), probs=a(0.3, 0.7, 0.2))}

    out = _run(lambda unused: {n: d.sample((NS,)) for n, d in make(gc.distributions).items()}, backend,
               unused=np.zeros(1, np.float32))
    for name, ref in make(torch.distributions).items():
        k = out[name]
        assert k.dtype == np.float32 and k.shape == (NS, 3)
        for j in range(3):
            part = ref.expand((3,))

            def log_pmf(v, part=part, j=j):
                vals = torch.from_numpy(np.repeat(v[:, None], 3, 1).astype(np.float32))
                return part.log_prob(vals).numpy()[:, j].astype(np.float64)

            mean, var = float(ref.mean[j]), float(ref.variance[j])
            _counts_check(k[:, j].astype(np.float64), log_pmf, int(mean + 15 * math.sqrt(var) + 30), mean, var)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_loop_draws_anew_each_iteration(backend):
    """Accept only ``u < 0.05``: the tries per element are Geometric(0.05) (mean 20, the cap out of reach: 0.95**1000
    < 1e-22), which a body repeating its first draw would never accept."""
    def fn(x):
        def step(u0, tries, done):
            u = gc.rand_like(u0)
            ok = (u < 0.05) & ~done
            return gc.any(~(done | ok)), gc.where(ok, u, u0), gc.where(done, tries, tries + 1.0), done | ok

        return dict(zip(("u", "tries"), until_accepted(step, (x * 0.0 + 1.0, x * 0.0, x < 0.0))[:2]))

    out = _run(fn, backend, x=np.zeros(4000))  # float64: distinct draws
    assert np.all(out["u"] < 0.05) and len(np.unique(out["u"])) == 4000
    tries = out["tries"].astype(np.float64)
    assert tries.max() < MAX_TRIES
    _assert_moments(tries, 20.0, 0.95 / 0.05 ** 2)


SHAPED = [
    ("gamma", lambda d, x: d.Gamma(x, 2.0)),
    ("chi2", lambda d, x: d.Chi2(x)),
    ("beta", lambda d, x: d.Beta(x, x + 1.0)),
    ("dirichlet", lambda d, x: d.Dirichlet(x)),
    ("student_t", lambda d, x: d.StudentT(x, 0.0, 2.0)),
    ("von_mises", lambda d, x: d.VonMises(x, x)),
    ("poisson", lambda d, x: d.Poisson(x)),
    ("negative_binomial", lambda d, x: d.NegativeBinomial(x, logits=0.3)),
]


@pytest.mark.parametrize("name, make", SHAPED, ids=[s[0] for s in SHAPED])
@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shapes_and_dtypes_match_torch_with_a_symbolic_batch(name, make, sample_shape, dtype):
    x = np.full((5, 3), 1.5, dtype)
    model = gc.capture(lambda x: make(gc.distributions, x).sample(sample_shape), x=gc.spec(dtype, ["b", 3]))
    onnx.checker.check_model(model.proto, full_check=True)
    want = make(torch.distributions, torch.from_numpy(x)).sample(sample_shape)
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run({"x": x})["output"]
        assert got.shape == tuple(want.shape) and got.dtype == dtype and np.all(np.isfinite(got)), backend


def _all_samplers(x):
    d = gc.distributions
    return {"gamma": gc._standard_gamma(x), "poisson": gc.poisson(x * 20.0), "t": d.StudentT(x).sample((3,)),
            "vm": d.VonMises(x, x).sample(), "nb": d.NegativeBinomial(x, probs=0.4).sample((2,))}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_session_replays_the_draws(backend):
    """As the other samplers: each run draws anew, a new Session of the model replays the same draws."""
    x = np.linspace(0.2, 3.0, 64)
    model = gc.capture(_all_samplers, x=gc.spec("float64", [64]))
    first = gc.Session(model, backend=backend)
    a, b = first.run({"x": x}), first.run({"x": x})
    c = gc.Session(model, backend=backend).run({"x": x})
    for k in a:
        np.testing.assert_array_equal(a[k], c[k], err_msg=k)
    assert not np.array_equal(a["gamma"], b["gamma"]) and not np.array_equal(a["poisson"], b["poisson"])
    if backend == "ort-cpu":  # another capture seed seeds onnxruntime's nodes with others
        other = gc.capture(_all_samplers, x=gc.spec("float64", [64]), seed=1)
        assert not np.array_equal(gc.Session(other, backend=backend).run({"x": x})["gamma"], a["gamma"])


@pytest.mark.parametrize("opset", [17, 21])
def test_opsets_17_and_21_run_on_both_backends(opset):
    x = np.linspace(0.2, 3.0, 2000).astype(np.float32)
    for backend in BACKENDS:
        out = _run(_all_samplers, backend, opset=opset, x=x)
        assert all(np.all(np.isfinite(v)) for v in out.values())
        assert abs(out["poisson"].mean() - (x * 20.0).mean()) < 5 * math.sqrt((x * 20.0).mean() / 2000)


def test_eager_capture_evaluates_the_loop():
    """With arrays given, capture evaluates the Loop as it traces (honouring its cond)."""
    x = np.array([0.3, 4.0, 25.0])
    model = gc.capture(lambda x: {"k": gc.poisson(x), "g": gc._standard_gamma(x)}, x=x)
    out = gc.Session(model, backend="numpy").run({"x": x})
    assert np.all(out["k"] == np.floor(out["k"])) and np.all(out["g"] > 0)


def test_no_gradient_flows_from_a_draw_as_torch_poisson():
    """torch.poisson's gradient is zero; so is gc.poisson's (the draws are detached), and gc.grad builds through the
    Loop."""
    rate = np.array([0.5, 3.0, 40.0])
    c = np.array([1.0, -2.0, 0.5])
    got = gc_grads(lambda M, r: gc.poisson(r) + r * r, {"r": rate}, {}, c)
    r = torch.tensor(rate, requires_grad=True)
    ((torch.poisson(r) + r * r) * torch.tensor(c)).sum().backward()
    np.testing.assert_allclose(got["r"], r.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc.poisson(gc.cast(x, "int64")), r"poisson\(int64\[3\]\): input must be a floating point Tensor"),
    (lambda x: gc._standard_gamma(gc.cast(x, "int32")), r"_standard_gamma\(int32\[3\]\): alpha must be a floating"),
    (lambda x: gc.poisson(np.array([1.0, -0.5])), r"input must be >= 0 and finite .*got \[ 1.  -0.5\]"),
    (lambda x: gc.poisson(np.array([np.inf])), r"input must be >= 0 and finite"),
    (lambda x: gc.poisson(x, generator=object()), r"a torch generator is refused"),
    (lambda x: gc.distributions.Poisson(-1.0).sample(), r"rate must satisfy constraints.nonnegative"),
])
def test_bad_arguments_raise_with_the_user_line(fn, match):
    """torch refuses these too (a dtype without a kernel, a negative or infinite Poisson rate)."""
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=gc.spec("float32", [3]))
    assert "test_dsl_rejection_sampling.py:" in str(info.value)
