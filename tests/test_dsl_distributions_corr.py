"""``gc.distributions.transforms.CorrCholeskyTransform`` and ``constraints.corr_cholesky``
(graphc/dsl/distributions/transforms_corr.py) against torch.distributions: the map, its inverse and
log-abs-det-Jacobian (float64 and float32 on numpy and ort-cpu, gradients against torch.autograd and float64
central differences, a symbolic batch dim), the shapes, biject_to/transform_to, the constraint's check, and the
errors naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

try:
    from distribution_util import D
    from torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, run_both
except ImportError:  # tests/ collected as a package
    from tests.distribution_util import D
    from tests.torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, run_both

torch = pytest.importorskip("torch")
R = np.random.default_rng(5)
X = R.standard_normal((2, 3, 6))  # 4 x 4 factors
BIG = np.array([[0.3, -40.0, 25.0]])  # tanh clamped to 1 - eps


def _method(method, registry=None):
    def fn(M, x):
        d = D(M)
        t = getattr(d, registry)(d.constraints.corr_cholesky) if registry else d.transforms.CorrCholeskyTransform()
        y = t(x)
        return {"call": lambda: y, "inv": lambda: t.inv(y), "ladj": lambda: t.log_abs_det_jacobian(x, y)}[method]()
    return fn


@pytest.mark.parametrize("method", ["call", "inv", "ladj"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_matches_torch(method, dtype):
    assert_matches_torch(_method(method), [X.astype(dtype)], {}, R)


@pytest.mark.parametrize("method", ["call", "ladj"])
def test_clamped_and_small_inputs_match_torch(method):
    """tanh's clamp at ``1 - eps`` (values only: torch's clamp passes no gradient there) and a 2 x 2 factor."""
    for x in (BIG, X[..., :1]):
        assert_matches_torch(lambda M, x: _method(method)(M, x), [], {"x": x}, R)


@pytest.mark.parametrize("registry", ["biject_to", "transform_to"])
def test_registries_map_corr_cholesky(registry):
    ref = getattr(torch.distributions, registry)(torch.distributions.constraints.corr_cholesky)
    assert type(ref).__name__ == "CorrCholeskyTransform"
    assert_matches_torch(_method("ladj", registry), [X], {}, R)


@pytest.mark.parametrize("method", ["call", "inv", "ladj"])
def test_gradients_match_float64_central_differences(method):
    assert_grads_match_central_differences(_method(method), X[0] * 0.7)


def test_symbolic_batch_and_attributes():
    ours, ref = gc.distributions.CorrCholeskyTransform(), torch.distributions.transforms.CorrCholeskyTransform()
    assert ours.bijective and (ours.domain.event_dim, ours.codomain.event_dim) == (1, 2)
    assert ours == gc.distributions.transforms.CorrCholeskyTransform()
    assert ours.forward_shape((5, 10)) == tuple(ref.forward_shape((5, 10))) == (5, 5, 5)
    assert ours.inverse_shape((2, 4, 4)) == tuple(ref.inverse_shape((2, 4, 4))) == (2, 6)
    model = gc.capture(lambda x: {"y": ours(x), "back": ours.inv(ours(x))}, x=gc.spec("float64", ("N", 6)))
    for batch in (X[0], X[0, :1]):
        got = run_both(model, {"x": batch})
        np.testing.assert_allclose(got["y"], ref(torch.from_numpy(batch)).numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got["back"], batch, rtol=1e-10, atol=1e-12)


def test_constraint_check_matches_torch():
    """Unit rows within torch's ``10 n eps``; a lower-Cholesky factor with a long row fails."""
    y = torch.distributions.transforms.CorrCholeskyTransform()(torch.from_numpy(X))
    bad = y.clone()
    bad[0, 1, 2, 0] += 1e-3
    for v in (y, bad, y.float()):
        np.testing.assert_array_equal(gc.distributions.constraints.corr_cholesky.check(v.numpy()),
                                      torch.distributions.constraints.corr_cholesky.check(v).numpy())
    assert not gc.distributions.constraints.corr_cholesky.check(bad.numpy())[0, 1]


ERRORS = [
    (lambda t, x: t(x[..., :5]), r"the last dim 5 is not a flattened strict lower triangle"),
    (lambda t, x: t.inv(x), r"y must be square matrices, got float64\[2,3,6\]"),
    (lambda t, x: t.inverse_shape((3, 4)), r"shape \(3, 4\) is not of square matrices"),
]


@pytest.mark.parametrize("fn,match", ERRORS, ids=[e[1][:30] for e in ERRORS])
def test_bad_arguments_name_the_problem(fn, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(lambda x: fn(gc.distributions.CorrCholeskyTransform(), x), x=X)
