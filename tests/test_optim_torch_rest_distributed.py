"""Data-parallel training (2 local Ray workers, ``accumulate=2``) with the kinds whose first step reads the lr
into their state (Rprop's ``step_size``, ASGD's ``eta``) under a ``LinearLR`` warm-up, and Adadelta (a no_decay
group) and Adafactor (its step reads whole params' norms, so each is stepped alone; clipped), of a model with a param
read only through an argmax: as one process's Trainer (which equals torch 2.13, ``test_optim_torch_rest_combos``
and ``test_no_gradient_params``) to 1e-12, and that param untrained on every worker."""

import importlib.util

import numpy as np
import pytest

import graphc as gc
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from test_no_gradient_params import READS

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]
WORKERS = {"workers": 2, "num_cpus": 0.5, "timeout_s": 120, "backend": "numpy"}


class Net(gc.nn.Module):
    """``fc`` trains; ``other`` reaches the output only through an argmax."""

    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(4, 3, dtype="float64")
        self.other = gc.nn.Linear(4, 3, dtype="float64")

    def forward(self, x):
        return READS["argmax"](self.fc(x), self.other(x))


def _run(trainer, batches):
    scheduler = gc.optim.lr_scheduler.LinearLR(trainer, start_factor=0.3, total_iters=2)
    losses, states = [], []
    for batch in batches:
        losses.append(trainer.step(batch))
        states.append(trainer.state_dict())
        scheduler.step()
    return losses, states


@pytest.mark.parametrize("spec", [gc.optim.Rprop(0.05), gc.optim.ASGD(0.05, t0=1),
                                  gc.optim.Adadelta(0.5, weight_decay=0.05, no_decay="*.bias"),
                                  gc.optim.Adafactor(0.05, weight_decay=0.05, max_grad_norm=0.3)],
                         ids=["rprop", "asgd", "adadelta", "adafactor"])
def test_two_workers_accumulating_equal_one_process(ray_cluster, spec):
    model = gc.capture(Net(), seed=0, x=gc.spec("float64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), spec)
    assert arts.manifest.frozen == ["other.weight", "other.bias"]
    rng = np.random.default_rng(2)
    batches = [{"x": rng.normal(size=(6, 4)), "y": rng.normal(size=(6, 1))} for _ in range(3)]
    want_losses, want = _run(gc.Trainer(arts, backend="numpy", accumulate=2), batches)
    dp = gc.Trainer(arts, accumulate=2, **WORKERS)
    try:
        losses, got = _run(dp, batches)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for t, (ours, theirs) in enumerate(zip(got, want), start=1):
            assert set(ours) == set(theirs)
            for name, value in theirs.items():
                np.testing.assert_allclose(ours[name], value, rtol=1e-12, atol=1e-15, err_msg=f"step {t} {name}")
        if spec.kind == "rprop":  # torch's first step_size: the warmed-up lr at step 1 (no sign seen yet)
            np.testing.assert_allclose(got[0]["fc.weight.step_size"], 0.3 * 0.05, rtol=1e-15)
        for name in arts.manifest.frozen:
            np.testing.assert_array_equal(dp.params[name], arts.inference.params[name], err_msg=name)
    finally:
        dp.shutdown()
