"""The cross-entropy and nll losses' arguments as torch 2.13 takes them (probed live): negative
class weights computed as torch (values and logits' gradients, numpy float64 and ort-cpu float32),
label_smoothing below 0 or NaN smoothing nothing and above 1 refused, ignore_index an int,
``reduction="elementwise_mean"`` as ``"mean"``; and a training set whose class weights sum below 0
evaluated as one batch of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from torch_grad_util import gc_grads
from trainer_models import blobs, imported_mlp

import graphc as gc
from graphc.errors import GraphError

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)
MIXED = np.array([1.0, -2.0, 0.5, -0.3])
NEGATIVE = np.array([-1.0, -0.5, -2.0, -0.25])


def _logits_labels(extra=(), ignored=-100):
    labels = RNG.integers(0, 4, (6, *extra))
    labels.reshape(-1)[1] = ignored
    return RNG.standard_normal((6, 4, *extra)) * 2, labels


def _soft():
    p = np.exp(RNG.standard_normal((6, 4)))
    return RNG.standard_normal((6, 4)), p / p.sum(1, keepdims=True)


# (id, f(F, w, x, y), make() -> (x, y)); w turns a numpy array into the namespace's constant
CASES = [
    ("ce_mixed", lambda F, w, x, y: F.cross_entropy(x, y, w(MIXED)), _logits_labels),
    ("ce_negative_sum", lambda F, w, x, y: F.cross_entropy(x, y, w(NEGATIVE), reduction="sum"), _logits_labels),
    ("ce_mixed_smooth", lambda F, w, x, y: F.cross_entropy(x, y, w(MIXED), label_smoothing=0.3), _logits_labels),
    ("ce_negative_kdim_none", lambda F, w, x, y: F.cross_entropy(x, y, w(NEGATIVE), reduction="none",
                                                                 label_smoothing=0.1), lambda: _logits_labels((3,))),
    ("ce_negative_ignore", lambda F, w, x, y: F.cross_entropy(x, y, w(NEGATIVE), ignore_index=2),
     lambda: _logits_labels(ignored=2)),
    ("ce_probs_mixed", lambda F, w, x, y: F.cross_entropy(x, y, w(MIXED), label_smoothing=0.2), _soft),
    ("ce_smoothing_below_0", lambda F, w, x, y: F.cross_entropy(x, y, label_smoothing=-0.2), _logits_labels),
    ("ce_smoothing_nan", lambda F, w, x, y: F.cross_entropy(x, y, w(MIXED), label_smoothing=math.nan),
     _logits_labels),
    ("ce_smoothing_1", lambda F, w, x, y: F.cross_entropy(x, y, label_smoothing=1.0), _logits_labels),
    ("ce_probs_smoothing_below_0", lambda F, w, x, y: F.cross_entropy(x, y, label_smoothing=-1.0), _soft),
    ("ce_elementwise_mean", lambda F, w, x, y: F.cross_entropy(x, y, reduction="elementwise_mean"), _logits_labels),
    ("nll_mixed", lambda F, w, x, y: F.nll_loss(x, y, w(MIXED)), _logits_labels),
    ("nll_negative_kdim", lambda F, w, x, y: F.nll_loss(x, y, w(NEGATIVE)), lambda: _logits_labels((2,))),
]


@pytest.mark.filterwarnings("ignore:reduction='elementwise_mean' is deprecated")
@pytest.mark.parametrize("name, fn, make", CASES, ids=[c[0] for c in CASES])
def test_loss_arguments_compute_as_torch(name, fn, make):
    x, y = make()
    xt = torch.tensor(x, requires_grad=True)
    out = fn(torch.nn.functional, torch.from_numpy, xt, torch.from_numpy(y))
    c = RNG.standard_normal(out.shape)
    (out * torch.from_numpy(c)).sum().backward()
    import graphc.nn.functional as gF

    def ours(x, y, c, backend):
        return gc_grads(lambda M, x, y: fn(gF, lambda a: a, x, y), {"x": x}, {"y": y}, c, backend=backend)

    got = ours(x, y, c, "numpy")
    np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    f32 = ours(x.astype(np.float32), y.astype(np.float32) if y.dtype == np.float64 else y, c.astype(np.float32),
               "ort-cpu")
    np.testing.assert_allclose(f32["out"], out.detach().numpy(), rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(f32["x"], xt.grad.numpy(), rtol=2e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs, torch_error, ours", [
    ({"label_smoothing": 1.5}, "label_smoothing must be between 0.0 and 1.0", "label_smoothing must be at most 1"),
    ({"label_smoothing": math.inf}, "label_smoothing must be between 0.0 and 1.0", "label_smoothing must be at most 1"),
    ({"ignore_index": 1.5}, "must be int, not float", "ignore_index must be an int, got 1.5"),
    ({"ignore_index": True}, "must be int, not bool", "ignore_index must be an int, got True"),
    ({"reduction": "batchmean"}, "batchmean is not a valid value", "reduction must be 'mean', 'sum', 'none'"),
])
def test_what_torch_refuses_is_refused_naming_the_argument(kwargs, torch_error, ours):
    import graphc.nn.functional as gF

    x, y = _logits_labels()
    with pytest.raises((RuntimeError, TypeError, ValueError), match=torch_error):
        torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.from_numpy(y), **kwargs)
    with pytest.raises((GraphError, TypeError), match=ours):
        gc.capture(lambda x, y: gF.cross_entropy(x, y, **kwargs), x=x, y=y)
    if "reduction" not in kwargs:  # the training spec's checks: at once, or at generate
        with pytest.raises((GraphError, TypeError), match=ours):
            spec = gc.losses.cross_entropy("logits", label="y", **kwargs)
            gc.training.generate(gc.load(imported_mlp()), spec, gc.optim.SGD(0.1))


def test_training_with_negative_class_weights_evaluates_as_one_batch():
    """Class weights summing below 0 over the set: the eval loader's loss (batches of 7) is the
    whole set's weighted mean, torch's, where a total weight below 0 was refused as one of 0."""
    model, weights, data = gc.load(imported_mlp()), [-1.0, 0.25, -0.5], blobs(40)
    spec = gc.losses.cross_entropy("logits", label="y", weight=weights)
    trainer = gc.Trainer(gc.training.generate(model, spec, gc.optim.SGD(0.0)), backend="numpy")
    got = trainer.evaluate_loader(gc.data.DataLoader(data, batch_size=7))["loss"]
    logits = gc.Session(model, backend="numpy").run({"x": data["x"]})["logits"]
    want = torch.nn.functional.cross_entropy(torch.from_numpy(logits.astype(np.float64)), torch.from_numpy(data["y"]),
                                             weight=torch.tensor(weights, dtype=torch.float64)).item()
    assert np.take(weights, data["y"]).sum() < 0 < want
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(trainer.evaluate(data)["loss"], want, rtol=1e-5)
