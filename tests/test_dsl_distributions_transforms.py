"""gc.distributions.transforms, constraints, biject_to/transform_to and TransformedDistribution against
torch.distributions: each transform's map, inverse and log-abs-det-Jacobian (values on numpy and ort-cpu, float64
and float32, gradients against torch.autograd), their attributes, TransformedDistribution's log_prob/cdf/icdf with
torch's event-dim bookkeeping, its shapes, expand, draws (a Kolmogorov-Smirnov check, rsample's gradient with the
noise held fixed), the KL of two, and the errors naming the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
from graphc.dsl.ops import constant

try:
    from distribution_util import D, assert_shapes_match_torch
    from torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, gc_grads
except ImportError:  # tests/ collected as a package
    from tests.distribution_util import D, assert_shapes_match_torch
    from tests.torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, gc_grads

torch = pytest.importorskip("torch")
R = np.random.default_rng(11)
X = R.standard_normal((2, 3))
POS = np.abs(X) + 0.4
S = np.array([[0.7, -1.3, 2.1], [-0.4, 1.6, 0.9]])  # scales of both signs
U = np.array([[0.15, 0.5, 0.8], [0.3, 0.65, 0.95]])
SQ = R.standard_normal((2, 3, 3))


def _t(d):
    return d.transforms


# (id, make(d, *params) with d torch.distributions or gc.distributions, params, x, methods with gradients to x and
# the params, methods without (torch's value does not depend on them))
TRANSFORMS = [
    ("exp", lambda d: _t(d).ExpTransform(), [], X, "call inv ladj", ""),
    ("sigmoid", lambda d: _t(d).SigmoidTransform(), [], X * 3.0, "call inv ladj", ""),
    ("softplus", lambda d: _t(d).SoftplusTransform(), [], X * 3.0, "call inv ladj", ""),
    ("tanh", lambda d: _t(d).TanhTransform(), [], X, "call inv ladj", ""),
    ("abs", lambda d: _t(d).AbsTransform(), [], X, "call inv", ""),
    ("power", lambda d, e: _t(d).PowerTransform(e), [S], POS, "call inv ladj", ""),
    ("power_number", lambda d: _t(d).PowerTransform(2.5), [], POS, "call inv ladj", ""),
    ("affine", lambda d, loc, s: _t(d).AffineTransform(loc, s), [X[::-1].copy(), S], X, "call inv ladj", ""),
    ("affine_numbers", lambda d: d.AffineTransform(0.5, -2.0), [], X, "call inv", "ladj"),
    ("affine_event1", lambda d, loc, s: d.AffineTransform(loc, s, event_dim=1), [X[0], S[1]], X, "call inv ladj",
     ""),
    ("affine_event2", lambda d, s: d.AffineTransform(1.5, s, event_dim=2), [S], X, "call inv ladj", ""),
    ("softmax", lambda d: _t(d).SoftmaxTransform(), [], X, "call inv", ""),
    ("stick_breaking", lambda d: _t(d).StickBreakingTransform(), [], X, "call inv ladj", ""),
    ("lower_cholesky", lambda d: _t(d).LowerCholeskyTransform(), [], SQ, "call inv", ""),
    ("positive_definite", lambda d: _t(d).PositiveDefiniteTransform(), [], SQ, "call inv", ""),
    ("inverse", lambda d: _t(d).SigmoidTransform().inv, [], U, "call inv ladj", ""),
    ("compose", lambda d, s: _t(d).ComposeTransform([_t(d).AffineTransform(0.3, s), _t(d).ExpTransform()]), [S], X,
     "call inv ladj", ""),
    ("compose_event", lambda d: _t(d).ComposeTransform([_t(d).ExpTransform(), _t(d).StickBreakingTransform()]), [],
     X, "call inv ladj", ""),
    ("compose_inverse", lambda d: _t(d).ComposeTransform([_t(d).TanhTransform(), _t(d).AffineTransform(2.0, 3.0)]).inv,
     [], X * 0.5 + 2.0, "call inv ladj", ""),
    ("independent", lambda d, s: _t(d).IndependentTransform(_t(d).AffineTransform(0.0, s), 1), [S], X,
     "call inv ladj", ""),
    ("reshape", lambda d: _t(d).ReshapeTransform((3,), (3, 1)), [], X, "call inv", "ladj"),
    ("cat", lambda d: _t(d).CatTransform([_t(d).ExpTransform(), _t(d).TanhTransform()], dim=1, lengths=[1, 2]), [],
     X, "call inv ladj", ""),
    ("cat_batch_dim", lambda d: _t(d).CatTransform([_t(d).SoftplusTransform(), _t(d).ExpTransform()], dim=0), [], X,
     "call inv ladj", ""),
    ("stack", lambda d: _t(d).StackTransform([_t(d).ExpTransform(), _t(d).SigmoidTransform(), _t(d).TanhTransform()],
                                             dim=1), [], X, "call inv ladj", ""),
    ("cumulative", lambda d, m, s: _t(d).CumulativeDistributionTransform(d.Normal(m, s)), [X[::-1].copy(), POS], X,
     "call inv ladj", ""),
]


def _apply(make, method):
    def fn(M, *args, **kw):
        *params, x = args if args else (*(kw[f"a{i}"] for i in range(len(kw) - 1)), kw["x"])
        t = make(D(M), *params)
        y = t(x)
        return {"call": lambda: y, "inv": lambda: t.inv(y), "ladj": lambda: t.log_abs_det_jacobian(x, y)}[method]()
    return fn


CASES = [pytest.param(make, method, params, x, method in grads.split(), id=f"{name}-{method}")
         for name, make, params, x, grads, nograds in TRANSFORMS for method in grads.split() + nograds.split()]


@pytest.mark.parametrize("make, method, params, x, differentiable", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_matches_torch(make, method, params, x, differentiable, dtype, request):
    """``t(x)``, ``t.inv(t(x))`` and ``t.log_abs_det_jacobian(x, t(x))``: values on numpy and ort-cpu and, where
    torch's depends on them, gradients to ``x`` and the parameters."""
    if dtype == np.float32 and request.node.callspec.id.endswith("compose_event-inv"):
        pytest.skip("in float32 the stick-breaking inverse of exp's output cancels in 1 - cumsum(y) (graphc's and "
                    "torch's differ by 2e-5); float64 checks it")
    params, x = [p.astype(dtype) for p in params], x.astype(dtype)
    fn = _apply(make, method)
    if differentiable:
        assert_matches_torch(fn, [*params, x], {}, R)
    else:
        assert_matches_torch(lambda M, **kw: fn(M, **kw), [], {"x": x, **{f"a{i}": p for i, p in enumerate(params)}},
                             R)


@pytest.mark.parametrize("make, params, x", [pytest.param(*c[1:4], id=c[0]) for c in TRANSFORMS])
def test_transform_attributes_match_torch(make, params, x):
    """``bijective``, ``sign`` (where torch has one; a Tensor for a Tensor parameter), the domain's and codomain's
    event dims, ``event_dim`` and ``forward_shape``/``inverse_shape``."""
    ref = make(torch.distributions, *map(torch.tensor, params))
    shape = tuple(ref.forward_shape(x.shape))
    try:
        want = ref.sign
    except NotImplementedError:
        want = None

    def f(*ps):
        ours = make(gc.distributions, *ps)
        assert ours.bijective == ref.bijective
        assert (ours.domain.event_dim, ours.codomain.event_dim) == (ref.domain.event_dim, ref.codomain.event_dim)
        if ref.domain.event_dim == ref.codomain.event_dim:
            assert ours.event_dim == ref.event_dim
        assert ours.forward_shape(x.shape) == shape and ours.inverse_shape(shape) == tuple(ref.inverse_shape(shape))
        if want is None:
            with pytest.raises(gc.CaptureError, match="has no sign"):
                ours.sign  # noqa: B018 - the property raises
        elif not isinstance(ours.sign, gc.Tensor):  # a number parameter's sign is an int (torch's a Tensor)
            assert ours.sign == int(want) and isinstance(ours.sign, int)
        return ours.sign if want is not None and isinstance(ours.sign, gc.Tensor) else gc.zeros(1)
    feeds = {f"p{i}": p for i, p in enumerate(params)}
    model = gc.capture(lambda **kw: f(*kw.values()), **feeds) if params else gc.capture(lambda u: f(), u=np.zeros(1))
    if isinstance(want, torch.Tensor) and params:
        np.testing.assert_array_equal(gc.Session(model).run(feeds)["output"], want.numpy())


def test_inverse_and_equality_follow_torch():
    t = gc.distributions.transforms
    exp = t.ExpTransform()
    assert exp.inv.inv is exp and exp.inv == t.ExpTransform().inv and exp == t.ExpTransform()
    assert t.AffineTransform(1.0, 2.0) == t.AffineTransform(1.0, 2.0) != t.AffineTransform(1.0, 3.0)
    compose = t.ComposeTransform([exp, t.AffineTransform(0.0, 2.0)])
    assert compose.inv.inv is compose and compose.inv.parts[0] == t.AffineTransform(0.0, 2.0).inv
    assert t.identity_transform.domain is gc.distributions.constraints.real


def test_cache_size_one_returns_the_cached_values():
    """As torch's: with ``cache_size=1`` the inverse of the last output is the last input (no new node)."""
    def f(x):
        t = gc.distributions.transforms.ExpTransform(cache_size=1)
        y = t(x)
        assert t.inv(y) is x and t(x) is y
        return y
    gc.capture(f, x=X)


# (id, make(d, *params), params, value for log_prob/cdf (icdf reads sigmoid(value)), methods)
DISTRIBUTIONS = [
    ("lognormal", lambda d, m, s: d.TransformedDistribution(d.Normal(m, s), [d.transforms.ExpTransform()]), [X, POS],
     POS, "log_prob cdf icdf"),
    ("logistic", lambda d, m, s: d.TransformedDistribution(d.Uniform(m * 0.0, m * 0.0 + 1.0),  # m's dtype
                                                           [d.SigmoidTransform().inv, d.AffineTransform(m, s)]),
     [X, POS], X, "log_prob cdf icdf"),
    ("decreasing", lambda d, m, s: d.TransformedDistribution(d.Normal(m, s), [d.ExpTransform(),
                                                                            d.AffineTransform(1.0, -2.0)]),
     [X, POS], 1.0 - POS, "log_prob cdf icdf"),
    ("signed_scale", lambda d, m, s: d.TransformedDistribution(d.Normal(m, 1.5), d.AffineTransform(m, s)), [X, S], X,
     "log_prob cdf icdf"),
    ("tanh_normal", lambda d, m, s: d.TransformedDistribution(d.Normal(m, s), [d.TanhTransform()]), [X, POS],
     np.tanh(X * 0.7), "log_prob cdf"),
    ("stick_breaking", lambda d, m, s: d.TransformedDistribution(d.Normal(m, s), d.StickBreakingTransform()),
     [X, POS], np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.4, 0.1]]), "log_prob"),
    ("mvn_affine", lambda d, m, s, tril: d.TransformedDistribution(
        d.MultivariateNormal(m, scale_tril=tril), d.AffineTransform(m, s, event_dim=1)),
     [X, S, np.diag([1.0, 2.0, 0.5])], X[::-1].copy(), "log_prob"),
    ("reshape", lambda d, m, s: d.TransformedDistribution(d.Independent(d.Normal(m, s), 1),
                                                          d.ReshapeTransform((3,), (3, 1))), [X, POS],
     X[:, :, None], "log_prob"),
    ("expanded_base", lambda d, m, e: d.TransformedDistribution(d.LogNormal(m, 0.5), d.PowerTransform(e)),
     [X[0], np.abs(S) + 0.5], POS, "log_prob cdf icdf"),
    ("chain_of_event_dims", lambda d, m, s: d.TransformedDistribution(
        d.Normal(m, s), [d.ExpTransform(), d.IndependentTransform(d.PowerTransform(2.0), 1)]), [X, POS], POS,
     "log_prob"),
]


def _method(make, method):
    def fn(M, *args):
        *params, value = args
        dist = make(D(M), *params)
        return dist.icdf(M.sigmoid(value)) if method == "icdf" else getattr(dist, method)(value)
    return fn


TD_CASES = [pytest.param(make, method, params, value, id=f"{name}-{method}")
            for name, make, params, value, methods in DISTRIBUTIONS for method in methods.split()]


@pytest.mark.parametrize("make, method, params, value", TD_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transformed_distribution_matches_torch(make, method, params, value, dtype):
    """log_prob (the transforms inverted, their log-dets summed over the event dims they leave out), cdf and icdf
    (flipped by a decreasing chain's sign, a Tensor sign too): values and gradients to the parameters and the value."""
    value = value if method != "icdf" else X
    assert_matches_torch(_method(make, method), [p.astype(dtype) for p in params] + [value.astype(dtype)], {}, R)


@pytest.mark.parametrize("make", [pytest.param(c[1], id=c[0]) for c in DISTRIBUTIONS])
@pytest.mark.parametrize("sample_shape", [(), (4,)])
def test_transformed_shapes_match_torch(make, sample_shape):
    """batch and event shapes (the event widened by the transforms), samples' and their log_prob's shapes."""
    params = next(c[2] for c in DISTRIBUTIONS if c[1] is make)
    ref = make(torch.distributions, *(torch.tensor(p, dtype=torch.float32) for p in params))
    assert_shapes_match_torch(lambda d: make(d, *(p.astype(np.float32) for p in params)), ref, sample_shape)


def test_expand_matches_torch():
    def make(d, m, e):
        return d.TransformedDistribution(d.Normal(m, 1.0), [d.ExpTransform(), d.PowerTransform(e)]).expand((4, 2, 3))
    ref = make(torch.distributions, torch.tensor(X[0]), torch.tensor(POS))
    ours = gc.capture(lambda m, e, v: make(gc.distributions, m, e).log_prob(v), m=X[0], e=POS, v=POS)
    assert ref.batch_shape == (4, 2, 3)
    got = gc.Session(ours).run({"m": X[0], "e": POS, "v": POS})["output"]
    np.testing.assert_allclose(got, ref.log_prob(torch.tensor(POS)).numpy(), rtol=1e-12)
    assert got.shape == (4, 2, 3)


NS = 20000


def _draws(make, method):
    model = gc.capture(lambda unused: getattr(make(gc.distributions), method)((NS,)), unused=np.zeros(1))
    return gc.Session(model, backend="numpy").run({"unused": np.zeros(1)})["output"].astype(np.float64)


@pytest.mark.parametrize("method", ["sample", "rsample"])
def test_samples_pass_ks_against_torch_cdf(method):
    def make(d):
        return d.TransformedDistribution(d.Normal(0.3, 0.8), [d.TanhTransform(), d.AffineTransform(1.0, -2.0)])
    x = np.sort(_draws(make, method))
    c = make(torch.distributions).cdf(torch.tensor(x)).numpy()
    n = len(x)
    ks = max(np.max(np.arange(1, n + 1) / n - c), np.max(c - np.arange(n) / n))
    assert ks < 1.95 / math.sqrt(n)


def test_sample_of_a_rejection_sampled_base():
    """``sample`` draws the base by ``sample`` (Gamma has no rsample): ``exp`` of Gamma(3, 4) draws has the mean
    ``(4 / 3)^3`` and the variance ``2^3 - (4 / 3)^6`` (the Gamma's moment generating function)."""
    x = _draws(lambda d: d.TransformedDistribution(d.Gamma(3.0, 4.0), d.ExpTransform()), "sample")
    mean, var = (4 / 3) ** 3, 8.0 - (4 / 3) ** 6
    assert np.all(x > 1.0) and abs(x.mean() - mean) < 5 * math.sqrt(var / NS)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_rsample_gradient_matches_torch_with_the_noise_fixed(backend):
    """The gradient of ``sum(rsample((5,)) * c)`` to the parameters: torch's ``tanh(a + b (m + s e))`` fed the noise
    graphc drew (read back from the sample)."""
    params = {"m": X, "s": POS, "a": S, "b": POS[::-1].copy()}

    def make(d, m, s, a, b):
        return d.TransformedDistribution(d.Normal(m, s), [d.AffineTransform(a, b), d.TanhTransform()])
    c = R.standard_normal((5, 2, 3))
    got = gc_grads(lambda M, *p: make(gc.distributions, *p).rsample((5,)), params, {}, c, backend=backend)
    eps = (np.arctanh(got["out"]) - params["a"]) / params["b"] - params["m"]
    eps /= params["s"]
    ts = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    (torch.tanh(ts["a"] + ts["b"] * (ts["m"] + ts["s"] * torch.tensor(eps))) * torch.tensor(c)).sum().backward()
    for k, t in ts.items():
        np.testing.assert_allclose(got[k], t.grad.numpy(), rtol=1e-6, atol=1e-8, err_msg=k)


@pytest.mark.parametrize("fn", [
    pytest.param(lambda M, x: gc.distributions.TransformedDistribution(
        gc.distributions.Normal(x[0], gc.exp(x[1])), [gc.distributions.StickBreakingTransform()]).log_prob(
            gc.softmax(gc.pad(x[2:], (0, 1)), -1)), id="stick_breaking_log_prob"),
    pytest.param(lambda M, x: gc.distributions.TransformedDistribution(
        gc.distributions.Normal(x[0], 1.0), [gc.distributions.AffineTransform(x[1], gc.exp(x[2])),
                                             gc.distributions.SigmoidTransform()]).cdf(gc.sigmoid(x[3])),
                 id="logistic_cdf"),
    pytest.param(lambda M, x: gc.distributions.LowerCholeskyTransform()(x[:3, :3][None]).sum(), id="lower_cholesky"),
])
def test_gradients_match_central_differences(fn):
    assert_grads_match_central_differences(fn, R.standard_normal((5, 3)) * 0.5)


# constraints torch's registries map, and the point fed to the transform found
CONSTRAINTS = [
    ("real", lambda c: c.real, X),
    ("positive", lambda c: c.positive, X),
    ("nonnegative", lambda c: c.nonnegative, X),
    ("greater_than", lambda c: c.greater_than(1.5), X),
    ("less_than", lambda c: c.less_than(-1.0), X),
    ("interval", lambda c: c.interval(-2.0, 3.0), X),
    ("unit_interval", lambda c: c.unit_interval, X),
    ("half_open_interval", lambda c: c.half_open_interval(0.5, 1.5), X),
    ("simplex", lambda c: c.simplex, X),
    ("independent", lambda c: c.independent(c.positive, 1), X),
]


@pytest.mark.parametrize("registry", ["biject_to", "transform_to"])
@pytest.mark.parametrize("con, x", [pytest.param(c[1], c[2], id=c[0]) for c in CONSTRAINTS] + [
    pytest.param(lambda c: c.lower_cholesky, SQ, id="lower_cholesky"),
    pytest.param(lambda c: c.positive_definite, SQ, id="positive_definite")])
def test_biject_to_and_transform_to_match_torch(registry, con, x):
    """The transform's values and log-det (where it has one), and its codomain holds them."""
    try:
        ref = getattr(torch.distributions, registry)(con(torch.distributions.constraints))
    except NotImplementedError:
        with pytest.raises(gc.CaptureError, match=rf"{registry}\(\): has no transform onto constraints"):
            gc.capture(lambda x: getattr(gc.distributions, registry)(con(gc.distributions.constraints))(x), x=x)
        return
    def fn(M, x):
        t = getattr(D(M), registry)(con(D(M).constraints))
        return t.log_abs_det_jacobian(x, t(x)) if ref.bijective else t(x)
    assert_matches_torch(lambda M, x: getattr(D(M), registry)(con(D(M).constraints))(x), [x], {}, R)
    assert_matches_torch(fn, [], {"x": x}, R)  # the log-dets' gradients: test_transform_matches_torch


def test_families_support_maps_by_its_name():
    """A family's ``support`` pair reads as the constraint of its name: ``biject_to(Gamma(...).support)``."""
    def f(x):
        t = gc.distributions.biject_to(gc.distributions.Gamma(x, 1.0).support)
        assert isinstance(t, gc.distributions.ComposeTransform)
        assert isinstance(t.parts[0], gc.distributions.ExpTransform)
        return t(x)
    gc.capture(f, x=X)


def test_constraint_check_reads_constants_by_event():
    c = gc.distributions.constraints

    def f(x):
        np.testing.assert_array_equal(c.simplex.check(constant(np.array([[0.2, 0.8], [0.5, 0.6]]))), [True, False])
        np.testing.assert_array_equal(c.independent(c.positive, 1).check(np.array([[1.0, 2.0], [1.0, -1.0]])),
                                      [True, False])
        np.testing.assert_array_equal(c.interval(0.0, 2.0).check(np.array([0.0, 2.5])), [True, False])
        with pytest.raises(gc.CaptureError, match="constant's values only"):
            c.real.check(x)
        return x
    gc.capture(f, x=X)


def test_kl_of_transformed_distributions_matches_torch():
    def kl(M, m1, s1, m2, s2):
        d = D(M)
        return d.kl_divergence(d.TransformedDistribution(d.Normal(m1, s1), [d.ExpTransform()]),
                               d.TransformedDistribution(d.Normal(m2, s2), [d.ExpTransform()]))
    assert_matches_torch(kl, [X, POS, X[::-1].copy(), POS[::-1].copy()], {}, R)
    with pytest.raises(gc.CaptureError, match="different transforms"):
        gc.capture(lambda m: gc.distributions.kl_divergence(
            gc.distributions.TransformedDistribution(gc.distributions.Normal(m, 1.0), gc.distributions.ExpTransform()),
            gc.distributions.TransformedDistribution(gc.distributions.Normal(m, 1.0),
                                                     gc.distributions.TanhTransform())),
            m=X)


def _refused(fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=X)
    assert "test_dsl_distributions_transforms.py:" in str(info.value)


@pytest.mark.parametrize("fn, match", [
    (lambda x: gc.distributions.AffineTransform("a", 1.0)(x),
     r"AffineTransform.*loc must be a Tensor, an array or a number, got str"),
    (lambda x: gc.distributions.AffineTransform(0.0, 1.0, event_dim=-1)(x), r"event_dim must be an int >= 0, got -1"),
    (lambda x: gc.distributions.PowerTransform(None)(x),
     r"exponent must be a Tensor, an array or a number, got NoneType"),
    (lambda x: gc.distributions.ExpTransform(cache_size=2)(x), r"cache_size must be 0 or 1.*got 2"),
    (lambda x: gc.distributions.ExpTransform()(np.ones(3)), r"ExpTransform.*x must be a Tensor, got ndarray"),
    (lambda x: gc.distributions.ExpTransform().inv(1.0), r"ExpTransform.*y must be a Tensor, got float"),
    (lambda x: gc.distributions.ReshapeTransform((3,), (2, 2))(x),
     r"in_shape \(3,\) and out_shape \(2, 2\) have different numbers of elements"),
    (lambda x: gc.distributions.ReshapeTransform((2,), (2, 1))(x), r"x of shape \(2, 3\) does not end in \(2,\)"),
    (lambda x: gc.distributions.ComposeTransform([gc.exp])(x),
     r"parts must be a list of gc.distributions.transforms Transforms"),
    (lambda x: gc.distributions.IndependentTransform(gc.distributions.ExpTransform(), -1)(x),
     r"reinterpreted_batch_ndims must be an int >= 0, got -1"),
    (lambda x: gc.distributions.IndependentTransform(gc.distributions.ExpTransform(), 3)(x),
     r"x needs at least 3 dims \(the event dim\), got float64\[2,3\]"),
    (lambda x: gc.distributions.CatTransform([gc.distributions.ExpTransform()], dim=1, lengths=[2])(x),
     r"x has 3 entries on dim 1, the lengths \[2\] sum to 2"),
    (lambda x: gc.distributions.CatTransform([gc.distributions.ExpTransform()], lengths=[1, 2])(x),
     r"lengths must be 1 ints >= 0 \(one per transform\), got \[1, 2\]"),
    (lambda x: gc.distributions.StackTransform([gc.distributions.ExpTransform()], dim=4)(x),
     r"dim 4 is out of range for x"),
    (lambda x: gc.distributions.StackTransform([gc.distributions.ExpTransform()], dim=1)(x),
     r"x has 3 entries on dim 1, one per transform needs 1"),
    (lambda x: gc.distributions.AbsTransform().log_abs_det_jacobian(x, x), r"has no log_abs_det_jacobian"),
    (lambda x: gc.distributions.TransformedDistribution(gc.exp, gc.distributions.ExpTransform()),
     r"base_distribution must be a gc.distributions Distribution, got function"),
    (lambda x: gc.distributions.TransformedDistribution(gc.distributions.Normal(x, 1.0), [gc.exp]),
     r"transforms must be a list of gc.distributions.transforms Transforms"),
    (lambda x: gc.distributions.TransformedDistribution(gc.distributions.Normal(0.0, 1.0),
                                                        gc.distributions.StickBreakingTransform()),
     r"base_distribution's shape \(\) has fewer dims than the transforms' event dim 1"),
    (lambda x: gc.distributions.TransformedDistribution(gc.distributions.Normal(x, 1.0),
                                                        gc.distributions.ExpTransform()).log_prob(-1.0),
     r"value must satisfy constraints.greater_than\(lower_bound=0.0\)"),
    (lambda x: gc.distributions.TransformedDistribution(gc.distributions.Normal(x, 1.0),
                                                        gc.distributions.ExpTransform()).log_prob(np.ones(4)),
     r"value float64\[4\] does not broadcast with the batch and event shape \(2, 3\)"),
    (lambda x: gc.distributions.biject_to("positive"),
     r"constraint must be a gc.distributions.constraints Constraint, got 'positive'"),
    (lambda x: gc.distributions.constraints.independent(gc.distributions.constraints.real, 1.5),
     r"reinterpreted_batch_ndims must be an int >= 0, got 1.5"),
])
def test_bad_arguments_are_refused_naming_them(fn, match):
    _refused(fn, match)


def test_affine_log_det_counts_every_event_element():
    """A 0-d Tensor ``scale`` with ``event_dim=1``: graphc's log-det is ``3 log 2`` over a 3-wide event, torch's
    value for the number ``2.0`` (torch's for a 0-d Tensor counts ``log 2`` once)."""
    ref = torch.distributions.AffineTransform(0.0, 2.0, event_dim=1)
    want = ref.log_abs_det_jacobian(torch.tensor(X), ref(torch.tensor(X))).numpy()
    def ladj(x, s):
        t = gc.distributions.AffineTransform(0.0, s, event_dim=1)
        return t.log_abs_det_jacobian(x, t(x))
    model = gc.capture(ladj, x=X, s=np.array(2.0))
    np.testing.assert_allclose(gc.Session(model).run({"x": X, "s": np.array(2.0)})["output"], want, rtol=1e-12)


@pytest.mark.parametrize("make", [
    pytest.param(lambda d, a: d.LogNormal(a, 1.5), id="lognormal"),
    pytest.param(lambda d, a: d.HalfNormal(a * a + 0.5), id="half_normal"),
    pytest.param(lambda d, a: d.HalfCauchy(a * a + 0.5), id="half_cauchy"),
    pytest.param(lambda d, a: d.Pareto(a * a + 0.5, 2.0), id="pareto"),
])
def test_families_torch_builds_by_transforms_are_transformed_distributions(make):
    """``isinstance(..., TransformedDistribution)`` and the transforms' types as torch's; the family's own log_prob
    stays torch's."""
    ref = make(torch.distributions, torch.tensor(X))

    def f(a):
        ours = make(gc.distributions, a)
        assert isinstance(ours, gc.distributions.TransformedDistribution) == isinstance(
            ref, torch.distributions.TransformedDistribution) is True
        assert [type(t).__name__ for t in ours.transforms] == [type(t).__name__ for t in ref.transforms]
        return ours.log_prob(a * a + 1.0)
    got = gc.Session(gc.capture(f, a=X)).run({"a": X})["output"]
    np.testing.assert_allclose(got, ref.log_prob(torch.tensor(X * X + 1.0)).numpy(), rtol=1e-12)


def test_kl_of_a_transformed_distribution_and_lognormal_matches_torch():
    def kl(M, m1, m2, s):
        d = D(M)
        return d.kl_divergence(d.TransformedDistribution(d.Normal(m1, s), d.ExpTransform()), d.LogNormal(m2, 1.5))
    assert_matches_torch(kl, [X, X[::-1].copy(), POS], {}, R)


def test_symbolic_batch_dim_matches_torch():
    """A batch dim fed at run time: the shapes keep its name, log_prob and draws take the fed size."""
    def f(x):
        d = gc.distributions
        td = d.TransformedDistribution(d.Normal(x, 1.0), [d.AffineTransform(0.5, np.array([1.0, 2.0, 3.0])),
                                                          d.StickBreakingTransform()])
        assert (td.batch_shape, td.event_shape) == (("N",), (4,))
        return {"lp": td.log_prob(gc.softmax(gc.pad(x, (0, 1)), -1)), "s": td.rsample((2,))}
    model = gc.capture(f, x=gc.spec("float64", ("N", 3)))
    x = R.standard_normal((5, 3))
    t = torch.distributions
    xt = torch.tensor(x)
    scale = torch.tensor([1.0, 2.0, 3.0], dtype=xt.dtype)
    ref = t.TransformedDistribution(t.Normal(xt, 1.0), [t.AffineTransform(0.5, scale), t.StickBreakingTransform()])
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"x": x})
        want = ref.log_prob(torch.softmax(torch.nn.functional.pad(xt, (0, 1)), -1)).numpy()
        np.testing.assert_allclose(out["lp"], want, rtol=1e-12)
        assert out["s"].shape == (2, 5, 4) and np.allclose(out["s"].sum(-1), 1.0)
