"""``Dropout1d``, ``Dropout2d``, ``Dropout3d``, ``AlphaDropout`` and ``FeatureAlphaDropout``: exactly
the identity in eval mode on both backends; in training, masks over whole channels where torch's
are, torch's kept and dropped values (compared with torch's own output where both keep or both
drop), the mean and variance alpha dropout keeps, gradients by float64 central differences (a
fresh numpy session draws the same mask), and in the generated training graphs a noise input of
the mask's shape whose gradients match the closed form on numpy and onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn

R = np.random.default_rng(49)
ALPHA = 1.7580993408473766
LAYERS = [("Dropout1d", (16, 32, 9), 2), ("Dropout1d", (32, 9), 1), ("Dropout2d", (16, 32, 3, 4), 2),
          ("Dropout2d", (16, 32, 9), 2), ("Dropout3d", (8, 16, 2, 3, 4), 2), ("Dropout3d", (32, 2, 3, 4), 1),
          ("AlphaDropout", (64, 40, 5), 0), ("FeatureAlphaDropout", (64, 40, 5), 2)]


def _values(name: str, p: float, x: np.ndarray) -> tuple[np.ndarray, float]:
    """(the kept value of each element, the dropped value), torch's formulas."""
    if "Alpha" not in name:
        return x / (1 - p), 0.0
    a = 1 / math.sqrt((ALPHA ** 2 * p + 1) * (1 - p))
    return a * x + ALPHA * a * p, ALPHA * a * (p - 1)


@pytest.mark.parametrize("name,shape,features", LAYERS, ids=[f"{n}-{len(s)}d" for n, s, _ in LAYERS])
def test_eval_mode_is_exactly_the_identity(name, shape, features):
    x = R.standard_normal(shape).astype(np.float32)
    layer = getattr(nn, name)(0.4)
    layer.eval()
    model = gc.capture(layer, x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_array_equal(gc.Session(model, backend=backend).run({"x": x})["output"], x)


@pytest.mark.parametrize("name,shape,features", LAYERS, ids=[f"{n}-{len(s)}d" for n, s, _ in LAYERS])
def test_training_mode_drops_as_torch(name, shape, features):
    torch = pytest.importorskip("torch")
    p = 0.3
    x = R.standard_normal(shape).astype(np.float32)
    model = gc.capture(getattr(nn, name)(p), x=x, training=True)
    onnx.checker.check_model(model.proto, full_check=True)
    got = gc.Session(model, backend="numpy").run({"x": x})["output"]
    want = getattr(torch.nn, name)(p).train()(torch.from_numpy(x)).numpy()
    kept, dropped = _values(name, p, x)
    masks = []
    for out in (got, want):
        mask = ~np.isclose(out, dropped, rtol=0, atol=1e-6)
        np.testing.assert_allclose(out[mask], kept[mask], rtol=1e-5, atol=1e-6)
        if features:  # one draw per entry of the leading dims: all of a channel, or none of it
            lead = mask.reshape(*shape[:features], -1)
            assert (lead.all(-1) | ~lead.any(-1)).all()
            mask = lead[..., 0]
        masks.append(mask)
    for mask in masks:  # the share dropped, within 5 standard deviations of p
        assert abs((~mask).mean() - p) < 5 * math.sqrt(p * (1 - p) / mask.size)
    if "Alpha" in name:  # mean and variance of N(0, 1) input kept
        assert abs(got.mean()) < 0.03 and abs(got.var() - 1) < 0.05


@pytest.mark.parametrize("name,shape", [("Dropout2d", (4, 6, 3, 3)), ("AlphaDropout", (4, 5, 6)),
                                        ("FeatureAlphaDropout", (4, 6, 5))])
def test_training_mode_gradients_match_central_differences(name, shape):
    """float64, numpy backend: each fresh session (seed 0) draws the same mask."""
    x = R.standard_normal(shape)
    c = R.standard_normal(shape)
    layer = getattr(nn, name)(0.4).train()  # called from a function: capture's training= does not reach it

    def loss_of(x, c):
        return {"loss": gc.sum(layer(x) * c)}

    model = gc.capture(loss_of, x=x, c=c, training=True)
    got = gc.Session(gc.grad(_as_param(loss_of, x, c), "loss"), backend="numpy").run({"c": c})["x_grad"]
    t, eps = R.standard_normal(shape), 1e-6
    plus, minus = (gc.Session(model, backend="numpy").run({"x": x + s * eps * t, "c": c})["loss"] for s in (1, -1))
    np.testing.assert_allclose(np.sum(got * t), (plus - minus) / (2 * eps), rtol=1e-6)
    assert (got == 0).any() and (got != 0).any()  # some elements dropped, some kept


def _as_param(loss_of, x, c):
    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.x = nn.Parameter(x, dtype="float64")

        def forward(self, c):
            return loss_of(self.x, c)

    return gc.capture(Wrap(), c=c, training=True)


class _Scaled(nn.Module):
    """``layer(weight * x)``, weight per channel: a parameter for the training graphs."""

    def __init__(self, layer):
        super().__init__()
        self.weight, self.layer = nn.Parameter(shape=(4, 1, 1), init=nn.init.ones), layer

    def forward(self, x):
        return self.layer(self.weight * x)


@pytest.mark.parametrize("name", ["Dropout2d", "FeatureAlphaDropout", "AlphaDropout"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_training_graphs_read_noise_of_the_mask_shape(name, backend):
    """gradients: one noise input, [N, 4, 1, 1] for channel dropout, and the closed-form MSE loss
    and weight gradient for that noise."""
    p, rng = 0.4, np.random.default_rng(3)
    model = gc.capture(_Scaled(getattr(nn, name)(p)), x=gc.spec("float32", ["N", 4, 3, 3]))
    x0 = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(gc.Session(model, backend=backend).run({"x": x0})["output"], x0)  # 1 * x, no drop
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    (noise,) = [e for e in arts.manifest.graphs["gradients"].inputs if e.role == "noise"]
    shape = [5, 4, 1, 1] if name != "AlphaDropout" else [5, 4, 3, 3]
    assert noise.shape == ["N", *shape[1:]]
    x, y = rng.standard_normal((5, 4, 3, 3)).astype(np.float32), rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    draw = rng.random(shape, dtype=np.float32)
    w = rng.uniform(0.5, 1.5, (4, 1, 1))
    got = gc.Session(arts.gradients, backend=backend).run({"x": x, "y": y, noise.name: draw,
                                                           "weight": w.astype(np.float32)})
    keep = np.broadcast_to(draw >= p, x.shape)
    kept, dropped = _values(name, p, w * x.astype(np.float64))
    out = np.where(keep, kept, dropped)
    slope = 1 / (1 - p) if "Alpha" not in name else 1 / math.sqrt((ALPHA ** 2 * p + 1) * (1 - p))  # d kept / d (w x)
    np.testing.assert_allclose(got["loss"], np.mean((out - y) ** 2), rtol=1e-5)
    want = (2 * (out - y) / out.size * np.where(keep, slope * x, 0)).sum((0, 2, 3)).reshape(4, 1, 1)
    np.testing.assert_allclose(got["weight_grad"], want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("fn,rank,layout", [("dropout1d", 4, r"\(C, L\) or \(N, C, L\)"),
                                            ("dropout3d", 3, r"\(C, D, H, W\) or \(N, C, D, H, W\)")])
def test_channel_dropouts_refuse_other_ranks_by_layout(fn, rank, layout):
    with pytest.raises(gc.GraphError, match=rf"{fn}.*expects a {layout} input, got rank {rank}"):
        gc.capture(getattr(gc.nn.functional, fn), x=np.zeros((2,) * rank, np.float32))
