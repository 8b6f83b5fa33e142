"""A parametrized tensor's name in ``frozen=`` / ``trainable=`` / ``params=`` / ``no_decay=``: the exact
name (``a.weight`` of a ``weight_norm``'ed Linear) selects the params it is computed from
(``a.parametrizations.weight.original0``/``original1``, torch's ``named_parameters``), trained as torch 2.13
trains those (float64, AdamW, numpy and ort-cpu, 1e-12); a glob names params by their own names, and one that
names only a parametrized tensor is an error saying which params it has."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
ORIGINALS = ["a.parametrizations.weight.original0", "a.parametrizations.weight.original1"]


class _Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = gc.nn.utils.parametrizations.weight_norm(gc.nn.Linear(3, 4, dtype="float64"))
        self.c = gc.nn.Linear(4, 2, dtype="float64")

    def forward(self, x, y):
        return {"loss": gc.nn.functional.mse_loss(self.c(gc.tanh(self.a(x))), y)}


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(3, 4, dtype=torch.float64))
        self.c = torch.nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.c(torch.tanh(self.a(x))), y)


def _model() -> gc.Model:
    return gc.capture(_Net(), x=gc.spec("float64", ("N", 3)), y=gc.spec("float64", ("N", 2)))


@pytest.mark.parametrize("option", ["frozen", "trainable", "params", "no_decay"])
def test_a_parametrized_tensors_name_selects_its_params_as_torch_trains_them(option):
    """``option=["a.weight"]`` raised 'unknown parameter(s) ['a.weight']'; now it means both originals:
    frozen (torch: requires_grad off), the only ones trained (trainable; params= keeps the rest
    trainable too) or without weight decay (a param group of weight_decay 0); 2 AdamW steps equal torch's."""
    twin = _TorchNet()
    ours = _Net()
    ours.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()})
    model = gc.capture(ours, x=gc.spec("float64", ("N", 3)), y=gc.spec("float64", ("N", 2)))
    optimizer = gc.optim.AdamW(0.05, weight_decay=0.1, **({"no_decay": ["a.weight"]} if option == "no_decay" else {}))
    arts = gc.training.generate(model, "loss", optimizer, **({} if option == "no_decay" else {option: ["a.weight"]}))
    named = dict(twin.named_parameters())
    if option == "frozen":
        for name in ORIGINALS:
            named[name].requires_grad_(False)
    if option == "trainable":
        for name in set(named) - set(ORIGINALS):
            named[name].requires_grad_(False)
    trained = [n for n, p in named.items() if p.requires_grad]
    assert sorted(arts.manifest.trainable) == sorted(trained)
    plain = [named[n] for n in trained if not (option == "no_decay" and n in ORIGINALS)]
    groups = [{"params": plain}] + ([{"params": [named[n] for n in ORIGINALS], "weight_decay": 0.0}]
                                    if option == "no_decay" else [])
    opt = torch.optim.AdamW(groups, lr=0.05, weight_decay=0.1)
    batches = [{"x": RNG.standard_normal((5, 3)), "y": RNG.standard_normal((5, 2))} for _ in range(2)]
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss = twin(**{k: torch.from_numpy(v) for k, v in batch.items()})
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for backend in BACKENDS:
        trainer = gc.Trainer(arts, backend=backend)
        np.testing.assert_allclose([trainer.step(dict(b)) for b in batches], losses, rtol=1e-12, err_msg=backend)
        state = ours.state_dict()
        for name, value in twin.state_dict().items():
            np.testing.assert_allclose(trainer.params.get(name, state[name]), value.detach().numpy(), rtol=1e-12,
                                       atol=1e-12, err_msg=f"{backend} {name}")


@pytest.mark.parametrize("option", ["frozen", "trainable", "params"])
def test_a_glob_naming_only_a_parametrized_tensor_says_which_params_it_has(option):
    """A glob matches the params' own names (as torch's ``named_parameters``): 'a.w*' selects none, and the
    error names the parametrized tensor it matches and that tensor's params."""
    with pytest.raises(gc.PassError, match=rf"{option}: unknown parameter\(s\) \['a\.w\*'\]; .*; a\.weight is "
                                           rf"parametrized: its params are {', '.join(ORIGINALS)}$"):
        gc.training.generate(_model(), "loss", gc.optim.AdamW(0.05), **{option: ["a.w*"]})


def test_no_decay_of_a_frozen_parametrized_tensor_and_a_glob_say_why_they_match_nothing():
    with pytest.raises(gc.PassError, match=r"no_decay pattern\(s\) \['a\.w\*'\] match no trainable param .*; "
                                           rf"a\.weight is parametrized: its params are {', '.join(ORIGINALS)}$"):
        gc.training.generate(_model(), "loss", gc.optim.AdamW(0.05, no_decay=["a.w*"]))
    with pytest.raises(gc.PassError, match=r"no_decay pattern\(s\) \['a\.weight'\] match no trainable param"):
        gc.training.generate(_model(), "loss", gc.optim.AdamW(0.05, no_decay=["a.weight"]), frozen=["a.weight"])
