"""A param read only inside control flow that never runs (a gc.cond on a constant false, a loop of
0 trips, a scan of length 0, an imported If whose condition is a constant) has torch's grad None on
every step: never updated (no weight decay, no momentum, no moments), with a warning naming it.
Stepped with a zero gradient, it moved by 1e-3 a step (weight decay and momentum)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
from test_untaken_params import OPTIMIZERS

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
FLAGS = [False, True, False, True, True, False]


class ConstNet(gc.nn.Module):
    """``a`` read only in a body that never runs (``kind``), or, for "mixed", there and in a cond
    fed ``flag``; "detached": only through gc.detach in a cond's branch; "true": in a branch a
    constant true always takes (stepped every step)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a = gc.nn.Linear(3, 3, dtype="float64")
        self.b = gc.nn.Linear(3, 2, dtype="float64")

    def forward(self, x, flag):
        h = {"false": lambda: gc.cond(gc.tensor(False), lambda: self.a(x), lambda: x * 2.0),
             "true": lambda: gc.cond(gc.tensor(True), lambda: self.a(x), lambda: x * 2.0),
             "loop0": lambda: gc.fori_loop(0, 0, lambda k, c: self.a(c).tanh(), x),
             "scan0": lambda: gc.scan(lambda c, e: (self.a(c).tanh(), e), x, gc.zeros((0, 3), dtype="float64"))[0],
             "detached": lambda: gc.cond(flag, lambda: gc.detach(self.a(x)), lambda: x * 2.0),
             "mixed": lambda: gc.cond(flag, lambda: self.a(x), lambda: x * 2.0)
             + gc.cond(gc.tensor(False), lambda: self.a(x), lambda: x * 0.0)}[self.kind]()
        return self.b(h)


class Twin(torch.nn.Module):
    """The same model in torch: ``a`` runs where the graphc model's body does."""

    def __init__(self, state, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = torch.nn.Linear(3, 3).double(), torch.nn.Linear(3, 2).double()
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})

    def forward(self, x, flag):
        if self.kind == "detached":
            return self.b(self.a(x).detach() if flag else x * 2.0)
        runs = self.kind == "true" or (self.kind == "mixed" and flag)
        return self.b(self.a(x) if runs else x if self.kind in ("loop0", "scan0") else x * 2.0)


def _train_as_torch(arts, twin, topt, backend, frozen):
    """6 steps each, params compared after each (1e-12); ``frozen`` never moves in either."""
    trainer, r = gc.Trainer(arts, backend=backend), np.random.default_rng(1)
    start = {k: v.detach().clone() for k, v in twin.state_dict().items()}
    for flag in FLAGS:
        batch = {"x": r.normal(size=(4, 3)), "y": r.normal(size=(4, 2)), "flag": np.array(flag)}
        topt.zero_grad()
        out = twin(torch.from_numpy(batch["x"]), flag)
        torch.nn.functional.mse_loss(out, torch.from_numpy(batch["y"])).backward()
        topt.step()
        trainer.step(batch)
        ours = trainer.state_dict()
        for name, p in twin.named_parameters():
            want = p.detach().numpy()
            if name in frozen:
                assert name not in ours and torch.equal(p, start[name]), name
            else:
                np.testing.assert_allclose(ours[name], want, rtol=1e-12, atol=1e-14, err_msg=name)
    return ours


@pytest.mark.parametrize("kind", ["false", "loop0", "scan0", "detached"])
@pytest.mark.parametrize("opt", ["sgd_momentum_wd", "adamw"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_param_under_a_body_that_never_runs_is_never_stepped(kind, opt, backend, torch_float64):
    net = ConstNet(kind)
    model = gc.capture(net, seed=3, x=gc.spec("float64", (4, 3)), flag=gc.spec("bool", ()))
    kind_name, kw = OPTIMIZERS[opt]
    with pytest.warns(UserWarning, match=r"\['a.weight', 'a.bias'\] are read only inside control flow that never"):
        arts = gc.training.generate(model, gc.losses.mse("output", label="y"), getattr(gc.optim, kind_name)(**kw))
    assert {"a.weight", "a.bias"} <= set(arts.manifest.frozen)
    assert not [k for k in arts.state if k.startswith("a.")]
    twin = Twin(net.state_dict(), kind)
    _train_as_torch(arts, twin, getattr(torch.optim, kind_name)(twin.parameters(), **kw), backend, {"a.weight", "a.bias"})


@pytest.mark.parametrize("kind", ["mixed", "true"])
@pytest.mark.parametrize("opt", ["sgd_momentum_wd", "adamw"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_never_run_read_does_not_make_a_param_always_read(kind, opt, backend, torch_float64, recwarn):
    """"mixed": ``a`` is also read in a cond fed ``flag``: stepped on the steps that take it only
    (before, the never-run read counted as read on every step); "true": always taken, always stepped."""
    net = ConstNet(kind)
    model = gc.capture(net, seed=3, x=gc.spec("float64", (4, 3)), flag=gc.spec("bool", ()))
    kind_name, kw = OPTIMIZERS[opt]
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), getattr(gc.optim, kind_name)(**kw))
    assert not [w for w in recwarn if "never runs" in str(w.message)]
    assert ("a.weight.step" in arts.state) == (kind == "mixed")
    twin = Twin(net.state_dict(), kind)
    ours = _train_as_torch(arts, twin, getattr(torch.optim, kind_name)(twin.parameters(), **kw), backend, set())
    if kind == "mixed":
        assert int(ours["a.weight.step"]) == sum(FLAGS)


def _imported_if(cond: str) -> onnx.ModelProto:
    """``(x @ wa if c else x * 2) @ wb``, ``c`` a constant false: an initializer or a Constant node."""
    wa, wb = RNG.normal(size=(3, 3)), RNG.normal(size=(3, 2))
    then = helper.make_graph([helper.make_node("MatMul", ["x", "wa"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.DOUBLE, [4, 3])])
    two = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0)))
    other = helper.make_graph([two, helper.make_node("Mul", ["x", "two"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.DOUBLE, [4, 3])])
    false = numpy_helper.from_array(np.array(False), "c")
    nodes = [helper.make_node("If", ["c"], ["h"], then_branch=then, else_branch=other),
             helper.make_node("MatMul", ["h", "wb"], ["output"])]
    if cond == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["c"], value=false))
    inits = [numpy_helper.from_array(wa, "wa"), numpy_helper.from_array(wb, "wb"),
             *([false] if cond == "initializer" else [])]
    graph = helper.make_graph(nodes, "imported_if", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4, 3])],
                              [helper.make_tensor_value_info("output", TensorProto.DOUBLE, [4, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("cond", ["initializer", "constant"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_imported_if_with_a_constant_condition_leaves_its_branch_params(cond, backend, torch_float64):
    proto = _imported_if(cond)
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    kw = OPTIMIZERS["sgd_momentum_wd"][1]
    with pytest.warns(UserWarning, match=r"\['wa'\] are read only inside control flow that never runs"):
        arts = gc.training.generate(gc.load(proto), gc.losses.mse("output", label="y"), gc.optim.SGD(**kw))
    assert "wa" in arts.manifest.frozen and "wa" not in arts.state
    wb = torch.tensor(weights["wb"], requires_grad=True)
    topt = torch.optim.SGD([wb], **kw)
    trainer, r = gc.Trainer(arts, backend=backend), np.random.default_rng(1)
    for _ in range(4):
        x, y = r.normal(size=(4, 3)), r.normal(size=(4, 2))
        topt.zero_grad()
        torch.nn.functional.mse_loss(torch.from_numpy(x) * 2.0 @ wb, torch.from_numpy(y)).backward()
        topt.step()
        trainer.step({"x": x, "y": y})
        np.testing.assert_allclose(trainer.state_dict()["wb"], wb.detach().numpy(), rtol=1e-12, atol=1e-14)
