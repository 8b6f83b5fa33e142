"""A param read only under control flow reached through other guarded bodies (an If after an If,
an If in an If's branch, a constant-trip fori_loop with a cond inside, unrolled into Ifs): skipped
on a step where none of the paths by which the loss reaches it runs, as torch.optim skips it."""

import itertools

import numpy as np
import onnx
import pytest

import graphc as gc
from test_untaken_params import OPTIMIZERS

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)

# every pair of flags, each more than once, the first step skipping the innermost param
FLAGS = [(False, True), (True, False), (True, True), (False, False), (True, False), (False, True),
         (True, True), (False, False)]
LOOP_FLAGS = [f for f in itertools.product((False, True), repeat=3)][::-1]  # all 8 ways, none taken last


def _after(m, x, f1, f2):
    """``h`` read by both branches of a later cond: ``a`` runs where f1 holds, ``c`` where f2 does."""
    h = m.cond(f1, lambda: m.a(x), lambda: x)
    return m.b(m.cond(f2, lambda: m.c(h).tanh(), lambda: h * 0.5))


def _within(m, x, f1, f2):
    """A cond in a cond's branch: ``a`` runs where f1 and f2 hold, ``c`` where f1 does."""
    return m.b(m.cond(f1, lambda: m.cond(f2, lambda: m.a(x), lambda: x * 2.0) + m.c(x), lambda: x * 0.5))


def _looped(m, x, g):
    """A cond in each of a constant 3 trips: ``a`` runs where some g[k] holds."""
    return m.b(m.loop(3, lambda k, h: m.cond(g[k], lambda: m.a(h).tanh(), lambda: h * 0.5), x))


RUNS = {  # steps that read a and c (None: c unread, or read every step)
    "after": lambda steps: (sum(f1 for f1, _ in steps), sum(f2 for _, f2 in steps)),
    "within": lambda steps: (sum(f1 and f2 for f1, f2 in steps), sum(f1 for f1, _ in steps)),
    "looped": lambda steps: (sum(any(g) for g in steps), None),
}
CASES = {"after": (_after, FLAGS), "within": (_within, FLAGS), "looped": (_looped, LOOP_FLAGS)}


class Net(gc.nn.Module):
    def __init__(self, forward):
        super().__init__()
        self.a = gc.nn.Linear(3, 3, dtype="float64")
        self.c = gc.nn.Linear(3, 3, dtype="float64")
        self.b = gc.nn.Linear(3, 2, dtype="float64")
        self.run = forward

    @staticmethod
    def cond(flag, then, other):
        return gc.cond(flag, then, other)

    @staticmethod
    def loop(n, body, x):
        return gc.fori_loop(0, n, body, x)

    def forward(self, x, *flags):
        return self.run(self, x, *flags)


class Twin(torch.nn.Module):
    def __init__(self, forward, state):
        super().__init__()
        self.a, self.c = torch.nn.Linear(3, 3).double(), torch.nn.Linear(3, 3).double()
        self.b = torch.nn.Linear(3, 2).double()
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        self.run = forward

    @staticmethod
    def cond(flag, then, other):
        return then() if bool(flag) else other()

    @staticmethod
    def loop(n, body, x):
        for k in range(n):
            x = body(k, x)
        return x

    def forward(self, x, *flags):
        return self.run(self, x, *flags)


def _feeds(case, flags):
    if case == "looped":
        return {"g": np.array(flags)}
    return {"f1": np.array(flags[0]), "f2": np.array(flags[1])}


@pytest.mark.parametrize("opt", ["adamw", "sgd_momentum_wd"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("case", list(CASES))
def test_guards_reached_through_guarded_bodies_as_torch(tmp_path, case, opt, backend, torch_float64):
    """Stepped every step (its path's own condition left out), ``a`` moved 1e-4..1e-2 off torch."""
    forward, steps = CASES[case]
    net = Net(forward)
    specs = {"g": gc.spec("bool", (3,))} if case == "looped" else {"f1": gc.spec("bool", ()), "f2": gc.spec("bool", ())}
    model = gc.capture(net, seed=3, x=gc.spec("float64", (4, 3)), **specs)
    kind, kw = OPTIMIZERS[opt]
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), getattr(gc.optim, kind)(**kw))
    arts.save(tmp_path / "arts")
    for path in sorted((tmp_path / "arts").glob("*.onnx")):  # the Ifs' and Loops' added flag outputs
        onnx.checker.check_model(str(path), full_check=True)
    start = {k: np.array(v) for k, v in net.state_dict().items()}
    twin = Twin(forward, start)
    topt = getattr(torch.optim, kind)(twin.parameters(), **kw)
    trainer = gc.Trainer(arts, backend=backend)
    r = np.random.default_rng(1)
    for flags in steps:
        batch = {"x": r.normal(size=(4, 3)), "y": r.normal(size=(4, 2)), **_feeds(case, flags)}
        topt.zero_grad()
        out = twin(torch.from_numpy(batch["x"]), *(flags if case != "looped" else (flags,)))
        torch.nn.functional.mse_loss(out, torch.from_numpy(batch["y"])).backward()
        topt.step()
        trainer.step(batch)
        ours = {**start, **trainer.state_dict()}  # ``c`` unread (looped): frozen, as torch never steps it
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(ours[name], p.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=f"{name} {flags}")
    a_runs, c_runs = RUNS[case](steps)
    assert int(ours["a.weight.step"]) == a_runs
    assert ("c.weight.step" in ours) == (c_runs is not None) and int(ours.get("c.weight.step", -1)) == (c_runs or -1)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("case", ["after", "within"])
def test_workers_touched_flags_per_path(case, backend):
    """The gradients graph's ``<param>.touched`` (data-parallel workers OR them): ``a`` read by
    f1 (after) or f1 and f2 (within), ``c`` by f2 (after) or f1 (within), for all 4 pairs."""
    model = gc.capture(Net(CASES[case][0]), seed=3, x=gc.spec("float64", (4, 3)),
                       f1=gc.spec("bool", ()), f2=gc.spec("bool", ()))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(0.01))
    session = gc.Session(arts.gradients, backend=backend)
    for f1, f2 in itertools.product((False, True), repeat=2):
        feeds = {"x": RNG.normal(size=(4, 3)), "y": RNG.normal(size=(4, 2)), "f1": np.array(f1), "f2": np.array(f2),
                 **{k: v for k, v in arts.state.items() if k in {s.name for s in session.inputs}}}
        out = session.run(feeds)
        a_runs, c_runs = RUNS[case]([(f1, f2)])
        assert (bool(out["a.weight.touched"]), bool(out["c.weight.touched"])) == (bool(a_runs), bool(c_runs)), (f1, f2)
