"""torch 2.13's softmaxes without ``dim`` (``F.softmax(x)``, ``nn.Softmax()``): torch's deprecated implicit
dim (0 for a 0-, 1- or 3-D input, else 1) and its UserWarning, values and gradients on numpy and ort-cpu
(float64)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn
from graphc.errors import CaptureError

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(0)
NAMES = ("softmax", "log_softmax", "softmin")
MODULES = {"softmax": "Softmax", "log_softmax": "LogSoftmax", "softmin": "Softmin"}
SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 3, 4, 5), (2, 2, 3, 2, 3)]


def _torch(name, x, module):
    t = torch.from_numpy(x).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = getattr(torch.nn, MODULES[name])()(t) if module else getattr(torch.nn.functional, name)(t)
    (out * torch.from_numpy(np.cos(np.arange(out.numel())).reshape(out.shape))).sum().backward()
    return out.detach().numpy(), t.grad.numpy()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("module", [False, True], ids=["F", "nn"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_implicit_dim_matches_torch(shape, name, module, backend):
    x = RNG.standard_normal(shape)
    fn = getattr(nn, MODULES[name])() if module else getattr(F, name)
    weights = np.cos(np.arange(x.size)).reshape(shape)
    with pytest.warns(UserWarning, match=f"Implicit dimension choice for {name} has been deprecated. Change the "
                                         f"call to include dim=X as an argument."):
        model = gc.capture(lambda x: {"y": fn(x), "loss": (fn(x) * weights).sum()},
                           x=gc.spec("float64", shape))
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    want, grad = _torch(name, x, module)
    np.testing.assert_allclose(out["y"], want, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(out["x_grad"], grad, rtol=1e-12, atol=1e-14)


def test_a_given_dim_does_not_warn_and_unknown_rank_is_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc.capture(lambda x: F.softmax(x, -1) + nn.Softmax(1)(x), x=gc.spec("float32", (2, 3, 4)))
    with pytest.raises(CaptureError, match=r"log_softmax\(dim=None\) takes torch's implicit dim from the input's "
                                           r"rank, which is unknown here: give dim"):
        gc.capture(lambda x: F.log_softmax(x), x=gc.spec("float32", None))
