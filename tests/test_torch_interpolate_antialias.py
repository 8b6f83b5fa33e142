"""``F.interpolate(..., antialias=True)`` against torch 2.13: antialiased bilinear and bicubic down- and
upsampling by size and by scale factor (align_corners too), values in float64 and float32 and float64
gradients on numpy and ort-cpu; what torch refuses is refused."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc.errors import CaptureError

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(0)
CASES = [{"size": (8, 11)}, {"size": (5, 7)}, {"size": (16, 20)}, {"size": (34, 12)}, {"size": (1, 1)},
         {"scale_factor": 0.3}, {"scale_factor": (0.45, 1.7)}, {"scale_factor": 0.3, "recompute_scale_factor": True},
         {"size": (8, 11), "align_corners": True}]


def _torch(x, mode, kw):
    t = torch.from_numpy(x).requires_grad_()
    y = torch.nn.functional.interpolate(t, mode=mode, antialias=True, **kw)
    (y * torch.from_numpy(np.cos(np.arange(y.numel())).reshape(y.shape)).to(y.dtype)).sum().backward()
    return y.detach().numpy(), t.grad.numpy()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kw", CASES, ids=[str(sorted(c.items())) for c in CASES])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialias_matches_torch(mode, kw, backend):
    x = RNG.standard_normal((2, 3, 17, 23))
    want, grad = _torch(x, mode, kw)
    w = np.cos(np.arange(want.size)).reshape(want.shape)
    model = gc.capture(lambda x: {"y": F.interpolate(x, mode=mode, antialias=True, **kw),
                                  "loss": (F.interpolate(x, mode=mode, antialias=True, **kw) * w).sum()},
                       x=gc.spec("float64", x.shape))
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    np.testing.assert_allclose(out["y"], want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(out["x_grad"], grad, rtol=1e-13, atol=1e-14)
    x32 = x.astype(np.float32)
    got = gc.Session(gc.capture(lambda x: F.interpolate(x, mode=mode, antialias=True, **kw),
                                x=gc.spec("float32", x.shape)), backend=backend).run({"x": x32})
    np.testing.assert_allclose(next(iter(got.values())), _torch(x32, mode, kw)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn, spec, match", [
    (lambda x: F.interpolate(x, size=(4, 5), mode="nearest", antialias=True), ("float32", (1, 2, 8, 9)),
     r"antialias=True takes mode 'bilinear' or 'bicubic' and a 4-D float16/32/64 input, as torch's, got "
     r"mode='nearest', rank 4"),
    (lambda x: F.interpolate(x, size=4, mode="linear", antialias=True), ("float32", (1, 2, 8)),
     r"got mode='linear', rank 3"),
    (lambda x: F.interpolate(x, size=(4, 5), mode="bilinear", antialias=True), ("float32", (1, 2, "H", 9)),
     r"antialias=True needs static spatial dims"),
], ids=["nearest", "3-D", "symbolic"])
def test_antialias_refusals(fn, spec, match):
    with pytest.raises(CaptureError, match=match):
        gc.capture(fn, x=gc.spec(*spec))
