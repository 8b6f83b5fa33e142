"""An imported BatchNorm whose ONNX momentum is 1.0 or 0.0: torch.onnx writes those for a torch
BatchNorm(momentum=None) (eval-mode and training-mode exports), whose cumulative average the ONNX
file cannot hold, as for momentum=0 and momentum=1. Training follows the file's momentum, so
``generate`` warns, naming the layer; a momentum of 0.1 trains torch's running statistics and
warns not, and neither do captured BatchNorms."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


class _Net(torch.nn.Module):
    def __init__(self, momentum):
        super().__init__()
        self.fc = torch.nn.Linear(3, 4, dtype=torch.float64)
        self.bn = torch.nn.BatchNorm1d(4, momentum=momentum, dtype=torch.float64)
        self.head = torch.nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.fc(x))))


def _exported(tmp_path, net, **options):
    path = tmp_path / "bn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation
        torch.onnx.export(net, (torch.zeros(2, 3, dtype=torch.float64),), str(path), dynamo=False,
                          input_names=["x"], output_names=["out"], dynamic_axes={"x": {0: "N"}}, **options)
    return gc.load(path)


def _generate(model, batchnorm="train"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arts = gc.training.generate(model, gc.losses.mse("out", label="y"), gc.optim.SGD(0.1), batchnorm=batchnorm)
    return arts, [str(w.message) for w in caught if "momentum" in str(w.message)]


def _train(arts, net, backend):
    """3 SGD steps on graphc and on ``net`` (torch, train mode): both nets' running statistics."""
    trainer = gc.Trainer(arts, backend=backend)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net.train()
    for _ in range(3):
        batch = {"x": RNG.standard_normal((5, 3)) * 2 + 1, "y": RNG.standard_normal((5, 2))}
        trainer.step(batch)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"])).backward()
        opt.step()
    state = trainer.state_dict()
    return ({k: state[f"bn.{k}"] for k in ("running_mean", "running_var")},
            {k: getattr(net.bn, k).detach().numpy() for k in ("running_mean", "running_var")})


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_momentum_none_export_warns_and_trains_as_momentum_0(tmp_path, backend):
    torch.manual_seed(0)
    net = _Net(None).eval()
    arts, said = _generate(_exported(tmp_path, net))
    assert len(said) == 1 and "'bn': ONNX momentum 1.0" in said[0] and "never updates" in said[0], said
    assert "momentum=None" in said[0] and "bn.momentum = 0.1" in said[0]
    assert _generate(_exported(tmp_path, net), batchnorm="frozen")[1] == []  # the statistics are kept there
    as_zero = _Net(0.0)
    as_zero.load_state_dict(net.state_dict())
    ours, theirs = _train(arts, as_zero, backend)
    for k in ours:  # the exported statistics kept, as torch's momentum=0 keeps them
        np.testing.assert_allclose(ours[k], theirs[k], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(ours[k], getattr(net.bn, k).numpy())


def test_a_training_mode_export_of_momentum_none_warns(tmp_path):
    _, said = _generate(_exported(tmp_path, _Net(None).train(), training=torch.onnx.TrainingMode.TRAINING,
                                  do_constant_folding=False))
    assert len(said) == 1 and "'bn': ONNX momentum 0.0" in said[0] and "each batch's" in said[0], said


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_momentum_export_trains_torchs_running_statistics_without_a_warning(tmp_path, backend):
    torch.manual_seed(0)
    net = _Net(0.1).eval()
    arts, said = _generate(_exported(tmp_path, net))
    assert said == []
    ours, theirs = _train(arts, net, backend)
    for k in ours:  # the file's momentum is a float32 attribute, 0.9 as 0.89999998: 2.4e-7 relative in 1 - m
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6, atol=0)


@pytest.mark.parametrize("momentum", [None, 0.0])
def test_captured_batchnorms_do_not_warn(momentum):
    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn = gc.nn.Linear(3, 4), gc.nn.BatchNorm1d(4, momentum=momentum)

        def forward(self, x):
            return {"out": self.bn(self.fc(x))}

    _, said = _generate(gc.capture(Net(), seed=0, x=gc.spec("float32", ("N", 3))))
    assert said == []
