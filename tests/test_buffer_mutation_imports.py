"""A dynamo export of a training-mode module that writes a buffer in its forward (an EMA under
``no_grad``, spectral norm's power iteration updating ``weight_u``/``weight_v``): the signature records
each as a ``BUFFER_MUTATION`` of a graph value, which ``generate`` carries from step to step as a
written buffer, with no gradient through it, as torch. And a Dropout(p=1) export trains as torch's
(zeros) rather than failing on 1 / (1 - p)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")
nn = torch.nn
LR, WD = 1e-2, 0.01


class EMA(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(4, 3), nn.Linear(3, 2)
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * h.mean(0))
        return self.head(h - self.ema)


class SpectralNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.utils.spectral_norm(nn.Linear(4, 5)), nn.Linear(5, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.fc(x)))


def _exported(net, x, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gc.load(torch.onnx.export(copy.deepcopy(net), (x,), dynamo=True, optimize=False, verbose=False,
                                         input_names=["x"], output_names=["out"], **options).model_proto)


def _train_both(net, model, backend, steps=3):
    """``steps`` AdamW steps of graphc (``model``) and torch (``net``, train mode): the losses, and
    graphc's state after them."""
    gen = torch.Generator().manual_seed(1)
    arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.AdamW(lr=LR, weight_decay=WD))
    trainer = gc.Trainer(arts, backend=backend)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(6, 4, generator=gen), torch.randn(6, 2, generator=gen)
        x, y = x.to(torch.float64), y.to(torch.float64)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append((trainer.step({"x": x.numpy(), "y": y.numpy()}), loss.item()))
    return arts, losses, trainer.state_dict()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("make", [EMA, SpectralNormed])
def test_a_dynamo_exports_buffer_writes_train_as_torch(make, backend):
    """Before: the buffers stayed as exported and the gradient went through their update (EMA: the
    second loss 3e-3 off torch's; spectral norm: u never updated, a gradient through the power
    iteration, the second loss 1.3e-2 off)."""
    torch.manual_seed(0)
    net = make().double().train()
    before = copy.deepcopy(net.state_dict())
    model = _exported(net, torch.zeros(6, 4, dtype=torch.float64))
    net.load_state_dict(before)
    arts, losses, state = _train_both(net, model, backend)
    assert arts.manifest.trainable == [n for n, _ in net.named_parameters()]
    for ours, theirs in losses:
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    # spectral norm's weight_v: computed afresh from weight_u in training, never read, not in the export
    assert [n for n, _ in net.named_buffers() if n not in state] == (["fc.weight_v"] if make is SpectralNormed else [])
    for name, value in [*net.named_parameters(), *((n, b) for n, b in net.named_buffers() if n in state)]:
        np.testing.assert_allclose(state[name], value.detach().numpy(), rtol=0, atol=1e-8, err_msg=name)


def test_a_dropout_of_p_1_trains_to_zeros_as_torch():
    """Before: ZeroDivisionError from the 1 / (1 - p) scale."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.Dropout(1.0), nn.Linear(6, 2)).double().train()
    model = _exported(net, torch.zeros(6, 4, dtype=torch.float64))
    _, losses, _ = _train_both(net, model, "numpy")
    for ours, theirs in losses:
        assert ours == pytest.approx(theirs, rel=1e-12)
