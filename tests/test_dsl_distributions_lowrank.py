"""gc.distributions.LowRankMultivariateNormal against torch.distributions: log_prob, entropy and the matrices
(values on numpy and ort-cpu, float64 and float32, gradients against torch.autograd and float64 central
differences), the KL pairs torch registers (LowRank-LowRank, MultivariateNormal-LowRank, LowRank-MultivariateNormal),
samples' mean and covariance, shapes and expand, and the errors naming the argument."""

from __future__ import annotations

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
R = np.random.default_rng(5)
LOC = R.standard_normal((2, 4))
W = R.standard_normal((2, 4, 2)) * 0.7
DIAG = np.abs(R.standard_normal((2, 4))) + 0.3
VALUE = R.standard_normal((3, 2, 4))
_M = R.standard_normal((2, 4, 4))
COV = _M @ _M.transpose(0, 2, 1) + np.eye(4)


def _lowrank(d, loc, w, diag):
    return d.LowRankMultivariateNormal(loc, w, diag)


METHODS = "log_prob entropy mean variance covariance_matrix precision_matrix scale_tril"
# (id, params: loc, cov_factor, cov_diag (their batch dims broadcast))
PARAMS = [
    ("batched", [LOC, W, DIAG]),
    ("broadcast_factor", [LOC, W[0], DIAG[0]]),
    ("broadcast_loc", [LOC[0], W, DIAG]),
    ("rank_one", [LOC[1], W[1, :, :1].copy(), DIAG[1]]),
]


@pytest.mark.parametrize("params", [pytest.param(p, id=i) for i, p in PARAMS])
@pytest.mark.parametrize("method", METHODS.split())
def test_values_and_gradients_match_torch(params, method):
    assert_method_matches_torch(_lowrank, method, params, VALUE, True, R)


@pytest.mark.parametrize("method", ["log_prob", "entropy", "precision_matrix", "scale_tril"])
def test_float32_matches_torch(method):
    assert_method_matches_torch(_lowrank, method, [p.astype(np.float32) for p in (LOC, W, DIAG)],
                                VALUE.astype(np.float32), True, R)


KL_CASES = [
    ("lowrank_lowrank", lambda d, a, b, c: _lowrank(d, a, b, c), lambda d, a, b, c: _lowrank(d, a, b, c),
     [LOC, W, DIAG], [LOC[::-1].copy(), W[0, :, :1].copy(), DIAG[0]]),
    ("mvn_lowrank", lambda d, a, c: d.MultivariateNormal(a, covariance_matrix=c), _lowrank, [LOC, COV],
     [LOC[::-1].copy(), W[0], DIAG[0]]),
    ("lowrank_mvn", _lowrank, lambda d, a, c: d.MultivariateNormal(a, covariance_matrix=c), [LOC, W[0], DIAG[0]],
     [LOC[::-1].copy(), COV]),
    ("lowrank_mvn_batched_p", _lowrank, lambda d, a, c: d.MultivariateNormal(a, covariance_matrix=c), [LOC, W, DIAG],
     [LOC[0], COV[0]]),
]


@pytest.mark.parametrize("make_p, make_q, p, q", [pytest.param(*c[1:], id=c[0]) for c in KL_CASES])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kl_divergence_matches_torch(make_p, make_q, p, q, dtype):
    n = len(p)
    assert_matches_torch(lambda M, *a: D(M).kl_divergence(make_p(D(M), *a[:n]), make_q(D(M), *a[n:])),
                         [v.astype(dtype) for v in (*p, *q)], {}, R)


@pytest.mark.parametrize("fn", [
    pytest.param(lambda M, x: gc.distributions.LowRankMultivariateNormal(x[0], x[1:, :2], gc.exp(x[0])).log_prob(
        x[1:, 2]), id="log_prob"),
    pytest.param(lambda M, x: gc.distributions.LowRankMultivariateNormal(x[0], x[1:, :2], gc.exp(x[0])).entropy(),
                 id="entropy"),
    pytest.param(lambda M, x: gc.distributions.kl_divergence(
        gc.distributions.LowRankMultivariateNormal(x[0], x[1:, :1], gc.exp(x[1])),
        gc.distributions.LowRankMultivariateNormal(x[2], x[1:, 1:], gc.exp(x[3]))), id="kl"),
])
def test_gradients_match_central_differences(fn):
    assert_grads_match_central_differences(fn, R.standard_normal((4, 3)) * 0.5)


@pytest.mark.parametrize("method", ["sample", "rsample"])
def test_samples_match_mean_and_covariance(method):
    loc, diag = np.array([1.0, -2.0, 0.5]), np.array([0.5, 1.0, 0.2])
    w = np.array([[1.0, 0.2], [0.5, -0.7], [0.0, 0.4]])
    cov, ns = w @ w.T + np.diag(diag), 20000
    model = gc.capture(lambda u: getattr(gc.distributions.LowRankMultivariateNormal(loc, w, diag), method)((ns,)),
                       u=np.zeros(1))
    x = gc.Session(model, backend="numpy").run({"u": np.zeros(1)})["output"].astype(np.float64)
    assert x.shape == (ns, 3)
    var = np.diag(cov)
    assert np.all(np.abs(x.mean(0) - loc) < 5 * np.sqrt(var / ns))
    assert np.all(np.abs(np.cov(x.T) - cov) < 5 * np.sqrt((np.outer(var, var) + cov ** 2) / ns))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_rsample_gradient_matches_its_noise(backend):
    """One draw ``y = loc + W eps_W + sqrt(D) eps_D`` per batch element: the gradient of ``sum(y * c)`` to ``loc`` is
    ``c``, to ``W`` ``c eps_W^T`` and to ``D`` ``c eps_D / (2 sqrt(D))``; the noise read back from the last two
    rebuilds ``y``."""
    c = R.standard_normal((2, 4)) + 3.0
    got = gc_grads(lambda M, a, b, d: gc.distributions.LowRankMultivariateNormal(a, b, d).rsample(),
                   {"a": LOC, "b": W, "d": DIAG}, {}, c, backend=backend)
    np.testing.assert_allclose(got["a"], c, rtol=1e-12)
    eps_w = got["b"] / c[..., None]
    np.testing.assert_allclose(eps_w, np.broadcast_to(eps_w[:, :1], eps_w.shape), rtol=1e-10)  # one eps_W per row
    eps_d = got["d"] * 2 * np.sqrt(DIAG) / c
    rebuilt = LOC + (W @ eps_w[:, 0, :, None])[..., 0] + np.sqrt(DIAG) * eps_d
    np.testing.assert_allclose(got["out"], rebuilt, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make", [
    pytest.param(lambda d: d.LowRankMultivariateNormal(np.zeros((2, 3)), np.ones((3, 1)), np.ones(3)), id="batched"),
    pytest.param(lambda d: d.LowRankMultivariateNormal(np.zeros(3), np.ones((4, 3, 2)), np.ones(3)), id="factor_batch"),
    pytest.param(lambda d: d.LowRankMultivariateNormal(np.zeros(3), np.ones((3, 2)), np.ones(3)).expand((5,)),
                 id="expanded"),
])
@pytest.mark.parametrize("sample_shape", [(), (4,)])
def test_shapes_match_torch(make, sample_shape):
    class Float32:
        def __getattr__(self, name):
            cls = getattr(torch.distributions, name)
            return lambda *a: cls(*(torch.tensor(v, dtype=torch.float32) for v in a))
    assert_shapes_match_torch(make, make(Float32()), sample_shape)


def test_expand_matches_torch():
    def lp(M, a, b, c, v):
        return _lowrank(D(M), a, b, c).expand((3, 2)).log_prob(v)
    assert_matches_torch(lp, [LOC[0], W[0], DIAG[0], VALUE[:, :1]], {}, R)


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc.distributions.LowRankMultivariateNormal(x[0, 0], np.ones((1, 1)), np.ones(1)),
     r"loc must be at least one-dimensional \(static sizes\), got float64\[\]"),
    (lambda x: gc.distributions.LowRankMultivariateNormal(x[0], np.ones(3), np.ones(3)),
     r"cov_factor must be a batch of 3 x m matrices \(n = loc's last dim\) \(static sizes\), got float64\[3\]"),
    (lambda x: gc.distributions.LowRankMultivariateNormal(x[0], np.ones((2, 1)), np.ones(3)),
     r"cov_factor must be a batch of 3 x m matrices \(n = loc's last dim\), got float64\[2,1\]"),
    (lambda x: gc.distributions.LowRankMultivariateNormal(x[0], np.ones((3, 1)), np.ones(2)),
     r"cov_diag must be a batch of vectors of size 3 \(loc's last dim\), got float64\[2\]"),
    (lambda x: gc.distributions.LowRankMultivariateNormal(x, np.ones((4, 3, 1)), np.ones(3)),
     r"the batch dims of loc float64\[2,3\], cov_factor float64\[4,3,1\] and cov_diag float64\[3\] do not broadcast"),
    (lambda x: gc.distributions.LowRankMultivariateNormal(x[0], np.ones((3, 1)), np.array([1.0, 0.0, 2.0])),
     r"cov_diag must satisfy constraints.positive"),
    (lambda x: gc.distributions.LowRankMultivariateNormal(x[0], np.ones((3, 1)), np.ones(3)).log_prob(np.ones(4)),
     r"value float64\[4\] does not broadcast with the batch and event shape \(3,\)"),
    (lambda x: gc.distributions.kl_divergence(gc.distributions.LowRankMultivariateNormal(x[0], np.ones((3, 1)), x[1]),
                                              gc.distributions.LowRankMultivariateNormal(x[0, :2], np.ones((2, 1)),
                                                                                         x[1, :2])),
     r"LowRankMultivariateNormals of event shapes \(3,\) and \(2,\)"),
])
def test_bad_arguments_are_refused_naming_them(fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.abs(R.standard_normal((2, 3))) + 0.5)
    assert "LowRankMultivariateNormal" in str(info.value) or "kl_divergence" in str(info.value)


def test_symbolic_batch_dim_matches_torch():
    model = gc.capture(lambda x: gc.distributions.LowRankMultivariateNormal(x, W[0], DIAG[0]).log_prob(x * 2.0),
                       x=gc.spec("float64", ("N", 4)))
    x = R.standard_normal((5, 4))
    ref = torch.distributions.LowRankMultivariateNormal(torch.tensor(x), torch.tensor(W[0]), torch.tensor(DIAG[0]))
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"],
                                   ref.log_prob(torch.tensor(x * 2.0)).numpy(), rtol=1e-10)
