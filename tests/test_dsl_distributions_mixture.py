"""gc.distributions' MixtureSameFamily, Multinomial and OneHotCategoricalStraightThrough against torch.distributions
2.13 (float64): values on numpy and ort-cpu with gradients against torch.autograd, a mixture density network's
training loss, sample frequencies and moments, shapes, expand and the errors naming the argument."""

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
RNG = np.random.default_rng(13)
W = np.array([[0.3, -1.0, 0.8], [1.2, 0.1, -0.5]])  # mixture logits, batch (2,), K = 3
MU = np.array([[-1.0, 0.5, 2.0], [0.3, -0.7, 1.1]])
SIG = np.array([[0.5, 1.2, 0.8], [0.9, 0.4, 1.5]])
MU2 = RNG.standard_normal((2, 3, 2))  # (batch, K, event 2)
SIG2 = np.abs(RNG.standard_normal((2, 3, 2))) + 0.3
Y = np.array([[0.4, -0.2], [1.5, 0.9], [-2.0, 0.1], [0.0, 3.0]])  # 4 values of each batch entry
PROBS = np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
COUNTS = np.array([[1.0, 3.0, 0.0], [2.0, 1.0, 1.0]])


def _gmm(d, w, m, s):
    return d.MixtureSameFamily(d.Categorical(logits=w), d.Normal(m, s))


def _gmm2(d, w, m, s):
    return d.MixtureSameFamily(d.Categorical(logits=w), d.Independent(d.Normal(m, s), 1))


def _gamma_mix(d, p, a, b):
    return d.MixtureSameFamily(d.Categorical(probs=p), d.Gamma(a, b))


# (id, make(Dist, *params), params, the value for log_prob/cdf, methods with gradients, methods without)
FAMILIES = [
    ("gmm", _gmm, [W, MU, SIG], Y[:, :1] * np.ones(2), "log_prob cdf mean variance", ""),
    ("gmm_shared_weights", _gmm, [W[0], MU, SIG], np.array([0.2, -1.3]), "log_prob cdf mean variance", ""),
    ("gmm_2d", _gmm2, [W, MU2, SIG2], Y[:, None, :], "log_prob mean variance", ""),
    ("gamma_mixture", _gamma_mix, [PROBS, SIG * 2.0, SIG + 0.5], np.array([0.7, 2.1]), "log_prob mean variance", ""),
    ("multinomial", lambda d, p: d.Multinomial(5, probs=p), [PROBS], np.array([[1.0, 3.0, 1.0], [0.0, 0.0, 5.0]]),
     "log_prob entropy mean variance", ""),
    ("multinomial_logits", lambda d, w: d.Multinomial(4, logits=w), [W], COUNTS, "log_prob entropy mean variance",
     ""),
    # without validation, log_prob reads each value's own count, as torch's
    ("multinomial_any_count", lambda d, w: d.Multinomial(logits=w, validate_args=False), [W], COUNTS * 2.0,
     "log_prob", ""),
    ("multinomial_zero", lambda d, w: d.Multinomial(0, logits=w), [W], COUNTS * 0.0, "log_prob entropy", ""),
    ("straight_through", lambda d, w: d.OneHotCategoricalStraightThrough(logits=w), [W], np.eye(3)[[2, 0]],
     "log_prob entropy mean variance", "mode"),
]
CASES = [pytest.param(make, method, params, value, method in grads.split(), id=f"{name}-{method}")
         for name, make, params, value, grads, nograds in FAMILIES for method in grads.split() + nograds.split()]


@pytest.mark.parametrize("make, method, params, value, differentiable", CASES)
def test_values_and_gradients_match_torch(make, method, params, value, differentiable):
    """Values (numpy and ort-cpu, the full checker) and the gradients to every parameter (and a continuous value)."""
    assert_method_matches_torch(make, method, params, value, differentiable, RNG)


def test_multinomial_log_prob_with_minus_inf_logits_matches_torch():
    """A ``-inf`` logit times a zero count adds 0, as torch's."""
    w = np.array([[0.5, -np.inf, 1.0]])
    assert_matches_torch(lambda M, v, w: D(M).Multinomial(3, logits=w).log_prob(v), [],
                         {"v": np.array([[2.0, 0.0, 1.0]]), "w": w}, RNG)


def test_multinomial_log_prob_above_the_sample_cap_matches_torch():
    """Only ``sample`` caps ``total_count`` (at 4096); ``log_prob`` takes any count, as torch's."""
    v = np.array([[1000.0, 3000.0, 1000.0], [0.0, 0.0, 5000.0]])
    assert_matches_torch(lambda M, p, v: D(M).Multinomial(5000, probs=p).log_prob(v), [PROBS], {"v": v},
                         np.random.default_rng(5))  # its own, so the later tests' RNG draws stay as they were


def test_mixture_log_prob_gradient_matches_central_differences():
    def fn(M, x):
        return _gmm(gc.distributions, x[0], x[1], gc.exp(x[2])).log_prob(x[3] * 2.0)
    assert_grads_match_central_differences(fn, RNG.standard_normal((4, 3)) * 0.5)


class MDN(gc.nn.Module):
    """A mixture density network: a hidden layer, then K mixture logits, means and log scales per input."""

    def __init__(self, k=3):
        super().__init__()
        self.hidden, self.out, self.k = gc.nn.Linear(1, 8), gc.nn.Linear(8, 3 * k), k

    def forward(self, x, y):
        h = self.out(gc.tanh(self.hidden(x)))
        k = self.k
        d = gc.distributions
        mix = d.MixtureSameFamily(d.Categorical(logits=h[:, :k]), d.Normal(h[:, k:2 * k], gc.exp(h[:, 2 * k:])))
        return {"loss": -gc.mean(mix.log_prob(y[:, 0]))}


class TorchMDN(torch.nn.Module):
    def __init__(self, k=3):
        super().__init__()
        self.hidden, self.out, self.k = torch.nn.Linear(1, 8), torch.nn.Linear(8, 3 * k), k

    def forward(self, x, y):
        h = self.out(torch.tanh(self.hidden(x)))
        k, d = self.k, torch.distributions
        mix = d.MixtureSameFamily(d.Categorical(logits=h[:, :k]), d.Normal(h[:, k:2 * k], h[:, 2 * k:].exp()))
        return -mix.log_prob(y[:, 0]).mean()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_mixture_density_network_gradients_match_torch(backend):
    """``gc.grad`` of an MDN's negative log likelihood to every weight, against torch.autograd's (float64)."""
    x = RNG.uniform(-1, 1, (16, 1))
    y = np.sin(3 * x) + 0.1 * RNG.standard_normal((16, 1))
    ref = TorchMDN().double()
    model = MDN()
    for name, p in ref.named_parameters():
        mod, attr = name.split(".")
        setattr(getattr(model, mod), attr, gc.nn.Parameter(p.detach().numpy().copy(), dtype="float64"))
    grads = gc.grad(gc.capture(model, x=x, y=y), "loss")
    got = gc.Session(grads, backend=backend).run({"x": x, "y": y})
    loss = ref(torch.tensor(x), torch.tensor(y))
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-10)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(got[f"{name}_grad"], p.grad.numpy(), rtol=1e-7, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_straight_through_rsample_gradient_is_that_of_probs(backend):
    """``sum(rsample((5,)) * c)``: the one-hot draw forward, ``probs``'s gradient (``sum`` over draws of ``c``)
    backward, as torch's."""
    c = RNG.standard_normal((5, 2, 3))
    got = gc_grads(lambda M, w: gc.distributions.OneHotCategoricalStraightThrough(logits=w).rsample((5,)), {"w": W},
                   {}, c, backend=backend)
    assert set(np.unique(got["out"])) <= {0.0, 1.0} and np.all(got["out"].sum(-1) == 1)
    w = torch.tensor(W, requires_grad=True)
    probs = torch.distributions.OneHotCategoricalStraightThrough(logits=w).probs
    ((probs - probs.detach()) * torch.tensor(c)).sum().backward()
    np.testing.assert_allclose(got["w"], w.grad.numpy(), rtol=1e-10, atol=1e-12)


NS = 20000


def _draws(make, method="sample"):
    model = gc.capture(lambda unused: getattr(make(gc.distributions), method)((NS,)), unused=np.zeros(1))
    return gc.Session(model, backend="numpy").run({"unused": np.zeros(1)})["output"].astype(np.float64)


def test_mixture_samples_match_torch_moments_and_component_frequencies():
    """A 1-D mixture of three separated Normals (weights 0.2, 0.5, 0.3): mean, variance and the share of draws
    nearest each component within 5 standard errors; a 2-D mixture's per-coordinate means."""
    w, mu, sig = np.log([0.2, 0.5, 0.3]), np.array([-6.0, 0.0, 6.0]), np.array([0.5, 1.0, 0.7])
    x = _draws(lambda d: _gmm(d, w, mu, sig))
    ref = _gmm(torch.distributions, *map(torch.tensor, (w, mu, sig)))
    mean, var = float(ref.mean), float(ref.variance)
    assert x.shape == (NS,) and abs(x.mean() - mean) < 5 * math.sqrt(var / NS)
    assert abs(x.var() - var) < 5 * math.sqrt((np.mean((x - x.mean()) ** 4) - x.var() ** 2) / NS)
    share = np.bincount(np.argmin(np.abs(x[:, None] - mu), 1), minlength=3) / NS
    assert np.all(np.abs(share - [0.2, 0.5, 0.3]) < 5 * np.sqrt(np.array([0.16, 0.25, 0.21]) / NS))
    x2 = _draws(lambda d: _gmm2(d, W, MU2, SIG2))
    ref2 = _gmm2(torch.distributions, *map(torch.tensor, (W, MU2, SIG2)))
    assert x2.shape == (NS, 2, 2)
    assert np.all(np.abs(x2.mean(0) - ref2.mean.numpy()) < 5 * np.sqrt(ref2.variance.numpy() / NS))


def test_mixture_with_shared_weights_samples():
    """Weights without the components' batch dims (torch 2.13's sample fails on these: its gather index lacks the
    batch dims): each draw's batch entries pick their components independently."""
    x = _draws(lambda d: _gmm(d, np.log([0.5, 0.5]), np.array([[-5.0, 5.0], [-5.0, 5.0]]), np.full((2, 2), 0.1)))
    assert x.shape == (NS, 2) and np.all(np.abs(np.abs(x) - 5.0) < 1.0)
    assert abs(np.mean(x > 0) - 0.5) < 5 * math.sqrt(0.25 / NS / 2)
    assert abs(np.mean((x[:, 0] > 0) == (x[:, 1] > 0)) - 0.5) < 5 * math.sqrt(0.25 / NS)


def test_multinomial_samples_count_total_count_with_torch_frequencies():
    x = _draws(lambda d: d.Multinomial(6, probs=PROBS[0]))
    assert x.shape == (NS, 3) and np.all(x.sum(-1) == 6) and np.all(x == np.floor(x))
    p = PROBS[0]
    assert np.all(np.abs(x.mean(0) - 6 * p) < 5 * np.sqrt(6 * p * (1 - p) / NS))
    assert np.all(np.abs(np.cov(x.T) - 6 * (np.diag(p) - np.outer(p, p))) < 0.05)
    zero = _draws(lambda d: d.Multinomial(0, probs=PROBS))
    assert zero.shape == (NS, 2, 3) and np.all(zero == 0)


SHAPED = [
    ("gmm", lambda d: _gmm(d, np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3)))),
    ("gmm_2d", lambda d: _gmm2(d, np.zeros((2, 3)), np.zeros((2, 3, 2)), np.ones((2, 3, 2)))),
    ("multinomial", lambda d: d.Multinomial(4, probs=np.full((2, 3), 1 / 3))),
    ("straight_through", lambda d: d.OneHotCategoricalStraightThrough(logits=np.zeros((2, 4)))),
]


def _torch_float32(make):
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


@pytest.mark.parametrize("make, params, value, batch", [
    pytest.param(_gmm, [W[0], MU[0], SIG[0]], np.array([[0.2], [1.0], [-0.3], [2.0]]) * np.ones(3), (4, 3), id="gmm"),
    pytest.param(lambda d, w: d.Multinomial(3, logits=w), [W[0]], np.array([[1.0, 1.0, 1.0], [0.0, 3.0, 0.0]]), (2,),
                 id="multinomial"),
])
def test_expand_matches_torch(make, params, value, batch):
    def fn(M, *a, v):
        d = make(D(M), *a).expand(batch)
        assert tuple(d.batch_shape) == batch
        return d.log_prob(v) + d.mean.sum()
    assert_matches_torch(fn, list(params), {"v": value}, RNG)


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc.distributions.MixtureSameFamily(gc.distributions.Normal(x, 1.0), gc.distributions.Normal(x, 1.0)),
     r"mixture_distribution must be a gc.distributions Categorical, got Normal"),
    (lambda x: gc.distributions.MixtureSameFamily(gc.distributions.Categorical(logits=x), x),
     r"component_distribution must be a gc.distributions Distribution, got Tensor"),
    (lambda x: gc.distributions.MixtureSameFamily(gc.distributions.Categorical(logits=x[0]),
                                                  gc.distributions.Normal(x[:, :2], 1.0)),
     r"mixture_distribution has 3 components but component_distribution.batch_shape\[-1\] is 2"),
    (lambda x: gc.distributions.MixtureSameFamily(gc.distributions.Categorical(logits=np.zeros((4, 3))),
                                                  gc.distributions.Normal(x, 1.0)),
     r"mixture_distribution.batch_shape \(4,\) does not broadcast with component_distribution.batch_shape\[:-1\]"),
    (lambda x: gc.distributions.MixtureSameFamily(gc.distributions.Categorical(logits=x), gc.distributions.Normal(
        x, 1.0)).rsample(), r"MixtureSameFamily.*has no rsample"),
    (lambda x: gc.distributions.MixtureSameFamily(gc.distributions.Categorical(logits=x[0]),
                                                  gc.distributions.Gamma(x + 1.0, 1.0)).log_prob(-1.0),
     r"Gamma.*value must satisfy constraints.nonnegative"),
    (lambda x: gc.distributions.Multinomial(2.5, probs=x), r"total_count must be a Python int >= 0"),
    (lambda x: gc.distributions.Multinomial(x, probs=x), r"total_count must be a Python int >= 0"),
    (lambda x: gc.distributions.Multinomial(5000, probs=x).sample(), r"total_count must be <= 4096"),
    (lambda x: gc.distributions.Multinomial(3, probs=-np.ones(3)), r"probs must satisfy constraints.nonnegative"),
    (lambda x: gc.distributions.Multinomial(3, probs=x + 1.0).log_prob(np.array([2.0, 2.0, 0.0])),
     r"value must satisfy constraints.multinomial"),
    (lambda x: gc.distributions.Multinomial(3, probs=x + 1.0).log_prob(np.array([0.5, 1.0, 0.0])),
     r"value must satisfy constraints.multinomial"),
    (lambda x: gc.distributions.OneHotCategoricalStraightThrough(probs=x, logits=x), r"either probs or logits"),
])
def test_bad_arguments_raise_with_the_user_line(fn, match):
    """torch refuses each of these too; the message names the argument and this file's line."""
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.ones((2, 3)))
    assert "test_dsl_distributions_mixture.py:" in str(info.value)
