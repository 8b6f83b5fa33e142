"""gc.nn.AdaptiveLogSoftmaxWithLoss against torch.nn's holding the same weights: forward's output
and loss, log_prob and predict, and the gradients of the loss plus a weighted log_prob with respect
to the input and every parameter, on the numpy and ort-cpu backends; unbatched input, a symbolic
batch through the full ONNX checker, and the refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn

try:
    from torch_grad_util import torch_twin
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import torch_twin

# the first's last cluster projects to 8 // 4**3 = 0 features, as torch allows (and warns of)
pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")

CTORS = ["AdaptiveLogSoftmaxWithLoss(8, 20, [4, 10, 15])",
         "AdaptiveLogSoftmaxWithLoss(16, 12, [3], div_value=2.0, head_bias=True)",
         "AdaptiveLogSoftmaxWithLoss(9, 7, [2, 5, 6], div_value=1.5)"]


class _Objective(nn.Module):
    """``loss + sum(log_prob(x) * c)`` of ``m`` with the input ``x`` a parameter, and what to compare."""

    def __init__(self, m, x):
        super().__init__()
        self.x, self.m = nn.Parameter(x), m

    def forward(self, target, c):
        output, loss = self.m(self.x, target)
        log_prob = self.m.log_prob(self.x)
        return {"output": output, "loss": loss, "log_prob": log_prob, "predict": self.m.predict(self.x),
                "objective": loss + gc.sum(log_prob * c)}


@pytest.mark.parametrize("ctor", CTORS)
def test_matches_torch(ctor):
    torch = pytest.importorskip("torch")
    layer, twin = torch_twin(ctor, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, layer.in_features)).astype(np.float32)
    target = np.concatenate([[0, layer.n_classes - 1], rng.integers(0, layer.n_classes, 5)])
    c = rng.standard_normal((7, layer.n_classes)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    want = twin(xt, torch.tensor(target))
    log_prob = twin.log_prob(xt)
    (want.loss + (log_prob * torch.tensor(c)).sum()).backward()
    grads = gc.grad(gc.capture(_Objective(layer, x), target=target, c=c), "objective")
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run({"target": target, "c": c})
        np.testing.assert_allclose(got["output"], want.output.detach().numpy(), 1e-5, 1e-6, err_msg=backend)
        np.testing.assert_allclose(got["loss"], want.loss.item(), 1e-5, err_msg=backend)
        np.testing.assert_allclose(got["log_prob"], log_prob.detach().numpy(), 1e-5, 1e-6, err_msg=backend)
        np.testing.assert_array_equal(got["predict"], twin.predict(xt).numpy())
        np.testing.assert_allclose(got["x_grad"], xt.grad.numpy(), 1e-4, 1e-6, err_msg=f"{backend} x")
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"m.{name}_grad"], p.grad.numpy(), 1e-4, 1e-6, err_msg=f"{backend} {name}")


def test_unbatched_and_symbolic_batch_match_torch():
    torch = pytest.importorskip("torch")
    layer, twin = torch_twin(CTORS[0], seed=3)
    x = np.random.default_rng(4).standard_normal((5, 8)).astype(np.float32)
    target = np.array([1, 19, 12, 4, 9])
    single = gc.capture(layer, input=x[0], target=np.array(12))
    want = twin(torch.tensor(x[0]), torch.tensor(12))
    got = gc.Session(single, backend="ort-cpu").run({"input": x[0], "target": np.array(12)})
    assert got["output_0"].shape == ()
    np.testing.assert_allclose([got["output_0"], got["output_1"]], [want.output.item(), want.loss.item()], 1e-5)
    model = gc.capture(layer, input=gc.spec("float32", ("N", 8)), target=gc.spec("int64", ("N",)))
    onnx.checker.check_model(model.proto, full_check=True)
    want = twin(torch.tensor(x), torch.tensor(target))
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"input": x, "target": target})
        np.testing.assert_allclose(got["output_0"], want.output.detach().numpy(), 1e-5, 1e-6)
        np.testing.assert_allclose(got["output_1"], want.loss.item(), 1e-5)


def test_a_target_out_of_range_gives_nan():
    layer = nn.AdaptiveLogSoftmaxWithLoss(4, 6, [2])
    x = np.ones((3, 4), np.float32)
    model = gc.capture(lambda x, t: layer(x, t).output, x=x, t=np.array([0, 5, 6]))
    out = gc.Session(model, backend="numpy").run({"x": x, "t": np.array([0, 5, 6])})["output"]
    assert np.isfinite(out[:2]).all() and np.isnan(out[2])


@pytest.mark.parametrize("cutoffs", [[], [3, 2], [0, 2], [2, 6], [2, 2], [2.5]])
def test_bad_cutoffs_are_refused(cutoffs):
    with pytest.raises(gc.GraphError, match="cutoffs should be a sequence"):
        nn.AdaptiveLogSoftmaxWithLoss(4, 6, cutoffs)


@pytest.mark.parametrize("x, target, match", [
    (np.ones((3, 4), np.float32), np.zeros((3, 1), np.int64), "target must be a 0-D or 1-D int64"),
    (np.ones((3, 4), np.float32), np.zeros(3, np.float32), "target must be a 0-D or 1-D int64"),
    (np.ones(4, np.float32), np.zeros(3, np.int64), "1D target tensor expects 2D input tensors, got rank 1"),
    (np.ones((3, 4), np.float32), np.zeros(2, np.int64), "input and target batch sizes"),
])
def test_bad_inputs_are_refused(x, target, match):
    layer = nn.AdaptiveLogSoftmaxWithLoss(4, 6, [2])
    with pytest.raises(gc.GraphError, match=match):
        gc.capture(layer, input=x, target=target)
