"""``gc.optim.Adadelta``, ``Rprop``, ``ASGD`` and ``Adafactor`` against torch.optim 2.13 (single-tensor
path): the update graph alone over 12 steps in float64 for 1-D, 2-D and 4-D params on numpy and
ort-cpu (state and ASGD's ``eta``/``mu`` too); the Trainer's fused and per-param updates of a conv
net (a frozen weight, a no_decay group); checkpoint/resume mid-run; the specs' checks; the CLI.
torch keeps ASGD's ``eta`` and ``mu`` in its default dtype: the comparisons run it with float64 as
the default (``torch_float64``)."""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pytest

import graphc as gc
from test_grad_clipping import _graphc
from test_optim import SCALAR_STATE, TORCH_OPTIM, run_steps, step_both, torch_kwargs, torch_steps
from trainer_models import straight_and_resumed

RNG = np.random.default_rng(0)
STEPS = 12
SPECS = [
    gc.optim.Adadelta(),
    gc.optim.Adadelta(0.5, rho=0.8, eps=1e-5, weight_decay=0.1, maximize=True),
    gc.optim.Rprop(),
    gc.optim.Rprop(0.05, etas=(0.3, 1.5), step_sizes=(1e-3, 0.1), maximize=True),
    gc.optim.ASGD(),
    gc.optim.ASGD(0.05, lambd=0.01, alpha=0.5, t0=3, weight_decay=0.1, maximize=True),  # averages from step 6 on
    gc.optim.Adafactor(),
    gc.optim.Adafactor(0.05, beta2_decay=-0.5, eps=(1e-20, 1e-2), d=1.1, weight_decay=0.1, maximize=True),
    gc.optim.Adafactor(0.5, eps=(None, 1e-1)),  # rho_t = 1/sqrt(t) from step 5, alpha from eps2 at first
]
IDS = [f"{s.kind}-{i}" for i, s in enumerate(SPECS)]
SHAPES = [(5,), (3, 4), (2, 3, 2, 4)]


def _grads(shape):
    """A start and gradients that jump in size and flip sign (Rprop's step sizes grow and shrink);
    one entry always 0."""
    p0 = RNG.normal(size=shape)
    grads = [RNG.normal(size=shape) * (3.0 if t % 4 == 0 else 1.0) for t in range(STEPS)]
    for g in grads:
        g.reshape(-1)[1] = 0.0
    return p0, grads


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_update_matches_torch_optim(spec, backend, shape, torch_float64):
    p0, grads = _grads(shape)
    got = run_steps(spec, backend, grads, p0, dtype=np.float64)
    want = torch_steps(torch_float64, spec, p0, grads, np.float64)
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        np.testing.assert_allclose(p_graph, p_torch, rtol=1e-12, atol=1e-14, err_msg=f"step {t}")
        assert set(state_graph) == set(state_torch)  # torch's state keys (ASGD's eta, mu too)
        for slot, value in state_graph.items():
            assert value.shape == state_torch[slot].shape, slot  # Adafactor's row_var [.., R, 1], col_var [.., 1, C]
            np.testing.assert_allclose(value, state_torch[slot], rtol=1e-12, atol=1e-14, err_msg=f"step {t} {slot}")


def test_cases_reach_each_branch():
    """Rprop's gradients flip sign and keep it; ASGD's second spec averages (mu < 1) from step 6
    (mu at step t is 1 / max(1, t - 1 - t0));
    Adafactor's lerp weight t^-0.8 passes 0.5 (torch's lerp switches formula there)."""
    _, grads = _grads((3, 4))
    signs = [np.sign(a * b) for a, b in zip(grads, grads[1:])]
    assert any((s > 0).any() for s in signs) and any((s < 0).any() for s in signs)
    assert [1 / max(1, t - 1 - 3) for t in range(1, STEPS + 1)].index(0.5) == 6 - 1
    assert 2 ** -0.8 > 0.5 > 3 ** -0.8


class _Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = gc.nn.Conv2d(2, 3, 3, dtype="float64")
        self.fc = gc.nn.Linear(12, 2, dtype="float64")
        self.head = gc.nn.Linear(2, 2, dtype="float64")

    def forward(self, x):
        return {"out": self.head(gc.tanh(self.fc(gc.flatten(gc.tanh(self.conv(x)), 1))))}


def _torch_forward(torch, params, x):
    h = torch.tanh(torch.nn.functional.conv2d(x, params["conv.weight"], params["conv.bias"]))
    h = torch.tanh(h.flatten(1) @ params["fc.weight"].T + params["fc.bias"])
    return h @ params["head.weight"].T + params["head.bias"]


def _batches(n: int = 8):
    rng = np.random.default_rng(5)
    return [{"x": rng.normal(size=(4, 2, 4, 4)), "y": rng.normal(size=(4, 2))} for _ in range(n)]


def _arts(spec, fused=True):
    model = gc.capture(_Net(), seed=0, x=gc.spec("float64", ("N", 2, 4, 4)))
    return gc.training.generate(model, gc.losses.mse("out", label="y"), spec, frozen=["head.weight"], fused=fused)


TRAINED = [gc.optim.Adadelta(0.5, weight_decay=0.05, no_decay="*.bias"),
           gc.optim.Rprop(0.01, maximize=False),
           gc.optim.ASGD(0.05, lambd=0.01, t0=2, weight_decay=0.05, no_decay="*.bias"),
           gc.optim.Adafactor(0.05, weight_decay=0.05, no_decay="*.bias")]


@pytest.mark.parametrize("spec", TRAINED, ids=[s.kind for s in TRAINED])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-param"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_trainer_matches_torch(spec, fused, backend, torch_float64):
    """The Trainer against torch over 8 steps: head.weight frozen, the biases a param group without
    weight decay (torch's param groups), each step's loss and every param after it, then the state."""
    torch = torch_float64
    trainer = gc.Trainer(_arts(spec, fused), backend=backend)
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in trainer.params.items()}
    params["head.weight"].requires_grad_(False)
    decayed = {"params": [v for k, v in params.items() if k.endswith(".weight") and k != "head.weight"]}
    plain = {"params": [v for k, v in params.items() if k.endswith(".bias")]}
    if "weight_decay" in type(spec).model_fields:
        plain["weight_decay"] = 0.0
    opt = getattr(torch.optim, TORCH_OPTIM[spec.kind])([decayed, plain], foreach=False, **torch_kwargs(spec))
    for t, batch in enumerate(_batches(), start=1):
        want = torch.nn.functional.mse_loss(_torch_forward(torch, params, torch.from_numpy(batch["x"])),
                                            torch.from_numpy(batch["y"]))
        step_both(trainer, opt, params, batch, want, t)
    state = trainer.state_dict()
    for name in ("conv.weight", "fc.bias"):
        for slot, value in opt.state[params[name]].items():
            if slot in ("eta", "mu"):  # one running state for every param (all step every step)
                np.testing.assert_allclose(state[slot], value.numpy(), rtol=1e-12, err_msg=slot)
            elif slot not in SCALAR_STATE:
                np.testing.assert_allclose(state[f"{name}.{slot}"], value.numpy(), rtol=1e-12, atol=1e-14,
                                           err_msg=f"{name}.{slot}")


def test_adafactor_steps_each_param_alone():
    """Adafactor's step reads each param's norm: no flat buffers even with fused=True, and each
    param's state as torch shapes it."""
    arts = _arts(gc.optim.Adafactor())
    assert arts.manifest.layout == []
    state = gc.Trainer(arts, backend="numpy").state_dict()
    assert state["conv.weight.row_var"].shape == (3, 2, 3, 1) and state["conv.weight.col_var"].shape == (3, 2, 1, 3)
    assert state["fc.bias.variance"].shape == (2,) and "fc.bias.row_var" not in state


@pytest.mark.parametrize("spec", TRAINED, ids=[s.kind for s in TRAINED])
def test_resume_is_bit_exact(tmp_path, spec):
    straight, resumed = straight_and_resumed(_arts(spec), _batches(), 3, tmp_path / "ck", backend="ort-cpu")
    state = straight.state_dict()
    assert {f"fc.weight.{s}" for s in spec.state_slots} & set(state)
    for name, value in state.items():
        assert resumed.state_dict()[name].tobytes() == value.tobytes(), name


def test_specs_take_torch_defaults_and_refuse_bad_values():
    torch = pytest.importorskip("torch")
    for spec in SPECS[::2]:
        cls = type(spec)
        signature = inspect.signature(getattr(torch.optim, TORCH_OPTIM[spec.kind])).parameters
        torch_defaults = {k: p.default for k, p in signature.items() if k in cls.model_fields}
        assert set(torch_defaults) == set(cls.model_fields) - {"kind", "no_decay", "max_grad_norm", "grad_norm_type",
                                                               "clip_grad_value"}
        assert {k: getattr(cls(), k) for k in torch_defaults} == torch_defaults, spec.kind
        assert gc.optim.from_dict(spec.model_dump(mode="json")) == spec
    assert gc.optim.Adafactor().state_slots == ("row_var", "col_var", "variance")
    assert gc.optim.Rprop().state_slots == ("prev", "step_size")
    for make, message in [(lambda: gc.optim.Adadelta(rho=1.5), "rho must lie in"),
                          (lambda: gc.optim.Rprop(etas=(1.0, 2.0)), "0 < etaminus < 1 < etaplus"),
                          (lambda: gc.optim.Rprop(step_sizes=(1.0, 0.5)), "0 <= min <= max"),
                          (lambda: gc.optim.Rprop(step_sizes=(1e-6, float("inf"))), "finite numbers"),
                          (lambda: gc.optim.Adafactor(eps=(-1.0, 1e-3)), "eps must each be >= 0"),
                          (lambda: gc.optim.Adafactor(beta2_decay=0.5), "beta2_decay must be <= 0"),
                          (lambda: gc.optim.Adafactor(d=0.5), "d must be >= 1"),
                          (lambda: gc.optim.Rprop(weight_decay=0.1), "weight_decay")]:
        with pytest.raises(ValueError, match=message):
            make()
    assert gc.optim.ASGD(alpha=-0.5).alpha == -0.5  # eta's power: torch takes any


def test_cli_grad(tmp_path):
    onnx.save(gc.capture(_Net(), x=gc.spec("float64", ("N", 2, 4, 4))).proto, tmp_path / "net.onnx")
    for flags, want in [(("--optimizer", "adadelta", "--lr", "0.5", "--rho", "0.8", "--eps", "1e-5"),
                         gc.optim.Adadelta(0.5, rho=0.8, eps=1e-5)),
                        (("--optimizer", "rprop", "--etas", "0.4,1.3", "--step-sizes", "1e-4,10", "--maximize"),
                         gc.optim.Rprop(etas=(0.4, 1.3), step_sizes=(1e-4, 10.0), maximize=True)),
                        (("--optimizer", "asgd", "--lambd", "0.01", "--alpha", "0.5", "--t0", "100"),
                         gc.optim.ASGD(lambd=0.01, alpha=0.5, t0=100)),
                        (("--optimizer", "adafactor", "--beta2-decay", "-0.5", "--eps", "none,1e-2", "--d", "2",
                          "--weight-decay", "0.1"),
                         gc.optim.Adafactor(beta2_decay=-0.5, eps=(None, 1e-2), d=2.0, weight_decay=0.1))]:
        r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:out:y", *flags, "-o", tmp_path / want.kind)
        assert r.returncode == 0, r.stderr
        assert gc.optim.from_dict(gc.training.read_manifest(tmp_path / want.kind).optimizer) == want
    for flags, message in [(("--optimizer", "adam", "--rho", "0.5"), "--rho applies to adadelta, not --optimizer adam"),
                           (("--optimizer", "adafactor", "--eps", "1e-3"), "--eps: adafactor takes two numbers"),
                           (("--optimizer", "adam", "--eps", "1e-3,1e-3"), "--eps: adam takes one number")]:
        r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:out:y", *flags, "-o", tmp_path / "bad")
        assert r.returncode != 0 and message in r.stderr, r.stderr


# torch.optim's optimizers graphc has no spec for, and why
ABSENT = {
    "LBFGS": "a step re-evaluates the loss several times (a closure) with a line search: not one update graph after "
             "one backward",
    "SparseAdam": "for sparse gradients (nn.Embedding(sparse=True)); graphc's gradients are dense",
    "Muon": "orthogonalises 2-D updates by Newton-Schulz iterations and hands other params to a second optimizer "
            "(AdamW): not yet lowered",
}


def test_every_torch_optimizer_is_a_spec_or_listed_absent_with_the_reason():
    torch = pytest.importorskip("torch")
    found = {n for n in dir(torch.optim) if inspect.isclass(getattr(torch.optim, n))
             and issubclass(getattr(torch.optim, n), torch.optim.Optimizer) and n != "Optimizer"}
    specs = {cls.__name__ for cls in gc.optim.BY_KIND.values()}
    assert sorted(found - specs - set(ABSENT)) == [] and sorted(set(ABSENT) & specs) == []
    assert set(TORCH_OPTIM.values()) == specs
