"""``BatchNorm1d/2d/3d(momentum=None)``: torch's cumulative moving average (running statistic =
mean of every batch statistic so far, factor 1/num_batches_tracked), against torch over several
SGD steps (float64), through a checkpoint resume and in the eval graph."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

try:
    from torch_grad_util import assert_step_matches_torch
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch

F64 = {"dtype": "float64"}


class _Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 4, **F64)
        self.bn = gc.nn.BatchNorm1d(4, momentum=None, **F64)
        self.out = gc.nn.Linear(4, 1, **F64)

    def forward(self, x):
        return self.out(gc.relu(self.bn(self.fc(x))))


def _torch_twin(net: _Net):
    f64 = {"dtype": torch.float64}
    twin = torch.nn.ModuleDict({"fc": torch.nn.Linear(3, 4, **f64), "bn": torch.nn.BatchNorm1d(4, momentum=None, **f64),
                                "out": torch.nn.Linear(4, 1, **f64)})
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in net.state_dict().items()})
    return twin


def _torch_forward(twin, x):
    return twin.out(torch.relu(twin.bn(twin.fc(torch.from_numpy(x)))))


def _batches(n: int):
    rng = np.random.default_rng(2)
    return [{"x": rng.standard_normal((5, 3)) * 3 + 1, "y": rng.standard_normal((5, 1))} for _ in range(n)]


def _artifacts(net: _Net):
    return gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                gc.optim.SGD(0.125, momentum=0.5))  # rates exact in float32


def test_running_statistics_are_the_cumulative_average_like_torch(tmp_path):
    net = _Net()
    net.bn.num_batches_tracked.data = np.array(3)  # as loaded from a torch state_dict mid-training
    arts = _artifacts(net)
    twin = _torch_twin(net)
    opt = torch.optim.SGD(twin.parameters(), lr=0.125, momentum=0.5)
    trainer = gc.Trainer(arts, backend="ort-cpu")
    batches = _batches(5)
    for step, batch in enumerate(batches):
        if step == 3:  # stop and resume: the counter is state like the statistics
            trainer.save_checkpoint(tmp_path / "ckpt")
            trainer = gc.Trainer(arts, backend="numpy")
            trainer.load_checkpoint(tmp_path / "ckpt")
        state = assert_step_matches_torch(
            trainer, batch, opt, lambda: torch.nn.functional.mse_loss(_torch_forward(twin, batch["x"]),
                                                                      torch.from_numpy(batch["y"])),
            twin, step, state_rtol=1e-10)
    assert int(state["bn.num_batches_tracked"]) == 3 + len(batches)
    x = _batches(6)[-1]["x"]
    got = gc.Session(arts.eval, backend="numpy").run({"x": x, "y": np.zeros((5, 1)), **trainer.params,
                                                      **{k: state[k] for k in ("bn.running_mean", "bn.running_var")}})
    with torch.no_grad():
        np.testing.assert_allclose(got["output"], _torch_forward(twin.eval(), x).numpy(), rtol=1e-10)


def test_counter_is_train_step_state_and_eval_reads_none():
    arts = _artifacts(_Net())
    assert "bn.num_batches_tracked" in [v.name for v in arts.train_step.inputs]
    assert "bn.num_batches_tracked.next" in [v.name for v in arts.train_step.outputs]
    assert "bn.num_batches_tracked" not in [v.name for v in arts.eval.inputs]
    frozen = gc.training.generate(gc.capture(_Net(), x=gc.spec("float64", ("N", 3))),
                                  gc.losses.mse("output", label="y"), gc.optim.SGD(0.1), batchnorm="frozen")
    assert "bn.num_batches_tracked" not in [v.name for v in frozen.train_step.inputs]


@pytest.mark.filterwarnings("ignore:one tensor is the scale or bias of several normalization nodes")
def test_a_cumulative_batchnorm_run_twice_per_forward_is_refused_by_name():
    class Twice(_Net):
        def forward(self, x):
            return self.out(self.bn(self.bn(self.fc(x))))

    model = gc.capture(Twice(), x=gc.spec("float64", ("N", 3)))
    with pytest.raises(gc.GraphError, match=r"counter 'bn.num_batches_tracked' \(momentum=None\).*once per forward"):
        gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
