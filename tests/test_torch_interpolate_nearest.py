"""Legacy ``F.interpolate(mode="nearest")`` / ``nn.Upsample`` against torch 2.13, float32 and float64, bit for bit:
ONNX Resize divided by the float32 factor (7 by 0.6 read input 4 where torch reads 5); now a Gather per static dim
by torch's index rule, its gradient (the Gather's index-add) torch's backward to 1e-12."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F

torch = pytest.importorskip("torch")
SHAPES = {1: (2, 3, 7), 2: (2, 3, 7, 6), 3: (1, 2, 5, 4, 7)}
CASES = [{"scale_factor": 0.6}, {"scale_factor": 1.7}, {"scale_factor": 0.3}, {"scale_factor": 2.0}, {"scale_factor": 3.0},
         {"scale_factor": 1.05},
         {"scale_factor": 2.5, "recompute_scale_factor": True}, {"size": 11}, {"size": 3}, {"size": 1}]


def _run(x, kw, backend, dtype):
    w = np.cos(np.arange(np.prod(torch.nn.functional.interpolate(torch.from_numpy(x), **kw).shape)))
    t = torch.from_numpy(x).requires_grad_()
    want = torch.nn.functional.interpolate(t, mode="nearest", **kw)
    (want * torch.from_numpy(w.reshape(want.shape).astype(x.dtype))).sum().backward()
    w = w.reshape(want.shape).astype(x.dtype)
    model = gc.capture(lambda x: {"y": F.interpolate(x, mode="nearest", **kw),
                                  "loss": (F.interpolate(x, mode="nearest", **kw) * w).sum()},
                       x=gc.spec(dtype, x.shape))
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    return out, want.detach().numpy(), t.grad.numpy()


def _forward_vjp(x, kw, w):
    """``x``'s gradient of ``(interpolate(x) * w).sum()`` from torch's forward on each unit input."""
    units = torch.eye(int(np.prod(x.shape[2:])), dtype=torch.float64).reshape(-1, 1, *x.shape[2:])
    columns = torch.nn.functional.interpolate(units, mode="nearest", **kw).reshape(len(units), -1).numpy()
    return (w.reshape(*x.shape[:2], -1) @ columns.T).reshape(x.shape)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kw", CASES, ids=[str(sorted(c.items())) for c in CASES])
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nearest_matches_torch(dtype, rank, kw, backend):
    x = np.random.default_rng(rank).standard_normal(SHAPES[rank]).astype(dtype)
    if "size" in kw:
        kw = {**kw, "size": (kw["size"],) * rank}
    out, want, grad = _run(x, kw, backend, dtype)
    if rank != 2 and kw.get("scale_factor") == 1.05:  # torch's backward copies (7 -> 7), its forward does not
        grad = _forward_vjp(x, kw, np.cos(np.arange(want.size)).reshape(want.shape))
    np.testing.assert_array_equal(out["y"], want)
    np.testing.assert_allclose(out["x_grad"], grad, rtol=0, atol=1e-12 if dtype == "float64" else 1e-5)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_upsample_module_per_dim_factors(backend):
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 6)).astype(np.float32)
    up = gc.nn.Upsample(scale_factor=(0.6, 1.7))
    got = gc.Session(gc.capture(up, x=gc.spec("float32", x.shape)), backend=backend).run({"x": x})
    want = torch.nn.Upsample(scale_factor=(0.6, 1.7))(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(next(iter(got.values())), want)


def test_random_sweep_of_500_sizes_and_factors():
    """Each case's spatial values are their indices, so a mismatch is a wrong source pixel; 2-D forward copies
    at equal and doubled sizes (2-D only, per dim), probed here by factors just off 1 and 2."""
    rng = np.random.default_rng(7)
    mismatches, cases = [], 0
    while cases < 500:
        rank = int(rng.integers(1, 4))
        sizes = [int(n) for n in rng.integers(1, 14 if rank < 3 else 7, rank)]
        factors = [float(rng.choice([rng.uniform(0.2, 3.5), rng.uniform(0.95, 1.1), rng.uniform(1.95, 2.1)]))
                   for _ in sizes]
        if any(int(np.floor(n * f)) < 1 for n, f in zip(sizes, factors)):
            continue
        cases += 1
        x = np.arange(np.prod(sizes), dtype=np.float64).reshape(1, 1, *sizes)
        want = torch.nn.functional.interpolate(torch.from_numpy(x), scale_factor=factors, mode="nearest").numpy()
        got = gc.Session(gc.capture(lambda x: F.interpolate(x, scale_factor=factors, mode="nearest"),
                                    x=gc.spec("float64", x.shape)), backend="numpy").run({"x": x})
        if not np.array_equal(next(iter(got.values())), want):
            mismatches.append((sizes, factors))
    assert mismatches == []


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_integer_factors_keep_one_resize(factor, backend):
    """Resize reads torch's sources at factors 2 and 3 and is faster than the Gathers there."""
    x = np.random.default_rng(0).standard_normal((1, 2, 257, 130)).astype(np.float32)
    model = gc.capture(lambda x: F.interpolate(x, scale_factor=factor), x=gc.spec("float32", x.shape))
    assert Counter(n.op_type for n in model.proto.graph.node)["Resize"] == 1
    got = next(iter(gc.Session(model, backend=backend).run({"x": x}).values()))
    np.testing.assert_array_equal(got, torch.nn.functional.interpolate(torch.from_numpy(x), scale_factor=factor))


def test_symbolic_dims_keep_resize():
    model = gc.capture(lambda x: F.interpolate(x, scale_factor=0.6, mode="nearest"), x=gc.spec("float32", (2, 3, "n")))
    assert "Resize" in Counter(n.op_type for n in model.proto.graph.node)
