"""Spectral norm's power iteration as often as torch runs it when a module's forward reads its
normalised weight twice: once per call for the hook form (``gc.nn.utils.spectral_norm``, torch's
forward pre-hook; it ran at each read), at each read for the parametrization form (torch's
parametrize without ``cached()``). Against torch (float64): the training- and eval-mode forward,
and AdamW steps with the ``u``/``v`` buffers compared after each."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.utils.parametrizations  # noqa: F401 - importable as torch's
from graphc.nn import utils as U
from graphc.passes.values import BUFFER_WRITE_KEY
from test_buffer_updates import _artifacts, _batches, _train_like_torch, _twin

torch = pytest.importorskip("torch")

APIS = {"hook": (U.spectral_norm, lambda: torch.nn.utils.spectral_norm, ("weight_u", "weight_v")),
        "parametrizations": (U.parametrizations.spectral_norm, lambda: torch.nn.utils.parametrizations.spectral_norm,
                             ("parametrizations.weight.0._u", "parametrizations.weight.0._v"))}
WEIGHT = np.random.default_rng(3).normal(size=(3, 4))


class Twice(gc.nn.Module):
    """``tanh(x W^T) + x W^T / 2``: forward reads its weight twice."""

    def __init__(self):
        super().__init__()
        self.weight = gc.nn.Parameter(WEIGHT, dtype="float64")

    def forward(self, x):
        return gc.tanh(x @ self.weight.T) + (x @ self.weight.T) * 0.5


class TorchTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.from_numpy(WEIGHT.copy()))

    def forward(self, x):
        return torch.tanh(x @ self.weight.T) + (x @ self.weight.T) * 0.5


def pair(api: str, iterations: int = 1):
    """``Twice`` under spectral norm, then a Linear(3, 2), in graphc and (same values) torch;
    ``u`` and ``v`` set to unit vectors far from the top singular pair, so that each power
    iteration moves them (and sigma) visibly."""
    norm, torch_norm, keys = APIS[api]
    net = gc.nn.Sequential(norm(Twice(), n_power_iterations=iterations), gc.nn.Tanh(),
                           gc.nn.Linear(3, 2, dtype="float64"))
    rng = np.random.default_rng(4)
    buffers = dict(net[0].named_buffers())
    for key in keys:
        start = rng.normal(size=buffers[key].shape)
        buffers[key].data = start / np.linalg.norm(start)
    twin = torch.nn.Sequential(torch_norm()(TorchTwice(), n_power_iterations=iterations), torch.nn.Tanh(),
                               torch.nn.Linear(3, 2, dtype=torch.float64))
    return net, _twin(net, twin)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("api", list(APIS))
def test_the_forward_matches_torch(api, training):
    net, twin = pair(api)
    model = gc.capture(net.train(training), training=training, x=gc.spec("float64", ("N", 4)))
    x = _batches(1, 4)[0]["x"]
    with torch.no_grad():
        want = twin.train(training)(torch.from_numpy(x)).numpy()
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], want, rtol=1e-12,
                                   err_msg=backend)


@pytest.mark.parametrize("api, writes", [("hook", 2), ("parametrizations", 4)])
def test_the_buffers_are_written_once_per_iteration(api, writes):
    """One power iteration writes u and v: once per call for the hook form, at each of the two
    reads for the parametrization form."""
    model = gc.capture(pair(api)[0].train(), training=True, x=gc.spec("float64", ("N", 4)))
    assert sum(BUFFER_WRITE_KEY in n.metadata_props for n in model.graph) == writes


def test_weight_norm_computes_the_weight_once_per_call():
    layer = U.weight_norm(Twice())
    model = gc.capture(layer, x=gc.spec("float64", ("N", 4)))
    assert [n.op_type for n in model.graph].count("Sqrt") == 1
    x = _batches(1, 4)[0]["x"]
    np.testing.assert_allclose(gc.Session(model, backend="numpy").run({"x": x})["output"],
                               np.tanh(x @ WEIGHT.T) + x @ WEIGHT.T * 0.5, rtol=1e-12)


@pytest.mark.parametrize("iterations", [1, 2])
@pytest.mark.parametrize("api", list(APIS))
def test_adamw_steps_match_torch_with_u_and_v(api, iterations, tmp_path):
    """Four AdamW steps (a checkpoint and resume on the other backend after two), each against
    torch's loss and state_dict, ``u`` and ``v`` included; the buffers moved."""
    net, twin = pair(api, iterations)
    arts = _artifacts(net.train(), features=4)
    before = net.state_dict()
    trainer = _train_like_torch(arts, twin.train(), _batches(4, 4), ("ort-cpu", "numpy"), tmp_path / "c", 2)
    state = trainer.state_dict()
    for key in APIS[api][2]:
        assert not np.allclose(state[f"0.{key}"], before[f"0.{key}"]), key


class _ReadAfter(gc.nn.Module):
    """Calls its spectral-normed Linear, then reads that Linear's weight (a tied projection back)."""

    def __init__(self):
        super().__init__()
        self.fc = U.spectral_norm(gc.nn.Linear(4, 3, dtype="float64"))

    def forward(self, x):
        return self.fc(x) @ self.fc.weight


class _TorchReadAfter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.utils.spectral_norm(torch.nn.Linear(4, 3, dtype=torch.float64))

    def forward(self, x):
        return self.fc(x) @ self.fc.weight


def test_a_read_after_the_call_is_that_calls_weight():
    """torch's hook leaves the weight it computed as the module's attribute: a parent reading it
    after the call reads that value, with no further power iteration."""
    net = _ReadAfter()
    rng = np.random.default_rng(5)
    for key in ("weight_u", "weight_v"):
        start = rng.normal(size=net.fc._parameters[key].shape)
        net.fc._parameters[key].data = start / np.linalg.norm(start)
    twin = _twin(net, _TorchReadAfter())
    model = gc.capture(net.train(), training=True, x=gc.spec("float64", ("N", 4)))
    x = _batches(1, 4)[0]["x"]
    with torch.no_grad():
        want = twin.train()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(gc.Session(model, backend="numpy").run({"x": x})["output"], want, rtol=1e-12)
