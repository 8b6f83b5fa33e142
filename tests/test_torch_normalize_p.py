"""``F.normalize`` at torch 2.13's every ``p`` (``x / max(norm(x, p, dim), eps)``): values and gradients
against torch's autograd in float64 on numpy and ort-cpu, rows with tied maxima, a zero row (the ``eps``
floor) and float32; a ``p`` that is not a number is refused."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc.errors import CaptureError

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(0)
PS = [2, 1, 3, 0.5, float("inf"), float("-inf"), 0, -1.5]


def _both(x, p, dim, backend, **kw):
    """graphc's and torch's (value, gradient of a cos-weighted sum)."""
    w = np.cos(np.arange(x.size)).reshape(x.shape).astype(x.dtype)
    model = gc.capture(lambda x: {"y": F.normalize(x, p, dim, **kw), "loss": (F.normalize(x, p, dim, **kw) * w).sum()},
                       x=gc.spec(x.dtype, x.shape))
    got = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    t = torch.from_numpy(x).requires_grad_()
    y = torch.nn.functional.normalize(t, p, dim, **kw)
    (y * torch.from_numpy(w)).sum().backward()
    return (got["y"], got["x_grad"]), (y.detach().numpy(), t.grad.numpy())


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("p", PS, ids=str)
def test_normalize_any_p_matches_torch(p, backend):
    x = RNG.standard_normal((3, 4, 5))
    x[0, :, 0] = [2.0, -2.0, 1.0, 0.5]  # tied largest magnitudes along dim 1
    x[1, :, 1] = [0.25, -1.0, 0.25, -0.25]  # tied smallest
    x[2, :, 2] = 0.0  # a zero vector: the eps floor
    (got, grad), (want, wgrad) = _both(x, p, 1, backend)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    if p < 1:  # |x|**p's slope is infinite at 0, in torch's too: compare away from the zero vector
        grad, wgrad = grad[:2], wgrad[:2]
    np.testing.assert_allclose(grad, wgrad, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("p", [1, float("inf"), 3])
def test_normalize_float32_and_eps_match_torch(p, backend):
    x = (RNG.standard_normal((4, 6)) * 1e-3).astype(np.float32)
    (got, grad), (want, wgrad) = _both(x, p, -1, backend, eps=1e-3)  # some rows' norms under eps
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, wgrad, rtol=1e-5, atol=1e-6 * np.abs(wgrad).max())  # float32 cancellation


def test_normalize_p_not_a_number_is_refused():
    with pytest.raises(CaptureError, match=r"normalize p='nuc'; expected a number"):
        gc.capture(lambda x: F.normalize(x, "nuc"), x=gc.spec("float32", (2, 3)))
