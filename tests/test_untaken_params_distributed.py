"""A param read only in a gc.cond branch, on data-parallel workers (a local Ray cluster): stepped
where any worker's shard read it, with the averaged gradient (0 from the shards that did not),
held where none did, as torch DDP with find_unused_parameters (grad defined on every rank when
any rank used the param, None when none did)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import graphc as gc
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from test_untaken_params import OPTIMIZERS, CondNet

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")]

RNG = np.random.default_rng(0)
# per step, whether each of the 2 shards (4 rows each) reads a: one, none, both, the other, none
READS = [(True, False), (False, False), (True, True), (False, True), (False, False)]


class ShardNet(CondNet):
    """a is read where the shard's x sums above 0: each worker decides for its own rows."""

    def forward(self, x):
        return self.b(gc.cond(x.sum() > 0.0, lambda: self.a(x), lambda: x * 2.0))


def _batches() -> list[dict[str, np.ndarray]]:
    batches = []
    for reads in READS:
        x = np.concatenate([np.abs(RNG.normal(size=(4, 3))) * (1 if r else -1) for r in reads])
        batches.append({"x": x, "y": RNG.normal(size=(8, 2))})
    return batches


def _torch_ddp(state, kind, kw, batches):
    """Each shard's forward on its own, the loss their rows' mean (DDP's average of two 4-row
    shards' mean losses): a's grad is None on a step no shard read it, so torch.optim skips it."""
    net = torch.nn.Module()
    net.a, net.b = torch.nn.Linear(3, 3).double(), torch.nn.Linear(3, 2).double()
    net.load_state_dict({k: torch.from_numpy(np.array(state[k])) for k in net.state_dict()})
    opt = getattr(torch.optim, kind)(net.parameters(), **kw)
    states = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = 0
        for lo in (0, 4):
            x, y = torch.from_numpy(batch["x"][lo:lo + 4]), torch.from_numpy(batch["y"][lo:lo + 4])
            h = net.a(x) if bool(x.sum() > 0) else x * 2.0
            loss = loss + torch.nn.functional.mse_loss(net.b(h), y) / 2
        loss.backward()
        opt.step()
        states.append({k: v.detach().numpy().copy() for k, v in net.state_dict().items()})
    return states


@pytest.mark.parametrize(("opt", "backend"), [("adamw", "ort-cpu"), ("sgd_momentum_wd", "numpy")])
def test_workers_step_a_param_any_shard_read_as_torch_ddp(ray_cluster, tmp_path, opt, backend):
    model = gc.capture(ShardNet(), seed=3, x=gc.spec("float64", ("N", 3)))
    kind, kw = OPTIMIZERS[opt]
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), getattr(gc.optim, kind)(**kw))
    assert {"a.weight.touched", "a.bias.touched"} <= {e.name for e in arts.manifest.graphs["gradients"].outputs}
    batches = _batches()
    want = _torch_ddp(arts.state, kind, kw, batches)
    with pytest.warns(gc.DataParallelWarning, match="ReduceSum"):  # the gate is each shard's own, as DDP's
        dp = gc.Trainer(arts, workers=2, num_cpus=0.5, timeout_s=120, backend=backend)
    for step, batch in enumerate(batches):
        dp.step(batch)
        got = dp.state_dict()
        for name, value in want[step].items():
            np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=f"step {step} {name}")
        assert int(got["a.weight.step"]) == sum(any(r) for r in READS[:step + 1]), step
    first, second = dp.worker_states()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
