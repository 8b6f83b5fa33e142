"""Backward hooks and ``gc.autograd.Function``s under ``accumulate=k`` see the micro-batch's weighted gradient, as
torch 2.13's in its ``(loss * rows / step_rows).backward()`` loop: a clamping Function, a clamp hook and a module full
hook that clips its gradient's norm, each not linear in its gradient, step as torch's to 1e-12 in float64."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import graphc as gc
from graphc.errors import ArtifactsError

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


def _net(lib):
    """A 3-4-1 MLP whose backward clamps (a Function), clamps (a Tensor hook) and clips a norm (a full hook)."""
    base = torch.autograd.Function if lib is torch else gc.autograd.Function

    class Clamped(base):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return lib.clamp(g, -0.01, 0.01)

    def clip(module, grad_input, grad_output):  # grad_input's norm clipped to 0.02
        g = grad_input[0]
        return (g * (0.02 / lib.clamp(lib.sqrt((g * g).sum()), min=0.02)),)

    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = lib.nn.Linear(3, 4), lib.nn.Linear(4, 1)
            self.fc2.register_full_backward_hook(clip)

        def forward(self, x):
            h = self.fc1(x)
            h.register_hook(lambda g: lib.clamp(g, -0.03, 0.03))
            return self.fc2(lib.tanh(Clamped.apply(h)))

    return Net


def _torch_step(params, x, y, k, reduction, scale=1.0):
    """torch's accumulation loop, one SGD(0.5) step: ``(loss * scale * weight).backward()`` per micro-batch, the
    weight its rows over the step's (1 for a summed loss)."""
    twin = _net(torch)().double()
    twin.load_state_dict({n: torch.tensor(v) for n, v in params.items()})
    for xs, ys in zip(np.array_split(x, k), np.array_split(y, k)):
        loss = torch.nn.functional.mse_loss(twin(torch.tensor(xs)), torch.tensor(ys), reduction=reduction)
        weight = len(xs) / len(x) if reduction == "mean" else 1.0
        (loss * scale * weight).backward()
    return {n: params[n] - 0.5 * p.grad.numpy() / scale for n, p in twin.named_parameters()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k, reduction, scale", [(2, "mean", None), (3, "mean", None), (3, "sum", None),
                                                 (3, "mean", 1024.0)])
def test_hooks_and_functions_see_the_weighted_gradient(backend, k, reduction, scale):
    """8 rows in k micro-batches (k=3: 3, 3 and 2 rows), a mean or summed loss, with and without loss scaling."""
    model = gc.capture(_net(gc)().double(), x=gc.spec("float64", ("N", 3)))
    x, y = RNG.normal(size=(8, 3)) * 2, RNG.normal(size=(8, 1)) * 3
    extra = {} if scale is None else {"loss_scale": scale}
    artifacts = gc.training.generate(model, gc.losses.mse("output", label="y", reduction=reduction),
                                     gc.optim.SGD(0.5), **extra)
    trainer = gc.Trainer(artifacts, backend=backend, accumulate=k)
    trainer.step({"x": x, "y": y})
    want = _torch_step(model.params, x, y, k, reduction, scale or 1.0)
    for name, value in want.items():
        np.testing.assert_allclose(trainer.params[name], value, rtol=1e-12, atol=1e-15, err_msg=name)
    # the clamps and the clip bite: a micro-batch's own gradient (or the whole batch's) steps elsewhere
    whole = _torch_step(model.params, x, y, 1, reduction)
    assert np.abs(whole["fc1.weight"] - want["fc1.weight"]).max() > 1e-3


def test_a_model_without_functions_keeps_its_graphs():
    """Only a model with Functions or hooks takes the seed weight; its train_step steps as before (weight 1)."""
    plain = gc.capture(gc.nn.Linear(3, 1).double(), x=gc.spec("float64", ("N", 3)))
    hooked = gc.capture(_net(gc)().double(), x=gc.spec("float64", ("N", 3)))
    loss = gc.losses.mse("output", label="y")
    names = {key: [e.name for e in entries.inputs]
             for key, entries in gc.training.generate(plain, loss, gc.optim.SGD(0.5)).manifest.graphs.items()}
    assert all("accumulate.weight" not in inputs for inputs in names.values())
    hooked_artifacts = gc.training.generate(hooked, loss, gc.optim.SGD(0.5))
    roles = {e.name: e.role for e in hooked_artifacts.manifest.graphs["gradients"].inputs}
    assert roles["accumulate.weight"] == "weight"
    x, y = RNG.normal(size=(8, 3)) * 2, RNG.normal(size=(8, 1)) * 3
    trainer = gc.Trainer(hooked_artifacts, backend="numpy")
    trainer.step({"x": x, "y": y})
    for name, value in _torch_step(hooked.params, x, y, 1, "mean").items():
        np.testing.assert_allclose(trainer.params[name], value, rtol=1e-12, atol=1e-15, err_msg=name)


def _clamped_mlp(lib):
    """A 3-4-1 MLP whose first weight's post-accumulate hook clamps ``.grad`` to 0.01."""
    net = lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.Tanh(), lib.nn.Linear(4, 1)).double()

    def clamp(p):
        p.grad.clamp_(-0.01, 0.01)

    net[0].weight.register_post_accumulate_grad_hook(clamp)
    return net


def test_post_accumulate_hooks_step_as_torchs_and_are_refused_where_torch_sees_a_sum():
    """torch runs a post-accumulate hook on ``.grad`` after each micro-batch's backward (the running sum), and
    graphc's gradients graph on the micro-batch's own gradient: ``accumulate=2`` (and ``workers=2``) refuse it
    naming the capture's line; one batch steps as torch's."""
    model = gc.capture(_clamped_mlp(gc), x=gc.spec("float64", ("N", 3)))
    artifacts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.5))
    where = r"the model captured at .*test_accumulate_hooks.py:\d+ has a Parameter.register_post_accumulate_grad_hook"
    with pytest.raises(ArtifactsError, match=rf"gc.Trainer\(accumulate=2\): {where}.*sum of the micro-batches"):
        gc.Trainer(artifacts, backend="numpy", accumulate=2)
    if importlib.util.find_spec("ray") is not None:  # refused before Ray starts
        with pytest.raises(ArtifactsError, match=rf"gc.Trainer\(workers=2\): {where}"):
            gc.Trainer(artifacts, backend="numpy", workers=2)
    x, y = RNG.normal(size=(8, 3)) * 2, RNG.normal(size=(8, 1)) * 3
    trainer = gc.Trainer(artifacts, backend="numpy")
    trainer.step({"x": x, "y": y})
    twin = _clamped_mlp(torch)
    twin.load_state_dict({n: torch.tensor(v) for n, v in model.params.items()})
    torch.nn.functional.mse_loss(twin(torch.tensor(x)), torch.tensor(y)).backward()
    assert twin[0].weight.grad.abs().max() == pytest.approx(0.01)  # the clamp bites
    for n, p in twin.named_parameters():
        np.testing.assert_allclose(trainer.params[n], model.params[n] - 0.5 * p.grad.numpy(), rtol=1e-12,
                                   atol=1e-15, err_msg=n)
