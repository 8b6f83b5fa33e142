"""Why float16-autocast CNN draws of ``test_training_option_combos`` miss torch by up to 2.7e-3:
torch 2.13's CPU float16 conv2d weight gradient (on some CPUs) adds each sample's float32 sum into a float16
buffer (rounded once per sample), ~40% of its entries 1+ ulp from the correctly rounded sum that
graphc computes (numpy and ort-cpu). A 1-ulp step-0 difference moves a BatchNorm output across
ReLU's 0 a step later; the fixed draw below (SGD, BatchNorm training, inf-norm clipping) then
misses by 5e-2 relative, and matches to float32's rounding (1e-6) once torch's weight gradient is rounded once."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import test_training_option_combos as combos

torch = pytest.importorskip("torch")
F = torch.nn.functional
RNG = np.random.default_rng(0)


class _WeightGradRoundedOnce(torch.autograd.Function):
    """A float16 3x3 conv (padding 1) whose weight gradient is the float64 sum rounded to float16 once."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return F.conv2d(x, w, padding=1)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return None, torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), padding=1).half()


def _weight_grads(n: int, rng: np.random.Generator = RNG):
    """torch's float16 conv weight gradient, the per-sample float16 accumulation and the correctly
    rounded sum, for a random batch of ``n``."""
    x = torch.from_numpy(rng.normal(size=(n, 2, 4, 4))).half()
    dy = torch.from_numpy(rng.normal(size=(n, 3, 4, 4)) * 8).half()
    w = torch.zeros(3, 2, 3, 3, dtype=torch.float16, requires_grad=True)
    F.conv2d(x, w, padding=1).backward(dy)
    per_sample = [torch.nn.grad.conv2d_weight(x[i:i + 1].double(), w.shape, dy[i:i + 1].double(), padding=1)
                  for i in range(n)]
    acc = torch.zeros(w.shape, dtype=torch.float16)
    for part in per_sample:
        acc = (acc.float() + part.float()).half()
    return w.grad, acc, sum(per_sample).half()


def _torch_rounds_per_sample() -> bool:
    """Whether this machine's torch kernel accumulates per sample: it depends on the CPU (on another
    VM torch's float16 weight gradient came out correctly rounded, equal to graphc's)."""
    got, _, once = _weight_grads(6, np.random.default_rng(1))
    return bool((got != once).any())


PER_SAMPLE = _torch_rounds_per_sample()


@pytest.mark.skipif(not PER_SAMPLE, reason="this CPU's torch float16 conv weight gradient is rounded once")
def test_torch_float16_conv_weight_grad_rounds_per_sample():
    wrong = 0
    for n in (3, 4, 5, 6):
        got, per_sample, once = _weight_grads(n)
        np.testing.assert_array_equal(got.numpy(), per_sample.numpy(), err_msg=f"batch {n}")
        wrong += int((got != once).sum())
    assert wrong > 0.2 * 4 * 54, wrong  # torch's rounding, not graphc's: the reason for the combos' float16 tolerance


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_fixed_draw_matches_torch_with_its_weight_grad_rounded_once(tmp_path, backend):
    spec = gc.optim.SGD(lr=0.1, momentum=0.9, max_grad_norm=0.5, grad_norm_type="inf")
    case = {"arch": "cnn", "spec": spec, "autocast": "float16", "scale": 256.0, "batchnorm": "train",
            "scheduled": (), "frozen": (), "fused": True, "recompute": False, "backend": backend, "seed": 2}
    net = combos._Net("cnn")
    combos._artifacts(case, net).save(tmp_path / "arts")
    batches = [combos._batch("cnn", n, case["seed"] + i) for i, n in enumerate((4, 5, 3, 6, 4))]
    trainer = gc.Trainer(tmp_path / "arts", backend=backend)
    losses = combos._train(trainer, batches)
    ours = trainer.state_dict()

    as_is, rounded_once = combos._TorchRun(case, net.state_dict()), combos._TorchRun(case, net.state_dict())
    conv = rounded_once.model.conv
    conv.forward = lambda x: _WeightGradRoundedOnce.apply(x.half(), conv.weight.half())
    for oracle in (as_is, rounded_once):
        oracle.losses = [oracle.step(b) for b in batches]
    miss = max(np.abs(ours[k] - v).max() / np.abs(v).max() for k, v in as_is.state().items())
    if PER_SAMPLE:
        assert miss > 1e-2, miss  # the draw still shows the miss (torch as it is)
    else:  # torch's kernel rounds once on this CPU: torch as it is is the oracle rounded once
        assert miss < 1e-5, miss
    np.testing.assert_allclose(losses, rounded_once.losses, rtol=1e-6)
    for name, want in rounded_once.state().items():  # float32's summation order alone
        np.testing.assert_allclose(ours[name], want, rtol=2e-6, atol=1e-7, err_msg=name)
