"""A param read only in a gc.cond branch not taken, or a loop run zero times, is skipped that step as
torch.optim skips a grad-None param: no weight decay, no momentum or moment update, no step count."""

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
FLAGS = [False, True, False, False, True, True]  # the first step skips: its own step count starts late
TRIPS = [0, 2, 0, 1, 0, 3]
OPTIMIZERS = {
    "sgd_momentum_wd": ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    "sgd_nesterov": ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    "sgd_dampening": ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}),
    "adam_wd": ("Adam", {"lr": 0.01, "weight_decay": 0.01}),
    "adamw": ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    "adamw_amsgrad": ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    "rmsprop": ("RMSprop", {"lr": 0.01, "momentum": 0.5, "weight_decay": 0.01}),
    "adagrad": ("Adagrad", {"lr": 0.1, "lr_decay": 0.01}),
    "adamax": ("Adamax", {"lr": 0.01}),
    "nadam": ("NAdam", {"lr": 0.01}),
    "radam": ("RAdam", {"lr": 0.01, "weight_decay": 0.01}),
}


class CondNet(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = gc.nn.Linear(3, 3, dtype="float64")
        self.b = gc.nn.Linear(3, 2, dtype="float64")

    def forward(self, x, flag):
        return self.b(gc.cond(flag, lambda: self.a(x), lambda: x * 2.0))


class LoopNet(CondNet):
    def forward(self, x, n):
        return self.b(gc.fori_loop(0, n, lambda k, h: self.a(h).tanh(), x))


class Twin(torch.nn.Module):
    def __init__(self, state, loop):
        super().__init__()
        self.loop = loop
        self.a, self.b = torch.nn.Linear(3, 3).double(), torch.nn.Linear(3, 2).double()
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})

    def forward(self, x, gate):
        if self.loop:
            for _ in range(int(gate)):
                x = torch.tanh(self.a(x))
            return self.b(x)
        return self.b(self.a(x) if bool(gate) else x * 2.0)


def _batches(loop):
    r = np.random.default_rng(1)
    gates = TRIPS if loop else FLAGS
    return [{"x": r.normal(size=(4, 3)), "y": r.normal(size=(4, 2)),
             ("n" if loop else "flag"): np.array(g, np.int64 if loop else np.bool_)} for g in gates]


def _setup(tmp_path, opt, loop=False, fused=True):
    net = LoopNet() if loop else CondNet()
    gate = gc.spec("int64", ()) if loop else gc.spec("bool", ())
    model = gc.capture(net, seed=3, x=gc.spec("float64", (4, 3)), **{("n" if loop else "flag"): gate})
    kind, kw = OPTIMIZERS[opt]
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), getattr(gc.optim, kind)(**kw), fused=fused)
    arts.save(tmp_path / "arts")
    twin = Twin(net.state_dict(), loop)
    return tmp_path / "arts", twin, getattr(torch.optim, kind)(twin.parameters(), **kw)


def _torch_step(twin, topt, batch, loop):
    topt.zero_grad()
    gate = batch["n" if loop else "flag"]
    out = twin(torch.from_numpy(batch["x"]), gate)
    torch.nn.functional.mse_loss(out, torch.from_numpy(batch["y"])).backward()
    topt.step()


def _steps_as_torch(trainer, twin, topt, loop: bool, atol: float = 1e-12) -> dict:
    """Both take a step on each of ``_batches(loop)``, their params compared after each (rtol 1e-12);
    returns graphc's last state."""
    for batch in _batches(loop):
        _torch_step(twin, topt, batch, loop)
        trainer.step(batch)
        ours = trainer.state_dict()
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(ours[name], p.detach().numpy(), rtol=1e-12, atol=atol, err_msg=name)
    return ours


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_cond_branch_untaken_steps_as_torch(tmp_path, opt, backend, torch_float64):
    """torch's per-param scalar state in float64 (NAdam's ``mu_product`` is 1.3e-10 off in float32);
    a missed skip moves a param by about 1e-3."""
    arts, twin, topt = _setup(tmp_path, opt)
    ours = _steps_as_torch(gc.Trainer(arts, backend=backend), twin, topt, False, atol=1e-14)
    assert int(ours["a.weight.step"]) == sum(FLAGS) and int(ours["step"]) == len(FLAGS)


@pytest.mark.parametrize("opt", ["sgd_momentum_wd", "adamw", "adam_wd"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("fused", [True, False])
def test_loop_of_zero_trips_steps_as_torch(tmp_path, opt, backend, fused):
    arts, twin, topt = _setup(tmp_path, opt, loop=True, fused=fused)
    _steps_as_torch(gc.Trainer(arts, backend=backend), twin, topt, True)


def test_resume_mid_run_is_bit_identical(tmp_path):
    arts, _, _ = _setup(tmp_path, "adamw")
    batches = _batches(False)
    whole = gc.Trainer(arts, backend="numpy")
    first = gc.Trainer(arts, backend="numpy")
    for batch in batches[:3]:
        whole.step(batch)
        first.step(batch)
    first.save_checkpoint(tmp_path / "ck")
    second = gc.Trainer(arts, backend="numpy")
    second.load_checkpoint(tmp_path / "ck")
    for batch in batches[3:]:
        whole.step(batch)
        second.step(batch)
    a, b = whole.state_dict(), second.state_dict()
    assert set(a) == set(b) and "a.weight.step" in a
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_params_read_outside_control_flow_keep_the_shared_step(tmp_path):
    """b is read in the main graph, a only in a branch: only a gets its own step, out of the flat buffers."""
    arts = gc.training.load(_setup(tmp_path, "adamw")[0])
    state = arts.manifest.state
    assert sorted(n for n in state if n.endswith(".step")) == ["a.bias.step", "a.weight.step"]
    assert [p for buf in arts.manifest.layout for p in buf.params] == ["b.weight", "b.bias"]


def test_workers_update_counts_a_gated_params_own_step(tmp_path):
    """Data-parallel workers' update (built from the manifest) carries the own step counts too and
    takes whether any worker read the param: the gradients graph's ``.touched`` flags, ORed."""
    from graphc.compile.training import update_model

    arts = gc.training.load(_setup(tmp_path, "adamw")[0])
    graph = update_model(arts.manifest).ir.graph
    flags = {"a.weight.touched", "a.bias.touched"}
    assert {"a.weight.step", "a.bias.step"} | flags <= {v.name for v in graph.inputs}
    assert {"a.weight.step.next", "a.bias.step.next"} <= {v.name for v in graph.outputs}
    assert flags == {e.name for e in arts.manifest.graphs["gradients"].outputs if e.role == "touched"}


class OutsideNet(CondNet):
    """a's weight transposed in the main graph, read only by the branch: torch's grad is None too."""

    def forward(self, x, flag):
        w = self.a.weight.t()
        return self.b(gc.cond(flag, lambda: x @ w + self.a.bias, lambda: x * 2.0))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_param_read_through_a_main_graph_node_only_by_a_branch_steps_as_torch(tmp_path, backend):
    model = gc.capture(OutsideNet(), seed=3, x=gc.spec("float64", (4, 3)), flag=gc.spec("bool", ()))
    kind, kw = OPTIMIZERS["adamw"]
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(**kw))
    assert "a.weight.step" in arts.manifest.state
    twin = Twin({k: v for k, v in arts.state.items() if k.count(".") == 1 and not k.endswith(".step")}, False)
    topt = torch.optim.AdamW(twin.parameters(), **kw)
    _steps_as_torch(gc.Trainer(arts, backend=backend), twin, topt, False)


class _Branches(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = gc.nn.ModuleList([gc.nn.Linear(3, 3, dtype="float64") for _ in range(4)])

    def forward(self, x, flag):
        return gc.cond(flag, lambda: self.layers[1](self.layers[0](x)), lambda: self.layers[3](self.layers[2](x)))


def test_gated_params_step_counts_follow_the_params_order():
    """The ``<param>.step`` inputs and state of 8 params read only in cond branches come in the
    params' order, every time (they followed a set of values hashed by id: another order a run)."""
    for _ in range(3):
        model = gc.capture(_Branches(), seed=0, x=gc.spec("float64", ("N", 3)), flag=gc.spec("bool", ()))
        arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.Adam(0.01))
        want = [f"{p}.step" for p in arts.state if p.startswith("layers.") and p.count(".") == 2]
        assert len(want) == 8
        assert [k for k in arts.state if k.endswith(".step")] == want
        assert [v.name for v in arts.train_step.graph.inputs if v.name.endswith(".step")] == want
