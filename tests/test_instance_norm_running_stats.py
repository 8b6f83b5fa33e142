"""``InstanceNorm1d/2d/3d(track_running_stats=True)`` against torch: the module in train and eval
mode, and three SGD steps of ``gc.training.generate`` (losses, params and the running statistics,
updated by the mean over the batch of each sample's statistics) followed by the eval graph, which
normalises by the running statistics (float64, numpy and ort-cpu)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

try:
    from torch_grad_util import assert_step_matches_torch
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch

F64 = {"dtype": "float64"}
NORMS = {1: (5,), 2: (3, 4), 3: (2, 3, 2)}  # spatial dims per kind


def _pair(dims: int, **kwargs):
    ours = getattr(gc.nn, f"InstanceNorm{dims}d")(3, track_running_stats=True, **kwargs, **F64)
    theirs = getattr(torch.nn, f"InstanceNorm{dims}d")(3, track_running_stats=True, **kwargs, dtype=torch.float64)
    rng = np.random.default_rng(dims)
    state = {**ours.state_dict(), "running_mean": rng.standard_normal(3), "running_var": rng.uniform(0.5, 2, 3)}
    if "weight" in state:
        state.update(weight=rng.standard_normal(3), bias=rng.standard_normal(3))
    ours.load_state_dict(state)
    theirs.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    return ours, theirs


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("dims", NORMS, ids=[f"{d}d" for d in NORMS])
def test_module_matches_torch_in_train_and_eval_mode(dims, affine):
    ours, theirs = _pair(dims, affine=affine, momentum=0.2)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = np.random.default_rng(7).standard_normal((4, 3, *NORMS[dims])) * 2 + 1
    unbatched = gc.capture(ours.eval(), x=x[0])
    np.testing.assert_allclose(gc.Session(unbatched, backend="ort-cpu").run({"x": x[0]})["output"],
                               theirs.eval()(torch.from_numpy(x[0])).detach().numpy(), rtol=1e-10, atol=1e-12)
    for training in (False, True):  # torch's train-mode forward updates its statistics: last
        (ours.train if training else ours.eval)()
        (theirs.train if training else theirs.eval)()
        model = gc.capture(ours, x=gc.spec("float64", ("N", 3, *NORMS[dims])))
        onnx.checker.check_model(model.proto, full_check=True)
        with torch.no_grad():
            want = theirs(torch.from_numpy(x)).numpy()
        backends = ("numpy", "ort-cpu") if not training else ("numpy",)  # onnxruntime: no training-mode BatchNorm
        for backend in backends:
            got = gc.Session(model, backend=backend).run({"x": x})["output"]
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=f"{backend} training={training}")


class _Net(gc.nn.Module):
    def __init__(self, dims: int, momentum):
        super().__init__()
        self.mix = gc.nn.Linear(2, 3, **F64)  # over the channels (onnxruntime has no float64 Conv)
        self.norm = getattr(gc.nn, f"InstanceNorm{dims}d")(3, affine=True, track_running_stats=True, momentum=momentum,
                                                           **F64)
        self.fc = gc.nn.Linear(3 * int(np.prod(NORMS[dims])), 1, **F64)

    def forward(self, x):
        return self.fc(gc.relu(self.norm(self.mix(x.movedim(1, -1)).movedim(-1, 1))).reshape(x.shape[0], -1))


def _twin(net: _Net, dims: int, momentum):
    f64 = {"dtype": torch.float64}
    twin = torch.nn.ModuleDict({
        "mix": torch.nn.Linear(2, 3, **f64),
        "norm": getattr(torch.nn, f"InstanceNorm{dims}d")(3, affine=True, track_running_stats=True, momentum=momentum,
                                                           **f64),
        "fc": torch.nn.Linear(3 * int(np.prod(NORMS[dims])), 1, **f64)})
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in net.state_dict().items()})
    return twin


def _torch_forward(twin, x):
    return twin.fc(torch.relu(twin.norm(twin.mix(torch.from_numpy(x).movedim(1, -1)).movedim(-1, 1))).flatten(1))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("dims,momentum", [(1, 0.3), (2, 0.1), (3, None)], ids=["1d", "2d", "3d_momentum_none"])
def test_three_training_steps_and_eval_match_torch(dims, momentum, backend):
    """Losses, params and running statistics step for step (torch's momentum=None: no update,
    num_batches_tracked never stepped), then the eval graph on the trained state."""
    net = _Net(dims, momentum)
    twin = _twin(net, dims, momentum)
    shape = (2, *NORMS[dims])
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", *shape))),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.125, momentum=0.5))
    assert {"norm.running_mean", "norm.running_var"} <= set(arts.manifest.feeds.values())  # state, fed step to step
    trainer = gc.Trainer(arts, backend=backend)
    opt = torch.optim.SGD(twin.parameters(), lr=0.125, momentum=0.5)
    rng = np.random.default_rng(dims)
    for step in range(3):
        batch = {"x": rng.standard_normal((4, *shape)) * 2 + 1, "y": rng.standard_normal((4, 1))}
        state = assert_step_matches_torch(
            trainer, batch, opt, lambda: torch.nn.functional.mse_loss(_torch_forward(twin, batch["x"]),
                                                                      torch.from_numpy(batch["y"])),
            twin, step, rtol=1e-9, skip=("norm.num_batches_tracked",))
    x = rng.standard_normal((3, *shape))
    got = gc.Session(arts.eval, backend=backend).run({"x": x, "y": np.zeros((3, 1)), **trainer.params,
                                                      **{k: state[k] for k in ("norm.running_mean", "norm.running_var")}})
    with torch.no_grad():
        np.testing.assert_allclose(got["output"], _torch_forward(twin.eval(), x).numpy(), rtol=1e-9)
