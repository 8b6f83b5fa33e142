"""RReLU / F.rrelu and F.gumbel_softmax: the eval-mode RReLU against torch (values and gradients);
the random forms by their statistics on the numpy and ort-cpu backends (the slopes' range, mean
and variance; the Gumbel-max sample frequencies), never by draws; the gradients through the same
draw (RReLU's slope, gumbel_softmax's straight-through estimator against the soft sample's, both
drawn by numpy sessions of one seed); the full ONNX checker; and the refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

F = gc.nn.functional
BACKENDS = ("numpy", "ort-cpu")
X = np.random.default_rng(2).standard_normal((3, 7)).astype(np.float32)


def _grad_model(fn, x, c):
    """``{"output": fn(x), "loss": sum(fn(x) * c)}`` and the gradient of the loss by x."""
    model = gc.capture(lambda x, c: {"output": (y := fn(x)), "loss": gc.sum(y * c)}, x=x, c=c)
    onnx.checker.check_model(model.proto, full_check=True)
    return gc.grad(model, "loss", wrt=["x"])


@pytest.mark.parametrize("lower,upper", [(1 / 8, 1 / 3), (0.05, 0.5)])
def test_rrelu_eval_matches_torch(lower, upper):
    torch = pytest.importorskip("torch")
    xt = torch.tensor(X, requires_grad=True)
    want = torch.nn.functional.rrelu(xt, lower, upper, training=False)
    c = np.random.default_rng(0).standard_normal(X.shape).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in BACKENDS:
        got = gc_grads(lambda F, x: nn.RReLU(lower, upper)(x), {"x": X}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-6, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-6, err_msg=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rrelu_training_slopes_are_uniform_and_are_the_gradient(backend):
    lower, upper = 0.1, 0.4
    x = np.where(np.arange(40000) % 4 == 0, 2.0, -1.5).astype(np.float32)
    grads = _grad_model(lambda x: F.rrelu(x, lower, upper, training=True), x, np.ones_like(x))
    session = gc.Session(grads, backend=backend)
    out, again = session.run({"x": x, "c": np.ones_like(x)}), session.run({"x": x, "c": np.ones_like(x)})
    neg = x < 0
    slopes = out["output"][neg] / x[neg]
    assert lower <= slopes.min() and slopes.max() <= upper
    assert abs(slopes.mean() - (lower + upper) / 2) < 0.003
    assert abs(slopes.var() - (upper - lower) ** 2 / 12) < 0.0005
    np.testing.assert_array_equal(out["output"][~neg], x[~neg])
    np.testing.assert_allclose(out["x_grad"][neg], slopes, rtol=1e-6)  # the gradient is this run's slope
    np.testing.assert_array_equal(out["x_grad"][~neg], 1)
    assert not np.array_equal(again["output"], out["output"])  # each run draws anew


def test_rrelu_module_is_random_in_training_mode_only():
    layer = nn.RReLU()
    assert "RandomUniformLike" not in [n.op_type for n in gc.capture(layer, x=X).ir.graph]
    layer.train()
    model = gc.capture(layer, x=X)
    assert "RandomUniformLike" in [n.op_type for n in model.ir.graph]
    got = gc.Session(model, backend="numpy").run({"x": X})["output"]
    slopes = got[X < 0] / X[X < 0]
    assert np.all((slopes >= 1 / 8) & (slopes <= 1 / 3)) and slopes.std() > 0


def test_rrelu_trains_in_the_training_graphs():
    """A Linear before a training-mode RReLU: train_step runs the draw on both backends and lowers the loss."""
    net = nn.Sequential(nn.Linear(4, 8), nn.RReLU(), nn.Linear(8, 1)).train()
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float32", ("N", 4))), gc.losses.mse("output", label="y"),
                                gc.optim.SGD(0.05))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x @ rng.standard_normal((4, 1))).astype(np.float32)
    for backend in BACKENDS:
        trainer = gc.Trainer(arts, backend=backend)
        losses = [trainer.step({"x": x, "y": y}) for _ in range(30)]
        assert np.all(np.isfinite(losses)) and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), backend


LOGITS = np.array([1.0, 0.0, -0.5, 2.0], np.float32)
PROBS = np.exp(LOGITS) / np.exp(LOGITS).sum()


@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gumbel_softmax_samples_follow_the_softmax(backend, hard):
    """Gumbel-max: the argmax of a sample is category k with probability softmax(logits)[k]."""
    logits = np.tile(LOGITS, (20000, 1))
    model = gc.capture(lambda x: F.gumbel_softmax(x, tau=0.5, hard=hard), x=logits)
    onnx.checker.check_model(model.proto, full_check=True)
    y = gc.Session(model, backend=backend).run({"x": logits})["output"]
    np.testing.assert_allclose(y.sum(-1), 1, rtol=1e-5)
    if hard:
        assert set(np.unique(y)) == {0.0, 1.0}
    freq = np.bincount(y.argmax(-1), minlength=4) / len(y)
    np.testing.assert_allclose(freq, PROBS, atol=0.012)


@pytest.mark.parametrize("tau,dim", [(1.0, -1), (0.3, 0)])
def test_gumbel_softmax_hard_gradient_is_the_soft_samples(tau, dim):
    """Straight through: two numpy sessions (each seeded 0) draw the same noise, so the hard sample is
    the one-hot of the soft one's argmax and the hard gradient equals the soft gradient."""
    x = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)
    c = np.random.default_rng(4).standard_normal((5, 6)).astype(np.float32)
    runs = {}
    for hard in (False, True):
        grads = _grad_model(lambda x: F.gumbel_softmax(x, tau, hard, dim=dim), x, c)
        runs[hard] = gc.Session(grads, backend="numpy").run({"x": x, "c": c})
    soft, hard = runs[False], runs[True]
    expected = np.zeros_like(x)
    np.put_along_axis(expected, soft["output"].argmax(dim, keepdims=True), 1.0, dim)
    np.testing.assert_allclose(hard["output"], expected, atol=1e-6)
    y = soft["output"]  # the soft sample's gradient, in closed form: y * (c - sum(y * c)) / tau
    np.testing.assert_allclose(soft["x_grad"], y * (c - (y * c).sum(dim, keepdims=True)) / tau, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(hard["x_grad"], soft["x_grad"], rtol=1e-5, atol=1e-7)


def test_refusals_name_the_argument():
    with pytest.raises(gc.GraphError, match=r"rrelu.*lower \(0.5\) must be <= upper \(0.2\)"):
        gc.capture(lambda x: F.rrelu(x, 0.5, 0.2), x=X)
    with pytest.raises(gc.GraphError, match=r"gumbel_softmax.*tau must be > 0, got 0"):
        gc.capture(lambda x: F.gumbel_softmax(x, tau=0), x=X)
