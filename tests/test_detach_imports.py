"""torch's ``detach`` in a dynamo export: the exporter writes an Identity recording
``aten.detach``, which graphc's training graphs treat as ``gc.detach`` (no gradient through
it). A straight-through estimator trains as in torch, and a param read only through
``detach`` has no gradient, so AdamW neither steps nor decays it (torch.optim skips it)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")
LR, WD = 1e-2, 0.01


class StraightThrough(torch.nn.Module):
    """``h + (tanh(h) - h).detach()``: tanh forward, identity backward; a gate read detached."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 5)
        self.gate = torch.nn.Parameter(torch.linspace(-1, 1, 8))

    def forward(self, x):
        h = self.fc1(x)
        h = h + (torch.tanh(h) - h).detach()
        return self.fc2(h * torch.sigmoid(self.gate.detach()))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_dynamo_export_of_detach_stops_the_gradient_like_torch(backend):
    """Without the mark the gradient went through tanh and ``gate`` trained (2 lr from torch's,
    which stays as it was, after two AdamW steps)."""
    torch.manual_seed(0)
    net = StraightThrough()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=gen), torch.randint(0, 5, (8,), generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = torch.onnx.export(net, (x,), dynamo=True, optimize=False, verbose=False, input_names=["x"],
                                  output_names=["logits"]).model_proto
    assert [n.op_type for n in proto.graph.node].count("Identity") == 2
    arts = gc.training.generate(gc.load(proto), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.AdamW(lr=LR, weight_decay=WD))
    assert arts.manifest.trainable == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert arts.manifest.frozen == ["gate"]
    trainer = gc.Trainer(arts, backend=backend)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step({"x": x.numpy(), "y": y.numpy()}), loss.item(), rtol=1e-6)
    assert net.gate.grad is None
    params = trainer.params
    for name, p in net.named_parameters():
        got = params[name] if name in params else arts.inference.params[name]
        np.testing.assert_allclose(got, p.detach().numpy(), rtol=0, atol=1e-3 * LR, err_msg=name)
