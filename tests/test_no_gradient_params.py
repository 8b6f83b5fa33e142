"""A param the loss reads only through an integer or bool value (an argmax, a comparison, a cast to an
integer type) gets ``grad = None`` from torch's backward, and ``torch.optim`` skips it: no weight decay,
no momentum or moment update. graphc leaves it out of training too (``manifest.frozen``), in the main
graph, in a ``gc.cond`` branch and in a torch export (either exporter, with a warning naming it there);
params and optimizer state match torch 2.13 to 1e-12 in float64 on numpy and ort-cpu over 4 steps.
Before, it was stepped with a zero gradient: 1.5e-2 to 2.5e-1 off torch after 4 steps."""

import warnings

import numpy as np
import onnx
import pytest

import graphc as gc
from test_optim import torch_state

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]
OPTIMIZERS = {  # lrs and decays exact in float32
    "sgd": ("SGD", {"lr": 0.125, "momentum": 0.9, "weight_decay": 0.0625}),
    "adam": ("Adam", {"lr": 0.0625, "weight_decay": 0.125}),
    "adamw": ("AdamW", {"lr": 0.0625, "weight_decay": 0.125}),
}
# how the loss reads ``other``: through no gradient, except "round" (torch's zero gradient: a step) and "plain"
READS = {
    "plain": lambda h, o: h + o,
    "argmax": lambda h, o: h.gather(1, o.argmax(1, keepdim=True)),
    "compare": lambda h, o: h * (o > 0).double() if isinstance(h, torch.Tensor) else h * (o > 0).astype("float64"),
    "int_cast": lambda h, o: h + (o * 4).long().double() if isinstance(h, torch.Tensor)
    else h + (o * 4).astype("int64").astype("float64"),
    "round": lambda h, o: h + o.round(),
}


class Net(gc.nn.Module):
    """``fc`` trains; ``other`` reaches the loss only as ``READS[kind]`` reads it, in the main graph or,
    ``in_cond``, in a ``gc.cond`` branch taken where the batch sums above 0."""

    def __init__(self, kind, in_cond=False):
        super().__init__()
        self.kind, self.in_cond = kind, in_cond
        self.fc = gc.nn.Linear(4, 3, dtype="float64")
        self.other = gc.nn.Linear(4, 3, dtype="float64")

    def forward(self, x):
        h = self.fc(x)
        if self.in_cond:
            h = gc.cond(x.sum() > 0, lambda: READS[self.kind](h, self.other(x)), lambda: h * 2.0)
        else:
            h = READS[self.kind](h, self.other(x))
        return (h ** 2).mean()


class Twin(torch.nn.Module):
    def __init__(self, kind, state, in_cond=False):
        super().__init__()
        self.kind, self.in_cond = kind, in_cond
        self.fc, self.other = torch.nn.Linear(4, 3).double(), torch.nn.Linear(4, 3).double()
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})

    def forward(self, x):
        h = self.fc(x)
        if not self.in_cond or x.sum() > 0:
            h = READS[self.kind](h, self.other(x))
        else:
            h = h * 2.0
        return (h ** 2).mean()


def _batches(label=False):
    """4 batches whose sums alternate in sign (the cond's branch); ``label``: with a target ``t``."""
    r = np.random.default_rng(1)
    xs = [r.normal(size=(6, 4)) for _ in range(4)]
    return [{"x": x if k % 2 else -np.abs(x), **({"t": r.normal(size=(6, 1))} if label else {})}
            for k, x in enumerate(xs)]


def _own_loss(twin, batch):
    return twin(torch.from_numpy(batch["x"]))


def _check_as_torch(arts, twin, opt, backend, batches, loss=_own_loss, groups=None, lr=None):
    """A step of ``arts`` and of ``twin`` (``loss(twin, batch)``) with ``opt`` per batch: params and
    optimizer state within 1e-12 of torch's after each; a param torch skips has no state in either
    and never moves. ``groups``: torch's param groups (default all params), ``lr``: the trainer's."""
    kind, kw = OPTIMIZERS[opt]
    spec = getattr(gc.optim, kind)(**kw)
    topt = getattr(torch.optim, kind)(twin.parameters() if groups is None else groups, **kw)
    trainer = gc.Trainer(arts, backend=backend)
    if lr is not None:
        trainer.lr = lr
    start = {k: v.detach().clone().numpy() for k, v in twin.named_parameters()}
    for step, batch in enumerate(batches):
        trainer.step(batch)
        topt.zero_grad()
        loss(twin, batch).backward()
        topt.step()
        state = trainer.state_dict()
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(state.get(name, start[name]), p.detach().numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{backend} {opt} step {step} {name}")
            ours = torch_state(spec, {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(f"{name}.")})
            if name in arts.manifest.frozen:
                assert not ours and not topt.state[p], (name, sorted(ours), sorted(topt.state[p]))
            for slot, value in topt.state[p].items():  # a param's own step, where it has one (gc.cond)
                got = ours.get(slot, state["step"]) if slot == "step" else ours[slot]
                np.testing.assert_allclose(got, value.numpy(), rtol=1e-12, atol=1e-12,
                                           err_msg=f"{backend} {opt} step {step} {name}.{slot}")


@pytest.mark.parametrize("in_cond", [False, True], ids=["main", "cond"])
@pytest.mark.parametrize("kind", list(READS))
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_a_param_read_only_without_a_gradient_trains_as_torch(kind, opt, in_cond):
    net = Net(kind, in_cond)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 4))), "output",
                                    getattr(gc.optim, OPTIMIZERS[opt][0])(**OPTIMIZERS[opt][1]))
    skipped = [] if kind in ("round", "plain") else ["other.weight", "other.bias"]
    assert arts.manifest.frozen == skipped
    said = [str(w.message) for w in caught if "where it runs, only through" in str(w.message)]
    assert len(said) == (in_cond and bool(skipped)), said  # a body's stop-gradient is named, the main graph's is code
    for backend in BACKENDS:
        _check_as_torch(arts, Twin(kind, net.state_dict(), in_cond), opt, backend, _batches())


class Exported(torch.nn.Module):
    """``other`` picks, by its argmax, the logit of ``fc`` the loss reads: no gradient reaches it."""

    def __init__(self, no_grad=False):
        super().__init__()
        self.no_grad = no_grad
        self.fc, self.other = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

    def forward(self, x):
        if self.no_grad:  # the exporters record no grad mode: ``other`` reads as any other param
            with torch.no_grad():
                t = self.other(x)
            return self.fc(x) - t
        return self.fc(x).gather(1, self.other(x).argmax(1, keepdim=True))


def _export(module, path, dynamo):
    x = torch.from_numpy(RNG.normal(size=(6, 4)))
    torch.onnx.export(module, (x,), path, input_names=["x"], output_names=["y"], dynamo=dynamo,
                      **({} if dynamo else {"dynamic_axes": {"x": {0: "N"}}}))
    onnx.checker.check_model(str(path), full_check=True)
    return gc.load(path)


def _mse(twin, batch):
    return torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"])), torch.from_numpy(batch["t"]))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_an_exported_param_read_only_through_an_argmax_is_named_and_not_trained(tmp_path, dynamo):
    torch.manual_seed(0)
    module = Exported().double()
    model = _export(module, tmp_path / "m.onnx", dynamo)
    with pytest.warns(UserWarning, match=r"\['other.weight', 'other.bias'\] do not reach the loss.*argmax"):
        arts = gc.training.generate(model, gc.losses.mse("y", label="t"), gc.optim.SGD(**OPTIMIZERS["sgd"][1]))
    assert arts.manifest.frozen == ["other.weight", "other.bias"]
    for backend in BACKENDS:
        twin = Exported().double()
        twin.load_state_dict(module.state_dict())
        _check_as_torch(arts, twin, "sgd", backend, _batches(label=True), loss=_mse)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_an_exported_param_read_under_no_grad_cannot_be_told_and_trains(tmp_path, dynamo):
    """Neither exporter records ``torch.no_grad()``: the graph shows no stop-gradient, so the param
    trains, unwarned, unless ``frozen`` names it (docs/api.md, imports)."""
    model = _export(Exported(no_grad=True).double(), tmp_path / "m.onnx", dynamo)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*do not reach the loss")
        arts = gc.training.generate(model, gc.losses.mse("y", label="t"), gc.optim.SGD(0.1))
    assert arts.manifest.trainable == ["fc.weight", "fc.bias", "other.weight", "other.bias"]
    arts = gc.training.generate(model, gc.losses.mse("y", label="t"), gc.optim.SGD(0.1), frozen=["other.*"])
    assert arts.manifest.frozen == ["other.weight", "other.bias"]


GROUPS = {  # torch's param groups -> generate's options and the trainer's lr
    "omitted": (lambda fc, other: [{"params": fc}], {"frozen": ["other.*"]}, {}, None),
    "no_decay": (lambda fc, other: [{"params": fc}, {"params": other, "weight_decay": 0.0}], {},
                 {"no_decay": ["other.*"]}, None),
    "lr_0": (lambda fc, other: [{"params": fc + other, "lr": 0.0}], {}, {}, 0.0),
}


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_param_groups_torch_leaves_out_or_excludes_train_as_torch(group, opt):
    """A param torch's groups omit stays as it is (no state); a group of weight decay 0 or lr 0 steps as torch's."""
    make, generate_options, spec_options, lr = GROUPS[group]
    net = Net("plain")
    kind, kw = OPTIMIZERS[opt]
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 4))), "output",
                                getattr(gc.optim, kind)(**kw, **spec_options), **generate_options)
    for backend in BACKENDS:
        twin = Twin("plain", net.state_dict())
        groups = make([twin.fc.weight, twin.fc.bias], [twin.other.weight, twin.other.bias])
        _check_as_torch(arts, twin, opt, backend, _batches(), groups=groups, lr=lr)


@pytest.mark.parametrize("params", [[np.zeros(2)], [{"params": [], "weight_decay": 0.0}], iter([])],
                         ids=["list", "groups", "iterator"])
def test_an_optimizer_given_torch_params_says_where_to_leave_params_out(params):
    """torch's ``AdamW(params, ...)`` ported as is: the spec holds no params (it was pydantic's "lr:
    Input should be a valid number")."""
    with pytest.raises(TypeError, match=r"AdamW takes no params \(got \w+ where lr goes\).*frozen=.*no_decay="):
        gc.optim.AdamW(params, weight_decay=0.1)
