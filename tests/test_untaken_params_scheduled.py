"""A param read only in a gc.cond branch, under a scheduled momentum (``scheduled=["momentum"]``,
OneCycleLR and CyclicLR cycling it): its own NAdam ``mu_product`` and SGD momentum buffer start
(``momentum_steps``), counted over the steps that read it, as torch keeps them per param."""

import numpy as np
import pytest

import graphc as gc
from test_untaken_params import CondNet, Twin

torch = pytest.importorskip("torch")

FLAGS = [False, True, False, False, True, True, True, False, True, False, False, True]
CYCLES = {"onecycle": lambda m, o: m.OneCycleLR(o, max_lr=0.05, total_steps=len(FLAGS)),
          # the momentum 0 at steps 1, 7: SGD's buffer created by the first step after, undamped
          "cyclic-to-zero": lambda m, o: m.CyclicLR(o, 0.001, 0.05, step_size_up=3, base_momentum=0.0)}
RUNS = {"nadam": ("NAdam", {"lr": 0.01}, "onecycle"),
        "nadam-decoupled": ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}, "onecycle"),
        "sgd-dampening": ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.5}, "onecycle"),
        "sgd-dampening-to-zero": ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.5}, "cyclic-to-zero"),
        "adamw": ("AdamW", {"lr": 0.01, "weight_decay": 0.1}, "onecycle")}


def _batches():
    r = np.random.default_rng(1)
    return [{"x": r.normal(size=(4, 3)), "y": r.normal(size=(4, 2)), "flag": np.array(f)} for f in FLAGS]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("run", RUNS)
def test_scheduled_momentum_with_an_untaken_branch_steps_as_torch(tmp_path, run, backend, torch_float64):
    """torch with float64 scalar state (``torch_float64``: its ``mu_product`` float64); a shared
    ``mu_product`` or momentum buffer start moves ``a`` by 1e-4..1e-2."""
    kind, kw, cycle = RUNS[run]
    net = CondNet()
    model = gc.capture(net, seed=3, x=gc.spec("float64", (4, 3)), flag=gc.spec("bool", ()))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), getattr(gc.optim, kind)(**kw),
                                scheduled=["momentum"])
    twin = Twin(net.state_dict(), False)
    topt = getattr(torch.optim, kind)(twin.parameters(), foreach=False, **kw)
    trainer = gc.Trainer(arts, backend=backend)
    ours_sched, torch_sched = CYCLES[cycle](gc.optim.lr_scheduler, trainer), CYCLES[cycle](torch.optim.lr_scheduler, topt)
    for batch in _batches():
        topt.zero_grad()
        out = twin(torch.from_numpy(batch["x"]), batch["flag"])
        torch.nn.functional.mse_loss(out, torch.from_numpy(batch["y"])).backward()
        topt.step()
        torch_sched.step()
        trainer.step(batch)
        ours_sched.step()
        ours = trainer.state_dict()
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(ours[name], p.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
            if "mu_product" in topt.state[p]:
                own = ours.get(f"{name}.mu_product", ours["mu_product"])
                assert abs(float(own) - float(topt.state[p]["mu_product"])) <= 1e-15, name
    assert int(ours["a.weight.step"]) == sum(FLAGS)
    if kind == "SGD":  # steps with a nonzero momentum that read a
        want = sum(f and m != 0 for f, m in zip(FLAGS, _momenta(cycle)))
        assert int(ours["a.weight.momentum_steps"]) == want


def _momenta(cycle):
    """The momentum each step of ``cycle`` runs with (torch's schedule)."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    sched, out = CYCLES[cycle](torch.optim.lr_scheduler, opt), []
    for _ in FLAGS:
        out.append(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step()
    return out


def test_gated_params_keep_their_own_running_state():
    """NAdam's ``<param>.mu_product`` beside ``<param>.step`` for the gated params only; the shared
    ``mu_product`` stays for the others."""
    model = gc.capture(CondNet(), seed=3, x=gc.spec("float64", (4, 3)), flag=gc.spec("bool", ()))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.NAdam(0.01),
                                scheduled=["momentum"])
    own = sorted(n for n in arts.state if n.endswith("mu_product"))
    assert own == ["a.bias.mu_product", "a.weight.mu_product", "mu_product"]
    assert all(float(arts.state[n]) == 1.0 for n in own)
    from graphc.compile.training import update_model

    names = {v.name for v in update_model(arts.manifest).ir.graph.inputs}  # data-parallel workers' update
    assert {"a.weight.mu_product", "a.bias.mu_product", "mu_product"} <= names
