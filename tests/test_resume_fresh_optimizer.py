"""Params-only resume (``load_checkpoint(path, fresh_optimizer=True)``): torch's
``model.load_state_dict(checkpoint["model"])`` and a new optimizer, against torch in float64;
what it refuses, and the checkpoint folder it may then replace."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.runtime.checkpoint import CheckpointError

F64 = {"dtype": "float64"}
RNG = np.random.default_rng(0)


class Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 4, bias=False, **F64)  # a bias before BatchNorm: a gradient of rounding noise only
        self.bn = gc.nn.BatchNorm1d(4, momentum=None, **F64)  # buffers: running stats and num_batches_tracked
        self.out = gc.nn.Linear(4, 1, **F64)

    def forward(self, x):
        return self.out(gc.relu(self.bn(self.fc(x))))


NET = Net()


def artifacts(optimizer, frozen=()):
    return gc.training.generate(gc.capture(NET, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                optimizer, frozen=frozen)


def batches(n):
    return [{"x": RNG.standard_normal((5, 3)) * 3 + 1, "y": RNG.standard_normal((5, 1))} for _ in range(n)]


def torch_run(data, frozen_before):
    """torch: Adam(1e-2) on ``data[:3]`` with ``frozen_before`` not requiring grad, the state_dict
    loaded into a new model trained by a new SGD(0.05, momentum=0.9) on every param over the rest."""
    torch = pytest.importorskip("torch")
    f64 = {"dtype": torch.float64}

    def make():
        return torch.nn.ModuleDict({"fc": torch.nn.Linear(3, 4, bias=False, **f64), "bn": torch.nn.BatchNorm1d(4, momentum=None, **f64),
                                    "out": torch.nn.Linear(4, 1, **f64)})

    def steps(model, opt, part):
        for b in part:
            opt.zero_grad()
            y = model.out(torch.relu(model.bn(model.fc(torch.from_numpy(b["x"])))))
            torch.nn.functional.mse_loss(y, torch.from_numpy(b["y"])).backward()
            opt.step()

    first = make()
    first.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in NET.state_dict().items()})
    for name, p in first.named_parameters():
        p.requires_grad_(name not in frozen_before)
    steps(first, torch.optim.Adam([p for p in first.parameters() if p.requires_grad], lr=1e-2), data[:3])
    second = make()
    second.load_state_dict(first.state_dict())
    steps(second, torch.optim.SGD(second.parameters(), lr=0.05, momentum=0.9), data[3:])
    return {k: v.detach().numpy() for k, v in second.state_dict().items()}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_params_only_resume_with_another_optimizer_and_frozen_set_is_torchs_new_optimizer(tmp_path, backend):
    """Adam with out.bias frozen for 3 steps, then SGD with momentum training everything from the
    checkpoint's params and BatchNorm buffers: torch's load_state_dict + new optimizer, to 1e-12."""
    data = batches(6)
    first = gc.Trainer(artifacts(gc.optim.Adam(1e-2), frozen=["out.bias"]), backend=backend)
    for batch in data[:3]:
        first.step(batch)
    first.save_checkpoint(tmp_path / "ck")
    resumed = gc.Trainer(artifacts(gc.optim.SGD(0.05, momentum=0.9)), backend=backend)
    resumed.load_checkpoint(tmp_path / "ck", fresh_optimizer=True)
    assert resumed.step_count == 0 and resumed.epoch == 0
    state = resumed.state_dict()
    assert not state["fc.weight.momentum_buffer"].any() and int(state["step"]) == 0
    for batch in data[3:]:
        resumed.step(batch)
    want = torch_run(data, {"out.bias"})
    got = resumed.state_dict()
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=name)
    assert int(got["bn.num_batches_tracked"]) == 6


def test_a_param_the_graphs_freeze_that_the_checkpoint_trained_is_refused(tmp_path):
    """The graphs hold fc.weight's initial value as a constant: its trained value would be lost."""
    first = gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend="numpy")
    first.step(batches(1)[0])
    first.save_checkpoint(tmp_path / "ck")
    resumed = gc.Trainer(artifacts(gc.optim.Adam(1e-2), frozen=["fc.weight"]), backend="numpy")
    before = resumed.state_dict()
    with pytest.raises(CheckpointError, match=r"the checkpoint's run trained fc\.weight, which these training graphs "
                                              r"freeze.*graphc export CHECKPOINT -o model\.onnx"):
        resumed.load_checkpoint(tmp_path / "ck", fresh_optimizer=True)
    for name, value in before.items():
        assert resumed.state_dict()[name].tobytes() == value.tobytes(), name


def test_a_full_resume_on_a_grown_trainable_set_names_the_params_only_resume(tmp_path):
    gc.Trainer(artifacts(gc.optim.Adam(1e-2), frozen=["out.bias"]), backend="numpy").save_checkpoint(tmp_path / "ck")
    resumed = gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend="numpy")
    with pytest.raises(CheckpointError, match=r"frozen in the checkpoint's run, trained here: out\.bias\).*or pass "
                                              r"fresh_optimizer=True to take its params with a fresh optimizer"):
        resumed.load_checkpoint(tmp_path / "ck")
    with pytest.raises(ValueError, match="pass one of them"):
        resumed.load_checkpoint(tmp_path / "ck", fresh_optimizer=True, changed_optimizer=True)


def test_another_models_checkpoint_is_refused_naming_its_param(tmp_path):
    other = gc.training.generate(gc.capture(gc.nn.Linear(3, 1, **F64), x=gc.spec("float64", ("N", 3))),
                                 gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    gc.Trainer(other, backend="numpy").save_checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match=r"param\(s\) bias, weight, which this model lacks"):
        gc.Trainer(artifacts(gc.optim.SGD(0.1)), backend="numpy").load_checkpoint(tmp_path / "ck",
                                                                                  fresh_optimizer=True)


def test_the_new_run_replaces_the_checkpoint_and_its_graphs_and_resumes_from_them(tmp_path):
    """Adam -> SGD: the folder's Adam state and graphs belong to other graphs; the params-only
    run's first save replaces both as one step, and the folder then resumes as that run."""
    data = batches(4)
    first = gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend="numpy")
    first.step(data[0])
    first.save_checkpoint(tmp_path / "ck")
    sgd = artifacts(gc.optim.SGD(0.05, momentum=0.9))
    run = gc.Trainer(sgd, backend="numpy")
    run.load_checkpoint(tmp_path / "ck", fresh_optimizer=True)
    run.step(data[1])
    run.save_checkpoint(tmp_path / "ck")
    again = gc.Trainer(tmp_path / "ck", backend="numpy")
    assert again.step_count == 1 and again.manifest.optimizer == sgd.manifest.optimizer
    for batch in data[2:]:
        run.step(batch)
        again.step(batch)
    for name, value in run.state_dict().items():
        assert again.state_dict()[name].tobytes() == value.tobytes(), name
    adam = gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend="numpy")  # not restarted from it: refused
    with pytest.raises(CheckpointError, match="belongs to other training graphs"):
        adam.save_checkpoint(tmp_path / "ck")
    assert gc.Trainer(tmp_path / "ck", backend="numpy").step_count == 1


def test_a_param_frozen_in_the_checkpoints_run_takes_its_graphs_value_else_is_warned_of(tmp_path):
    """out.bias was a constant of the checkpoint's graphs (not in the checkpoint): a folder's
    graphs give it; a file checkpoint of graphs held in memory has none, and says so."""
    first = gc.Trainer(artifacts(gc.optim.Adam(1e-2), frozen=["out.bias"]), backend="numpy")
    first.step(batches(1)[0])
    first.save_checkpoint(tmp_path / "ck")
    first.save_checkpoint(tmp_path / "ck.safetensors")
    other = gc.capture(Net(), x=gc.spec("float64", ("N", 3)), seed=7)  # another seed: other initial values
    other_arts = gc.training.generate(other, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    assert other.params["out.bias"] != first.params["out.bias"]
    resumed = gc.Trainer(other_arts, backend="numpy")
    resumed.load_checkpoint(tmp_path / "ck", fresh_optimizer=True)
    for name, value in first.params.items():
        assert resumed.params[name].tobytes() == value.tobytes(), name
    with pytest.warns(UserWarning, match=r"holds no out\.bias \(frozen in its run\).*start from these graphs' values"):
        resumed.load_checkpoint(tmp_path / "ck.safetensors", fresh_optimizer=True)
    assert resumed.params["out.bias"] == other.params["out.bias"]
    assert resumed.params["fc.weight"].tobytes() == first.params["fc.weight"].tobytes()
