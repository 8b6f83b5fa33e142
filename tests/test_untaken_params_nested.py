"""A param read only by a gc.cond inside a gc.fori_loop body: skipped on a step where no iteration
takes that branch (the loop runs, the cond is false every time), as torch.optim skips it."""

import numpy as np
import pytest

import graphc as gc
from test_untaken_params import OPTIMIZERS

torch = pytest.importorskip("torch")

TRIPS = [2, 3, 0, 3, 1, 2, 3]
TAKEN = [0, 1, 2, 0, 0, 3, 1]  # iterations k < TAKEN take the branch: none on steps 0, 2 (no trips), 3, 4


class NestedNet(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = gc.nn.Linear(3, 3, dtype="float64")
        self.b = gc.nn.Linear(3, 2, dtype="float64")

    def forward(self, x, n, m):
        def body(k, h):
            return gc.cond(k < m, lambda: self.a(h).tanh(), lambda: h * 0.5)
        return self.b(gc.fori_loop(0, n, body, x))


class Twin(torch.nn.Module):
    def __init__(self, state):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 3).double(), torch.nn.Linear(3, 2).double()
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})

    def forward(self, x, n, m):
        for k in range(n):
            x = torch.tanh(self.a(x)) if k < m else x * 0.5
        return self.b(x)


@pytest.mark.parametrize("opt", ["adamw", "sgd_momentum_wd", "adam_wd"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_cond_in_a_loop_taken_on_no_iteration_steps_as_torch(tmp_path, opt, backend, torch_float64):
    """A param stepped with a zero gradient where torch skips it moves by 1e-3 (weight decay, momentum)."""
    net = NestedNet()
    model = gc.capture(net, seed=3, x=gc.spec("float64", (4, 3)), n=gc.spec("int64", ()), m=gc.spec("int64", ()))
    kind, kw = OPTIMIZERS[opt]
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), getattr(gc.optim, kind)(**kw))
    assert "a.weight.step" in arts.state and "b.weight.step" not in arts.state
    twin = Twin(net.state_dict())
    topt = getattr(torch.optim, kind)(twin.parameters(), **kw)
    trainer = gc.Trainer(arts, backend=backend)
    r = np.random.default_rng(1)
    for n, m in zip(TRIPS, TAKEN):
        batch = {"x": r.normal(size=(4, 3)), "y": r.normal(size=(4, 2)), "n": np.array(n), "m": np.array(m)}
        topt.zero_grad()
        torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"]), n, m), torch.from_numpy(batch["y"])).backward()
        topt.step()
        trainer.step(batch)
        ours = trainer.state_dict()
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(ours[name], p.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
    runs = [m > 0 and n > 0 for n, m in zip(TRIPS, TAKEN)]
    assert int(ours["a.weight.step"]) == sum(runs)
