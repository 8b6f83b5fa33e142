"""float64 ``F.interpolate`` / ``nn.Upsample`` against torch 2.13: (bi/tri)linear and bicubic by non-representable
scale factors (ONNX Resize's float32 scales were 5e-7 off torch's double coordinates), by size and with
align_corners, values and gradients to 1e-12 on numpy and ort-cpu; float32 keeps its one Resize node."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(0)
SHAPES = {"linear": (2, 3, 9), "bilinear": (2, 3, 7, 6), "bicubic": (2, 3, 7, 6), "trilinear": (1, 2, 5, 4, 6)}
CASES = [{"scale_factor": 1.7}, {"scale_factor": 0.3}, {"scale_factor": 0.6}, {"scale_factor": 1.1},
         {"scale_factor": 2.5, "recompute_scale_factor": True}, {"size": 11}, {"size": 3},
         {"scale_factor": 1.7, "align_corners": True}, {"size": 11, "align_corners": True}, {"size": 1}]


def _torch(x, mode, kw):
    t = torch.from_numpy(x).requires_grad_()
    y = torch.nn.functional.interpolate(t, mode=mode, **kw)
    (y * torch.from_numpy(np.cos(np.arange(y.numel())).reshape(y.shape))).sum().backward()
    return y.detach().numpy(), t.grad.numpy()


def _forward_vjp(x, mode, kw, w):
    """``x``'s gradient of ``(interpolate(x) * w).sum()`` from torch's forward alone (each plane's map applied to
    the unit inputs), for where torch's bicubic backward copies at equal sizes though its forward interpolates."""
    spatial = x.shape[2:]
    units = torch.eye(int(np.prod(spatial)), dtype=torch.float64).reshape(-1, 1, *spatial)
    columns = torch.nn.functional.interpolate(units, mode=mode, **kw).reshape(len(units), -1).numpy()
    return (w.reshape(*x.shape[:2], -1) @ columns.T).reshape(x.shape)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kw", CASES, ids=[str(sorted(c.items())) for c in CASES])
@pytest.mark.parametrize("mode", list(SHAPES))
def test_float64_matches_torch(mode, kw, backend):
    x = RNG.standard_normal(SHAPES[mode])
    if "size" in kw:
        kw = {**kw, "size": (kw["size"],) * (x.ndim - 2)}
    want, grad = _torch(x, mode, kw)
    w = np.cos(np.arange(want.size)).reshape(want.shape)
    if mode == "bicubic" and want.shape == x.shape:
        grad = _forward_vjp(x, mode, kw, w)
    model = gc.capture(lambda x: {"y": F.interpolate(x, mode=mode, **kw),
                                  "loss": (F.interpolate(x, mode=mode, **kw) * w).sum()},
                       x=gc.spec("float64", x.shape))
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    np.testing.assert_allclose(out["y"], want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["x_grad"], grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_upsample_module_per_dim_factors_float64(backend):
    x = RNG.standard_normal((2, 3, 6, 7))
    up = gc.nn.Upsample(scale_factor=(0.45, 1.7), mode="bicubic")
    got = gc.Session(gc.capture(up, x=gc.spec("float64", x.shape)), backend=backend).run({"x": x})
    want = torch.nn.Upsample(scale_factor=(0.45, 1.7), mode="bicubic")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", list(SHAPES))
def test_float32_keeps_one_resize(mode):
    """float32 is ONNX's Resize as before: one node, no weight matrices."""
    model = gc.capture(lambda x: F.interpolate(x, scale_factor=1.7, mode=mode), x=gc.spec("float32", SHAPES[mode]))
    assert Counter(n.op_type for n in model.proto.graph.node) == Counter({"Resize": 1, "Constant": 1})
